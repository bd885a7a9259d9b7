"""The phase vocabulary of spectrace: NVTX domain, phase names and colors.

This module is the single source of truth. The SGLang hooks and the embedded
workload emit these names in the ``spectrace`` NVTX domain; ``analyze`` reads
them to select ranges, order phases and colour plots. It imports nothing
heavy (no nvtx, no torch) so analysis machines need neither.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["DOMAIN", "Phase", "CYCLE", "DRAFT", "VERIFY", "DRAFT_EXTEND", "HOST", "PREFILL", "PREFILL_TARGET",
           "PREFILL_DRAFT_EXTEND", "DECODE_STEP", "ACCEPT", "PHASES", "NAMES", "MARKS", "EMITTED", "CYCLE_ORDER",
           "SEAM_COLOR", "IDLE_COLOR", "COMM_COLOR", "COMPUTE_COLOR", "PAYLOAD_FIELDS", "color_of", "base_name",
           "prefixed_phase_regex", "PAYLOAD_VERSION", "encode_payload", "decode_payload"]

DOMAIN = "spectrace"


@dataclass(frozen=True)
class Phase:
    """One kind of NVTX range spectrace emits."""

    name: str  # the range text, without domain
    color: int  # ARGB, as nsys stores it
    doc: str
    role: str  # "cycle" (a parent range), "phase" (a leaf of a cycle), "prefill", or "mark" (an instant)

    @property
    def hex(self) -> str:
        """The colour as ``#rrggbb`` for matplotlib and HTML."""
        return f"#{self.color & 0xFFFFFF:06x}"


CYCLE = Phase("cycle", 0xFF56B4E9, "one speculative decode cycle: the worker's per-batch entry", "cycle")
DRAFT = Phase("draft", 0xFFCC79A7, "draft model proposes tokens (draft CUDA graph replay or eager loop)", "phase")
VERIFY = Phase("verify", 0xFF009E73, "target model verifies the draft tokens, then accept/sample", "phase")
DRAFT_EXTEND = Phase(
    "draft_extend", 0xFFD55E00, "draft model extends over accepted tokens after verify", "phase"
)
HOST = Phase("host_overhead", 0xFFF0E442, "host-side work between phases (syncs, scheduling)", "phase")
PREFILL = Phase("prefill", 0xFF8C6D31, "one prefill batch: target extend then draft extend", "cycle")
PREFILL_TARGET = Phase("prefill_target_extend", 0xFFB8975A, "target model forward over the prompt", "prefill")
PREFILL_DRAFT_EXTEND = Phase(
    "prefill_draft_extend", 0xFF8C8C8C, "draft model extend over the prompt's hidden states", "prefill"
)
DECODE_STEP = Phase("decode_step", 0xFF56B4E9, "one plain (non-speculative) decode step: baseline runs", "cycle")
ACCEPT = Phase(
    "accept", 0xFFCCB974, "a decode batch's accept lengths reached the host (SGLang v2 result processing)", "mark"
)

PHASES: tuple[Phase, ...] = (
    CYCLE,
    DRAFT,
    VERIFY,
    DRAFT_EXTEND,
    HOST,
    PREFILL,
    PREFILL_TARGET,
    PREFILL_DRAFT_EXTEND,
    DECODE_STEP,
)
_BY_NAME: dict[str, Phase] = {p.name: p for p in PHASES}
NAMES: tuple[str, ...] = tuple(p.name for p in PHASES)
# Instant NVTX marks (``nvtxDomainMarkEx``, nsys eventType 34, no end): not ranges, so not phases.
MARKS: tuple[Phase, ...] = (ACCEPT,)
# Every name spectrace emits, ranges and marks (the strings ``ranges`` registers, with their colours).
EMITTED: dict[str, Phase] = {p.name: p for p in PHASES + MARKS}
# Order in which a decode cycle's phases run; used to order tables and plots.
CYCLE_ORDER: tuple[str, ...] = ("draft", "verify", "draft_extend", "host_overhead")

# Colour-blind safe (Okabe–Ito): the phases above, and compute / communication / idle, distinct wherever they meet
SEAM_COLOR = "#bbbbbb"
IDLE_COLOR = "#e8e8e8"
COMM_COLOR = "#0072b2"
COMPUTE_COLOR = "#e69f00"

# Payload keys carried on the cycle range (uint64 payload packs them, see hooks).
PAYLOAD_FIELDS: tuple[str, ...] = ("batch_size", "cycle_index", "accept_length")


def color_of(name: str, default: str = "#999999") -> str:
    """Colour of a phase given its range text, with or without a prefix (``eagle3.verify``)."""
    p = _BY_NAME.get(base_name(name))
    return p.hex if p else default


def base_name(text: str) -> str:
    """The phase name inside a range text: ``eagle3.verify`` → ``verify``; unknown text is kept."""
    if text in _BY_NAME:
        return text
    for sep in (".", ":", "/", " "):
        if sep in text:
            tail = text.rsplit(sep, 1)[1]
            if tail in _BY_NAME:
                return tail
    return text


def prefixed_phase_regex() -> str:
    """A regex that selects range texts naming a spectrace phase, with any prefix."""
    alts = "|".join(sorted(NAMES, key=len, reverse=True))
    return rf"(^|[.:/ ])({alts})$"


# --- Payload encoding -------------------------------------------------------
#
# One 63-bit non-negative integer per range, so it fits both NVTX payload
# columns: python ``nvtx`` sends a Python int as an INT64 payload (nsys column
# ``int64Value``); a C ULL payload lands in ``uint64Value``. Read either.
#
#   bits  0..15  batch_size      requests in the batch (saturates at 65535)
#   bits 16..39  cycle_index     per-process decode-cycle counter, mod 2**24;
#                                TP ranks run the same batches, so equal indices
#                                on different ranks are the same cycle
#   bits 40..59  accept_length+1 0 = unknown; else 1 + the sum over the batch of
#                                accepted *draft* tokens (bonus token excluded),
#                                so tokens emitted this cycle = accept_length + batch_size
#                                (saturates at 2**20 - 2)
#   bits 60..62  version         PAYLOAD_VERSION (1); 0 means "not a spectrace payload"
#
# Which event carries what (SGLang hooks): ``cycle`` and ``prefill`` carry
# batch_size and cycle_index (accept length is not known yet when they are
# pushed; prefill does not advance cycle_index); ``draft``, ``verify`` and the
# prefill sub-ranges carry no payload; ``draft_extend`` (pushed after verify)
# carries all three when the accept length is already on the host (SGLang v1
# ``verify`` does ``.tolist()``), else accept_length is unknown (v2 keeps it on
# the GPU). In v2 the ``accept`` mark carries all three: it is emitted on the
# scheduler thread when SGLang's result processing has copied the batch's
# accept lengths to the host (after the cycle range closed; with the overlap
# scheduler after the *next* cycle's range), with the cycle_index of the cycle
# that produced them and batch_size = the requests whose lengths were summed.
# The analyzer joins on (process, cycle_index) to put the accept length on the
# cycle.

PAYLOAD_VERSION = 1
_BS_BITS, _CYC_BITS, _ACC_BITS = 16, 24, 20
_BS_MAX = (1 << _BS_BITS) - 1
_CYC_MASK = (1 << _CYC_BITS) - 1
_ACC_MAX = (1 << _ACC_BITS) - 2
_CYC_SHIFT = _BS_BITS
_ACC_SHIFT = _BS_BITS + _CYC_BITS
_VER_SHIFT = _ACC_SHIFT + _ACC_BITS  # 60


def encode_payload(batch_size: int, cycle_index: int, accept_length: int | None = None) -> int:
    """Pack batch size, cycle index and (optional) accept length into one 63-bit int."""
    bs = min(max(int(batch_size), 0), _BS_MAX)
    cyc = int(cycle_index) & _CYC_MASK
    acc = 0 if accept_length is None else min(max(int(accept_length), 0), _ACC_MAX) + 1
    return (PAYLOAD_VERSION << _VER_SHIFT) | (acc << _ACC_SHIFT) | (cyc << _CYC_SHIFT) | bs


def decode_payload(value: int | None) -> dict | None:
    """Unpack an NVTX ``uint64Value``/``int64Value``; None if it is not a spectrace payload.

    Returns ``{"batch_size", "cycle_index", "accept_length"}``; accept_length is None when unknown.
    """
    if value is None:
        return None
    v = int(value) & ((1 << 64) - 1)  # accept signed int64 column values too
    if v >> _VER_SHIFT != PAYLOAD_VERSION:
        return None
    acc = (v >> _ACC_SHIFT) & ((1 << _ACC_BITS) - 1)
    return {
        "batch_size": v & _BS_MAX,
        "cycle_index": (v >> _CYC_SHIFT) & _CYC_MASK,
        "accept_length": acc - 1 if acc else None,
    }
