"""Compare two traces: per phase and seam, the GPU time per cycle in A and B, B − A split into compute,
communication and idle, one ranking, a noise-aware verdict.

- **Steady state only** on both sides (:mod:`analyze.compute.steady`; the same choice, e.g.
  ``--skip-cycles``, applies to both). Phases are matched by :func:`nvtx_hooks.phases.base_name`
  (``eagle3.verify`` and ``verify`` compare); seams by their base names (``seam:draft→verify``).
- **Per cycle** = summed over ranks and steady instances / steady cycles summed over ranks (the mean per
  rank per cycle). A phase's span is compute + comm + idle exactly (:mod:`analyze.compute.breakdown`), so
  ``delta_ns == delta_compute_ns + delta_comm_ns + delta_idle_ns``; a seam's number is its GPU idle
  time (all of it idle). Per token: divided by each trace's tokens per cycle (when both know tokens).
- **One ranking**: phases and seams together, by |Δ| per token when both traces know tokens, else per cycle.
  ``in_a``/``in_b`` say whether the row exists on each side (its numbers there are 0; text shows "–").
- **Noise**: each side's steady cycles are resampled with replacement (a cycle with all its ranks, :data:`BOOT`
  times, seeded) and every per-cycle mean recomputed; ``ci_low``/``ci_high`` are the 2.5 / 97.5 %
  quantiles of B − A over the resamples. The **verdict** is about the cycle period (per token when both
  know tokens): ``slower`` when the whole interval of the relative change is above 0, ``faster`` when it
  is below, else ``no clear change``.
"""

from __future__ import annotations

import polars as pl

from . import headline
from .tokens import DEFINITION, base_expr, selection, summary

BOOT = 1000
MAX_DRAWS = 2_000_000  # resamples × cycles, at most (fewer resamples for very long runs)
SPLIT = ("compute", "comm", "idle")


def _n_cycles(res) -> int:
    n = headline.steady_cycles(res)
    if n:
        return n
    p = headline.phases(res)
    return int(p["instances"].max() or 0) if p.height else 0


def _phase_totals(res, by_rank: bool) -> pl.DataFrame:
    """``[rank,] name, kind, ns, compute_ns, comm_ns, idle_ns`` summed over the steady state."""
    keys = ["rank", "name"] if by_rank else ["name"]
    p = headline.phases(res).with_columns(name=base_expr("phase"))
    ph = p.group_by(keys).agg(ns=pl.col("span_ns").sum(), compute_ns=pl.col("compute_ns").sum(),
                              comm_ns=pl.col("comm_ns").sum(), idle_ns=pl.col("idle_ns").sum()
                              ).with_columns(kind=pl.lit("phase"))
    s = headline.seam_instances(res)
    parts = [ph]
    if s.height:
        sm = (s.with_columns(f=base_expr("prev_range"), t=base_expr("range"))
              .with_columns(name=pl.format("seam:{}→{}", "f", "t"))
              .group_by(keys).agg(ns=pl.col("idle_ns").sum(), idle_ns=pl.col("idle_ns").sum())
              .with_columns(kind=pl.lit("seam"), compute_ns=pl.lit(0, pl.Int64), comm_ns=pl.lit(0, pl.Int64)))
        parts.append(sm)
    return pl.concat(parts, how="diagonal_relaxed").with_columns(
        pl.col("ns", "compute_ns", "comm_ns", "idle_ns").cast(pl.Float64))


def per_cycle(res, by_rank: bool = False) -> pl.DataFrame:
    """Per phase and seam (base names; per rank with ``by_rank``): ``ns, compute_ns, comm_ns, idle_ns`` per cycle."""
    t = _phase_totals(res, by_rank)
    if by_rank:
        cyc = headline.cycles_per_rank(res).rename({"cycles": "_n"})
        if cyc.height == 0:
            cyc = t.select("rank").unique().with_columns(_n=pl.lit(max(_n_cycles(res), 1)))
        t = t.join(cyc, on="rank", how="left").with_columns(pl.col("_n").fill_null(1))
    else:
        t = t.with_columns(_n=pl.lit(max(_n_cycles(res), 1)))
    return t.with_columns(pl.col("ns", "compute_ns", "comm_ns", "idle_ns") / pl.col("_n")).drop("_n")


def _wide(res) -> pl.DataFrame:
    """One row per steady cycle (identity ``key``, mean over its ranks): period, tokens and each item's ns."""
    v = headline.cycle_values(res)
    if v.height == 0:
        return pl.DataFrame()
    cyc = (v.filter(pl.col("kind") == "cycle").group_by("key")
           .agg(period=pl.col("ns").mean(), tokens=pl.col("tokens").mean(), _r=pl.col("rank").n_unique())
           .filter(pl.col("period").is_not_null()))
    items = v.filter(pl.col("kind") != "cycle")
    if items.height:
        # sum per (rank, key, name), then mean over the cycle's ranks (a rank without the item counts 0)
        w = (items.pivot(on="name", index=["rank", "key"], values="ns", aggregate_function="sum")
             .drop("rank").group_by("key").agg(pl.all().fill_null(0.0).sum()))
        cyc = cyc.join(w, on="key", how="left").with_columns(
            pl.exclude("key", "period", "tokens", "_r").fill_null(0.0) / pl.col("_r"))
    return cyc.drop("_r").sort("key")


def _boot(wide: pl.DataFrame, n: int, seed: int) -> pl.DataFrame:
    """``n`` resamples of the cycles (rows) of ``wide``, each column's mean per resample: one row per resample."""
    m = wide.height
    idx = pl.Series("i", range(m), dtype=pl.UInt32).sample(n * m, with_replacement=True, seed=seed)
    draws = pl.DataFrame({"b": pl.int_range(0, n * m, eager=True) // m, "i": idx})
    cols = [c for c in wide.columns if c != "key"]
    return (draws.join(wide.drop("key").with_row_index("i"), on="i")
            .group_by("b").agg(pl.col(cols).mean()).sort("b").drop("b"))


def _intervals(wa: pl.DataFrame, wb: pl.DataFrame, tok: bool, boot: int, seed: int) -> tuple[dict, dict]:
    """Per item: (ci_low, ci_high) of B − A per cycle (and per token); and the verdict's relative interval."""
    if wa.height < 2 or wb.height < 2:
        return {}, {}
    n = max(100, min(boot, MAX_DRAWS // max(wa.height, wb.height)))
    ba, bb = _boot(wa, n, seed), _boot(wb, n, seed + 1)
    names = sorted((set(ba.columns) | set(bb.columns)) - {"period", "tokens"})
    ba = ba.with_columns(pl.lit(0.0).alias(c) for c in names if c not in ba.columns)
    bb = bb.with_columns(pl.lit(0.0).alias(c) for c in names if c not in bb.columns)
    out: dict = {}
    for c in names:
        d = bb[c] - ba[c]
        out[c] = {"ci_low_ns": d.quantile(0.025, "linear"), "ci_high_ns": d.quantile(0.975, "linear")}
        if tok:
            dt = bb[c] / bb["tokens"] - ba[c] / ba["tokens"]
            out[c] |= {"ci_low_ns_per_token": dt.quantile(0.025, "linear"),
                       "ci_high_ns_per_token": dt.quantile(0.975, "linear")}
    sa = ba["period"] / ba["tokens"] if tok else ba["period"]
    sb = bb["period"] / bb["tokens"] if tok else bb["period"]
    rel = sb / sa - 1
    verdict = {"resamples": n, "ci_low_pct": 100 * rel.quantile(0.025, "linear"),
               "ci_high_pct": 100 * rel.quantile(0.975, "linear")}
    d = bb["period"] - ba["period"]
    out["period"] = {"ci_low_ns": d.quantile(0.025, "linear"), "ci_high_ns": d.quantile(0.975, "linear")}
    return out, verdict


def _joined(x: pl.DataFrame, y: pl.DataFrame, keys: list[str], ta, tb, tok: bool) -> pl.DataFrame:
    cols = ["ns", *[f"{s}_ns" for s in SPLIT]]
    j = x.rename({c: f"a_{c}" for c in cols}).with_columns(in_a=pl.lit(True)).join(
        y.rename({c: f"b_{c}" for c in cols}).with_columns(in_b=pl.lit(True)), on=[*keys, "kind"], how="full",
        coalesce=True)
    j = j.with_columns(pl.col("in_a", "in_b").fill_null(False),
                       *[pl.col(f"{s}_{c}").fill_null(0.0) for s in "ab" for c in cols])
    j = j.with_columns(
        pl.col("a_ns").alias("a_ns_per_cycle"), pl.col("b_ns").alias("b_ns_per_cycle"),
        (pl.col("b_ns") - pl.col("a_ns")).alias("delta_ns"),
        *[(pl.col(f"b_{s}_ns") - pl.col(f"a_{s}_ns")).alias(f"delta_{s}_ns") for s in SPLIT])
    if tok:
        ka, kb = 1 / ta.tokens_per_cycle, 1 / tb.tokens_per_cycle
        j = j.with_columns((pl.col("a_ns") * ka).alias("a_ns_per_token"), (pl.col("b_ns") * kb).alias("b_ns_per_token"),
                           (pl.col("b_ns") * kb - pl.col("a_ns") * ka).alias("delta_ns_per_token"),
                           *[(pl.col(f"b_{s}_ns") * kb - pl.col(f"a_{s}_ns") * ka).alias(f"delta_{s}_ns_per_token")
                             for s in SPLIT])
    return j.drop(*[f"{s}_{c}" for s in "ab" for c in cols]).rename({"name": "phase"})


def kernels(a, b, tok: bool, ta, tb, top: int = 3) -> pl.DataFrame:
    """Per phase (base name) and kernel: time and count per cycle in A and B, the biggest |Δ| first, ``top`` per
    phase."""
    def side(res):
        k = headline.kernels(res).with_columns(phase=base_expr("phase"))
        return k.group_by("phase", "name").agg(pl.col("per_cycle_ns").sum(), pl.col("count_per_cycle").sum())
    ka, kb = side(a), side(b)
    j = ka.rename({"per_cycle_ns": "a_ns_per_cycle", "count_per_cycle": "a_count_per_cycle"}).join(
        kb.rename({"per_cycle_ns": "b_ns_per_cycle", "count_per_cycle": "b_count_per_cycle"}),
        on=["phase", "name"], how="full", coalesce=True).fill_null(0.0)
    j = j.with_columns(delta_ns=pl.col("b_ns_per_cycle") - pl.col("a_ns_per_cycle"))
    if tok:
        j = j.with_columns(delta_ns_per_token=pl.col("b_ns_per_cycle") / tb.tokens_per_cycle
                           - pl.col("a_ns_per_cycle") / ta.tokens_per_cycle)
    j = j.sort(pl.col("delta_ns").abs(), "phase", "name", descending=[True, False, False])
    return j.group_by("phase", maintain_order=True).head(top)


def compare(a, b, boot: int = BOOT, seed: int = 0) -> dict:
    """The comparison document of analysed traces ``a`` and ``b`` (JSON-ready; see the module docstring)."""
    ta, tb = summary(a), summary(b)
    tok = ta.tokens_per_cycle is not None and tb.tokens_per_cycle is not None
    key = "delta_ns_per_token" if tok else "delta_ns"
    rows = _joined(per_cycle(a), per_cycle(b), ["name"], ta, tb, tok)
    ci, verdict = _intervals(_wide(a), _wide(b), tok, boot, seed)
    if ci:
        cis = pl.DataFrame([{"phase": k, **v} for k, v in ci.items() if k != "period"])
        rows = rows.join(cis, on="phase", how="left")
        rows = rows.with_columns(significant=(pl.col("ci_low_ns") > 0) | (pl.col("ci_high_ns") < 0))
    rows = rows.sort(pl.col(key).abs(), "phase", descending=[True, False])
    rank_rows = _joined(per_cycle(a, True), per_cycle(b, True), ["rank", "name"], ta, tb, tok).sort(
        "phase", "rank")
    period = {"a_ns": ta.period_ns, "b_ns": tb.period_ns,
              "delta_ns": tb.period_ns - ta.period_ns if ta.period_ns and tb.period_ns else None,
              **ci.get("period", {})}
    if tok:
        period |= {"a_ns_per_token": ta.period_ns / ta.tokens_per_cycle,
                   "b_ns_per_token": tb.period_ns / tb.tokens_per_cycle}
    return {
        "a": ", ".join(a.reports) or str(a.trace.path), "b": ", ".join(b.reports) or str(b.trace.path),
        "a_cycles": _n_cycles(a), "b_cycles": _n_cycles(b),
        "per_token": tok,
        "definition": DEFINITION,
        "steady": {"a": selection(a)["text"], "b": selection(b)["text"]},
        "rows": rows.to_dicts(),
        "phases": rows.filter(pl.col("kind") == "phase").to_dicts(),
        "seams": rows.filter(pl.col("kind") == "seam").to_dicts(),
        "per_rank": rank_rows.to_dicts(),
        "cycle_period": period,
        "verdict": _verdict(ta, tb, tok, verdict),
        "kernels": kernels(a, b, tok, ta, tb).to_dicts(),
        "tokens": {"a": ta.as_dict(), "b": tb.as_dict()},
    }


def _verdict(ta, tb, tok: bool, ci: dict) -> dict:
    metric = "ns per token" if tok else "cycle period"
    if not (ta.period_ns and tb.period_ns):
        return {"metric": metric, "result": "unknown", "text": "no cycle period on one side: no verdict"}
    a = ta.period_ns / ta.tokens_per_cycle if tok else ta.period_ns
    b = tb.period_ns / tb.tokens_per_cycle if tok else tb.period_ns
    change = 100 * (b / a - 1)
    out = {"metric": metric, "a": a, "b": b, "change_pct": change, **ci}
    if not ci:
        out |= {"result": "unknown", "text": f"B {change:+.1f} % {metric} (too few cycles for an interval)"}
        return out
    lo, hi = ci["ci_low_pct"], ci["ci_high_pct"]
    result = "slower" if lo > 0 else "faster" if hi < 0 else "no clear change"
    word = {"slower": "B is slower", "faster": "B is faster", "no clear change": "no clear change"}[result]
    out |= {"result": result, "text": f"{word}: {metric} {change:+.1f} % (95 % interval {lo:+.1f} … {hi:+.1f} %, "
                                      f"{ci['resamples']} resamples of the steady cycles)"}
    return out


def slower_than(doc: dict, pct: float) -> bool:
    """Whether B is slower than A by more than ``pct`` % and the verdict says it is not noise (CI gate)."""
    v = doc["verdict"]
    return v.get("result") == "slower" and v.get("change_pct", 0) > pct
