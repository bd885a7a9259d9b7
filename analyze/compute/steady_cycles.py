"""Which decode cycles are the steady state, and which slower cycles recur: warm-up and rare stalls detected,
recurring slow cycles described and kept, segments of one batch size, or the user's choice.

Input: the cycles of a trace (:func:`analyze.compute.cycles.cycles`: ``rank, n, kind, i_first, i_last,
period_ns, prefill_ns, payload_batch, pair_key, cycle_index …``); output: the same rows with ``key`` (the
cycle's identity across ranks), ``steady`` (bool), ``why`` (null, ``warm-up``, ``stall``, ``pause``,
``skipped``, ``outside window``), ``cycle_class`` (the class of slower cycles it belongs to, null when
typical), ``slow`` (elevated: noticeably above its segment's median, see below) and ``segment``, and a
dict saying what was decided.

Detection (the default) works on one number per cycle: its period without the prefill that ran before it,
averaged over ranks (a cycle's period ends at its last GPU op, so one late rank and the ranks that wait for
it in a collective all see the same long cycle; one late event counts once):

- *segments*: runs of cycles of one decode batch size and draft step count (the payload's; without a batch size,
  of the same CUDA graphs replayed: each batch size has its own graphs; the steps: :mod:`analyze.compute.cycles`,
  payload or inferred), each with its own *band*
  ``typical × (1 + tol)``, ``tol = max(10 %, 5 × sd / typical)``, where *typical* and *sd* come from the
  densest 40 % of its cycle times (:func:`_typical`: the median and standard deviation for normal noise, but
  still the fast cycles' level when a third or half of them belong to slower classes); a cycle above the
  band is *slow*, one over :data:`_PAUSE` × typical a *pause* (idle: no requests);
- *classes* of slower cycles that recur, kept in the steady state and described: slow cycles right after a
  prefill, slow cycles among the first :data:`_SEG_SETTLE` of a new batch size, **every N-th cycle** by index
  with an offset (most of its slots *elevated*, i.e. above ``typical × (1 + max(5 %, 3 × sd / typical))``,
  a lower bar than the band's);
  :data:`_COVER`; far more than chance: binomial tail × hypotheses < :data:`_CHANCE`; up to
  :data:`_MAX_CLASSES`), and *a second mode*: slow cycles without a period that are more than
  :data:`_MODE_SHARE` of the cycles (and at least :data:`_MIN_HITS`);
- *warm-up*: the cycles before the first :data:`_SETTLE` cycles in a row that are in band or in a class
  (looked for in the first half; if the period never settles, nothing is called warm-up);
- *stalls*: the rest of the slow cycles after warm-up, rare by construction (≤ :data:`_MODE_SHARE`), left
  out like the warm-up and the pauses; leaving out more than :data:`LEFT_OUT_WARN` is said first.

Cycles are identified across ranks by the pairing of :mod:`analyze.compute.windows` (the payload's cycle
index, or the offset under which collectives end together), else the payload index, else their order.
``segment=ID`` (internal: :func:`analyze.compute.whatif_segments.fit_segments`) keeps the detected steady cycles of one
segment only. ``skip_cycles=N`` leaves out exactly the first N cycles of each rank (0: none); ``window`` keeps only cycles
``START <= n < END`` (``"5:50"``, open ends allowed) or cycles whose first GPU op lies in a time range on the
session clock (``"1.5s:3s"``, units ns/us/µs/ms/s). With either, stalls and classes are still found and
named, but kept.
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar

import numpy as np
import polars as pl

from nvtx_hooks.capture.bounds import CYCLES_MAX, whole

from ..model import CycleChoice, InputError, Window
from ..read import results
from .scalars import real, real_or_none, to_float, to_int

__all__ = ["LEFT_OUT_WARN", "Stall", "Pause", "SlowClass", "CycleSegment", "Selection", "Flagged", "parse_window",
           "check_choice", "flag_cycles", "class_label"]

_SETTLE = 3  # consecutive explained cycles that end the warm-up
_MIN_TOL = 0.10  # the band is at least this far above the median period
_MAD_K = 5.0  # ... or this many robust standard deviations
_PAUSE = 10.0  # a period this many times the median is a pause, not a stall
_SEG_SETTLE = 5  # slow cycles among the first this many of a new batch size: after a batch-size change (kept)
_MODE_SHARE = 0.05  # slow cycles that recur without a period, above this share of the cycles: a mode, kept
LEFT_OUT_WARN = 0.10  # leaving out more than this share of the post-warm-up cycles is said first
_ELEV_TOL = 0.05  # a cycle this far above its segment's typical level (or _ELEV_K sds) is *elevated*: a candidate
_ELEV_K = 3.0  # for a periodic class
_COVER = 0.6  # a periodic class: at least this share of its slots are elevated
_MIN_HITS = 3  # ... and at least this many of them
_MIN_SLOTS = 4
_MAX_EVERY = 32  # periods looked for: every 2nd … every 32nd cycle
_MAX_CLASSES = 3  # periodic classes looked for, one after the other
_CHANCE = 0.01  # a periodic class must be this unlikely by chance (binomial tail × hypotheses tried)
_SHIFT_MIN = 20  # a level shift: at least this many cycles on each side of it (in its segment)
_SHIFT_Z = 5.0  # ... the rank statistic's standardised maximum at least this (no shift: about 1-3)
_SHIFT_FLAT = 0.25  # ... right at the split the level moves by the step within this share (a ramp is no step)
_SHIFT_K = 4.0  # ... the step at least this many robust standard deviations of the cycles about their level
_MAX_SHIFTS = 3  # level shifts looked for per segment (binary segmentation)
_UNITS = {"ns": 1, "us": 1_000, "µs": 1_000, "ms": 1_000_000, "s": 1_000_000_000}
_ORDINAL = {1: "st", 2: "nd", 3: "rd"}


class _Record:
    """A dataclass that reads like the JSON's dict too (``sel["text"]``, ``sel.get("classes")``: what the API gave
    before it was typed); :meth:`as_dict` is the JSON's."""

    _OMITTED: ClassVar[tuple[str, ...]] = ()

    def _omitted(self) -> tuple[str, ...]:
        return self._OMITTED

    def as_dict(self) -> dict[str, Any]:
        return {f.name: _plain(getattr(self, f.name)) for f in fields(self)  # type: ignore[arg-type]
                if f.name not in self._omitted()}

    def __getitem__(self, name: str) -> Any:
        if name in self._omitted() or name not in {f.name for f in fields(self)}:  # type: ignore[arg-type]
            raise KeyError(name)
        return getattr(self, name)

    def get(self, name: str, default: Any = None) -> Any:
        try:
            return self[name]
        except KeyError:
            return default


def _plain(v: Any) -> Any:
    if isinstance(v, _Record):
        return v.as_dict()
    if isinstance(v, list):
        return [_plain(x) for x in v]
    return v


@results.cacheable
@dataclass(frozen=True)
class Stall(_Record):
    """A rare cycle much slower than its segment's typical one, left out (``key``: its identity across ranks,
    ``n``: its order on its rank; ``excess_ns`` over the typical period)."""

    key: int
    n: int
    period_ns: int
    excess_ns: float
    limit_ns: float | None = None  # the band of its segment (batch size) it is above


@results.cacheable
@dataclass(frozen=True)
class Pause(_Record):
    """A cycle over :data:`_PAUSE` × the typical period: the server idle (no requests), left out."""

    key: int
    n: int
    period_ns: int


@results.cacheable
@dataclass(frozen=True)
class SlowClass(_Record):
    """A class of slower cycles that recurs (kept): ``kind`` ``prefill`` (after a prefill), ``batch change`` (the
    first cycles of a new batch size), ``every`` (every ``every``-th cycle, ``offset``), ``mode`` (a second
    mode) or ``shift`` (a level shift: every cycle from ``onset_key`` on, in its segment, is slower by ``extra_ns``
    than the level before; ``typical_ns`` that level); its ``slots``, how many of them are slower (``affected``), which (``keys``: the first 20, ``more_keys``
    beyond them; ``n``: their order on the first rank), and the extra time per affected cycle over the typical
    cycle of its segment (``extra_ns``; their mean period ``period_ns``, the typical one ``typical_ns``)."""

    id: int | None
    kind: str
    every: int | None
    offset: int | None
    slots: int = 0
    affected: int = 0
    keys: list[int] = field(default_factory=list)
    more_keys: int = 0
    first_key: int | None = None
    n: list[int] = field(default_factory=list)
    extra_ns: float = 0.0
    period_ns: float = 0.0
    typical_ns: float = 0.0
    onset_key: int | None = None  # a level shift: the first cycle of the higher level
    until_key: int | None = None  # ... its last when a later level follows in the segment (None: it stays)


@results.cacheable
@dataclass(frozen=True)
class CycleSegment(_Record):
    """A run of cycles of one decode batch size and draft step count (``key``: ``batch N, S steps``, ``batch N``
    when the steps are unknown, or ``graphs A+B`` without a payload, with ``, S steps`` when known)."""

    segment: int
    key: str | None
    batch_size: int | None
    first_key: int
    last_key: int
    first_n: int
    cycles: int
    steps: int | None = None  # the draft steps its cycles ran with (0: verify only); None unknown


@results.cacheable
@dataclass(frozen=True)
class Selection(_Record):
    """Which cycles are the steady state and why (:func:`flag_cycles`; the JSON's ``steady``): ``how``
    (``detected``, ``skip``, ``window``, or ``none`` without cycle ranges), what a cycle is (``kind``), how cycles
    are identified across ranks (``identity``), cycles and steady ones per rank, those left out, the warm-up, the
    band (``median_ns``, ``limit_ns``, ``tolerance``), the stalls, pauses, classes of slower cycles and segments,
    the user's ``choice`` and ``text``, the sentence that says it all. Without cycle ranges the band and the choice
    are not part of it (:meth:`as_dict` leaves them out)."""

    how: str
    cycles: int
    steady: int
    left_out: int
    warmup: int
    text: str
    kind: str | None = None
    identity: str | None = None
    post_warmup: int = 0
    left_out_share: float = 0.0
    settled: bool = False
    median_ns: float | None = None
    limit_ns: float | None = None
    tolerance: float | None = None
    stalls: list[Stall] = field(default_factory=list)
    pauses: list[Pause] = field(default_factory=list)
    classes: list[SlowClass] = field(default_factory=list)
    segments: list[CycleSegment] = field(default_factory=list)
    choice: dict[str, Any] = field(default_factory=dict)

    _ORDER: ClassVar = ("how", "kind", "identity", "cycles", "steady", "left_out", "warmup", "post_warmup",
                        "left_out_share", "settled", "median_ns", "limit_ns", "tolerance", "stalls", "pauses",
                        "classes", "segments", "choice", "text")
    _WITHOUT_CYCLES: ClassVar = ("kind", "identity", "post_warmup", "left_out_share", "settled", "median_ns",
                                 "limit_ns", "tolerance", "choice")

    def _omitted(self) -> tuple[str, ...]:
        return self._WITHOUT_CYCLES if self.how == "none" else ()

    def as_dict(self) -> dict[str, Any]:
        """As the JSON's ``steady`` has it (its order: the text last)."""
        return {k: _plain(getattr(self, k)) for k in self._ORDER if k not in self._omitted()}


@results.cacheable
@dataclass(frozen=True)
class Flagged:
    """The cycles of a trace flagged under a cycle choice (:func:`flag_cycles`) and what was decided."""

    cycles: pl.DataFrame
    selection: Selection


def _nth(n: int) -> str:
    """2 → "2nd", 4 → "4th", 11 → "11th"."""
    return f"{n}{'th' if 10 <= n % 100 <= 20 else _ORDINAL.get(n % 10, 'th')}"


def parse_window(text: str | tuple | None) -> Window | None:
    """``"START:END"`` → a :class:`~analyze.model.Window` (cycles ``START:END``, or times such as ``1.5s:3s``)."""
    if text is None:
        return None
    if isinstance(text, tuple | list):
        if len(text) != 2 or not all(v is None or (whole(v) and 0 <= v <= CYCLES_MAX) for v in text):
            raise InputError(f"window {tuple(text)!r}: expected (START, END), cycle numbers from 0 to "
                             f"{CYCLES_MAX:,} or None, or the text 'START:END'", "BAD_OPTION")
        a, b = text
        if a is not None and b is not None and b <= a:
            raise InputError(f"window {tuple(text)!r}: END must be after START", "BAD_OPTION")
        return Window("cycle", a, b, f"{'' if a is None else a}:{'' if b is None else b}")
    if not isinstance(text, str):
        raise InputError(f"window must be 'START:END' or (START, END), not {type(text).__name__}", "BAD_OPTION")
    parts = str(text).split(":")
    if len(parts) != 2:
        raise InputError(f"--window {text!r}: expected START:END (cycles, e.g. 5:50, or times, e.g. 1.5s:3s)",
                         "BAD_OPTION")
    vals: list[int | None] = []
    units = set()
    for p in parts:
        p = p.strip()
        if not p:
            vals.append(None)
            continue
        m = re.fullmatch(r"(\d+(?:\.\d*)?)\s*(ns|us|µs|ms|s)?", p)
        if not m or (m.group(2) is None and "." in m.group(1)):
            raise InputError(f"--window {text!r}: {p!r} is neither a cycle number nor a time such as 250ms",
                             "BAD_OPTION")
        units.add("cycle" if m.group(2) is None else "ns")
        vals.append(int(m.group(1)) if m.group(2) is None else int(float(m.group(1)) * _UNITS[m.group(2)]))
    if len(units) > 1:
        raise InputError(f"--window {text!r}: give both ends as cycles or both as times", "BAD_OPTION")
    if vals[0] is not None and vals[1] is not None and vals[1] <= vals[0]:
        raise InputError(f"--window {text!r}: END must be after START", "BAD_OPTION")
    return Window(units.pop() if units else "cycle", vals[0], vals[1], str(text))


def check_choice(skip_cycles: int | None, window) -> CycleChoice:
    """The ``cycle_choice`` of a Result from the user's options (InputError when they make no sense)."""
    if skip_cycles is not None and window is not None:
        raise InputError("give --skip-cycles or --window, not both", "BAD_OPTION")
    if skip_cycles is not None and not (whole(skip_cycles) and 0 <= skip_cycles <= CYCLES_MAX):
        raise InputError(f"--skip-cycles (skip_cycles) must be an integer from 0 to {CYCLES_MAX:,}, not "
                         f"{skip_cycles!r}", "BAD_OPTION")
    return CycleChoice(skip_cycles=None if skip_cycles is None else int(skip_cycles), window=parse_window(window))


def _identity(m: pl.DataFrame) -> tuple[pl.Expr, str]:
    """The cross-rank identity of a cycle: the pairing key of :mod:`analyze.compute.windows` (the payload's
    cycle index, or the offset under which collectives end together), else the payload index, else the order."""
    if m["pair_key"].null_count() == 0:
        return pl.col("pair_key"), "cycle index" if m["cycle_index"].null_count() == 0 else "paired by collectives"
    if m["cycle_index"].null_count() == 0:
        return pl.col("cycle_index"), "cycle index"
    return pl.col("n"), "order on each rank"


def _series(m: pl.DataFrame) -> pl.DataFrame:
    """One row per cycle (``key``, in order): ``t`` the mean over ranks of its period without prefill, its
    segment value (``batch N`` from the payload, else ``graphs A+B``: the CUDA graphs it replayed; ``seg_batch``
    the batch size), whether a prefill ran before it, its first ``n`` and GPU start."""
    by_batch = m["payload_batch"].null_count() < m.height
    seg = (pl.format("batch {}", pl.col("payload_batch").drop_nulls().min()) if by_batch
           else pl.format("graphs {}", pl.col("graphs").drop_nulls().min()))
    steps = pl.col("steps").drop_nulls().min() if "steps" in m.columns else pl.lit(None, pl.Int64)
    seg = (pl.when(steps.is_null()).then(seg).when(steps == 1).then(pl.format("{}, 1 step", seg))
           .otherwise(pl.format("{}, {} steps", seg, steps)))
    return (m.group_by("key")
            .agg(t=(pl.col("period_ns") - pl.col("prefill_ns")).mean(), seg_value=seg,
                 seg_batch=pl.col("payload_batch").drop_nulls().min(), seg_steps=steps,
                 prefill=(pl.col("prefills") > 0).any(), n=pl.col("n").min(), i_first=pl.col("i_first").min(),
                 period=pl.col("period_ns").max())
            .sort("key")
            .with_columns(pos=pl.int_range(pl.len()),
                          segment=(pl.col("seg_value").ne_missing(pl.col("seg_value").shift(1))
                                   | (pl.int_range(pl.len()) == 0)).cast(pl.Int64).cum_sum() - 1)
            .with_columns(seg_pos=pl.int_range(pl.len()).over("segment")))


_DENSE = 0.4  # the typical level is the median of the densest _DENSE of the cycle times
_DENSE_Z = 1.0488  # the range of the central 40 % of a normal distribution, in standard deviations


def _typical(t: pl.Series) -> tuple[float, float]:
    """The typical level and spread of cycle times ``t``: the median and the range of their densest
    :data:`_DENSE` (the shortest window holding that share of the values; :data:`_DENSE_Z` standard deviations for
    normal noise). Unlike the median and MAD of all values, it stays on the fast cycles even when half of them
    belong to slower classes."""
    v = t.drop_nulls().sort()
    n = v.len()
    if n == 0:
        return float("nan"), 0.0
    h = max(1, math.ceil(_DENSE * n))
    lo = v.head(n - h + 1)
    width = v.tail(n - h + 1) - lo.to_numpy() if n > 1 else pl.Series([0.0])
    i = int(width.arg_min() or 0)
    window = v.slice(i, h)
    return to_float(window.median()), float(width[i]) / _DENSE_Z


def _bands(s: pl.DataFrame) -> pl.DataFrame:
    """``s`` with each segment value's band (``median_ns``: its typical level, ``tol``, ``limit_ns``), ``slow``,
    ``elevated`` and ``pause``."""
    t = pl.col("t")
    rows = []
    # one band per batch size and level (a level shift starts a new one): a handful
    for (value, level), grp in s.filter(t.is_not_null()).group_by("seg_value", "level"):
        m, sd = _typical(grp["t"])
        rows.append({"seg_value": value, "level": level, "median_ns": m, "sd_ns": sd})
    band = (pl.DataFrame(rows, schema={"seg_value": s.schema["seg_value"], "level": pl.Int64, "median_ns": pl.Float64,
                                       "sd_ns": pl.Float64})
            .with_columns(tol=pl.max_horizontal(pl.lit(_MIN_TOL), _MAD_K * pl.col("sd_ns") / pl.col("median_ns")),
                          etol=pl.max_horizontal(pl.lit(_ELEV_TOL), _ELEV_K * pl.col("sd_ns") / pl.col("median_ns")))
            .with_columns(limit_ns=pl.col("median_ns") * (1 + pl.col("tol"))))
    return (s.join(band, on=["seg_value", "level"], how="left", nulls_equal=True, maintain_order="left")
            .with_columns(slow=(t > pl.col("limit_ns")).fill_null(False),
                          elevated=(t > pl.col("median_ns") * (1 + pl.col("etol"))).fill_null(False),
                          pause=(t > _PAUSE * pl.col("median_ns")).fill_null(False)))


def _best_split(x: np.ndarray) -> int | None:
    """Where the level of ``x`` (cycle times in order) steps, or None: the split that maximises the standardised
    rank sum of the cycles before it (a Wilcoxon/Mann-Whitney CUSUM: ranks, so a stall or a periodic class counts
    as one rank and weighs the same on both sides), kept when it is far beyond chance (:data:`_SHIFT_Z`), the step
    between the two sides' medians is at least :data:`_ELEV_TOL` of the level and :data:`_SHIFT_K` robust standard
    deviations, and the level moves by most of the step right at the split (the medians of the :data:`_SHIFT_MIN`
    cycles on each side within :data:`_SHIFT_FLAT` of it: a ramp, as a growing context makes, is no step)."""
    n = len(x)
    if n < 2 * _SHIFT_MIN:
        return None
    r = np.argsort(np.argsort(x, kind="stable"), kind="stable") + 1.0
    k = np.arange(1, n)
    c = np.cumsum(r - (n + 1) / 2)[:-1]
    z = np.abs(c) / np.sqrt(k * (n - k) * (n + 1) / 12)
    z[: _SHIFT_MIN - 1] = 0
    z[n - _SHIFT_MIN:] = 0
    at = int(np.argmax(z)) + 1
    if z[at - 1] < _SHIFT_Z:
        return None
    left, right = x[:at], x[at:]
    ml, mr = float(np.median(left)), float(np.median(right))
    step = mr - ml
    sd = 1.4826 * float(np.median(np.abs(np.concatenate([left - ml, right - mr]))))
    if abs(step) < max(_ELEV_TOL * min(ml, mr), _SHIFT_K * sd):
        return None
    # a step, not a ramp: right at the split (the _SHIFT_MIN cycles on each side) the level moves by most of it
    local = float(np.median(x[at:at + _SHIFT_MIN]) - np.median(x[at - _SHIFT_MIN:at]))
    if local * step <= 0 or abs(local) < (1 - _SHIFT_FLAT) * abs(step):
        return None
    return at


def _shifts(x: np.ndarray) -> list[int]:
    """The positions where the level of ``x`` steps (:func:`_best_split`, binary segmentation: each side searched
    again), at most :data:`_MAX_SHIFTS`, in order."""
    found: list[int] = []
    todo = [(0, len(x))]
    while todo and len(found) < _MAX_SHIFTS:
        a, b = todo.pop(0)
        at = _best_split(x[a:b])
        if at is None:
            continue
        found.append(a + at)
        todo += [(a, a + at), (a + at, b)]
    return sorted(found)


def _with_levels(s: pl.DataFrame) -> pl.DataFrame:
    """``s`` (one row per cycle, in order) with ``level``: 0, then one more at each level shift of its segment
    (:func:`_shifts` over the segment's cycle times, pauses and the first cycle without a time left out)."""
    level = np.zeros(s.height, np.int64)
    t = s["t"].to_numpy()
    seg = s["segment"].to_numpy()
    for g in np.unique(seg):  # one per segment: a handful
        idx = np.flatnonzero(seg == g)
        vals = t[idx]
        ok = ~np.isnan(vals)
        if ok.sum() < 2 * _SHIFT_MIN:
            continue
        med = float(np.median(vals[ok]))
        ok &= vals < _PAUSE * med
        pos = idx[ok]
        for at in _shifts(vals[ok]):
            level[idx[idx >= pos[at]]] += 1
    return s.with_columns(level=pl.Series(level))


def _settle(ok: pl.Series, half: int) -> int | None:
    """The first position (at most ``half``) that starts :data:`_SETTLE` consecutive ``ok`` cycles, or None."""
    run = ok.cast(pl.Int32).rolling_sum(_SETTLE).shift(-(_SETTLE - 1))
    hit = pl.DataFrame({"run": run, "pos": pl.int_range(len(ok), eager=True)}).filter(
        (pl.col("run") == _SETTLE) & (pl.col("pos") <= half))
    return int(hit["pos"][0]) if hit.height else None


def _tail(hits: int, slots: int, p: float) -> float:
    """P(X >= hits) for X ~ Binomial(slots, p)."""
    if p >= 1:
        return 1.0
    return sum(math.comb(slots, i) * p ** i * (1 - p) ** (slots - i) for i in range(hits, slots + 1))


def _periodic(post: pl.DataFrame) -> list[dict]:
    """Periodic classes among ``post`` (rows with ``key``, ``cand``): every N-th cycle by key with an offset,
    most of whose slots are slow, far more than chance; found one after the other (the best first)."""
    found: list[dict] = []
    rows = post.filter(pl.col("t").is_not_null()).select("key", "cand")
    n = rows.height
    top = min(_MAX_EVERY, n // _MIN_SLOTS)
    if top < 2:
        return found
    tried = sum(range(2, top + 1))
    taken = pl.lit(False)
    for _ in range(_MAX_CLASSES):
        cand = rows.with_columns(cand=pl.col("cand") & ~taken)
        k = int(cand["cand"].sum())
        if k < _MIN_HITS:
            break
        p = k / n
        ev = (cand.join(pl.DataFrame({"every": range(2, top + 1)}), how="cross")
              .group_by("every", offset=pl.col("key") % pl.col("every"))
              .agg(slots=pl.len(), hits=pl.col("cand").sum())
              .filter((pl.col("slots") >= _MIN_SLOTS) & (pl.col("hits") >= _MIN_HITS)
                      & (pl.col("hits") >= _COVER * pl.col("slots")))
              .with_columns(score=pl.col("hits") * pl.col("hits") / pl.col("slots"))
              .sort("score", "every", "offset", descending=[True, False, False]))
        best = None
        for row in ev.head(20).iter_rows(named=True):  # a handful of candidates, not events
            if _tail(row["hits"], row["slots"], p) * tried < _CHANCE:
                best = row
                break
        if best is None:
            break
        member = (pl.col("key") % best["every"]) == best["offset"]
        found.append({"every": int(best["every"]), "offset": int(best["offset"]), "member": member})
        taken = taken | member
    return found


def _classes(s: pl.DataFrame, w: int) -> tuple[pl.DataFrame, list[dict]]:
    """Classes of slower cycles after position ``w`` (``s`` from :func:`_bands`): column ``cycle_class`` (an id)
    and ``out`` (left out: an outlier or a pause); the classes' descriptions (without their numbers)."""
    post = pl.col("pos") >= w
    slow = post & pl.col("slow") & ~pl.col("pause")
    s = s.with_columns(cycle_class=pl.lit(None, pl.Int64), out=pl.lit(None, pl.String))
    classes: list[dict] = []

    def add(mask: pl.Expr, desc: dict) -> None:
        nonlocal s
        cid = len(classes)
        s = s.with_columns(cycle_class=pl.when(pl.col("cycle_class").is_null() & mask).then(pl.lit(cid))
                           .otherwise("cycle_class"))
        classes.append({"id": cid, **desc})

    free = pl.col("cycle_class").is_null()
    add(slow & pl.col("prefill"), {"kind": "prefill", "every": None, "offset": None})
    add(slow & (pl.col("seg_pos") < _SEG_SETTLE) & (pl.col("segment") > 0),
        {"kind": "batch change", "every": None, "offset": None})
    s = s.with_columns(cand=post & pl.col("elevated") & ~pl.col("pause") & free)
    for per in _periodic(s.filter(post)):
        add(post & per.pop("member"), {"kind": "every", **per})
    rest = s.filter(slow & free)
    npost = s.filter(post).height
    if rest.height >= _MIN_HITS and rest.height > _MODE_SHARE * npost:
        # every cycle nearer the mode's level than the typical one belongs to it (not only those above the band:
        # a second mode's cycles spread about its own level, a third of them below the band when its extra is small)
        mode_ns = to_float(rest["t"].median())
        near = (pl.col("t") > (pl.col("median_ns") + mode_ns) / 2) & pl.col("elevated")
        add(post & ~pl.col("pause") & free & (slow | near), {"kind": "mode", "every": None, "offset": None})
    # level shifts (up): the cycles of a later, higher level of a segment that no other class holds
    levels = (s.filter(pl.col("t").is_not_null()).group_by("segment", "level")
              .agg(pl.col("median_ns").first(), onset=pl.col("key").min(), onset_pos=pl.col("pos").min())
              .sort("segment", "level"))
    for r in levels.iter_rows(named=True):  # a handful
        prev = levels.filter((pl.col("segment") == r["segment"]) & (pl.col("level") == r["level"] - 1))
        if r["level"] == 0 or prev.height == 0 or r["median_ns"] <= prev["median_ns"][0]:
            continue
        member = (pl.col("segment") == r["segment"]) & (pl.col("level") == r["level"])
        nxt = levels.filter((pl.col("segment") == r["segment"]) & (pl.col("level") == r["level"] + 1))
        until = s.filter(member)["key"].max() if nxt.height else None
        add(post & member & ~pl.col("pause"), {"kind": "shift", "every": None, "offset": None,
                                               "onset": int(r["onset"]), "until": until,
                                               "level_ns": float(r["median_ns"]),
                                               "before_ns": float(prev["median_ns"][0]), "member": member})
    for c in classes:
        c.pop("member", None)
    s = s.with_columns(out=pl.when(post & pl.col("pause")).then(pl.lit("pause"))
                       .when(slow & pl.col("cycle_class").is_null()).then(pl.lit("stall")))
    used = set(s["cycle_class"].drop_nulls().unique().to_list())
    keep = [c for c in classes if c["id"] in used]
    remap = {c["id"]: i for i, c in enumerate(keep)}
    s = s.with_columns(pl.col("cycle_class").replace_strict(remap, default=None, return_dtype=pl.Int64))
    for c in keep:
        c["id"] = remap[c["id"]]
    return s.drop("cand"), keep


def _describe_classes(s: pl.DataFrame, classes: list[dict], w: int) -> list[SlowClass]:
    """Each class with its cycles: how many slots, how many slow (``affected``), which keys, the extra time per
    affected cycle over the typical cycle of its segment (median of the post-warm-up cycles in no class)."""
    typical = (s.filter((pl.col("pos") >= w) & ~pl.col("elevated") & pl.col("cycle_class").is_null()
                        & pl.col("t").is_not_null())
               .group_by("seg_value", "level").agg(typical_ns=pl.col("t").median()))
    s = s.join(typical, on=["seg_value", "level"], how="left", nulls_equal=True, maintain_order="left").with_columns(
        typical_ns=pl.coalesce("typical_ns", "median_ns"))
    out = []
    for c in classes:
        m = s.filter(pl.col("cycle_class") == c["id"])
        if c["kind"] == "shift":  # every cycle of the level; its extra: the level's typical over the one before
            hit = m.filter(pl.col("t").is_not_null())
            keys = hit["key"].to_list()
            out.append(SlowClass(id=c["id"], kind="shift", every=None, offset=None, slots=m.height,
                                 affected=hit.height, keys=keys[:20], more_keys=max(0, len(keys) - 20),
                                 first_key=keys[0] if keys else None, n=hit["n"].to_list()[:20],
                                 extra_ns=c["level_ns"] - c["before_ns"], period_ns=to_float(hit["t"].mean() or 0.0),
                                 typical_ns=c["before_ns"], onset_key=c["onset"], until_key=c["until"]))
            continue
        hit = m.filter(pl.col("elevated"))
        keys = hit["key"].to_list()
        extra = hit.select((pl.col("t") - pl.col("typical_ns")).mean()).item() if hit.height else 0.0
        out.append(SlowClass(id=c["id"], kind=c["kind"], every=c["every"], offset=c["offset"], slots=m.height,
                             affected=hit.height, keys=keys[:20], more_keys=max(0, len(keys) - 20),
                             first_key=keys[0] if keys else None, n=hit["n"].to_list()[:20],
                             extra_ns=float(extra or 0.0), period_ns=to_float(hit["t"].mean() or 0.0),
                             typical_ns=to_float(hit["typical_ns"].mean() or 0.0)))
    return out


def flag_cycles(cyc: pl.DataFrame, choice: CycleChoice | None = None) -> Flagged:
    """``cyc`` with ``steady``/``why``, ``key`` (the cross-rank cycle identity), ``cycle_class`` (the class of
    slower cycles it belongs to, null for a typical one) and ``segment``, and what was decided (module docstring)."""
    choice = choice or CycleChoice()
    if cyc.height == 0:
        return Flagged(cyc.with_columns(steady=pl.lit(True), why=pl.lit(None, pl.String), key=pl.col("n"),
                                        cycle_class=pl.lit(None, pl.Int64), segment=pl.lit(0, pl.Int64), level=pl.lit(0, pl.Int64)),
                       Selection(how="none", cycles=0, steady=0, left_out=0, warmup=0,
                                 text="no cycle ranges: the whole run"))
    main = cyc["kind"].mode().sort()[0]
    is_main = pl.col("kind") == main
    key, identity = _identity(cyc.filter(is_main))
    cyc = cyc.with_columns(key=key)
    s = _bands(_with_levels(_series(cyc.filter(is_main))))
    n = s.height
    half = n // 2
    # Warm-up: a provisional one (the leading slow cycles), the classes after it, then the first _SETTLE cycles
    # in a row that are in band or explained by a class (a periodic slot, a prefill, a batch change).
    w0 = _settle(~s["slow"], half)
    w0 = w0 if w0 is not None else int(s.with_columns(c=(~pl.col("slow")).cum_sum()).filter(pl.col("c") == 0).height)
    s1, _ = _classes(s, w0)
    explained = ~s1["slow"] | s1["cycle_class"].is_not_null()
    settled_at = _settle(explained, half)
    settled = settled_at is not None
    w = settled_at if settled_at is not None else 0
    s, classes = _classes(s, w)
    how = "detected"
    post = pl.col("pos") >= w
    why: pl.Expr
    if choice.skip_cycles is not None:
        how = "skip"
        why = pl.when(pl.col("n") < choice.skip_cycles).then(pl.lit("skipped"))
    elif choice.window is not None:
        how = "window"
        wd = choice.window
        col = pl.col("n") if wd.unit == "cycle" else pl.col("i_first")
        inside = pl.lit(True)
        if wd.start is not None:
            inside = inside & (col >= wd.start)
        if wd.end is not None:
            inside = inside & (col < wd.end)
        why = pl.when(~inside).then(pl.lit("outside window"))
    else:
        why = pl.when(~post).then(pl.lit("warm-up")).when(pl.col("out").is_not_null()).then(pl.col("out"))
    per_key = s.select("key", "cycle_class", "segment", "level", "out", slow="elevated",
                       _in_warmup=(~post).alias("_in_warmup"))
    c = (cyc.join(per_key, on="key", how="left", maintain_order="left")
         .with_columns(cycle_class=pl.when(is_main).then("cycle_class"), segment=pl.when(is_main).then("segment"),
                       level=pl.when(is_main).then("level")))
    if how == "detected":
        c = c.with_columns(why=pl.when(is_main).then(
            pl.when(pl.col("_in_warmup")).then(pl.lit("warm-up")).when(pl.col("out").is_not_null()).then(pl.col("out"))))
        if choice.segment is not None:  # one segment's steady cycles (a what-if per batch size): the others set aside
            # (a tuple: the segments of one batch size, a serving run visiting it several times)
            one = choice.segment
            other = ~pl.col("segment").is_in(list(one)) if isinstance(one, tuple) else pl.col("segment") != one
            c = c.with_columns(why=pl.when(is_main & pl.col("why").is_null() & other)
                               .then(pl.lit("other segment")).otherwise("why"))
    else:
        c = c.with_columns(why=pl.when(is_main).then(why))
    c = c.with_columns(pl.col("why").cast(pl.String)).with_columns(steady=pl.col("why").is_null())
    per_rank = c.filter(is_main).group_by("rank").agg(total=pl.len(), steady=pl.col("steady").sum())
    if how != "detected" and to_int(per_rank["steady"].max()) == 0:
        mm = c.filter(is_main)
        raise InputError(
            f"{'--skip-cycles ' + str(choice.skip_cycles) if how == 'skip' else '--window ' + _window_text(choice)}"
            f" leaves no cycle: there are {to_int(per_rank['total'].max())} per rank (n = 0…{to_int(mm['n'].max())}), "
            f"their first GPU ops from {real(mm['i_first'].min()) / 1e9:.3f} s to {real(mm['i_first'].max()) / 1e9:.3f} s "
            "on the "
            "capture's clock", "BAD_OPTION")
    if how != "detected":  # the user chose the cycles: what is described is what they hold
        chosen = c.filter(is_main & pl.col("steady"))["key"].unique().implode()
        s = s.with_columns(pl.when(pl.col("key").is_in(chosen)).then("cycle_class").alias("cycle_class"),
                           pl.when(pl.col("key").is_in(chosen)).then("out").alias("out"))
        classes = [cl for cl in classes if (s["cycle_class"] == cl["id"]).any()]
    described = _describe_classes(s, classes, w)
    stalls = s.filter(post & (pl.col("out") == "stall"))
    pauses = s.filter(post & (pl.col("out") == "pause"))
    npost = s.filter(post).height
    left_keys = s.filter(post & pl.col("out").is_not_null()).height if how == "detected" else 0
    seg = (s.group_by("segment").agg(seg_value=pl.col("seg_value").first(), seg_batch=pl.col("seg_batch").first(),
                                     seg_steps=pl.col("seg_steps").first(),
                                     first_key=pl.col("key").first(),
                                     last_key=pl.col("key").last(), first_n=pl.col("n").first(), cycles=pl.len())
           .sort("segment"))
    segmented = seg.height > 1 or seg["seg_value"][0] is not None
    info = Selection(
        how=how,
        kind=main,
        identity=identity,
        cycles=to_int(per_rank["total"].max()),
        steady=to_int(per_rank["steady"].max()),
        left_out=to_int((per_rank["total"] - per_rank["steady"]).max()),
        warmup=w if how == "detected" else 0,
        post_warmup=npost,
        left_out_share=left_keys / npost if npost else 0.0,
        settled=settled,
        median_ns=real_or_none(s["median_ns"].median()) if n else None,  # (one cycle: none has a period)
        limit_ns=real_or_none(s["limit_ns"].median()) if n else None,
        tolerance=real_or_none(s["tol"].max()) if n else None,
        stalls=[Stall(key=r["key"], n=r["n"], period_ns=r["period"], excess_ns=r["t"] - r["median_ns"],
                      limit_ns=r["limit_ns"])
                for r in stalls.iter_rows(named=True)],
        pauses=[Pause(key=r["key"], n=r["n"], period_ns=r["period"]) for r in pauses.iter_rows(named=True)],
        classes=described,
        segments=[CycleSegment(segment=r["segment"], key=r["seg_value"], batch_size=r["seg_batch"],
                               first_key=r["first_key"], last_key=r["last_key"], first_n=r["first_n"],
                               cycles=r["cycles"], steps=r["seg_steps"])
                  for r in seg.iter_rows(named=True)] if segmented else [],
        choice=choice.described(),
        text="",
    )
    info = dataclasses.replace(info, text=_describe(info))
    return Flagged(c.drop("out", "_in_warmup").with_columns(slow=pl.col("slow").fill_null(False)), info)


def _window_text(choice: CycleChoice) -> str:
    return choice.window.text if choice.window is not None else ""


def class_label(c: SlowClass) -> str:
    """``every 4th cycle (offset 1)``, ``after a prefill``, ``after a batch-size change``, ``a second mode``."""
    if c.kind == "every":
        return f"every {_nth(c.every or 0)} cycle" + (f" (offset {c.offset})" if c.offset else "")
    if c.kind == "shift":
        return (f"from cycle {c.onset_key} on (a level shift)" if c.until_key is None
                else f"cycles {c.onset_key}–{c.until_key} (a level shift, then back)")
    return {"prefill": "after a prefill", "batch change": "after a batch-size change",
            "mode": "a second mode (slower, not periodic)"}[c.kind]


def _keys_txt(keys: list, more: int) -> str:
    return ", ".join(str(k) for k in keys[:6]) + (" …" if len(keys) > 6 or more else "")


def _above(st: list[Stall], info: Selection) -> str:
    """The band the stalls are above: one limit when they share it, else each batch size's own (a stall is above its
    own segment's band, which may be below another segment's: never a stall listed under the limit it is over)."""
    limits = sorted({round(s.limit_ns) for s in st if s.limit_ns is not None})
    if len(limits) <= 1:
        lim = limits[0] if limits else (info.limit_ns or 0.0)
        return f"above {lim / 1e3:,.1f} µs"
    return f"each above its batch size's band, {limits[0] / 1e3:,.1f}–{limits[-1] / 1e3:,.1f} µs"


def _describe(info: Selection) -> str:
    """One sentence: which cycles the numbers use, what was left out and why, what recurs (kept), how to choose."""
    if info.how == "none":
        return info.text
    kind = "cycles" if info.kind == "cycle" else f"{info.kind} ranges"
    head = f"steady state: {info.steady} of {info.cycles} {kind} per rank"
    share = info.left_out_share
    if info.how == "detected" and share > LEFT_OUT_WARN:
        head += f" ({share:.0%} of the cycles after warm-up left out: read the numbers with care)"
    st = info.stalls
    st_txt = ", ".join(f"{s.key} ({s.period_ns / 1e3:,.0f} µs)" for s in st[:5]) + (" …" if len(st) > 5 else "")
    kept = [f"{class_label(c)}: {c.affected} cycles ({_keys_txt(c.keys, c.more_keys)}), "
            f"+{c.extra_ns / 1e3:,.1f} µs each" for c in info.classes if c.affected]
    shift = any(c.kind == "shift" for c in info.classes if c.affected)
    kept_txt = ((f"; kept, as they recur{' or last' if shift else ''}: " + "; ".join(kept)) if kept else "")
    if info.how != "detected":
        chosen = (f"--skip-cycles {info.choice['skip_cycles']}" if info.how == "skip"
                  else f"--window {info.choice['window']}")
        tail = f"; {len(st)} rare stall(s) kept (cycle {st_txt})" if st else ""
        return f"{head} ({chosen}){tail}{kept_txt}."
    left = []
    if info.warmup:
        left.append(f"{info.warmup} warm-up (before the period settles within {info.tolerance or 0.0:.0%} of its "
                    f"median {(info.median_ns or 0.0) / 1e3:,.1f} µs)")
    if st:
        left.append(f"{len(st)} rare stall{'s' if len(st) > 1 else ''} ({_above(st, info)}, not recurring: "
                    f"cycle {st_txt})")
    pa = info.pauses
    if pa:
        left.append(f"{len(pa)} pause{'s' if len(pa) > 1 else ''} (over {_PAUSE:.0f} × the median: cycle "
                    + ", ".join(f"{p.key} ({p.period_ns / 1e6:,.1f} ms)" for p in pa[:5]) + ")")
    text = head + ("; left out: " + ", ".join(left[:-1]) + (" and " if len(left) > 1 else "") + left[-1] if left
                   else "; nothing left out")
    if not info.settled:
        text += " (the period never settled: no warm-up detected)"
    return text + kept_txt + ". Choose with --skip-cycles N or --window START:END (--skip-cycles 0: the whole run)."
