"""Acceptance per draft position: each decode cycle's requests counted by the draft tokens they accepted.

The hooks (and the workload) emit, per decode cycle, ``accept_histogram`` marks (:mod:`nvtx_hooks.phases`, payload
layout 3): ``counts[j]`` = the batch's requests that accepted exactly ``j`` draft tokens (the bonus token not
counted), ``j = 0 … steps``. :func:`cycle_histograms` decodes them (polars expressions over every mark at once) into
one row per (process, cycle index, position); :func:`per_position` sums them per segment (the cycles of one batch
size and step count, :func:`analyze.compute.anatomy.segments`; one segment, the whole run, without segments) over
**every** cycle of the segment (acceptance is not a timing: warm-up, stalls and slower cycles accept like the
others), and over the run:

- ``histogram[j]``: requests that accepted exactly ``j`` drafts, ``requests`` their sum (request-cycles);
- ``accepted_at_position[j-1]``: requests that accepted at least ``j`` drafts (the acceptance at draft position
  ``j``), ``j = 1 … steps``;
- ``rate_at_position[j-1]``: of the requests that reached position ``j`` (accepted ``j-1`` drafts, in cycles that
  drafted at least ``j``), the share that accepted it: the conditional acceptance of position ``j``.

The what-if (:mod:`analyze.compute.whatif_fit`) uses the run's conditional rates (:class:`PositionRates`): expected
accepted drafts at ``k`` steps = ``Σ_{j≤k} Π_{i≤j} rate_i`` over the measured positions, and beyond the last
measured one the last measured rate repeated — a model, said where it is used.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import polars as pl

from nvtx_hooks import phases as ph

from ..model import Result
from ..read import results
from . import view
from .cycles import cycles
from .scalars import to_int

__all__ = ["HISTOGRAMS", "cycle_histograms", "PositionAcceptance", "PositionRates", "per_position", "rates",
           "SOURCE"]

SOURCE = "the hooks' accept_histogram marks"
HISTOGRAMS = pl.Schema({"rank": pl.Int64, "pid": pl.Int64, "cycle_index": pl.Int64, "position": pl.Int64,
                        "count": pl.Int64})
_U = pl.UInt64


@view.table(kept=False, any_choice=True)
def cycle_histograms(res: Result) -> pl.DataFrame:
    """The ``accept_histogram`` marks decoded and merged: one row per (rank, pid, cycle index, position) with a
    nonzero count (:data:`HISTOGRAMS`; the chunks of one cycle summed), sorted."""
    m = res.marks.filter((pl.col("domain") == ph.DOMAIN) & (pl.col("mark") == ph.ACCEPT_HISTOGRAM.name))
    if m.height == 0:
        return pl.DataFrame(schema=HISTOGRAMS)
    v = pl.coalesce(pl.col("uint64").cast(_U, strict=False), pl.col("int64").cast(_U, strict=False))
    shift = ph.VERSION_SHIFT
    m = (m.select("rank", "pid", _v=v).filter((pl.col("_v") // (1 << shift)) == ph.HISTOGRAM_LAYOUT)
         .with_columns(cycle_index=(pl.col("_v") % (1 << 24)).cast(pl.Int64),
                       _first=((pl.col("_v") // (1 << 24)) % (1 << 5)).cast(pl.Int64),
                       _code=((pl.col("_v") // (1 << 29)) % 4).cast(pl.Int64),
                       _slots=pl.col("_v") // (1 << 31)))
    widths = list(ph.HISTOGRAM_WIDTHS)
    width = pl.col("_code").replace_strict(list(range(len(widths))), widths, return_dtype=pl.Int64)
    parts = []
    for s in range(29 // min(widths)):  # a chunk holds 29 // width slots
        w = width.cast(_U)
        count = (pl.col("_slots") // (pl.lit(1, _U) * (pl.lit(2, _U).pow(w * s)))) % pl.lit(2, _U).pow(w)
        parts.append(m.filter(29 // width > s).select(
            "rank", "pid", "cycle_index", position=pl.col("_first") + s, count=count.cast(pl.Int64)))
    long = pl.concat(parts).filter(pl.col("count") > 0)
    return (long.group_by("rank", "pid", "cycle_index", "position").agg(pl.col("count").sum())
            .sort("rank", "pid", "cycle_index", "position").cast(HISTOGRAMS))


@results.cacheable
@dataclass
class PositionAcceptance:
    """One segment's (or the run's) requests by accepted drafts (module docstring); JSON
    ``acceptance_per_position``."""

    key: str  # the segment's key ("batch 8, 3 steps"), or "all" for the run
    segment: int | None
    batch_size: int | None
    steps: int | None
    cycles: int  # cycles with a histogram (first rank)
    requests: int
    histogram: list[int] = field(default_factory=list)
    accepted_at_position: list[int] = field(default_factory=list)
    rate_at_position: list[float | None] = field(default_factory=list)
    mean_accepted: float | None = None  # accepted drafts per request per cycle

    def as_dict(self) -> dict:
        return asdict(self)


@results.cacheable
@dataclass
class PositionRates:
    """The run's conditional acceptance per draft position (``rates[j-1]``: position ``j``), measured on
    ``requests[j-1]`` requests that reached it; what the what-if uses."""

    rates: list[float]
    requests: list[int]

    def accepted(self, steps: int) -> tuple[float, bool]:
        """Expected accepted drafts per request at ``steps`` draft steps, and whether positions beyond the measured
        ones were needed (then each further position is accepted at the last measured rate: a model)."""
        total, reach = 0.0, 1.0
        for j in range(steps):
            reach *= self.rates[min(j, len(self.rates) - 1)]
            total += reach
        return total, steps > len(self.rates)

    def text(self) -> str:
        return ", ".join(f"position {j + 1}: {r:.3f} ({n:,} requests)"
                         for j, (r, n) in enumerate(zip(self.rates, self.requests)))


def _summed(h: pl.DataFrame, steps: int | None) -> tuple[list[int], list[int], list[float | None], int]:
    """A histogram's counts summed: (histogram, accepted at ≥ j, conditional rate at j, requests) up to the steps
    (or the highest position seen)."""
    top = to_int(h["position"].max() or 0) if h.height else 0
    k = max(top, steps or 0)
    by = dict(zip(h["position"].to_list(), h["count"].to_list()))
    hist = [int(by.get(j, 0)) for j in range(k + 1)]
    at = [sum(hist[j:]) for j in range(1, k + 1)]
    reached = [sum(hist[j - 1:]) for j in range(1, k + 1)]
    rate = [a / r if r else None for a, r in zip(at, reached)]
    return hist, at, rate, sum(hist)


@view.table()
def per_position(res: Result) -> list[PositionAcceptance]:
    """Per segment (:func:`analyze.compute.anatomy.segments`), then the run (``key`` ``all``), the requests by
    accepted drafts over every cycle with a histogram (first rank: ranks run the same batches); [] without
    ``accept_histogram`` marks."""
    from . import anatomy

    hc = _first_rank(res)
    if hc.height == 0:
        return []
    out = []
    for sg in anatomy.segments(res):
        mine = hc.filter(pl.col("segment") == sg.segment)
        if mine.height == 0:
            continue
        out.append(_row(sg.key, sg.segment, sg.batch_size, sg.steps, mine))
    if hc.height:
        steps = hc["steps"].drop_nulls()
        out.append(_row("all", None, None, to_int(steps.max()) if steps.len() and steps.n_unique() == 1 else None, hc))
    return out


def _row(key: str, segment: int | None, batch: int | None, steps: int | None, h: pl.DataFrame) -> PositionAcceptance:
    summed = h.group_by("position").agg(pl.col("count").sum())
    hist, at, rate, n = _summed(summed, steps)
    cyc = h.select("pid", "cycle_index").unique().height
    mean = sum(j * x for j, x in enumerate(hist)) / n if n else None
    if steps is None:  # several step counts (the run): each position's rate over the cycles that drafted it
        rate = list(_conditional(h)[0])
    return PositionAcceptance(key, segment, batch, steps, cyc, n, hist, at, rate, mean)


def _conditional(h: pl.DataFrame) -> tuple[list[float], list[int]]:
    """Position j's conditional acceptance over the cycles that drafted at least j tokens (``h``: histogram rows
    with the cycle's ``steps``; a cycle of unknown steps counts up to its highest position seen), and the requests
    that reached it; up to the first position no request reached."""
    per = h.group_by("pid", "cycle_index").agg(pl.col("position"), pl.col("count"),
                                               k=pl.col("steps").first().fill_null(pl.col("position").max()))
    long = per.explode("position", "count")
    kmax = to_int(long["k"].max() or 0) if long.height else 0
    rs: list[float] = []
    ns: list[int] = []
    for j in range(1, kmax + 1):  # a handful of positions: one filter each
        d = long.filter(pl.col("k") >= j)
        reached = int(d.filter(pl.col("position") >= j - 1)["count"].sum())
        if not reached:
            break
        rs.append(int(d.filter(pl.col("position") >= j)["count"].sum()) / reached)
        ns.append(reached)
    return rs, ns


def _first_rank(res: Result) -> pl.DataFrame:
    """The first rank's histogram rows joined to their cycles (``segment``, ``steps``)."""
    h = cycle_histograms(res)
    c = cycles(res).filter(pl.col("kind") == "cycle")
    if h.height == 0 or c.height == 0:
        return h.with_columns(segment=pl.lit(None, pl.Int64), steps=pl.lit(None, pl.Int64)).clear()
    r0 = c["rank"].min()
    c = c.filter(pl.col("rank") == r0).select("pid", "cycle_index", "segment", "steps")
    return h.filter(pl.col("rank") == r0).join(c, on=["pid", "cycle_index"], how="inner")


def rates(res: Result) -> PositionRates | None:
    """The run's conditional acceptance per draft position (:class:`PositionRates`), None without histograms or
    when no position was drafted."""
    rs, ns = _conditional(_first_rank(res))
    return PositionRates(rs, ns) if rs else None
