"""Compare two traces phase by phase: GPU time per cycle in A and B, B − A, biggest movers first.

Phases are matched by :func:`nvtx_hooks.phases.base_name` (``eagle3.verify`` and ``verify`` compare).
Per cycle = the phase's exclusive GPU span summed over ranks and instances / the cycles summed over ranks
(a cycle is a ``cycle`` or ``decode_step`` range), so the mean per rank per cycle. When both traces know
their tokens (:mod:`analyze.tokens`), each row also has ns per generated token and the rows are ordered
by the per-token difference (what matters when a speculative run is compared with a baseline).
"""

from __future__ import annotations

import polars as pl

from .tokens import base_expr, cycles, summary


def per_cycle(res) -> tuple[pl.DataFrame, int]:
    """``phase, ns_per_cycle`` (leaf phases by base name) and the number of cycles (summed over ranks)."""
    c = cycles(res)
    pa = res.phases_all.with_columns(phase_base=base_expr("phase"))
    n = c.height or int(pa["instances"].max() or 0)
    out = pa.group_by("phase_base").agg(pl.col("span_ns").sum()).select(
        phase="phase_base", ns_per_cycle=pl.col("span_ns") / max(n, 1))
    return out, n


def seams_per_cycle(res, n: int) -> pl.DataFrame:
    """``phase`` (``seam:from→to`` by base names), GPU idle per cycle."""
    s = res.seam_instances.with_columns(f=base_expr("prev_range"), t=base_expr("range"))
    return s.group_by("f", "t").agg(pl.col("idle_ns").sum()).select(
        phase=pl.format("seam:{}→{}", "f", "t"), ns_per_cycle=pl.col("idle_ns") / max(n, 1))


def compare(a, b) -> dict:
    """The comparison document of analysed traces ``a`` and ``b`` (JSON-ready)."""
    pa, na = per_cycle(a)
    pb, nb = per_cycle(b)
    ta, tb = summary(a), summary(b)
    tok = ta.tokens_per_cycle is not None and tb.tokens_per_cycle is not None

    def joined(x: pl.DataFrame, y: pl.DataFrame) -> pl.DataFrame:
        j = x.rename({"ns_per_cycle": "a_ns_per_cycle"}).join(
            y.rename({"ns_per_cycle": "b_ns_per_cycle"}), on="phase", how="full", coalesce=True
        ).with_columns(pl.col("a_ns_per_cycle", "b_ns_per_cycle").fill_null(0.0))
        j = j.with_columns(delta_ns=pl.col("b_ns_per_cycle") - pl.col("a_ns_per_cycle"))
        if tok:
            j = j.with_columns(a_ns_per_token=pl.col("a_ns_per_cycle") / ta.tokens_per_cycle,
                               b_ns_per_token=pl.col("b_ns_per_cycle") / tb.tokens_per_cycle)
            j = j.with_columns(delta_ns_per_token=pl.col("b_ns_per_token") - pl.col("a_ns_per_token"))
        key = "delta_ns_per_token" if tok else "delta_ns"
        return j.sort(pl.col(key).abs(), "phase", descending=[True, False])

    period = {"a_ns": ta.period_ns, "b_ns": tb.period_ns,
              "delta_ns": tb.period_ns - ta.period_ns if ta.period_ns and tb.period_ns else None}
    if tok:
        period |= {"a_ns_per_token": ta.period_ns / ta.tokens_per_cycle,
                   "b_ns_per_token": tb.period_ns / tb.tokens_per_cycle}
    return {
        "a": str(a.trace.path), "b": str(b.trace.path), "a_cycles": na, "b_cycles": nb,
        "per_token": tok,
        "phases": joined(pa, pb).to_dicts(),
        "seams": joined(seams_per_cycle(a, na), seams_per_cycle(b, nb)).to_dicts(),
        "cycle_period": period,
        "tokens": {"a": ta.as_dict(), "b": tb.as_dict()},
    }
