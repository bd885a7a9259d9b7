"""Who is the straggler: the one rule, its thresholds named once.

The rows the rule reads are :func:`analyze.compute.collectives.stragglers`': per phase and rank, the waiting the
rank caused in the phase's matched collectives (the other ranks' wait at the collectives it arrived last at) and
its share of all of it. :func:`verdict` names at most one rank per phase:

- the rank that caused the most waiting, when it caused at least :data:`WAIT_SHARE` of it (a rank late by 500 µs
  once in 16 collectives is the straggler, not the rank last by 1 µs at the other 15);
- over the steady cycles (``per_cycle``: how many, and their period): ``per_cycle_ns``, the waiting it caused per
  steady cycle, and only when that is at least :data:`FLOOR` of the cycle period (a straggler that costs nothing
  is not named);
- none in a phase of ``untrusted``: its matched collectives do not end together across ranks
  (:func:`analyze.compute.steady_tables.matching`), so its instances were probably paired wrongly;
- for a finding (``min_collectives``): over at least :data:`MIN_COLLECTIVES` matched collectives of the phase.

Who applies what: the steady view's verdict (:func:`analyze.compute.steady_tables.straggler_verdict`: every rule but the
finding's count) is what ``analyze``'s findings (with :data:`MIN_COLLECTIVES`), ``comm``, ``compare`` and the
report name. Without cycle ranges (``comm`` over the whole run), over one class of slower cycles (the slow-cycle
anatomy, :mod:`analyze.compute.anatomy`) and in ``analyze``'s JSON ``straggler`` key (each phase's verdict beside
``stragglers_steady``), there is no cycle period to weigh the waiting against: the share rule alone (the phases
whose collectives do not end together are refused earlier there, or listed with their rows).

To change the rule, change a threshold here (every verb and output follows) and the sentence of the report that
states it (:func:`rule_text`).
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

import polars as pl

__all__ = ["WAIT_SHARE", "FLOOR", "MIN_COLLECTIVES", "STRAGGLERS", "VERDICT", "PerCycle", "verdict", "rule_text"]

WAIT_SHARE = 0.5  # a rank that caused this share of a phase's collective waiting (or more) is its straggler ...
FLOOR = 0.01  # ... over the steady cycles, when that waiting per cycle is at least this share of the cycle period
MIN_COLLECTIVES = 5  # a finding names a straggler over at least this many matched collectives of the phase

# The rows of :func:`analyze.compute.collectives.stragglers` (empty ones too), and of a verdict over the steady
# cycles (with ``per_cycle_ns``).
STRAGGLERS = pl.Schema({"domain": pl.String, "phase": pl.String, "rank": pl.Int64, "collectives": pl.UInt32,
                        "last_arrivals": pl.Int64, "share": pl.Float64, "mean_delay_ns": pl.Int64,
                        "total_delay_ns": pl.Int64, "max_delay_ns": pl.Int64, "caused_wait_ns": pl.Int64,
                        "wait_share": pl.Float64})
VERDICT = pl.Schema([*STRAGGLERS.items(), ("per_cycle_ns", pl.Float64)])


@dataclass(frozen=True)
class PerCycle:
    """The steady cycles a verdict is over: how many (summed as keys across ranks: the matched collectives are
    those of every steady cycle) and the cycle period (ns)."""

    cycles: int
    period_ns: float


def verdict(st: pl.DataFrame, per_cycle: PerCycle | None = None, untrusted: Collection[str] = (),
            min_collectives: int = 0) -> pl.DataFrame:
    """The straggler of each phase (module docstring) from ``st`` (:func:`analyze.compute.collectives.stragglers`
    rows): one row per phase at most, the rows of ``st`` (phases outside any range have none); with ``per_cycle``,
    ``per_cycle_ns`` too (:data:`VERDICT`)."""
    if st.height == 0:
        return pl.DataFrame(schema=VERDICT if per_cycle is not None else STRAGGLERS)
    if untrusted:
        st = st.filter(~pl.col("phase").is_in(list(untrusted)))
    v = (st.filter(pl.col("phase").is_not_null() & (pl.col("caused_wait_ns") > 0)
                   & (pl.col("wait_share") >= WAIT_SHARE))
         .sort("phase", "caused_wait_ns", "rank", descending=[False, True, False])
         .group_by("domain", "phase", maintain_order=True).head(1))
    if per_cycle is not None:
        v = (v.with_columns(per_cycle_ns=pl.col("caused_wait_ns") / per_cycle.cycles)
             .filter(pl.col("per_cycle_ns") >= FLOOR * per_cycle.period_ns))
    return v.filter(pl.col("collectives") >= min_collectives) if min_collectives else v


def rule_text() -> str:
    """The rule in words, as the report states it."""
    share = "half" if WAIT_SHARE == 0.5 else f"{100 * WAIT_SHARE:g} %"
    return (f"when that is at least {share} of it and at least {100 * FLOOR:g} % of the cycle per cycle — the same "
            "rule as the findings and `spectrace comm`")
