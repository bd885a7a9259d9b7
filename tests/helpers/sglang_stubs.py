"""Collaborators for real SGLang methods run without SGLang (tests/helpers/real_sglang.py builds the package).

The real ``EAGLEWorkerV2`` decode-step methods of a released wheel are compiled into a small package whose module
globals come from here: batches, forward modes, the environment flags, the parallel state, context managers, the
DP coordination plan and stub workers that log what ran. Nothing here touches a device; tensors are host lists.
"""

from __future__ import annotations

import contextlib
import json
import types
from pathlib import Path

__all__ = ["LOG", "Flag", "envs", "PARALLEL", "get_parallel", "ForwardMode", "FakeTensor", "SpecInput", "Batch",
           "ScheduleBatch", "CaptureHiddenMode", "EagleDraftInput", "EagleVerifyInput", "DPSpecPrefillCoordinationPlan",
           "PPProxyTensors", "Optional", "draft_tp_context", "speculative_moe_backend_context",
           "speculative_moe_a2a_backend_context", "spec_stage_span", "get_draft_recurrent_hidden_state_spec",
           "Result", "verify_result", "draft_worker_methods", "worker_methods", "log_info_on_rank0", "reset"]

from typing import Optional  # noqa: E402  (a name the real signatures use)

LOG: list[tuple] = []  # what the stub collaborators were asked to do, in order


class Flag:
    """``envs.X``: ``.get()``."""

    def __init__(self, value: bool = False):
        self.value = value

    def get(self) -> bool:
        return self.value


envs = types.SimpleNamespace(SGLANG_SPEC_SKIP_ZERO_STEP_DRAFT_EXTEND=Flag(False),
                             SGLANG_ENABLE_DP_SPEC_PREFILL_COORDINATION=Flag(False))
PARALLEL = types.SimpleNamespace(pp_size=1, attn_dp_rank=0)


def get_parallel():
    return PARALLEL


def reset() -> None:
    """Default flags and parallel state, empty log."""
    LOG.clear()
    envs.SGLANG_SPEC_SKIP_ZERO_STEP_DRAFT_EXTEND.value = False
    PARALLEL.pp_size, PARALLEL.attn_dp_rank = 1, 0


class ForwardMode:
    DECODE: ForwardMode

    def __init__(self, kind: str):
        self.kind = kind

    def is_extend(self) -> bool:
        return self.kind == "extend"

    def is_decode(self) -> bool:
        return self.kind == "decode"

    def is_idle(self) -> bool:
        return self.kind == "idle"


ForwardMode.DECODE = ForwardMode("decode")


class FakeTensor:
    """A host list with the tensor methods the step uses (shape, to, sum, clone)."""

    def __init__(self, values):
        self.values = list(values)

    @property
    def shape(self):
        return (len(self.values),)

    def to(self, device, non_blocking=False):
        return FakeTensor(self.values)

    def sum(self):
        return sum(self.values)

    def clone(self):
        return FakeTensor(self.values)


class SpecInput:
    """EagleDraftInput / EagleVerifyInput."""

    def __init__(self, verify: bool):
        self.verify = verify
        self.kv_loc_plan = None
        self.draft_token = FakeTensor([0])

    def is_verify_input(self) -> bool:
        return self.verify


class Batch:
    """ScheduleBatch: what the decode step reads and sets."""

    def __init__(self, n: int, kind: str = "decode", *, extend_in_batch: bool = False, coordination=None):
        self.reqs = list(range(n))
        self.forward_mode = ForwardMode(kind)
        self.is_extend_in_batch = extend_in_batch
        self.seq_lens = FakeTensor([16] * n)
        self.seq_lens_cpu = self.seq_lens_sum = self.input_ids = None
        self.spec_info = None
        self.global_num_tokens = [n]
        self.global_num_tokens_for_logprob = [n]
        self.draft_global_num_tokens = None
        self.dp_spec_prefill_coordination_metadata = coordination
        self.req_to_token_pool = self.token_to_kv_pool_allocator = self.tree_cache = self.model_config = None
        self.enable_overlap = True
        self.spec_algorithm = None

    def prepare_for_idle(self):
        self.forward_mode = ForwardMode("idle")


class ScheduleBatch:
    @staticmethod
    def init_new(reqs, *pools):
        return Batch(len(reqs))


CaptureHiddenMode = types.SimpleNamespace(NULL="null", LAST="last", FULL="full")
EagleVerifyInput = SpecInput
PPProxyTensors = object


class EagleDraftInput:
    @staticmethod
    def create_idle_input(**kw):
        return SpecInput(False)


class DPSpecPrefillCoordinationPlan:
    """The plan's logic as 0.5.23 ``dp_spec_prefill_coordination.py`` has it (heterogeneous, apply), on lists."""

    def __init__(self, counts, logprob_counts, prefills, draft_width, verify_width):
        self.counts, self.logprob_counts, self.prefills = counts, logprob_counts, prefills

    @property
    def heterogeneous(self):
        return any(p and n for p, n in zip(self.prefills, self.counts)) and any(
            not p and n for p, n in zip(self.prefills, self.counts))

    def apply(self, batch, phase, rank, *, local_only):
        LOG.append(("plan", phase))
        batch.is_extend_in_batch = True


@contextlib.contextmanager
def _null(*args, **kwargs):
    yield


draft_tp_context = speculative_moe_backend_context = speculative_moe_a2a_backend_context = spec_stage_span = _null


def get_draft_recurrent_hidden_state_spec(runner):
    return None, None


def log_info_on_rank0(logger, msg):
    LOG.append(("log", msg))


class Result:
    """GenerationBatchResult: attributes set freely (the hooks tag it)."""

    def __init__(self, **kw):
        self.__dict__.update(kw)


def verify_result(batch, num_steps=None) -> Result:
    LOG.append(("verify", len(batch.reqs), num_steps))
    return Result(new_seq_lens=FakeTensor(batch.seq_lens.values), next_draft_input=SpecInput(False))


# --- stub workers: methods put into the generated classes' bodies (so the hooks find them there) ---------


def _draft(self, batch, *, with_topology=False):
    LOG.append(("draft", len(batch.reqs), self.speculative_num_steps, with_topology))
    if with_topology:
        return SpecInput(True), FakeTensor([0]), FakeTensor([0])
    return SpecInput(True)


def _draft_extend_for_decode(self, batch, batch_result, *, kv_loc_plan=None):
    LOG.append(("draft_extend", len(batch.reqs)))


def _draft_extend_for_prefill(self, batch, target_hidden_states, next_token_ids, mm_input_embeds=None, *,
                              kv_loc_plan=None):
    LOG.append(("prefill_draft_extend", len(batch.reqs)))
    return SpecInput(False)


def _draft_init(self, steps: int):
    self.speculative_num_steps = steps
    self.parallel_layout = types.SimpleNamespace(local_dp=False)
    self.draft_runner = object()


draft_worker_methods = {"__init__": _draft_init, "draft": _draft, "_draft_extend_for_decode": _draft_extend_for_decode,
                        "_draft_extend_for_prefill": _draft_extend_for_prefill}


class _Target:
    model_config = types.SimpleNamespace(vocab_size=100)

    def forward_batch_generation(self, batch=None, forward_batch=None, is_verify=False, pp_proxy_tensors=None,
                                 capture_hidden_mode=None, return_kv_loc_plan=False):
        LOG.append(("target_extend", len(batch.reqs)))
        return Result(kv_loc_plan=None, logits_output=types.SimpleNamespace(hidden_states=None, mm_input_embeds=None),
                      next_token_ids=FakeTensor([1] * len(batch.reqs)), extra_keep_alive_refs=None)


class _Ctx:
    """#31499's EagleWorkerContext: a view of the worker's collaborators (None where the stub has none)."""

    def __init__(self, worker):
        self._worker = worker

    def __getattr__(self, name):
        return getattr(self._worker, name, None)


def _worker_init(self, draft_cls, steps=3, adaptive=None, dp=False, tmp=None):
    """``adaptive``: {batch size: [candidate steps]} -> a real AdaptiveController over the real
    AdaptiveSpeculativeParams, reading that config from a file as SGLang does."""
    self.speculative_num_steps, self.speculative_num_draft_tokens, self.topk = steps, steps + 1, 1
    self.device = "cuda"
    self._draft_worker = self.draft_worker = draft_cls(steps)
    self.target_worker = _Target()
    self.enable_dp_spec_prefill_coordination = dp
    self.speculative_algorithm = types.SimpleNamespace(is_standalone=lambda: False)
    self.plan_stream = self.plan_stream_ctx = self.req_to_token_pool = self.token_to_kv_pool_allocator = None
    self.ctx = _Ctx(self)
    self.adaptive_controller = None
    if adaptive:
        import importlib

        params = importlib.import_module("sglang.srt.speculative.adaptive_spec_params")
        ctl = importlib.import_module("sglang.srt.speculative.adaptive_runtime_state")
        path = Path(tmp) / "adaptive.json"
        path.write_text(json.dumps({str(bs): {"candidate_steps": c} for bs, c in adaptive.items()}))
        policy = params.AdaptiveSpeculativeParams(initial_steps=steps, cfg_path=str(path))
        self.adaptive_controller = ctl.AdaptiveController(self, policy)
        for s in policy.candidate_steps:
            self.adaptive_controller.register(types.SimpleNamespace(speculative_num_steps=s), s)


def _apply_runtime_state(self, state):
    s = state.speculative_num_steps
    LOG.append(("switch", s))
    self.speculative_num_steps, self.speculative_num_draft_tokens = s, s + 1
    self.draft_worker.speculative_num_steps = s


def _build_trivial_verify_input(self, batch):
    LOG.append(("trivial_verify_input", len(batch.reqs)))
    return SpecInput(True)


def _stub_skipped_draft_extend(self, batch, batch_output):
    LOG.append(("skipped_draft_extend", len(batch.reqs)))


worker_methods = {"apply_runtime_state": _apply_runtime_state,
                  "_build_trivial_verify_input": _build_trivial_verify_input,
                  "_stub_skipped_draft_extend": _stub_skipped_draft_extend}
