"""The phase vocabulary of spectrace: NVTX domain, phase names and colors.

This module is the single source of truth. The SGLang hooks and the embedded
workload emit these names in the ``spectrace`` NVTX domain; ``analyze`` reads
them to select ranges, order phases and colour plots. It imports nothing
heavy (no nvtx, no torch) so analysis machines need neither.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["DOMAIN", "HOST_DOMAIN", "Phase", "CYCLE", "DRAFT", "VERIFY", "DRAFT_EXTEND", "HOST", "PREFILL", "PREFILL_TARGET",
           "PREFILL_DRAFT_EXTEND", "DECODE_STEP", "ACCEPT", "ACCEPT_HISTOGRAM", "PHASES", "NAMES", "MARKS",
           "SCHEDULER_PREFIX", "SCHEDULER_STAGES", "SCHEDULER_RANGES", "EMITTED", "CYCLE_ORDER",
           "SEAM_COLOR", "IDLE_COLOR", "COMM_COLOR", "COMPUTE_COLOR", "PAYLOAD_FIELDS", "PAYLOAD_FIELDS_V2", "color_of", "base_name",
           "prefixed_phase_regex", "PayloadField", "VERSION_SHIFT", "PAYLOAD_VERSION", "PAYLOAD_LAYOUTS",
           "encode_payload", "decode_payload", "HISTOGRAM_LAYOUT", "HISTOGRAM_WIDTHS", "HISTOGRAM_MAX_POSITION",
           "histogram_of", "encode_accept_histogram", "decode_accept_histogram", "accept_histograms",
           "ANNOTATION_PREFIX", "ANNOTATION_RE", "annotation", "parse_annotation"]

DOMAIN = "spectrace"
# The hooks' host ranges around SGLang's scheduler methods (SCHEDULER_RANGES): their own domain, so that the
# ``spectrace`` domain stays the phases (``spectrace analyze`` selects that whole domain by default).
HOST_DOMAIN = "spectrace.host"


@dataclass(frozen=True)
class Phase:
    """One kind of NVTX range spectrace emits."""

    name: str  # the range text, without domain
    color: int  # ARGB, as nsys stores it
    doc: str
    role: str  # "cycle" (a parent range), "phase" (a leaf of a cycle), "prefill", "mark" (an instant) or "host"

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
ACCEPT_HISTOGRAM = Phase(
    "accept_histogram", 0xFFB8A45A,
    "a decode batch's requests counted by accepted draft tokens (0, 1, …, k), one mark per chunk of positions", "mark"
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
MARKS: tuple[Phase, ...] = (ACCEPT, ACCEPT_HISTOGRAM)

# Host ranges around SGLang's scheduler methods (role "host"): the same texts SGLang's own
# ``SGLANG_ENABLE_NVTX_SCHEDULER=1`` ranges have (``srt/observability/scheduler_stage_metrics.py``,
# ``scheduler.<stage>``, default NVTX domain), emitted by the hooks in HOST_DOMAIN. A host item is a range whose
# text is one of these, in either domain; the hooks emit none while SGLang's own are on, so a capture has one of
# the two, never both. They enclose a cycle (``run_batch``) or a result's marks (``process_batch_result``), so
# they are not phases: not in PHASES, NAMES, EMITTED or the phase regex.
SCHEDULER_PREFIX = "scheduler."
SCHEDULER_STAGES: tuple[str, ...] = (
    "recv_requests", "process_input_requests", "get_next_batch_to_run", "run_batch", "process_batch_result",
)
_STAGE_DOC = {
    "recv_requests": "receive new requests from the tokenizer (zmq polls, broadcast to the other ranks)",
    "process_input_requests": "handle the received requests (queue them, aborts, control messages)",
    "get_next_batch_to_run": "schedule: pick the next batch (prefill admission, decode batch update, memory checks)",
    "run_batch": "launch the batch on the model worker (the cycle or prefill range nests inside)",
    "process_batch_result": "process a batch's result on the host: D2H copy wait, tokens, finished requests",
}
_STAGE_COLOR = {  # SGLang's own colours for these ranges (srt/utils/nvtx_utils.py): blue, purple, green, red, cyan
    "recv_requests": 0xFF1F77B4, "process_input_requests": 0xFF9467BD, "get_next_batch_to_run": 0xFF2CA02C,
    "run_batch": 0xFFD62728, "process_batch_result": 0xFF17BECF,
}
SCHEDULER_RANGES: tuple[Phase, ...] = tuple(
    Phase(SCHEDULER_PREFIX + st, _STAGE_COLOR[st], _STAGE_DOC[st], "host") for st in SCHEDULER_STAGES
)
# Every name spectrace emits in its DOMAIN, ranges and marks (the strings ``ranges`` registers, with their colours).
EMITTED: dict[str, Phase] = {p.name: p for p in PHASES + MARKS}
# Order in which a decode cycle's phases run; used to order tables and plots.
CYCLE_ORDER: tuple[str, ...] = ("draft", "verify", "draft_extend", "host_overhead")

# Colour-blind safe (Okabe–Ito): the phases above, and compute / communication / idle, distinct wherever they meet
SEAM_COLOR = "#bbbbbb"
IDLE_COLOR = "#e8e8e8"
COMM_COLOR = "#0072b2"
COMPUTE_COLOR = "#e69f00"

# Payload keys (uint64 payload packs them, see below): what decode_payload returns for a version-1 payload, and
# for a version-2 one.
PAYLOAD_FIELDS: tuple[str, ...] = ("batch_size", "cycle_index", "accept_length")
PAYLOAD_FIELDS_V2: tuple[str, ...] = PAYLOAD_FIELDS + ("steps", "next_round", "in_prefill_batch")


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
# One 63-bit non-negative integer per range or mark, so it fits both NVTX payload columns: python ``nvtx`` sends a
# Python int as an INT64 payload (nsys column ``int64Value``); a C ULL payload lands in ``uint64Value``. Read either.
# Bits 60..62 hold the layout version; 0 means "not a spectrace payload". Every layout is defined here and only
# here: :data:`PAYLOAD_LAYOUTS` lists each version's fields (shift, width, offset) for vectorised decoders.
#
# Version 1 (written by spectrace before payload version 2; decoded exactly as before):
#   bits  0..15  batch_size      requests in the batch (saturates at 65535)
#   bits 16..39  cycle_index     per-process decode-cycle counter, mod 2**24;
#                                TP ranks run the same batches, so equal indices
#                                on different ranks are the same cycle
#   bits 40..59  accept_length+1 0 = unknown; else 1 + the sum over the batch of
#                                accepted *draft* tokens (bonus token excluded),
#                                so tokens emitted this cycle = accept_length + batch_size
#                                (saturates at 2**20 - 2)
#
# Version 2 (written now; the first three fields mean what they mean in version 1):
#   bits  0..15  batch_size      as version 1
#   bits 16..39  cycle_index     as version 1
#   bits 40..52  accept_length+1 as version 1, saturating at 2**13 - 2 = 8190
#   bits 53..57  steps+1         0 = unknown; else 1 + the ``speculative_num_steps`` the cycle ran with, 0..30
#                                (0 steps: verify only, no draft range; SGLang's adaptive tiers); more than 30
#                                is written as unknown, never as a wrong number
#   bit  58      next_round      1 on a ``draft`` range that drafts the *next* round of this batch after this
#                                cycle's verify (SGLang's pipeline-parallel tail draft, ``with_topology=True``);
#                                that next cycle has no draft range of its own
#   bit  59      in_prefill_batch  1 on a decode cycle (and its phases) that ran inside a batch SGLang classified
#                                as prefill (DP attention, ``_forward_dp_spec_prefill_coordination``: eager, no
#                                CUDA graphs), and on a ``prefill`` range of that path
#
# Version 3: an ``accept_histogram`` mark (see :func:`encode_accept_histogram`); :func:`decode_payload` returns
# None for it.
#
# Which event carries what (the SGLang hooks; the workload does the same): ``cycle`` carries batch_size,
# cycle_index and steps (accept length is not known yet when it is pushed); ``prefill`` carries batch_size and
# the cycle_index of the last decode cycle (prefill does not advance it); ``draft``, ``verify`` and
# ``draft_extend`` carry batch_size, cycle_index and steps (``verify``: the count read after SGLang activated
# it, the authority when it differs from the cycle's); ``draft_extend`` also the accept length when it is on
# the host already (SGLang v1 ``verify`` does ``.tolist()``; v2 keeps it on the GPU: unknown). In v2 the
# ``accept`` mark carries batch_size, cycle_index and the accept length: it is emitted on the scheduler thread
# when SGLang's result processing has copied the batch's accept lengths to the host (after the cycle range
# closed; with the overlap scheduler after the *next* cycle's range), with the cycle_index of the cycle that
# produced them. Join marks to their cycle on (process, cycle_index).

PayloadField = tuple[str, int, int, int]  # (name, shift, bits, offset): value = (raw >> shift) % 2**bits - offset
VERSION_SHIFT = 60
PAYLOAD_VERSION = 2  # the version encode_payload writes by default
_VERSION_MASK = 0b111

PAYLOAD_LAYOUTS: dict[int, tuple[PayloadField, ...]] = {
    # offset 1: a stored 0 means unknown (None); offset 0 with 1 bit: a flag (bool)
    1: (("batch_size", 0, 16, 0), ("cycle_index", 16, 24, 0), ("accept_length", 40, 20, 1)),
    2: (("batch_size", 0, 16, 0), ("cycle_index", 16, 24, 0), ("accept_length", 40, 13, 1), ("steps", 53, 5, 1),
        ("next_round", 58, 1, 0), ("in_prefill_batch", 59, 1, 0)),
}
_FLAGS = ("next_round", "in_prefill_batch")

# Version-1 field geometry under its historical names (analyze.compute reads them; the cycle index is 24 bits at
# bit 16 and the batch size 16 bits at bit 0 in both versions).
_BS_BITS, _CYC_BITS, _ACC_BITS = 16, 24, 20
_BS_MAX = (1 << _BS_BITS) - 1
_CYC_MASK = (1 << _CYC_BITS) - 1
_ACC_MAX = (1 << _ACC_BITS) - 2
_CYC_SHIFT = _BS_BITS
_ACC_SHIFT = _BS_BITS + _CYC_BITS
_VER_SHIFT = VERSION_SHIFT


def _field(layout: tuple[PayloadField, ...], name: str) -> PayloadField:
    return next(f for f in layout if f[0] == name)


# Version 2's geometry as constants, taken from its layout (encode_payload runs on every range a hook opens)
_ACC1_SHIFT, _ACC1_MAX = _field(PAYLOAD_LAYOUTS[1], "accept_length")[1], (1 << 20) - 2
_ACC2_SHIFT, _ACC2_BITS = _field(PAYLOAD_LAYOUTS[2], "accept_length")[1:3]
_ACC2_MAX = (1 << _ACC2_BITS) - 2
_STEPS_SHIFT, _STEPS_BITS = _field(PAYLOAD_LAYOUTS[2], "steps")[1:3]
_STEPS_MAX = (1 << _STEPS_BITS) - 2
_NEXT_ROUND = 1 << _field(PAYLOAD_LAYOUTS[2], "next_round")[1]
_IN_PREFILL_BATCH = 1 << _field(PAYLOAD_LAYOUTS[2], "in_prefill_batch")[1]
_V1, _V2 = 1 << VERSION_SHIFT, 2 << VERSION_SHIFT


def encode_payload(batch_size: int, cycle_index: int, accept_length: int | None = None, steps: int | None = None,
                   *, next_round: bool = False, in_prefill_batch: bool = False, version: int = PAYLOAD_VERSION) -> int:
    """Pack one range's or ``accept`` mark's numbers into a 63-bit int (:data:`PAYLOAD_VERSION` unless
    ``version=1``, the old layout, which has no steps and no flags: ValueError if any is given)."""
    bs = batch_size if 0 <= batch_size <= _BS_MAX else min(max(int(batch_size), 0), _BS_MAX)
    v = ((int(cycle_index) & _CYC_MASK) << _CYC_SHIFT) | bs
    if version == 2:
        if accept_length is not None:
            v |= (min(max(int(accept_length), 0), _ACC2_MAX) + 1) << _ACC2_SHIFT
        if steps is not None and 0 <= steps <= _STEPS_MAX:
            v |= (int(steps) + 1) << _STEPS_SHIFT
        if next_round:
            v |= _NEXT_ROUND
        if in_prefill_batch:
            v |= _IN_PREFILL_BATCH
        return v | _V2
    if version != 1:
        raise ValueError(f"payload version {version} is not one of {sorted(PAYLOAD_LAYOUTS)}")
    if steps is not None or next_round or in_prefill_batch:
        raise ValueError("payload version 1 carries no steps and no flags")
    if accept_length is not None:
        v |= (min(max(int(accept_length), 0), _ACC1_MAX) + 1) << _ACC1_SHIFT
    return v | _V1


def decode_payload(value: int | None) -> dict | None:
    """Unpack an NVTX ``uint64Value``/``int64Value``; None if it is not a version-1 or version-2 spectrace payload.

    Version 1 gives ``{"batch_size", "cycle_index", "accept_length"}`` (:data:`PAYLOAD_FIELDS`), version 2 adds
    ``steps`` (None: unknown; 0: a real verify-only cycle), ``next_round`` and ``in_prefill_batch`` (bools)
    (:data:`PAYLOAD_FIELDS_V2`); accept_length is None when unknown.
    """
    if value is None:
        return None
    v = int(value) & ((1 << 64) - 1)  # accept signed int64 column values too
    layout = PAYLOAD_LAYOUTS.get(v >> VERSION_SHIFT)
    if layout is None:
        return None
    out: dict = {}
    for name, shift, bits, offset in layout:
        raw = (v >> shift) & ((1 << bits) - 1)
        if name in _FLAGS:
            out[name] = bool(raw)
        elif offset:
            out[name] = raw - offset if raw else None
        else:
            out[name] = raw
    return out


# --- Acceptance per draft position: the ``accept_histogram`` marks ----------------------------------------
#
# A decode batch's distribution over requests of accepted draft tokens: counts[j] = requests that accepted
# exactly j draft tokens this cycle (j = 0 … steps; the bonus token is not counted). Requests that accepted
# at least j drafts (the acceptance at draft position j) = sum(counts[j:]). One histogram is one or more
# ``accept_histogram`` marks (version 3), each a chunk of consecutive positions:
#
#   bits  0..23  cycle_index     the decode cycle whose requests are counted (as in that cycle's payloads)
#   bits 24..28  first_position  the accepted-draft count of the chunk's first slot, 0..31
#   bits 29..30  width code c    every slot is W = HISTOGRAM_WIDTHS[c] = (3, 5, 7, 14)[c] bits wide, so a
#                                chunk holds 29 // W = 9, 5, 4 or 2 slots; W is the narrowest that holds the
#                                histogram's largest count (same W in every chunk of one histogram)
#   bits 31..59  slots           slot s (bits 31 + s*W .. 31 + (s+1)*W - 1): requests that accepted
#                                first_position + s draft tokens
#   bits 60..62  3
#
# A position no chunk covers has count 0 (an all-zero chunk is not emitted; slots past the last position are 0,
# which is true: no request accepted more drafts than the cycle drafted). The marks of one cycle are emitted
# together, right after its ``accept`` mark (v2: in SGLang's result processing) or right after its ``verify``
# range (v1: the accept lengths are on the host after verify's ``.tolist()``). Consistency a reader can check:
# sum(counts) = the batch's requests, sum(j * counts[j]) = its accept_length.

HISTOGRAM_LAYOUT = 3
HISTOGRAM_WIDTHS: tuple[int, ...] = (3, 5, 7, 14)
HISTOGRAM_MAX_POSITION = 30  # the last accepted-draft count a histogram holds (the most steps a payload holds)
_H_CYC_BITS, _H_FIRST_SHIFT, _H_FIRST_BITS, _H_WIDTH_SHIFT, _H_SLOT_SHIFT, _H_SLOT_BITS = 24, 24, 5, 29, 31, 29


def histogram_of(drafts_per_request) -> list[int]:
    """counts[j] = how many of ``drafts_per_request`` (each request's accepted draft tokens, ints ≥ 0) equal j;
    ``[]`` for no requests; ValueError for a negative count."""
    ds = drafts_per_request if isinstance(drafts_per_request, list) else list(drafts_per_request)
    if not ds:
        return []
    if min(ds) < 0:
        raise ValueError("accepted draft counts must be non-negative")
    counts = [0] * (max(ds) + 1)
    for d in ds:
        counts[d] += 1
    return counts


def encode_accept_histogram(cycle_index: int, counts: list[int]) -> list[int]:
    """The ``accept_histogram`` mark payloads (version 3) of one cycle's histogram ``counts`` (see above), all-zero
    chunks left out; ValueError if a count is negative or above 16383 or a nonzero count sits past position 30."""
    n = len(counts)
    while n and not counts[n - 1]:  # trailing zeros: implied
        n -= 1
    if not n:
        if counts and min(counts) < 0:
            raise ValueError("histogram counts must be non-negative")
        return []
    if min(counts) < 0:
        raise ValueError("histogram counts must be non-negative")
    top = max(counts)
    code = next((i for i, w in enumerate(HISTOGRAM_WIDTHS) if top < (1 << w)), None)
    if code is None:
        raise ValueError(f"a histogram count of {top} does not fit {HISTOGRAM_WIDTHS[-1]} bits")
    width = HISTOGRAM_WIDTHS[code]
    if n - 1 > HISTOGRAM_MAX_POSITION:  # (every width's chunk starts reach position 30: first_position <= 30)
        raise ValueError(f"accepted-draft position {n - 1} is past {HISTOGRAM_MAX_POSITION}")
    slots = _H_SLOT_BITS // width
    base = (HISTOGRAM_LAYOUT << VERSION_SHIFT) | (code << _H_WIDTH_SHIFT) | (int(cycle_index) & _CYC_MASK)
    out = []
    for first in range(0, n, slots):
        v = 0
        for s, c in enumerate(counts[first:min(first + slots, n)]):
            if c:
                v |= c << (_H_SLOT_SHIFT + s * width)
        if v:
            out.append(base | (first << _H_FIRST_SHIFT) | v)
    return out


def decode_accept_histogram(value: int | None) -> dict | None:
    """One ``accept_histogram`` mark: ``{"cycle_index", "first_position", "counts"}`` (counts: the chunk's slots,
    position first_position + s); None if ``value`` is not a version-3 spectrace payload."""
    if value is None:
        return None
    v = int(value) & ((1 << 64) - 1)
    if v >> VERSION_SHIFT != HISTOGRAM_LAYOUT:
        return None
    width = HISTOGRAM_WIDTHS[(v >> _H_WIDTH_SHIFT) & 0b11]
    mask = (1 << width) - 1
    slots = v >> _H_SLOT_SHIFT
    return {
        "cycle_index": v & _CYC_MASK,
        "first_position": (v >> _H_FIRST_SHIFT) & ((1 << _H_FIRST_BITS) - 1),
        "counts": [(slots >> (s * width)) & mask for s in range(_H_SLOT_BITS // width)],
    }


def accept_histograms(values) -> dict[int, list[int]]:
    """Merge ``accept_histogram`` mark payloads into one histogram per cycle index (trailing zeros dropped;
    values that are not histogram marks are skipped). For one process's marks: cycle indices are per process."""
    out: dict[int, list[int]] = {}
    for value in values:
        d = decode_accept_histogram(value)
        if d is None:
            continue
        h = out.setdefault(d["cycle_index"], [])
        end = d["first_position"] + len(d["counts"])
        if len(h) < end:
            h.extend([0] * (end - len(h)))
        for s, c in enumerate(d["counts"]):
            h[d["first_position"] + s] += c
    for h in out.values():
        while len(h) > 1 and h[-1] == 0:
            h.pop()
    return out


# --- Torch profiler annotations ---------------------------------------------
#
# Under torch.profiler (no NVTX tool attached) there are no domains and no payload
# columns: a phase is a ``record_function`` whose name is ``spectrace:<phase>``, its
# payload (the same int as the NVTX payload, :func:`encode_payload`: whatever fields
# that carries travel with it) appended in hex after `` #``:
#
#   spectrace:cycle #0x1000001000004    spectrace:draft    spectrace:accept #0x...
#
# ``analyze.read.kineto`` reads them back with ANNOTATION_RE (group 1: the phase,
# group 2: the payload's hex digits, if any) into the spectrace domain's ranges and
# payload column, so the analysis decodes them as it decodes the NVTX payload.

ANNOTATION_PREFIX = DOMAIN + ":"
ANNOTATION_RE = r"^spectrace:([A-Za-z_]+)(?: #0x([0-9a-f]+))?$"


def annotation(name: str, payload: int | None = None) -> str:
    """The ``record_function`` name of phase ``name`` with an encoded ``payload`` (:func:`encode_payload`)."""
    return ANNOTATION_PREFIX + name if payload is None else f"{ANNOTATION_PREFIX}{name} #{int(payload):#x}"


def parse_annotation(text: str) -> tuple[str, int | None] | None:
    """``(phase, payload)`` of a name :func:`annotation` made (payload None when it has none); None for any other."""
    import re

    m = re.match(ANNOTATION_RE, text)
    if m is None:
        return None
    return m.group(1), int(m.group(2), 16) if m.group(2) else None
