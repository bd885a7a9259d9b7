"""Generated tokens and the cycle period: the one definition (:data:`DEFINITION`), over the steady cycles.

**Cycle period and tokens/s** (CLI, JSON, report, compare and what-if all use :func:`summary`): a cycle's period
is the time from the previous cycle's last GPU op to its own last GPU op on the same rank (what it waited for
before it started, prefill included, and what it ran); the trace's cycle period is the mean of those over the
steady-state cycles (:mod:`analyze.compute.steady_cycles`: warm-up and rare outliers left out, recurring slow
cycles kept) of each rank, averaged over ranks, i.e. steady time per cycle; tokens per cycle is the mean over the
same cycles (first rank; tokens per cycle: :mod:`analyze.compute.cycles`); tokens/s = tokens per cycle / cycle
period. Anchored at the cycle's end, one late event is one cycle on every rank: a rank that starts cycle k late
and a rank that waits for it inside cycle k both see a long cycle k.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import polars as pl

from ..model import Result
from ..read.manifest import speculative
from .cycles import cycles
from .payload import decode_frame
from .scalars import real_or_none, to_float

__all__ = ["DEFINITION", "Tokens", "summary"]

DEFINITION = ("cycle period = last GPU op of the previous cycle → last GPU op of this cycle, mean over the "
              "steady-state cycles of each rank, averaged over ranks; tokens/s = tokens per cycle (mean over the same cycles) "
              "/ cycle period")


@dataclass
class Tokens:
    """What one trace says about generated tokens (None where unknown)."""

    kind: str | None  # "cycle" (speculative) or "decode_step" (baseline); None without cycles
    source: str | None  # "payload", "manifest" or None
    cycles: int  # cycle instances on the ranks, summed
    steps: int | None  # speculative draft steps (payload cannot carry it: manifest or caller)
    batch_size: float | None
    period_ns: float | None  # the cycle period (DEFINITION: mean over the steady-state cycles)
    period_p50_ns: float | None  # median over the same cycles
    tokens_per_cycle: float | None
    accepted_per_request: float | None  # accepted draft tokens per request per cycle (bonus excluded)
    tokens_per_s: float | None
    acceptance_source: str | None = None  # "payload" (a range's payload), "marks" (the hooks' accept marks)
    accepted_cycles: int = 0  # cycles (first rank) whose accepted tokens are known
    accepted_p50: float | None = None  # accepted draft tokens per request per cycle: median, p90
    accepted_p90: float | None = None
    steady_cycles: int = 0  # cycles the numbers use, summed over ranks
    period_p90_ns: float | None = None

    def as_dict(self) -> dict:
        return asdict(self)


def summary(res: Result, steps: int | None = None) -> Tokens:
    """Tokens per cycle, tokens/s and the acceptance of a trace over its steady-state cycles (:data:`DEFINITION`;
    first rank's cycles for tokens: ranks run the same)."""
    c = cycles(res)
    spec = speculative(res.trace.path)
    if steps is None and isinstance(spec.get("steps"), int) and not spec.get("baseline"):
        steps = spec["steps"]
    if c.height == 0:
        return Tokens(None, None, 0, steps, None, None, None, None, None, None)
    kind = c["kind"].mode().sort()[0]
    every = c.filter(pl.col("kind") == kind)
    c = every.filter("steady")
    if c.height == 0:
        c = every  # the choice left no cycle: numbers over all (the selection text says so)
    if c["period_ns"].null_count() < c.height:  # the period and the tokens over the same cycles: those with a period
        c = c.filter(pl.col("period_ns").is_not_null())
    r0 = c.filter(pl.col("rank") == c["rank"].min())
    period = real_or_none(c.group_by("rank").agg(pl.col("period_ns").mean())["period_ns"].mean())
    p50, p90 = real_or_none(c["period_ns"].median()), c["period_ns"].quantile(0.9, "nearest")
    known = r0.filter(pl.col("tokens").is_not_null())
    payload_bs = r0["batch_size"].is_not_null().any() and _has_payload(res)
    src = None
    tpc: float | None = None
    acc: float | None = None
    bs: float | None = None
    if known.height:
        tpc = to_float(known["tokens"].mean())
        bs = to_float(known["batch_size"].mean())
        src = "payload" if payload_bs else "manifest"
        if kind == "cycle":
            per = known["accept_length"] / known["batch_size"]
            acc = to_float(per.mean())
            dist = (to_float(per.quantile(0.5, "nearest")), to_float(per.quantile(0.9, "nearest")))
            how = known["accept_source"].drop_nulls().unique().sort().to_list()
    elif r0["batch_size"].is_not_null().any():
        bs = to_float(r0["batch_size"].mean())
    if steps is None and kind == "decode_step":
        steps = 0
    tps = tpc / period * 1e9 if tpc is not None and period else None
    p90_ns = float(p90) if p90 is not None else None
    if acc is None:
        return Tokens(kind, src, every.height, steps, bs, period, p50, tpc, acc, tps, steady_cycles=c.height,
                      period_p90_ns=p90_ns)
    return Tokens(kind, src, every.height, steps, bs, period, p50, tpc, acc, tps, "+".join(how) or None,
                  known.height, *dist, steady_cycles=c.height, period_p90_ns=p90_ns)


def _has_payload(res: Result) -> bool:
    inst = decode_frame(res.instances.select("uint64", "int64"))
    return bool(inst["batch_size"].is_not_null().any())
