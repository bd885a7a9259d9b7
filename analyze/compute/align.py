"""Put several nsys reports on one clock: session start (utcEpochNs), then collective end times.

One report of several processes needs none of this: nsys puts every process on one session clock.
Reports captured separately (one per node or per rank) each count from their own capture start.
Step 1 shifts report ``i`` by ``utcEpochNs_i - utcEpochNs_0`` (what NVIDIA's recipes do). Step 2
(nsys-jax's idea) uses the fact that the ranks of a collective finish together: per report, the
median over matched collectives of (its ranks' end - the reference report's median end) is a clock
error, subtracted. The residual is the spread of collective end times after alignment.
"""

from __future__ import annotations

import polars as pl

from .scalars import to_int

__all__ = ["ONE_CLOCK", "session_offsets", "shift", "end_skew", "end_spread"]

ONE_CLOCK = "one report: all processes share the nsys session clock (no alignment needed)"


def session_offsets(utc: list[int | None]) -> list[int] | None:
    """Per report, ns to add to its timestamps to put it on report 0's clock; None if any utcEpochNs is missing."""
    known = [u for u in utc if u is not None]
    if len(known) < len(utc):
        return None
    return [int(u) - int(known[0]) for u in known]


def shift(df: pl.DataFrame, offsets: pl.DataFrame, cols: tuple[str, ...] = ("start", "end")) -> pl.DataFrame:
    """Add each report's ``offset_ns`` (frame ``report, offset_ns``) to the time columns."""
    return (
        df.join(offsets, on="report", how="left")
        .with_columns(pl.col(c) + pl.col("offset_ns").fill_null(0) for c in cols)
        .drop("offset_ns")
    )


def end_skew(matched: pl.DataFrame, key: list[str]) -> pl.DataFrame:
    """Per report: the median of (end - report 0's median end of the same collective), rounded to ns."""
    ref = matched.filter(pl.col("report") == 0).group_by(key).agg(_ref=pl.col("end").median())
    return (
        matched.join(ref, on=key)
        .group_by("report")
        .agg(offset_ns=(pl.col("end") - pl.col("_ref")).median().round(0).cast(pl.Int64), collectives=pl.len())
        .sort("report")
    )


def end_spread(matched: pl.DataFrame, key: list[str]) -> dict[str, int | None]:
    """p50 / p99 / max over collectives of (latest end - earliest end across ranks)."""
    s = matched.group_by(key).agg(spread=pl.col("end").max() - pl.col("end").min())["spread"]
    if s.len() == 0:
        return {"end_spread_p50_ns": None, "end_spread_p99_ns": None, "end_spread_max_ns": None}
    return {
        "end_spread_p50_ns": to_int(s.quantile(0.5, "nearest")),
        "end_spread_p99_ns": to_int(s.quantile(0.99, "nearest")),
        "end_spread_max_ns": to_int(s.max()),
    }
