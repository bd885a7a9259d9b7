"""Compare two traces: per piece of the cycle (phases, seams, the gap between cycles, prefill), the GPU time per
cycle in A and B, B − A split into compute, communication and idle, one ranking, a noise-aware verdict.

- **Steady state only** on both sides (:mod:`analyze.compute.steady_cycles`: recurring slow cycles included, warm-up and
  rare stalls left out; the same choice, e.g. ``--skip-cycles``, applies to both). Pieces are the cycle
  budget's (:func:`analyze.compute.cycle_budget.cycle_pieces`), matched by base name (``eagle3.verify`` and
  ``verify`` compare; ``seam:draft→verify``; ``between cycles``; ``prefill``), so that a row's per-cycle value
  is the one ``analyze`` prints in its budget for the same cycles, and the rows add up to the cycle period.
- **Per cycle** = for each steady cycle (its key across ranks), the mean over its ranks; then the mean over the
  cycles. A phase's span is compute + comm + idle exactly (:mod:`analyze.compute.breakdown`), so
  ``delta_ns == delta_compute_ns + delta_comm_ns + delta_idle_ns``; a seam or the gap between cycles is all
  idle. Per token: divided by each trace's tokens per cycle (when both know tokens).
- **One ranking**: every row, by |Δ| per token when both traces know tokens, else per cycle. ``in_a``/``in_b``
  say whether the row exists on each side (its numbers there are 0; text shows "–").
- **Noise**: each side's steady cycles are resampled with replacement (a cycle with all its ranks, :data:`BOOT`
  times, seeded) and the same per-cycle means recomputed; ``ci_low``/``ci_high`` are the 2.5 / 97.5 % quantiles
  of B − A over the resamples, widened to contain the measured Δ when the percentiles miss it. The **verdict**
  is about the cycle period, the mean over every steady cycle (recurring slow cycles included), or about the
  time per token when the runs make different numbers of tokens per cycle (other draft steps, a baseline, or
  a difference in tokens per cycle that is not noise): ``slower`` when the whole interval of the relative
  change is above 0, ``faster`` when it is below, else ``no clear change``. ``warnings`` say when the two captures
  differ in how they were made or what they ran (CUDA-graph trace level, rank count (TP size), GPU model, draft
  step count, with whether tokens per cycle are unknown, decode batch sizes) or when either left out more than a
  tenth of its cycles.
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from ..model import Result
from ..read import packed_keys
from . import cycle_budget, steady_cycles, steady_tables, view
from .cycles import selection
from .payload import base_expr
from .scalars import real, to_float
from .steady_cycles import Selection
from .tokens import DEFINITION, Tokens, summary

__all__ = ["BOOT", "MAX_DRAWS", "SPLIT", "VALS", "PHASE_KINDS", "Comparison", "per_cycle", "kernels", "warnings",
           "Side", "compare_results", "compare_sides", "slower_than"]

BOOT = 1000
MAX_DRAWS = 2_000_000  # resamples × cycles, at most (fewer resamples for very long runs)
SPLIT = ("compute", "comm", "idle")
VALS = ("ns", "compute_ns", "comm_ns", "idle_ns")
PHASE_KINDS = ("phase", "prefill")


@dataclass
class Comparison:
    """What ``spectrace compare`` reports: runs A and B over their steady cycles (see the module docstring).

    ``a``/``b``: the reports of each side; ``a_cycles``/``b_cycles``: steady cycles with a period, summed over
    ranks; ``per_token``: both sides know tokens (rows carry ``*_per_token`` values and are ranked by them);
    ``definition``: the cycle period's definition; ``steady``: each side's steady-state sentence; ``warnings``:
    how the captures differ in how they were made; ``rows``: every piece of the cycle (phases, seams, the gap
    between cycles, prefill), largest |Δ| first, one dict per row (``phase, kind, in_a, in_b, a_ns_per_cycle,
    b_ns_per_cycle, delta_ns, delta_compute_ns, delta_comm_ns, delta_idle_ns``, the interval ``ci_low_ns,
    ci_high_ns, significant`` when there are enough cycles); ``per_rank``: the same per rank; ``cycle_period``:
    A, B, Δ and its interval; ``verdict``: ``metric, result`` (``slower``, ``faster``, ``no clear change`` or
    ``unknown``), ``change_pct``, the interval and ``text``; ``stragglers``: each side's straggler verdict;
    ``kernels``: the GPU operations that moved most per phase; ``tokens``: each side's :class:`Tokens`.
    """

    a: str
    b: str
    a_cycles: int
    b_cycles: int
    per_token: bool
    definition: str
    steady: dict[str, str]
    warnings: list[str]
    rows: list[dict]
    per_rank: list[dict]
    cycle_period: dict
    verdict: dict
    stragglers: dict[str, list[dict]]
    kernels: list[dict]
    tokens: dict[str, Tokens]

    @property
    def phases(self) -> list[dict]:
        """The rows of phases (and prefill), in the ranking's order."""
        return [r for r in self.rows if r["kind"] in PHASE_KINDS]

    @property
    def seams(self) -> list[dict]:
        """The rows of seams (and the gap between cycles), in the ranking's order."""
        return [r for r in self.rows if r["kind"] not in PHASE_KINDS]

    def slower_than(self, pct: float) -> bool:
        """Whether B is slower than A by more than ``pct`` % and the verdict says it is not noise (CI gate)."""
        return self.verdict.get("result") == "slower" and self.verdict.get("change_pct", 0) > pct

    def to_dict(self) -> dict:
        """The JSON document (``spectrace compare --format json``)."""
        return {
            "a": self.a, "b": self.b, "a_cycles": self.a_cycles, "b_cycles": self.b_cycles,
            "per_token": self.per_token, "definition": self.definition, "steady": self.steady,
            "warnings": self.warnings, "rows": self.rows, "phases": self.phases, "seams": self.seams,
            "per_rank": self.per_rank, "cycle_period": self.cycle_period, "verdict": self.verdict,
            "stragglers": self.stragglers, "kernels": self.kernels,
            "tokens": {k: t.as_dict() for k, t in self.tokens.items()},
        }


def _n_cycles(res: Result) -> int:
    """Steady cycles with a period, summed over ranks."""
    return cycle_budget.steady_keys(res).height


@view.table(name="compare_long")
def _long(res: Result) -> pl.DataFrame:
    """``rank, key, name, kind`` and the piece's ``ns, compute_ns, comm_ns, idle_ns`` of every steady cycle
    (made once per result: :func:`per_cycle` and :func:`_wide` both read it)."""
    p = packed_keys.semi_join(cycle_budget.cycle_pieces(res), cycle_budget.steady_keys(res), ["rank", "key"])
    return (p.group_by("rank", "key", name="item")
            .agg(kind=pl.col("kind").first(), ns=pl.col("ns").sum(), compute_ns=pl.col("compute_ns").sum(),
                 comm_ns=pl.col("comm_ns").sum(), idle_ns=pl.col("idle_ns").sum())
            .with_columns(pl.col(*VALS).fill_null(0.0), pl.col("name", "kind").cast(pl.String))
            .sort("rank", "key", "name"))  # (the same table however it was made)


def per_cycle(res: Result, by_rank: bool = False) -> pl.DataFrame:
    """Per piece (base names; per rank with ``by_rank``): ``name, kind, ns, compute_ns, comm_ns, idle_ns`` per
    cycle: the mean over the steady cycles of the mean over each cycle's ranks (per rank: over its cycles)."""
    lg = _long(res)
    if lg.height == 0:
        return pl.DataFrame(schema={**({"rank": pl.Int64} if by_rank else {}), "name": pl.String, "kind": pl.String,
                                    **{c: pl.Float64 for c in VALS}})  # (no steady cycle: the columns of a full one)
    if by_rank:
        n = cycle_budget.steady_keys(res).group_by("rank").agg(_n=pl.len())
        return (lg.group_by("rank", "name").agg(pl.col("kind").first(), *[pl.col(c).sum() for c in VALS])
                .join(n, on="rank").with_columns(pl.col(*VALS) / pl.col("_n")).drop("_n"))
    ranks = cycle_budget.steady_keys(res).group_by("key").agg(_r=pl.len())
    nkeys = ranks.height
    return (lg.join(ranks, on="key").with_columns(pl.col(*VALS) / pl.col("_r"))
            .group_by("name").agg(pl.col("kind").first(), *[(pl.col(c).sum() / nkeys) for c in VALS]))


def _wide(res: Result) -> pl.DataFrame:
    """One row per steady cycle (``key``): period and tokens (mean over its ranks) and each piece's ns."""
    keys = cycle_budget.steady_keys(res)
    if keys.height == 0:
        return pl.DataFrame()
    c = packed_keys.semi_join(cycle_budget.main_cycles(res), keys, ["rank", "key"])
    cyc = (c.group_by("key").agg(period=pl.col("period_ns").mean(), tokens=pl.col("tokens").mean(),
                                 _r=pl.col("rank").n_unique()))
    lg = _long(res)
    if lg.height:
        w = (lg.pivot(on="name", index=["rank", "key"], values="ns", aggregate_function="sum")
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


def _q(d: pl.Series, point: float | None) -> dict:
    """2.5 / 97.5 % quantiles of the resampled differences ``d``, widened to contain the measured ``point``."""
    lo, hi = d.quantile(0.025, "linear"), d.quantile(0.975, "linear")
    if point is not None:
        lo, hi = min(real(lo), point), max(real(hi), point)
    return {"lo": lo, "hi": hi}


def _intervals(wa: pl.DataFrame, wb: pl.DataFrame, tok: bool, boot: int, seed: int) -> tuple[dict, dict]:
    """Per item: (ci_low, ci_high) of B − A per cycle (and per token), each of the same quantity as its Δ (the
    mean over the cycles, :func:`per_cycle`) and containing it; and the verdict's relative interval."""
    if wa.height < 2 or wb.height < 2:
        return {}, {}
    n = max(100, min(boot, MAX_DRAWS // max(wa.height, wb.height)))
    ba, bb = _boot(wa, n, seed), _boot(wb, n, seed + 1)
    names = sorted((set(ba.columns) | set(bb.columns)) - {"period", "tokens"})
    ba = ba.with_columns(pl.lit(0.0).alias(c) for c in names if c not in ba.columns)
    bb = bb.with_columns(pl.lit(0.0).alias(c) for c in names if c not in bb.columns)
    def means(w: pl.DataFrame) -> dict:
        return {c: to_float(w[c].mean() or 0.0) if c in w.columns else 0.0 for c in [*names, "period", "tokens"]}

    ma, mb = means(wa), means(wb)
    out: dict = {}
    for c in names:
        q = _q(bb[c] - ba[c], mb[c] - ma[c])
        out[c] = {"ci_low_ns": q["lo"], "ci_high_ns": q["hi"]}
        if tok:
            qt = _q(bb[c] / bb["tokens"] - ba[c] / ba["tokens"], mb[c] / mb["tokens"] - ma[c] / ma["tokens"])
            out[c] |= {"ci_low_ns_per_token": qt["lo"], "ci_high_ns_per_token": qt["hi"]}
    rel = _q(100 * (bb["period"] / ba["period"] - 1), 100 * (mb["period"] / ma["period"] - 1))
    verdict = {"resamples": n, "period": {"ci_low_pct": rel["lo"], "ci_high_pct": rel["hi"], "a": ma["period"],
                                          "b": mb["period"]}}
    if tok:
        sa, sb = ba["period"] / ba["tokens"], bb["period"] / bb["tokens"]
        pa, pb = ma["period"] / ma["tokens"], mb["period"] / mb["tokens"]
        rt = _q(100 * (sb / sa - 1), 100 * (pb / pa - 1))
        tk = _q(100 * (bb["tokens"] / ba["tokens"] - 1), 100 * (mb["tokens"] / ma["tokens"] - 1))
        verdict |= {"token": {"ci_low_pct": rt["lo"], "ci_high_pct": rt["hi"], "a": pa, "b": pb},
                    "tokens_ci_pct": (tk["lo"], tk["hi"])}
    q = _q(bb["period"] - ba["period"], mb["period"] - ma["period"])
    out["period"] = {"ci_low_ns": q["lo"], "ci_high_ns": q["hi"]}
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
    return _kernels(_kernels_of(a), _kernels_of(b), tok, ta, tb, top)


def _kernels_of(res: Result) -> pl.DataFrame:
    """One side of :func:`kernels`: per phase (base name) and kernel, time and count per cycle."""
    k = steady_tables.kernels(res).with_columns(phase=base_expr("phase"))
    return k.group_by("phase", "name").agg(pl.col("per_cycle_ns").sum(), pl.col("count_per_cycle").sum())


def _kernels(ka: pl.DataFrame, kb: pl.DataFrame, tok: bool, ta, tb, top: int = 3) -> pl.DataFrame:
    j = ka.rename({"per_cycle_ns": "a_ns_per_cycle", "count_per_cycle": "a_count_per_cycle"}).join(
        kb.rename({"per_cycle_ns": "b_ns_per_cycle", "count_per_cycle": "b_count_per_cycle"}),
        on=["phase", "name"], how="full", coalesce=True).fill_null(0.0)
    j = j.with_columns(delta_ns=pl.col("b_ns_per_cycle") - pl.col("a_ns_per_cycle"))
    if tok:
        j = j.with_columns(delta_ns_per_token=pl.col("b_ns_per_cycle") / tb.tokens_per_cycle
                           - pl.col("a_ns_per_cycle") / ta.tokens_per_cycle)
    j = j.sort(pl.col("delta_ns").abs(), "phase", "name", descending=[True, False, False])
    return j.group_by("phase", maintain_order=True).head(top)


@dataclass
class _Capture:
    """How one trace was captured and its steady state chosen: what :func:`warnings` compares."""

    graph_trace_mode: str | None
    ranks: int
    gpus: list[str]
    selection: Selection
    steps: int | None = None  # draft steps (the manifest's, else inferred from the draft's structure), None: unknown
    steps_how: str = ""
    batch_sizes: tuple[int, ...] = ()  # decode batch sizes of the steady cycles (the payload's), () unknown
    tokens_known: bool = True

    @classmethod
    def of(cls, res: Result) -> _Capture:
        from ..model import InputError
        from .whatif_fit import steps_known

        try:
            steps, how = steps_known(res, None)
        except InputError:
            steps, how = None, ""
        info = selection(res)
        sizes = tuple(sorted({int(g.batch_size) for g in info.segments if g.batch_size is not None}))
        if not sizes:
            b = summary(res).batch_size
            sizes = (int(b),) if b is not None and float(b).is_integer() else ()
        return cls(res.trace.graph_trace_mode, res.ranks.height, _gpus(res), info, steps,
                   "inferred" if how.startswith("inferred") else "recorded" if how else "", sizes,
                   summary(res).tokens_per_cycle is not None)


def warnings(a, b) -> list[str]:
    """What makes the two captures hard to compare, in one line each (empty when nothing does)."""
    return _warnings(_Capture.of(a), _Capture.of(b))


def _warnings(a: _Capture, b: _Capture) -> list[str]:
    out = _warnings_between(a, b)
    for side, r in (("A", a), ("B", b)):
        info = r.selection
        if info.how == "detected" and info.left_out_share > steady_cycles.LEFT_OUT_WARN:
            out.append(f"{side} leaves out {info.left_out_share:.0%} of its cycles after warm-up (stalls, pauses): "
                       "its numbers describe the rest only")
    return out


def _warnings_between(a: _Capture, b: _Capture) -> list[str]:
    """How the two runs differ in how they were captured or what they ran."""
    out = []
    ma, mb = a.graph_trace_mode, b.graph_trace_mode
    if (ma or "none") != (mb or "none"):
        out.append(f"CUDA-graph trace levels differ (A: {ma or 'none'}, B: {mb or 'none'}): node-level tracing makes "
                   "graph launches block and costs 2–3 % of the cycle; compare captures made the same way")
    if a.ranks != b.ranks:
        out.append(f"rank counts (TP size) differ (A: {a.ranks}, B: {b.ranks}): per-cycle times compare, "
                   "communication does not")
    ga, gb = a.gpus, b.gpus
    if ga and gb and ga != gb:
        out.append(f"GPU models differ (A: {', '.join(ga)}; B: {', '.join(gb)})")
    if a.steps is not None and b.steps is not None and a.steps != b.steps:
        how = "" if a.steps_how == b.steps_how == "recorded" else " (inferred from the draft's structure on " + \
            " and ".join(s for s, c in (("A", a), ("B", b)) if c.steps_how == "inferred") + ")"
        out.append(f"draft step counts differ (A: {a.steps}, B: {b.steps}){how}: a cycle makes a different number "
                   "of tokens" + ("" if a.tokens_known and b.tokens_known else
                                  "; tokens per cycle are unknown on " + " and ".join(
                                      s for s, c in (("A", a), ("B", b)) if not c.tokens_known)
                                  + ", so the verdict is on the cycle period, not per token: a longer cycle may "
                                    "still be faster per token"))
    if a.batch_sizes and b.batch_sizes and a.batch_sizes != b.batch_sizes:
        out.append(f"decode batch sizes differ (A: {', '.join(map(str, a.batch_sizes))}; B: "
                   f"{', '.join(map(str, b.batch_sizes))}): a cycle does different work")
    return out


def _gpus(res: Result) -> list[str]:
    names = res.ranks["device_name"].drop_nulls().unique().sort().to_list() if "device_name" in res.ranks.columns else []
    return [str(n) for n in names]


@dataclass
class Side:
    """What :func:`compare_results` reads of one analysed trace (:meth:`of`): small tables only, so that the
    trace's :class:`Result` (hundreds of MB at 10 M kernels) can go before the other side's is read."""

    name: str
    cycles: int
    tokens: Tokens
    per_cycle: pl.DataFrame
    per_rank: pl.DataFrame
    wide: pl.DataFrame
    kernels: pl.DataFrame
    steady: str
    straggler: list[dict]
    capture: _Capture

    @classmethod
    def of(cls, res: Result) -> Side:
        return cls(name=", ".join(res.reports) or str(res.trace.path), cycles=_n_cycles(res), tokens=summary(res),
                   per_cycle=per_cycle(res), per_rank=per_cycle(res, True), wide=_wide(res),
                   kernels=_kernels_of(res), steady=selection(res).text, straggler=_straggler(res),
                   capture=_Capture.of(res))


def compare_results(a, b, boot: int = BOOT, seed: int = 0) -> Comparison:
    """The comparison of analysed traces ``a`` and ``b`` (see the module docstring; ``to_dict()``: the JSON)."""
    return compare_sides(Side.of(a), Side.of(b), boot, seed)


def compare_sides(a: Side, b: Side, boot: int = BOOT, seed: int = 0) -> Comparison:
    """:func:`compare_results` of the two sides' :class:`Side` (each made while its Result was at hand)."""
    ta, tb = a.tokens, b.tokens
    tok = (ta.tokens_per_cycle is not None and tb.tokens_per_cycle is not None  # per token: both know tokens and
           and ta.period_ns is not None and tb.period_ns is not None)  # a period (one cycle has none)
    key = "delta_ns_per_token" if tok else "delta_ns"
    rows = _joined(a.per_cycle, b.per_cycle, ["name"], ta, tb, tok)
    rows = rows.filter((pl.col("a_ns_per_cycle") != 0) | (pl.col("b_ns_per_cycle") != 0) | pl.col("kind").is_in(
        PHASE_KINDS))
    ci, verdict = _intervals(a.wide, b.wide, tok, boot, seed)
    if ci:
        cis = pl.DataFrame([{"phase": k, **v} for k, v in ci.items() if k != "period"])
        rows = rows.join(cis, on="phase", how="left")
        rows = rows.with_columns(significant=(pl.col("ci_low_ns") > 0) | (pl.col("ci_high_ns") < 0))
    rows = rows.sort(pl.col(key).abs(), "phase", descending=[True, False])
    rank_rows = _joined(a.per_rank, b.per_rank, ["rank", "name"], ta, tb, tok).sort("phase", "rank")
    period = {"a_ns": ta.period_ns, "b_ns": tb.period_ns,
              "delta_ns": tb.period_ns - ta.period_ns if ta.period_ns and tb.period_ns else None,
              **ci.get("period", {})}
    if tok:
        period |= {"a_ns_per_token": real(ta.period_ns) / real(ta.tokens_per_cycle),
                   "b_ns_per_token": real(tb.period_ns) / real(tb.tokens_per_cycle)}
    return Comparison(
        a=a.name, b=b.name,
        a_cycles=a.cycles, b_cycles=b.cycles,
        per_token=tok,
        definition=DEFINITION,
        steady={"a": a.steady, "b": b.steady},
        warnings=_warnings(a.capture, b.capture),
        rows=rows.to_dicts(),
        per_rank=rank_rows.to_dicts(),
        cycle_period=period,
        verdict=_verdict(ta, tb, tok, verdict),
        stragglers={"a": a.straggler, "b": b.straggler},
        kernels=_kernels(a.kernels, b.kernels, tok, ta, tb).to_dicts(),
        tokens={"a": ta, "b": tb},
    )


def _straggler(res: Result) -> list[dict]:
    """The straggler verdict of one side over its steady cycles (:func:`steady_tables.straggler_verdict`: the one
    ``analyze`` and ``comm`` name)."""
    return steady_tables.straggler_verdict(res).select("phase", "rank", "caused_wait_ns", "wait_share",
                                                  "per_cycle_ns").to_dicts()


def _verdict(ta, tb, tok: bool, ci: dict) -> dict:
    """The verdict on the cycle period (mean over every steady cycle), or on the time per token when the two runs
    make a different number of tokens per cycle (other draft steps, or tokens per cycle whose difference is not
    noise): a per-token ratio carries the acceptance's cycle-to-cycle noise, which a period change of a few
    percent drowns in when the acceptance is the same on both sides."""
    steps_differ = ta.steps is not None and tb.steps is not None and ta.steps != tb.steps
    tokens_differ = tok and "tokens_ci_pct" in ci and (ci["tokens_ci_pct"][0] > 0 or ci["tokens_ci_pct"][1] < 0)
    per_token = tok and (steps_differ or tokens_differ or (ta.kind != tb.kind))
    metric = "ns per token" if per_token else "cycle period"
    if not (ta.period_ns and tb.period_ns):
        return {"metric": metric, "result": "unknown", "text": "no cycle period on one side: no verdict"}
    why = ("" if not per_token else " (the runs make different numbers of tokens per cycle"
           + (": other draft steps)" if steps_differ else ")"))
    part = ci.get("token" if per_token else "period", {})
    a = part.get("a", ta.period_ns / ta.tokens_per_cycle if per_token else ta.period_ns)
    b = part.get("b", tb.period_ns / tb.tokens_per_cycle if per_token else tb.period_ns)
    change = 100 * (b / a - 1)
    out = {"metric": metric, "a": a, "b": b, "change_pct": change}
    if not part:
        out |= {"result": "unknown", "text": f"B {change:+.1f} % {metric}{why} (too few cycles for an interval)"}
        return out
    lo, hi = part["ci_low_pct"], part["ci_high_pct"]
    out |= {"ci_low_pct": lo, "ci_high_pct": hi, "resamples": ci["resamples"]}
    if "tokens_ci_pct" in ci:
        out["tokens_per_cycle_ci_pct"] = list(ci["tokens_ci_pct"])
    result = "slower" if lo > 0 else "faster" if hi < 0 else "no clear change"
    word = {"slower": "B is slower", "faster": "B is faster", "no clear change": "no clear change"}[result]
    out |= {"result": result, "text": f"{word}: {metric} {change:+.1f} % over every steady cycle{why} (95 % "
                                      f"interval {lo:+.1f} … {hi:+.1f} %, {ci['resamples']} resamples of the steady "
                                      "cycles)"}
    return out


def slower_than(doc: Comparison, pct: float) -> bool:
    """Whether B is slower than A by more than ``pct`` % and the verdict says it is not noise (CI gate)."""
    return doc.slower_than(pct)
