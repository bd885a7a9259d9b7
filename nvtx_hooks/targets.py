"""Which SGLang methods get which spectrace range, per SGLang version.

Pure data plus version parsing: imports nothing heavy, so ``spectrace hooks
check`` (static AST) and the runtime patcher share one table. Rows are
verified against the real wheels of 0.4.6 … 0.5.23 (``tests/test_hooks_check.py``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["Version", "MIN_VERSION", "MAX_VERSION", "ENTRY", "PHASE", "VERIFY", "DRAFT_EXTEND", "IN_PREFILL",
           "ACCEPT", "ANY", "Target", "V1", "V2", "ML1", "ML2", "TP", "MIXIN", "RESULTS", "TARGETS", "STANDALONE",
           "parse_version", "supported", "targets_for"]

Version = tuple[int, int, int]

# Versions the table knows. Outside this span the hooks warn once and patch nothing.
MIN_VERSION: Version = (0, 4, 6)
MAX_VERSION: Version = (0, 5, 23)

# Range kinds (what the wrapper does around the original method).
ENTRY = "entry"  # per-batch entry: "cycle" (decode) or "prefill", payload batch size + cycle index
PHASE = "phase"  # a fixed phase name, no payload
VERIFY = "verify"  # "verify"; afterwards reads the host-side accept lengths (v1) for draft_extend
DRAFT_EXTEND = "draft_extend"  # "draft_extend" with batch size, cycle index, accept length
IN_PREFILL = "in_prefill"  # the phase only when the innermost spectrace range is "prefill"
# After the call: an ``accept`` *mark* (no range) with the batch's accepted draft tokens, read from the
# result attribute in ``assigns`` (set by the call from a host list SGLang made itself), and the cycle
# index that the entry wrapper attached to that result object (``tags_result``).
ACCEPT = "accept"

ANY = "*"  # any parameter name


@dataclass(frozen=True)
class Target:
    """One method to wrap: ``module.cls.method`` gets range ``phase`` for versions lo..hi."""

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
    tags_result: bool = False  # ENTRY: attach the decode cycle's index to the returned result object

    @property
    def qualname(self) -> str:
        """``module.Class.method`` (first alternative)."""
        return f"{self.module}.{self.cls}.{self.methods[0]}"

    def applies(self, v: Version) -> bool:
        """True if this row is meant for SGLang version ``v``."""
        return self.lo <= v <= self.hi


_SPEC = "sglang.srt.speculative."
V1 = _SPEC + "eagle_worker"
V2 = _SPEC + "eagle_worker_v2"
ML1 = _SPEC + "multi_layer_eagle_worker"
ML2 = _SPEC + "multi_layer_eagle_worker_v2"
TP = "sglang.srt.managers.tp_worker"
MIXIN = "sglang.srt.managers.scheduler_output_processor_mixin"
RESULTS = "sglang.srt.managers.scheduler_components.batch_result_processor"

_B = ("batch",)
_MWB = ("batch", "model_worker_batch")
_S = ("self",)
_REPLAY = ("replay", "execute")  # graph runner launch: replay() ≤ 0.5.13, execute() ≥ 0.5.14
_EXT = ("replay", "execute", "forward")  # graph replay, or eager draft forward when no graph

_V1_LO, _V1_HI = (0, 4, 6), (0, 5, 12)
_ML_LO = (0, 5, 7)
_V2_LO = (0, 5, 4)
# Multi-layer EAGLE drafts eagerly (one runner per MTP layer, no draft CUDA graph in 0.5.7 … 0.5.23).
_ML_DRAFT = ("draft_forward", "forward")


def _v1(module: str, cls: str, lo: Version, draft_calls: tuple[str, ...] = _REPLAY) -> list[Target]:
    """The v1 (``EAGLEWorker``-shaped) rows for one class."""
    return [
        Target(module, cls, ("forward_batch_generation", "forward_batch_speculative_generation"),
               "cycle", ENTRY, lo, _V1_HI, (_S, _B)),
        Target(module, cls, ("draft",), "draft", PHASE, lo, _V1_HI, (_S, _B), draft_calls),
        Target(module, cls, ("verify",), "verify", VERIFY, lo, _V1_HI, (_S, _B),
               ("forward_batch_generation",)),
        Target(module, cls, ("forward_draft_extend_after_decode",), "draft_extend", DRAFT_EXTEND,
               lo, _V1_HI, (_S, _B), _EXT),
        Target(module, cls, ("forward_target_extend",), "prefill_target_extend", PHASE, lo, _V1_HI,
               (_S, _B), ("forward_batch_generation",)),
        Target(module, cls, ("forward_draft_extend",), "prefill_draft_extend", PHASE, lo, _V1_HI,
               (_S, _B, ("hidden_states",), ("next_token_ids",)), ("forward",)),
    ]


def _v2(module: str, worker: str, draft: str, lo: Version, draft_calls: tuple[str, ...] = _REPLAY) -> list[Target]:
    """The v2 (``EAGLEWorkerV2`` + draft worker) rows for one worker pair."""
    hi = MAX_VERSION
    return [
        Target(module, worker, ("forward_batch_generation",), "cycle", ENTRY, lo, hi, (_S, _MWB),
               tags_result=True),
        Target(module, worker, ("verify",), "verify", VERIFY, lo, hi, (_S, _MWB),
               ("forward_batch_generation", "run_eagle_verify")),
        Target(module, worker, ("_forward_prefill_batch",), "prefill", PHASE, lo, hi, (_S, _B),
               optional=True),
        Target(module, draft, ("draft",), "draft", PHASE, lo, hi, (_S, _MWB), draft_calls),
        Target(module, draft, ("_draft_extend_for_decode",), "draft_extend", DRAFT_EXTEND, lo, hi,
               (_S, _MWB, ("batch_result",)), _EXT),
        Target(module, draft, ("_draft_extend_for_prefill",), "prefill_draft_extend", PHASE, lo, hi,
               (_S, _MWB, ("target_hidden_states",), ("next_token_ids",)), ("forward",)),
    ]


def _accept() -> list[Target]:
    """The v2 scheduler's first host-side use of a decode batch's accept lengths, one row per shape.

    ``process_batch_result_decode`` waits on ``result.copy_done`` (SGLang's own event after its
    non-blocking D2H copy), then calls this method, which does ``accept_lens = result.accept_lens.tolist()``
    and sets ``result.<assigns> = sum(accept_lens) - len(batch.reqs)`` (0.5.23: minus
    ``num_non_draft_tokens_per_req``, 1 for EAGLE, per request): accepted draft tokens, bonus excluded.
    Method and attribute were renamed twice; the class moved to a scheduler component in 0.5.13. Verified
    on the wheels of 0.5.4, 0.5.5, 0.5.8, 0.5.10, 0.5.11, 0.5.12, 0.5.13, 0.5.18, 0.5.21, 0.5.23.
    """
    rb = (_S, ("result",), ("batch",))
    mixin = "SchedulerOutputProcessorMixin"
    return [
        Target(MIXIN, mixin, ("_resolve_spec_overlap_token_ids",), "accept", ACCEPT, _V2_LO, (0, 5, 10), rb,
               assigns=("num_accepted_tokens",)),
        Target(MIXIN, mixin, ("_resolve_spec_overlap_token_ids",), "accept", ACCEPT, (0, 5, 11), (0, 5, 11), rb,
               assigns=("num_accepted_drafts",)),
        Target(MIXIN, mixin, ("_resolve_spec_overlap_tokens",), "accept", ACCEPT, (0, 5, 12), (0, 5, 12), rb,
               assigns=("num_correct_drafts",)),
        Target(RESULTS, "SchedulerBatchResultProcessor", ("_resolve_spec_v2_tokens",), "accept", ACCEPT,
               (0, 5, 13), MAX_VERSION, rb, assigns=("num_correct_drafts",)),
    ]


TARGETS: tuple[Target, ...] = tuple(
    _v1(V1, "EAGLEWorker", _V1_LO)
    + _v1(ML1, "MultiLayerEagleWorker", _ML_LO, ())  # v1 multi-layer draft: tree build only, no forward
    + _v2(V2, "EAGLEWorkerV2", "EagleDraftWorker", _V2_LO)
    + _v2(ML2, "MultiLayerEagleWorkerV2", "MultiLayerEagleDraftWorker", _ML_LO, _ML_DRAFT)
    + [
        # v2 (and v1 idle) prefill: the target forward inside a "prefill" range.
        Target(TP, "TpModelWorker", ("forward_batch_generation",), "prefill_target_extend", IN_PREFILL,
               MIN_VERSION, MAX_VERSION, (_S, (ANY,))),
    ]
    + _accept()
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


def targets_for(v: Version | None) -> list[Target]:
    """The rows that apply to version ``v`` (empty when unsupported)."""
    if v is None or not supported(v):
        return []
    return [t for t in TARGETS if t.applies(v)]
