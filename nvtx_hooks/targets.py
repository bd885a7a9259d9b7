"""Which SGLang methods get which spectrace range, per SGLang version.

Pure data plus version parsing: imports nothing heavy, so ``spectrace hooks
check`` (static AST) and the runtime patcher share one table. Rows are
verified against the real wheels of 0.4.6 … 0.5.23 (``tests/test_hooks_check.py``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["Version", "MIN_VERSION", "MAX_VERSION", "ENTRY", "PHASE", "DRAFT", "VERIFY", "DRAFT_EXTEND", "IN_PREFILL",
           "PREFILL", "MIXED", "ACCEPT", "STAGE", "CHECK", "ANY", "LAYOUT_WORKER", "LAYOUT_SHARED", "LAYOUTS",
           "COMMON", "Target", "V1", "V2", "ML1", "ML2", "TP", "MIXIN", "RESULTS", "SCHEDULER", "RECEIVER",
           "ADAPTIVE", "TARGETS", "STANDALONE", "parse_version", "supported", "targets_for"]

Version = tuple[int, int, int]

# Versions the table knows. Outside this span the hooks warn once and patch nothing.
MIN_VERSION: Version = (0, 4, 6)
MAX_VERSION: Version = (0, 5, 23)

# Range kinds (what the wrapper does around the original method). Payloads: nvtx_hooks.phases (version 2).
ENTRY = "entry"  # per-batch entry: "cycle" (decode; steps, batch, cycle index) or "prefill" (batch, last index)
PHASE = "phase"  # a fixed phase name, no payload
DRAFT = "draft"  # "draft" with batch, cycle index, the draft worker's steps; next_round after this cycle's verify
VERIFY = "verify"  # "verify" with the worker's steps (read after SGLang activated them); afterwards reads the
#                    host-side accept lengths (v1) for draft_extend and the accept_histogram marks
DRAFT_EXTEND = "draft_extend"  # "draft_extend" with batch size, cycle index, steps, accept length
IN_PREFILL = "in_prefill"  # the phase only when the innermost spectrace range is "prefill"
PREFILL = "prefill"  # "prefill" with batch and last cycle index, unless a "prefill" is open already
MIXED = "mixed"  # DP-attention coordination: "cycle" (this rank decodes) or "prefill", flag in_prefill_batch
# After the call: an ``accept`` *mark* (no range) with the batch's accepted draft tokens, read from the
# result attribute in ``assigns`` (set by the call from a host list SGLang made itself), and the cycle
# index that the entry wrapper attached to that result object (``tags_result``); then ``accept_histogram``
# marks from the per-request host list in ``per_request`` where SGLang stores one.
ACCEPT = "accept"
STAGE = "stage"  # a scheduler method: host range "scheduler.<method>" (phases.SCHEDULER_RANGES)
CHECK = "check"  # never patched: ``hooks check`` verifies a fact the hooks rely on (a call in a body)

ANY = "*"  # any parameter name

# Where SGLang's v2 decode step lives. worker-step: in the worker's forward_batch_generation, verify a worker
# method (0.5.4 … 0.5.23 as released). shared-step: the open refactor #31499 moves the step into
# ``eagle_worker_common.eagle_forward_generation`` and verify into ``run_eagle_verify(batch, ctx, *, topk,
# num_steps, num_draft_tokens)``; ``EAGLEWorkerV2.verify`` may go. A tree is shared-step when that module
# defines ``eagle_forward_generation`` (:func:`nvtx_hooks.check.detect_layout`, :func:`nvtx_hooks.patch.layout`).
LAYOUT_WORKER = "worker-step"
LAYOUT_SHARED = "shared-step"
LAYOUTS: dict[str, str] = {
    LAYOUT_WORKER: "the decode step in the worker's forward_batch_generation, verify a worker method "
                   "(as released, 0.5.4 … 0.5.23)",
    LAYOUT_SHARED: "the decode step in eagle_worker_common.eagle_forward_generation, verify = "
                   "run_eagle_verify(batch, ctx, …) (sgl-project/sglang#31499)",
}


@dataclass(frozen=True)
class Target:
    """One method to wrap: ``module.cls.method`` gets range ``phase`` for versions lo..hi (``cls`` empty: a
    module-level function)."""

    module: str
    cls: str
    methods: tuple[str, ...]  # first one defined on the class is used (renames across versions)
    phase: str
    kind: str
    lo: Version
    hi: Version
    params: tuple[tuple[str, ...], ...]  # leading parameters: allowed names per position
    encloses: tuple[str, ...] = ()  # the body must call one of these (graph replay / target forward)
    optional: bool = False  # absent in some versions of the range: patched only if present
    assigns: tuple[str, ...] = ()  # the body must assign one of these on its parameter 1 (ACCEPT reads it)
    tags_result: bool = False  # ENTRY/MIXED: attach the decode cycle's index to the returned result object
    per_request: tuple[str, ...] = ()  # ACCEPT: a host list of accepted drafts per request on the result, if any
    routes_steps: bool = False  # ENTRY: the step calls activate_step_by_batch(bs): steps = the controller's route
    steps_kwarg: str | None = None  # VERIFY: the keyword argument that holds the step count (else self's)
    layout: str | None = None  # only for trees of this layout (None: any)

    @property
    def qualname(self) -> str:
        """``module.Class.method`` (first alternative; ``module.function`` for a function)."""
        return ".".join(x for x in (self.module, self.cls, self.methods[0]) if x)

    def applies(self, v: Version, layout: str | None = None) -> bool:
        """True if this row is meant for SGLang version ``v`` (and the tree's ``layout``, when given)."""
        return self.lo <= v <= self.hi and (layout is None or self.layout in (None, layout))


_SPEC = "sglang.srt.speculative."
V1 = _SPEC + "eagle_worker"
V2 = _SPEC + "eagle_worker_v2"
ML1 = _SPEC + "multi_layer_eagle_worker"
ML2 = _SPEC + "multi_layer_eagle_worker_v2"
COMMON = _SPEC + "eagle_worker_common"
ADAPTIVE = _SPEC + "adaptive_runtime_state"
TP = "sglang.srt.managers.tp_worker"
MIXIN = "sglang.srt.managers.scheduler_output_processor_mixin"
RESULTS = "sglang.srt.managers.scheduler_components.batch_result_processor"
SCHEDULER = "sglang.srt.managers.scheduler"
RECEIVER = "sglang.srt.managers.scheduler_components.request_receiver"

_B = ("batch",)
_MWB = ("batch", "model_worker_batch")
_S = ("self",)
_REPLAY = ("replay", "execute")  # graph runner launch: replay() ≤ 0.5.13, execute() ≥ 0.5.14
_EXT = ("replay", "execute", "forward")  # graph replay, or eager draft forward when no graph

_V1_LO, _V1_HI = (0, 4, 6), (0, 5, 12)
_ML_LO = (0, 5, 7)
_V2_LO = (0, 5, 4)
_ROUTED = (0, 5, 13)  # v2's decode step calls activate_step_by_batch(bs) (adaptive steps per batch size) from here
# Multi-layer EAGLE drafts eagerly (one runner per MTP layer, no draft CUDA graph in 0.5.7 … 0.5.23).
_ML_DRAFT = ("draft_forward", "forward")


def _v1(module: str, cls: str, lo: Version, draft_calls: tuple[str, ...] = _REPLAY) -> list[Target]:
    """The v1 (``EAGLEWorker``-shaped) rows for one class."""
    return [
        Target(module, cls, ("forward_batch_generation", "forward_batch_speculative_generation"),
               "cycle", ENTRY, lo, _V1_HI, (_S, _B)),
        Target(module, cls, ("draft",), "draft", DRAFT, lo, _V1_HI, (_S, _B), draft_calls),
        Target(module, cls, ("verify",), "verify", VERIFY, lo, _V1_HI, (_S, _B),
               ("forward_batch_generation",)),
        Target(module, cls, ("forward_draft_extend_after_decode",), "draft_extend", DRAFT_EXTEND,
               lo, _V1_HI, (_S, _B), _EXT),
        Target(module, cls, ("forward_target_extend",), "prefill_target_extend", PHASE, lo, _V1_HI,
               (_S, _B), ("forward_batch_generation",)),
        Target(module, cls, ("forward_draft_extend",), "prefill_draft_extend", PHASE, lo, _V1_HI,
               (_S, _B, ("hidden_states",), ("next_token_ids",)), ("forward",)),
    ]


def _v2(module: str, worker: str, draft: str, lo: Version, draft_calls: tuple[str, ...] = _REPLAY,
        routed: bool = True) -> list[Target]:
    """The v2 (``EAGLEWorkerV2`` + draft worker) rows for one worker pair (``routed``: its decode step activates
    the adaptive step count per batch size from 0.5.13 on)."""
    hi = MAX_VERSION
    entry = [Target(module, worker, ("forward_batch_generation",), "cycle", ENTRY, lo, hi, (_S, _MWB),
                    tags_result=True)]
    if routed:
        entry = [
            Target(module, worker, ("forward_batch_generation",), "cycle", ENTRY, lo, (0, 5, 12), (_S, _MWB),
                   tags_result=True),
            Target(module, worker, ("forward_batch_generation",), "cycle", ENTRY, _ROUTED, hi, (_S, _MWB),
                   ("activate_step_by_batch",), tags_result=True, routes_steps=True, layout=LAYOUT_WORKER),
            Target(module, worker, ("forward_batch_generation",), "cycle", ENTRY, _ROUTED, hi, (_S, _MWB),
                   ("eagle_forward_generation",), tags_result=True, routes_steps=True, layout=LAYOUT_SHARED),
        ]
    return entry + [
        Target(module, worker, ("verify",), "verify", VERIFY, lo, hi, (_S, _MWB),
               ("forward_batch_generation", "run_eagle_verify"), layout=LAYOUT_WORKER),
        Target(module, worker, ("_forward_prefill_batch",), "prefill", PREFILL, lo, hi, (_S, _B),
               optional=True),
        Target(module, draft, ("draft",), "draft", DRAFT, lo, hi, (_S, _MWB), draft_calls),
        Target(module, draft, ("_draft_extend_for_decode",), "draft_extend", DRAFT_EXTEND, lo, hi,
               (_S, _MWB, ("batch_result",)), _EXT),
        Target(module, draft, ("_draft_extend_for_prefill",), "prefill_draft_extend", PHASE, lo, hi,
               (_S, _MWB, ("target_hidden_states",), ("next_token_ids",)), ("forward",)),
    ]


def _shared_step() -> list[Target]:
    """The #31499 layout's own rows: verify is the module function ``run_eagle_verify(batch, ctx, *, topk,
    num_steps, num_draft_tokens)`` (patched in its module, which the shared step calls it from), and what
    ``hooks check`` verifies of the shared step itself (it activates the steps and calls that function)."""
    lo, hi = _ROUTED, MAX_VERSION
    return [
        Target(COMMON, "", ("run_eagle_verify",), "verify", VERIFY, lo, hi, (_B, ("ctx",)),
               ("forward_batch_generation",), steps_kwarg="num_steps", layout=LAYOUT_SHARED),
        Target(COMMON, "", ("eagle_forward_generation",), "cycle", CHECK, lo, hi, ((ANY,), (ANY,)),
               ("run_eagle_verify",), layout=LAYOUT_SHARED),
        Target(COMMON, "", ("eagle_forward_generation",), "cycle", CHECK, lo, hi, ((ANY,), (ANY,)),
               ("activate_step_by_batch",), layout=LAYOUT_SHARED),
    ]


def _steps() -> list[Target]:
    """What the cycle's step count relies on (0.5.13 …): SGLang's activation is the controller's route for the
    batch size, ``params.get_steps_for_batch(bs)``, which the entry reads before the step activates it (a pure
    lookup), and the DP-attention coordination path (0.5.22 …) the MIXED range sits on."""
    return [
        Target(ADAPTIVE, "AdaptiveController", ("activate_step_by_batch",), "cycle", CHECK, _ROUTED, MAX_VERSION,
               (_S, ("batch_size",)), ("get_steps_for_batch",)),
        Target(V2, "EAGLEWorkerV2", ("_forward_dp_spec_prefill_coordination",), "cycle", MIXED, _ROUTED,
               MAX_VERSION, (_S, _B), ("draft",), optional=True, tags_result=True),
    ]


def _accept() -> list[Target]:
    """The v2 scheduler's first host-side use of a decode batch's accept lengths, one row per shape.

    ``process_batch_result_decode`` waits on ``result.copy_done`` (SGLang's own event after its
    non-blocking D2H copy), then calls this method, which does ``accept_lens = result.accept_lens.tolist()``
    and sets ``result.<assigns> = sum(accept_lens) - len(batch.reqs)`` (0.5.23: minus
    ``num_non_draft_tokens_per_req``, 1 for EAGLE, per request): accepted draft tokens, bonus excluded.
    Method and attribute were renamed twice; the class moved to a scheduler component in 0.5.13. Verified
    on the wheels of 0.5.4, 0.5.5, 0.5.8, 0.5.10, 0.5.11, 0.5.12, 0.5.13, 0.5.18, 0.5.21, 0.5.23. The
    per-request host list (``per_request``: accepted drafts of each request, the histogram's source) is stored
    from 0.5.10 on (``accept_length_per_req_cpu``; 0.5.4 and 0.5.5 keep it in a local: no histogram there).
    """
    rb = (_S, ("result",), ("batch",))
    mixin = "SchedulerOutputProcessorMixin"
    return [
        Target(MIXIN, mixin, ("_resolve_spec_overlap_token_ids",), "accept", ACCEPT, _V2_LO, (0, 5, 10), rb,
               assigns=("num_accepted_tokens",), per_request=("accept_length_per_req_cpu",)),
        Target(MIXIN, mixin, ("_resolve_spec_overlap_token_ids",), "accept", ACCEPT, (0, 5, 11), (0, 5, 11), rb,
               assigns=("num_accepted_drafts",), per_request=("num_accepted_drafts_per_req_cpu",)),
        Target(MIXIN, mixin, ("_resolve_spec_overlap_tokens",), "accept", ACCEPT, (0, 5, 12), (0, 5, 12), rb,
               assigns=("num_correct_drafts",), per_request=("num_correct_drafts_per_req_cpu",)),
        Target(RESULTS, "SchedulerBatchResultProcessor", ("_resolve_spec_v2_tokens",), "accept", ACCEPT,
               (0, 5, 13), MAX_VERSION, rb, assigns=("num_correct_drafts",),
               per_request=("num_correct_drafts_per_req_cpu",)),
    ]


def _scheduler() -> list[Target]:
    """Host ranges ``scheduler.<method>`` around the scheduler's loop methods (every event loop calls them: normal,
    overlap, pipeline-parallel), the names SGLang's own ``SGLANG_ENABLE_NVTX_SCHEDULER`` ranges have (0.5.14 …).
    ``recv_requests`` moved to a scheduler component in 0.5.13. Verified on the wheels of 0.4.6 … 0.5.23."""
    sb = (_S, ("batch",))
    return [
        Target(SCHEDULER, "Scheduler", ("recv_requests",), "scheduler.recv_requests", STAGE, MIN_VERSION,
               (0, 5, 12), (_S,)),
        Target(RECEIVER, "SchedulerRequestReceiver", ("recv_requests",), "scheduler.recv_requests", STAGE,
               (0, 5, 13), MAX_VERSION, (_S,)),
        Target(SCHEDULER, "Scheduler", ("process_input_requests",), "scheduler.process_input_requests", STAGE,
               MIN_VERSION, MAX_VERSION, (_S, ("recv_reqs",))),
        Target(SCHEDULER, "Scheduler", ("get_next_batch_to_run",), "scheduler.get_next_batch_to_run", STAGE,
               MIN_VERSION, MAX_VERSION, (_S,)),
        Target(SCHEDULER, "Scheduler", ("run_batch",), "scheduler.run_batch", STAGE, MIN_VERSION, MAX_VERSION, sb,
               ("forward_batch_generation", "forward_batch_speculative_generation")),
        Target(SCHEDULER, "Scheduler", ("process_batch_result",), "scheduler.process_batch_result", STAGE,
               MIN_VERSION, MAX_VERSION, (*sb, ("result",))),
    ]


TARGETS: tuple[Target, ...] = tuple(
    _v1(V1, "EAGLEWorker", _V1_LO)
    + _v1(ML1, "MultiLayerEagleWorker", _ML_LO, ())  # v1 multi-layer draft: tree build only, no forward
    + _v2(V2, "EAGLEWorkerV2", "EagleDraftWorker", _V2_LO)
    + _v2(ML2, "MultiLayerEagleWorkerV2", "MultiLayerEagleDraftWorker", _ML_LO, _ML_DRAFT, routed=False)
    + _shared_step()
    + _steps()
    + [
        # v2 (and v1 idle) prefill: the target forward inside a "prefill" range.
        Target(TP, "TpModelWorker", ("forward_batch_generation",), "prefill_target_extend", IN_PREFILL,
               MIN_VERSION, MAX_VERSION, (_S, (ANY,))),
    ]
    + _accept()
    + _scheduler()
)

# Standalone workers (StandaloneWorker(EAGLEWorker), StandaloneWorkerV2(EAGLEWorkerV2),
# StandaloneDraftWorker(EagleDraftWorker)) override none of these methods in 0.5.3 … 0.5.23,
# so the base-class patches cover them; ``hooks check`` verifies that they still do not.
STANDALONE: tuple[tuple[str, str, str], ...] = (
    (_SPEC + "standalone_worker", "StandaloneWorker", "EAGLEWorker"),
    (_SPEC + "standalone_worker_v2", "StandaloneWorkerV2", "EAGLEWorkerV2"),
    (_SPEC + "standalone_worker_v2", "StandaloneDraftWorker", "EagleDraftWorker"),
)


def parse_version(text: str) -> Version | None:
    """``"0.5.10.post2"`` → ``(0, 5, 10)``; None if it does not start with three numbers."""
    m = re.match(r"^\s*v?(\d+)\.(\d+)\.(\d+)", text or "")
    if not m:
        m2 = re.match(r"^\s*v?(\d+)\.(\d+)(?:rc\d+)?", text or "")  # "0.5.0rc0" has three; "0.5" too
        return (int(m2.group(1)), int(m2.group(2)), 0) if m2 else None
    return int(m.group(1)), int(m.group(2)), int(m.group(3))


def supported(v: Version | None) -> bool:
    """True if the table covers SGLang version ``v``."""
    return v is not None and v != (0, 0, 0) and MIN_VERSION <= v <= MAX_VERSION


def targets_for(v: Version | None, layout: str | None = None) -> list[Target]:
    """The rows that apply to version ``v`` (empty when unsupported); with ``layout``, those of that layout and the
    layout-free ones (without: every layout's, as the runtime patcher arms them and picks per module)."""
    if v is None or not supported(v):
        return []
    return [t for t in TARGETS if t.applies(v, layout)]
