"""The phase vocabulary of spectrace: NVTX domain, phase names and colors.

This module is the single source of truth. The SGLang hooks and the embedded
workload emit these names in the ``spectrace`` NVTX domain; ``analyze`` reads
them to select ranges, order phases and colour plots. It imports nothing
heavy (no nvtx, no torch) so analysis machines need neither.
"""

from __future__ import annotations

from dataclasses import dataclass

DOMAIN = "spectrace"


@dataclass(frozen=True)
class Phase:
    """One kind of NVTX range spectrace emits."""

    name: str  # the range text, without domain
    color: int  # ARGB, as nsys stores it
    doc: str
    role: str  # "cycle" (a parent range), "phase" (a leaf of a cycle) or "prefill"

    @property
    def hex(self) -> str:
        """The colour as ``#rrggbb`` for matplotlib and HTML."""
        return f"#{self.color & 0xFFFFFF:06x}"


CYCLE = Phase("cycle", 0xFF4C72B0, "one speculative decode cycle: the worker's per-batch entry", "cycle")
DRAFT = Phase("draft", 0xFFDD8452, "draft model proposes tokens (draft CUDA graph replay or eager loop)", "phase")
VERIFY = Phase("verify", 0xFF55A868, "target model verifies the draft tokens, then accept/sample", "phase")
DRAFT_EXTEND = Phase(
    "draft_extend", 0xFFC44E52, "draft model extends over accepted tokens after verify", "phase"
)
HOST = Phase("host_overhead", 0xFF8172B3, "host-side work between phases (syncs, scheduling)", "phase")
PREFILL = Phase("prefill", 0xFF937860, "one prefill batch: target extend then draft extend", "cycle")
PREFILL_TARGET = Phase("prefill_target_extend", 0xFFDA8BC3, "target model forward over the prompt", "prefill")
PREFILL_DRAFT_EXTEND = Phase(
    "prefill_draft_extend", 0xFF8C8C8C, "draft model extend over the prompt's hidden states", "prefill"
)
DECODE_STEP = Phase("decode_step", 0xFF64B5CD, "one plain (non-speculative) decode step: baseline runs", "cycle")

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
BY_NAME: dict[str, Phase] = {p.name: p for p in PHASES}
NAMES: tuple[str, ...] = tuple(p.name for p in PHASES)
# Order in which a decode cycle's phases run; used to order tables and plots.
CYCLE_ORDER: tuple[str, ...] = ("draft", "verify", "draft_extend", "host_overhead")

SEAM_COLOR = "#bbbbbb"
IDLE_COLOR = "#e8e8e8"
COMM_COLOR = "#2a6f97"

# Payload keys carried on the cycle range (uint64 payload packs them, see hooks).
PAYLOAD_FIELDS: tuple[str, ...] = ("batch_size", "cycle_index", "accept_length")


def color_of(name: str, default: str = "#999999") -> str:
    """Colour of a phase given its range text, with or without a prefix (``eagle3.verify``)."""
    p = BY_NAME.get(base_name(name))
    return p.hex if p else default


def base_name(text: str) -> str:
    """The phase name inside a range text: ``eagle3.verify`` → ``verify``; unknown text is kept."""
    if text in BY_NAME:
        return text
    for sep in (".", ":", "/", " "):
        if sep in text:
            tail = text.rsplit(sep, 1)[1]
            if tail in BY_NAME:
                return tail
    return text


def prefixed_phase_regex() -> str:
    """A regex that selects range texts naming a spectrace phase, with any prefix."""
    alts = "|".join(sorted(NAMES, key=len, reverse=True))
    return rf"(^|[.:/ ])({alts})$"
