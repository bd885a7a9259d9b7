"""What the embedded workload injects, planned up front from its seed: the truth its JSON record states.

- **Segments** (``--schedule BS:CYCLES,...`` or ``--adaptive BS:STEPS[:CYCLES],...``): batch size, draft steps and
  cycles of each stretch of the measured loop (:class:`Segment`).
- **Acceptance** (:func:`plan_drafts`): each request's accepted draft tokens per cycle: the same for every request of
  a cycle (uniform in 0..steps, or geometric with ``--accept-rate``: the workload's historical models), or per request
  from a per-position profile (``--accept-profile P1,P2,...``: the probability that draft position j is accepted
  given position j-1 was; positions past the list use its last value).
- **Injected host time** (``--extra PIECE:US:RULE``, :class:`Extra`): US µs more in a named piece — one of SGLang's
  scheduler methods the workload emulates (:data:`SCHEDULER_FUNCTIONS`), ``host_overhead`` or ``between`` (outside
  any range) — in every N-th cycle (``every=N[+K]``), in each cycle with probability P (``p=P``, seeded) or in every
  cycle from N on (``from=N``: a level shift).
- **The scheduler's host functions** (``--scheduler``): their µs (:data:`DEFAULT_SCHEDULER_US`, ``--scheduler-us``),
  a pure-Python busy function with a distinctive name (:func:`spectrace_busy_python`) for CPU sampling to find, and
  the ranges they are wrapped in: SGLang's own (``scheduler.<method>`` in the default NVTX domain, as
  ``SGLANG_ENABLE_NVTX_SCHEDULER=1`` emits them: :class:`DefaultDomainRanges`), the hooks' (the same names in the
  ``spectrace.host`` domain) or none.

Pure Python, no torch: the planning runs (and is tested) anywhere.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from typing import Any

from ..phases import SCHEDULER_PREFIX, SCHEDULER_STAGES

__all__ = ["SCHEDULER_FUNCTIONS", "DEFAULT_SCHEDULER_US", "PIECES", "BUSY_FUNCTION", "RANGE_KINDS", "Segment",
           "parse_adaptive", "Extra", "parse_extra", "extra_cycles", "parse_profile", "parse_scheduler_us",
           "request_drafts", "plan_drafts", "spectrace_busy_python", "DefaultDomainRanges", "range_name"]

# The scheduler methods the workload emulates on the host, in the order one iteration of SGLang's loop calls them
# (run_batch, which launches the cycle, sits between get_next_batch_to_run and process_batch_result).
SCHEDULER_FUNCTIONS: tuple[str, ...] = tuple(s for s in SCHEDULER_STAGES if s != "run_batch")
DEFAULT_SCHEDULER_US: dict[str, int] = {"recv_requests": 40, "process_input_requests": 60,
                                        "get_next_batch_to_run": 150, "process_batch_result": 200}
PIECES: tuple[str, ...] = SCHEDULER_FUNCTIONS + ("host_overhead", "between")
BUSY_FUNCTION = "spectrace_busy_python"
RANGE_KINDS = ("hooks", "sglang", "none")  # --scheduler-ranges


@dataclass(frozen=True)
class Segment:
    """A stretch of the measured loop: ``cycles`` cycles at decode batch size ``batch`` and ``steps`` draft steps."""

    batch: int
    steps: int
    cycles: int


def parse_adaptive(text: str, cycles: int) -> list[Segment]:
    """``--adaptive BS:STEPS[:CYCLES],...`` (0 steps: verify only); CYCLES defaults to ``cycles``; ValueError with
    a one-line reason otherwise."""
    out = []
    for part in text.split(","):
        fields = part.strip().split(":")
        try:
            if len(fields) not in (2, 3):
                raise ValueError
            bs, steps = int(fields[0]), int(fields[1])
            n = int(fields[2]) if len(fields) == 3 else cycles
        except ValueError:
            raise ValueError(f"segment {part.strip()!r} of {text!r} is not BS:STEPS or BS:STEPS:CYCLES "
                             "(e.g. 1:4,8:3,64:0)") from None
        if bs < 1 or steps < 0 or n < 1 or steps > 30:
            raise ValueError(f"segment {part.strip()!r}: batch size and cycles at least 1, steps 0..30")
        out.append(Segment(bs, steps, n))
    return out


@dataclass(frozen=True)
class Extra:
    """``us`` µs more host time in ``piece``, in the cycles its rule picks (exactly one rule is set)."""

    piece: str
    us: int
    every: int | None = None  # cycles i > 0 with i % every == offset
    offset: int = 0
    prob: float | None = None  # each cycle i > 0 with this probability (seeded)
    start: int | None = None  # every cycle i >= start: a level shift

    @property
    def rule(self) -> str:
        """The rule as written on the command line."""
        if self.every is not None:
            return f"every={self.every}" + (f"+{self.offset}" if self.offset else "")
        if self.prob is not None:
            return f"p={self.prob:g}"
        return f"from={self.start}"

    def as_dict(self) -> dict:
        return {"piece": self.piece, "us": self.us, "rule": self.rule, "every": self.every, "offset": self.offset,
                "p": self.prob, "from": self.start}


def parse_extra(text: str) -> Extra:
    """``PIECE:US:every=N[+K]`` | ``PIECE:US:p=P`` | ``PIECE:US:from=N``; ValueError with a one-line reason."""
    parts = text.split(":")
    why = (f"{text!r} is not PIECE:US:every=N[+K], PIECE:US:p=P or PIECE:US:from=N "
           f"(PIECE one of {', '.join(PIECES)})")
    if len(parts) != 3 or parts[0] not in PIECES:
        raise ValueError(why)
    key, eq, val = parts[2].partition("=")
    try:
        us = int(parts[1])
        if us < 0 or not eq:
            raise ValueError
        if key == "every":
            n, _, k = val.partition("+")
            every, offset = int(n), int(k or 0)
            if every < 1 or not 0 <= offset < every:
                raise ValueError
            return Extra(parts[0], us, every=every, offset=offset)
        if key == "p":
            p = float(val)
            if not 0 <= p <= 1:
                raise ValueError
            return Extra(parts[0], us, prob=p)
        if key == "from":
            start = int(val)
            if start < 0:
                raise ValueError
            return Extra(parts[0], us, start=start)
    except ValueError:
        pass
    raise ValueError(why)


def extra_cycles(extras: list[Extra], n: int, seed: int) -> list[list[int]]:
    """Per extra, the cycle indices (of 0..n-1) it applies to; a probabilistic one draws from its own seeded stream
    (seed and the extra's position), the same on every rank."""
    out = []
    for k, x in enumerate(extras):
        if x.every is not None:
            out.append([i for i in range(1, n) if i % x.every == x.offset])
        elif x.prob is not None:
            rng = random.Random(seed * 1_000_003 + 7_919 * (k + 1))
            out.append([i for i in range(1, n) if rng.random() < x.prob])
        else:
            out.append([i for i in range(n) if i >= (x.start or 0)])
    return out


def parse_profile(text: str) -> tuple[float, ...]:
    """``--accept-profile P1,P2,...``: conditional acceptance per draft position, each 0..1."""
    try:
        vals = tuple(float(v) for v in text.split(","))
    except ValueError:
        vals = ()
    if not vals or any(not 0 <= v <= 1 for v in vals):
        raise ValueError(f"{text!r} is not a list of probabilities from 0 to 1 (e.g. 0.9,0.7,0.5)")
    return vals


def parse_scheduler_us(text: str) -> dict[str, int]:
    """``--scheduler-us NAME=US,...``: µs per emulated scheduler function (the others keep their default)."""
    out = dict(DEFAULT_SCHEDULER_US)
    for part in text.split(","):
        name, eq, val = part.strip().partition("=")
        try:
            us = int(val)
        except ValueError:
            us = -1
        if not eq or name not in DEFAULT_SCHEDULER_US or us < 0:
            raise ValueError(f"{part.strip()!r} is not NAME=US with NAME one of {', '.join(SCHEDULER_FUNCTIONS)}")
        out[name] = us
    return out


def request_drafts(rng: random.Random, steps: int, profile: tuple[float, ...]) -> int:
    """One request's accepted draft tokens: position j (1..steps) accepted with profile[j-1] (its last value past
    the end) given j-1 was; stops at the first rejection."""
    d = 0
    while d < steps and rng.random() < profile[min(d, len(profile) - 1)]:
        d += 1
    return d


def plan_drafts(batch_steps: list[tuple[int, int]], seed: int, rate: float | None,
                profile: tuple[float, ...] | None) -> list[list[int]]:
    """Per cycle (``batch_steps``: its batch size and steps), each request's accepted draft tokens.

    With ``profile``: per request (:func:`request_drafts`). Else one count for the whole cycle, as the workload
    always drew it: uniform in 0..steps, or with ``rate`` geometric (each draft accepted with that probability until
    the first rejection); one stream ``random.Random(seed)``, one draw per cycle (per request with a profile).
    """
    rng = random.Random(seed)
    out = []
    for bs, steps in batch_steps:
        if profile is not None:
            out.append([request_drafts(rng, steps, profile) for _ in range(bs)])
            continue
        if rate is None:
            d = rng.randint(1, steps + 1) - 1
        else:
            d = 0
            while d < steps and rng.random() < rate:
                d += 1
        out.append([d] * bs)
    return out


def spectrace_busy_python(seconds: float) -> int:
    """Pure-Python CPU work (integer arithmetic, no call into C that releases the GIL) until ``seconds`` have passed:
    in a CPU-sampled capture, the top Python frame of its samples is this function's name."""
    end = time.perf_counter() + seconds
    x = 1
    while time.perf_counter() < end:
        for _ in range(64):
            x = (x * 1_103_515_245 + 12_345) & 0x7FFFFFFF
    return x


def range_name(function: str) -> str:
    """The range text of an emulated scheduler function: ``scheduler.<function>``, as SGLang's own and the hooks'."""
    return SCHEDULER_PREFIX + function


class DefaultDomainRanges:
    """Ranges in the default NVTX domain, as SGLang's ``SGLANG_ENABLE_NVTX_SCHEDULER=1`` emits them (python ``nvtx``
    ``push_range``/``pop_range`` with no domain); no-ops without python nvtx."""

    def __init__(self) -> None:
        try:
            import nvtx

            self._push: Any = nvtx.push_range
            self._pop: Any = nvtx.pop_range
        except ImportError:
            self._push = self._pop = None

    def push(self, name: str, payload: int | None = None) -> None:
        if self._push is not None:
            self._push(name)

    def pop(self) -> None:
        if self._pop is not None:
            self._pop()

    def mark(self, name: str, payload: int | None = None) -> None:
        return None
