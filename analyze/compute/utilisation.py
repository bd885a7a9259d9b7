"""Hardware utilisation per phase: nsys GPU-metrics samples (:mod:`analyze.read.gpu_metrics`) over each phase
instance's GPU span.

- **Per instance** (:func:`interval_means`): the time-weighted mean of each metric over ``[first op start,
  last op end)`` of the instance (its exclusive GPU span, as the phase table): a sample counts by the part of
  its interval inside the span. Done with cumulative integrals per GPU and two ``join_asof`` per span, never a
  loop: ``mean = (I(end) - I(start)) / (T(end) - T(start))`` with ``I`` the integral of the metric and ``T`` the
  sampled time. ``samples`` is the number of samples whose interval overlaps the span. A span shorter than
  :data:`MIN_PERIODS` sampling periods gets no number (``short``): most of its samples' time would be its
  neighbours'.
- **Per phase** (:func:`phases`): per rank, phase and scope — ``steady`` (the steady-state instances of
  :mod:`analyze.compute.steady_tables`), ``all`` (the whole run) and each decode-batch segment of the steady state
  (``batch 16``) — the mean over its measured instances weighted by their sampled time, with ``samples``, the
  measured ``instances`` and the ``short`` ones. A phase whose every instance is short says so (``note``).
- **Per seam** (:func:`seams`): the same over the gaps between consecutive phases (steady state).
- **Bound** (:func:`bound`): memory-bound when DRAM read ≥ :data:`DRAM_BOUND_PCT` and tensor active ≤
  :data:`TENSOR_LOW_PCT`; compute-bound when tensor active ≥ :data:`TENSOR_BOUND_PCT` or SM issue ≥
  :data:`ISSUE_BOUND_PCT` with DRAM read below :data:`DRAM_BOUND_PCT`; ``idle`` when SMs are active under
  :data:`IDLE_PCT` of the time (a gap, a span mostly waiting); else mixed.

Ranks get their own GPU's samples: the rank's device (``res.ranks.device``, the CUDA device of its kernels)
through the export's GPU list, per report when several were merged (each instance stays on its report's clock).
An export without samples gives empty frames, no error.
"""

from __future__ import annotations

import polars as pl

from ..model import InputError, Result
from ..read import gpu_metrics
from . import steady_tables, view
from .cycles import cycles, selection

__all__ = ["MIN_PERIODS", "DRAM_BOUND_PCT", "TENSOR_LOW_PCT", "TENSOR_BOUND_PCT", "ISSUE_BOUND_PCT",
           "IDLE_PCT", "period_ns", "interval_means", "instances", "scope_order", "phases", "bound_expr",
           "long", "seams"]

MIN_PERIODS = 2  # a span shorter than this many sampling periods gets no number
DRAM_BOUND_PCT = 60.0  # DRAM read bandwidth share of peak at or above which a phase is memory-bound ...
TENSOR_LOW_PCT = 20.0  # ... while its tensor cores are active at most this share of the time
TENSOR_BOUND_PCT = 50.0  # tensor cores active at least this share: compute-bound
ISSUE_BOUND_PCT = 60.0  # or SM issue slots used at least this share (non-tensor compute)
IDLE_PCT = 10.0  # SMs active below this share of the time: the GPU mostly idle in the span, no bound
_SPAN_SCHEMA = {"rank": pl.Int64, "id": pl.Int64, "start": pl.Int64, "end": pl.Int64}


@view.table(kept=False, any_choice=True, name="gpu_metrics_samples")
def _samples(res: Result) -> dict[int, gpu_metrics.GpuSamples]:
    """The GPU-metrics samples of each report of ``res`` (index in ``res.reports``), read once per result (none of
    a report that went away or changed since it was analysed)."""
    out = {}
    for i, p in enumerate(res.reports or [res.trace.path]):
        try:
            s = gpu_metrics.read(p)
        except (InputError, OSError):  # the report went away or changed since it was analysed
            continue
        if s is not None:
            out[i] = s
    return out


def period_ns(res: Result) -> int | None:
    """The sampling period (ns), the longest of the reports'; None without samples."""
    s = _samples(res)
    return max(x.period_ns for x in s.values()) if s else None


def _rank_gpu(res: Result) -> pl.DataFrame:
    """``rank, report, gpu``: each rank's GPU (the CUDA device its kernels ran on)."""
    r = res.ranks
    rep = pl.col("report").cast(pl.Int64) if "report" in r.columns else pl.lit(0, pl.Int64)
    return r.select(pl.col("rank").cast(pl.Int64), rep.alias("report"), pl.col("device").cast(pl.Int64).alias("gpu"))


def _wide(s: gpu_metrics.GpuSamples) -> tuple[pl.DataFrame, list[str]]:
    """One row per GPU and sample time: ``gpu, start, end`` and per metric its cumulative integral before the
    sample (``_I_<m>``) and value (``_v_<m>``); ``_T``: sampled time before it; ``_k``: its index on the GPU."""
    w = s.samples.pivot(on="metric", index=["gpu", "start", "end"], values="value", aggregate_function="mean")
    ms = [c for c in w.columns if c not in ("gpu", "start", "end")]
    w = w.sort("gpu", "start")
    dur = pl.col("end") - pl.col("start")
    return w.select(
        "gpu", "start", "end",
        (dur.cum_sum() - dur).over("gpu").alias("_T"),
        pl.int_range(pl.len()).over("gpu").alias("_k"),
        *[(pl.col(m).fill_null(0) * dur).cum_sum().over("gpu").alias(f"_I_{m}") for m in ms],
        *[pl.col(m).fill_null(0).alias(f"_v_{m}") for m in ms],
    ).with_columns([(pl.col(f"_I_{m}") - pl.col(f"_v_{m}") * dur).alias(f"_I_{m}") for m in ms]), ms


def _at(spans: pl.DataFrame, w: pl.DataFrame, ms: list[str], col: str, tag: str) -> pl.DataFrame:
    """``spans`` with the integrals at time ``col`` (``_I{tag}_<m>``, ``_T{tag}``) and the index of the sample
    at or before it (``_k{tag}``; ``_in{tag}``: whether that sample's interval still covers the time)."""
    left = spans.with_columns(_x=pl.col(col)).sort("_x")
    j = left.join_asof(w.rename({"start": "_s", "end": "_e"}), left_on="_x", right_on="_s", by="gpu", check_sortedness=False,
                       strategy="backward")
    part = pl.min_horizontal(pl.col("_x"), pl.col("_e")) - pl.col("_s")
    return j.select(
        *spans.columns,
        pl.col("_T").add(part).fill_null(0).alias(f"_T{tag}"),
        pl.col("_k").fill_null(-1).alias(f"_k{tag}"),
        (pl.col("_x") < pl.col("_e")).fill_null(False).alias(f"_in{tag}"),
        (pl.col("_x") == pl.col("_s")).fill_null(False).alias(f"_on{tag}"),
        *[(pl.col(f"_I_{m}") + pl.col(f"_v_{m}") * part).fill_null(0).alias(f"_I{tag}_{m}") for m in ms],
    )


def interval_means(spans: pl.DataFrame, s: gpu_metrics.GpuSamples) -> pl.DataFrame:
    """Per span (``gpu, start, end`` and any other columns): ``samples``, ``sampled_ns`` (the sampled time inside
    it), ``short`` (shorter than :data:`MIN_PERIODS` periods) and per metric its time-weighted mean (null when
    short or unsampled)."""
    if spans.height == 0:
        return spans.with_columns(samples=pl.lit(0, pl.Int64), sampled_ns=pl.lit(0, pl.Int64),
                                  short=pl.lit(False))
    w, ms = _wide(s)
    a = _at(spans.with_row_index("_row"), w, ms, "start", "a")
    b = _at(spans.with_row_index("_row"), w, ms, "end", "b")
    j = a.join(b.select("_row", "_Tb", "_kb", "_onb", *[f"_Ib_{m}" for m in ms]), on="_row").sort("_row")
    cov = pl.col("_Tb") - pl.col("_Ta")
    # overlapping samples: from the one covering the start (or the next) to the last one starting before the end
    first = pl.col("_ka") + pl.when(pl.col("_ina")).then(0).otherwise(1)
    last = pl.col("_kb") - pl.when(pl.col("_onb")).then(1).otherwise(0)
    n = (last - first + 1).clip(lower_bound=0)
    short = (pl.col("end") - pl.col("start")) < MIN_PERIODS * s.period_ns
    return j.select(
        *spans.columns,
        samples=n.cast(pl.Int64), sampled_ns=cov.cast(pl.Int64), short=short,
        **{m: pl.when(~short & (cov > 0)).then((pl.col(f"_Ib_{m}") - pl.col(f"_Ia_{m}")) / cov) for m in ms},
    )


@view.table(kept=False, name="utilisation_instances")
def instances(res: Result) -> pl.DataFrame:
    """Per phase instance with GPU work: ``rank, report, range_id, domain, phase, steady, segment, start, end``
    and the columns of :func:`interval_means`; empty without samples."""
    got = _samples(res)
    out = pl.DataFrame()
    if got:
        inst = steady_tables.instances_marked_steady(res).filter(pl.col("left_out").is_null() & (pl.col("x_ops") > 0)
                                              & pl.col("rank").is_not_null())
        rep = pl.col("report").cast(pl.Int64) if "report" in inst.columns else pl.lit(0, pl.Int64)
        seg = _segments(res)
        spans = inst.select("rank", rep.alias("report"), "range_id", "domain", pl.col("range").alias("phase"),
                            "steady", "top", start="x_first", end="x_last")
        spans = spans.join(seg, on=["rank", "top"], how="left").drop("top")
        out = _measure(res, spans, got)
        if out.height:  # in time order, whatever the export's row order (the sums over instances add in this order)
            out = out.sort("rank", "report", "start", "end", "domain", "phase", nulls_last=True)
    return out


def _segments(res: Result) -> pl.DataFrame:
    """``rank, top, segment``: the decode-batch segment (its key, ``batch 16``) of each steady cycle."""
    c = cycles(res)
    segs = selection(res).segments
    if c.height == 0 or "segment" not in c.columns or len(segs) < 2:
        return pl.DataFrame(schema={"rank": pl.Int64, "top": pl.Int64, "segment": pl.String})
    names = pl.DataFrame({"segment": [s.segment for s in segs], "_name": [str(s.key) for s in segs]},
                         schema={"segment": pl.Int64, "_name": pl.String})
    return (c.filter(pl.col("steady")).select("rank", top="range_id", segment=pl.col("segment").cast(pl.Int64))
            .join(names, on="segment", how="left").select("rank", "top", segment="_name"))


def _measure(res: Result, spans: pl.DataFrame, got: dict[int, gpu_metrics.GpuSamples]) -> pl.DataFrame:
    """:func:`interval_means` of ``spans`` (with ``rank, report``) on each rank's GPU of its report."""
    spans = spans.join(_rank_gpu(res), on=["rank", "report"], how="left")
    parts = [interval_means(spans.filter((pl.col("report") == i) & pl.col("gpu").is_in(s.gpus)), s)
             for i, s in got.items()]
    parts = [p for p in parts if p.height]
    return pl.concat(parts, how="diagonal_relaxed") if parts else pl.DataFrame()


def _metric_names(res: Result) -> list[str]:
    """The metric keys measured (the main five first, in :data:`gpu_metrics.MAIN` order)."""
    have = sorted({m for s in _samples(res).values() for m in s.metrics["metric"].to_list()})
    return [m for m in gpu_metrics.MAIN if m in have] + [m for m in have if m not in gpu_metrics.MAIN]


def _aggregate(inst: pl.DataFrame, keys: list[str], ms: list[str]) -> pl.DataFrame:
    ok = ~pl.col("short") & (pl.col("sampled_ns") > 0)
    w = pl.when(ok).then(pl.col("sampled_ns")).otherwise(0)
    return inst.group_by(keys).agg(
        instances=ok.sum().cast(pl.Int64), short=pl.col("short").sum().cast(pl.Int64),
        samples=pl.when(ok).then(pl.col("samples")).otherwise(0).sum().cast(pl.Int64),
        sampled_ns=w.sum().cast(pl.Int64),
        span_p50_ns=(pl.col("end") - pl.col("start")).median(),
        **{m: (pl.col(m).fill_null(0) * w).sum() / w.sum() for m in ms},
    ).with_columns(
        [pl.when(pl.col("instances") > 0).then(pl.col(m)).alias(m) for m in ms]
    )


def scope_order() -> pl.Expr:
    """A sort key of ``scope`` for the tables, figures and the report: ``steady``, ``all``, scopes without a number, then
    ``batch N`` in numeric order (``batch 16`` before ``batch 128``); ties broken by the scope's name."""
    return (pl.when(pl.col("scope") == "steady").then(-3).when(pl.col("scope") == "all").then(-2)
            .otherwise(pl.col("scope").str.extract(r"(\d+)$").cast(pl.Int64, strict=False).fill_null(-1)))


@view.table(kept=False, name="utilisation_phases")
def phases(res: Result) -> pl.DataFrame:
    """Per rank, phase and scope (``steady``, ``all``, the steady state's ``batch N`` segments), plus all-ranks
    rows (``rank`` null): the main metrics as columns (percent of peak), ``samples``, ``instances`` measured,
    ``short`` instances, ``bound`` and ``note``; empty without samples."""
    inst = instances(res)
    if inst.height == 0:
        return pl.DataFrame()
    ms = _metric_names(res)
    scoped = pl.concat([
        inst.filter("steady").with_columns(scope=pl.lit("steady")),
        inst.with_columns(scope=pl.lit("all")),
        inst.filter(pl.col("steady") & pl.col("segment").is_not_null()).with_columns(scope=pl.col("segment")),
    ])
    per_rank = _aggregate(scoped, ["rank", "domain", "phase", "scope"], ms)
    every = _aggregate(scoped, ["domain", "phase", "scope"], ms).with_columns(rank=pl.lit(None, pl.Int64))
    out = pl.concat([per_rank, every], how="diagonal_relaxed")
    out = _finish(out, ms, period_ns(res))
    out = (out.with_columns(_o=scope_order()).sort("_o", "scope", pl.col("rank").is_null(), "rank", "sampled_ns", "domain",
                                            "phase", descending=[False, False, False, False, True, False, False])
           .drop("_o"))
    return out


def _finish(out: pl.DataFrame, ms: list[str], period: int | None,
            keys: tuple[str, ...] = ("rank", "domain", "phase", "scope")) -> pl.DataFrame:
    main = list(gpu_metrics.MAIN)  # absent ones are null columns: the table keeps its shape
    out = out.with_columns(pl.lit(None, pl.Float64).alias(m) for m in main if m not in out.columns)
    note = (pl.when((pl.col("instances") == 0) & (pl.col("short") > 0))
            .then(pl.format("too short for the sampling period: p50 span {} µs, sampled every {} µs",
                            (pl.col("span_p50_ns") / 1e3).round(1), pl.lit(round((period or 0) / 1e3, 1))))
            .when(pl.col("instances") == 0).then(pl.lit("no samples")))
    first = [*keys, *main, "samples", "instances", "short", "sampled_ns"]
    return out.with_columns(bound=bound_expr(), note=note).select(
        *first, "bound", "note", *[m for m in ms if m not in main], "span_p50_ns")


def bound_expr() -> pl.Expr:
    """``idle``, ``memory``, ``compute`` or ``mixed`` from a row's main metric columns (null when unmeasured)."""
    dram, tensor = pl.col("dram_read_pct"), pl.col("tensor_active_pct")
    issue = pl.col("sm_issue_pct")
    sm = pl.col("sm_active_pct")
    return (pl.when(dram.is_null() | tensor.is_null()).then(pl.lit(None, pl.String))
            .when(sm.is_not_null() & (sm < IDLE_PCT)).then(pl.lit("idle"))
            .when((dram >= DRAM_BOUND_PCT) & (tensor <= TENSOR_LOW_PCT)).then(pl.lit("memory"))
            .when((dram < DRAM_BOUND_PCT) & ((tensor >= TENSOR_BOUND_PCT) | (issue.fill_null(0) >= ISSUE_BOUND_PCT)))
            .then(pl.lit("compute"))
            .otherwise(pl.lit("mixed")))


def long(res: Result) -> pl.DataFrame:
    """Every metric per rank, phase and scope as rows: ``rank, domain, phase, scope, metric, name, unit, mean,
    samples, instances, short, note`` (``--table gpu_metrics``)."""
    p = phases(res)
    if p.height == 0:
        return pl.DataFrame(schema={"rank": pl.Int64, "domain": pl.String, "phase": pl.String, "scope": pl.String,
                                    "metric": pl.String, "mean": pl.Float64})
    ms = _metric_names(res)
    names = pl.concat([s.metrics for s in _samples(res).values()]).unique("metric", keep="first")
    return (p.unpivot(on=ms, index=["rank", "domain", "phase", "scope", "samples", "instances", "short", "note"],
                      variable_name="metric", value_name="mean")
            .join(names, on="metric", how="left")
            .select("rank", "domain", "phase", "scope", "metric", "name", "unit", "mean", "samples", "instances",
                    "short", "note"))


def seams(res: Result) -> pl.DataFrame:
    """Per seam (``parent, from, to``) of the steady state, all ranks: the main metrics over the gaps between
    consecutive phases (``[end of from, start of to)``), as :func:`phases`; empty without samples."""
    got = _samples(res)
    s = steady_tables.steady_seam_instances(res)
    if not got or s.height == 0 or "a" not in s.columns:
        return pl.DataFrame()
    rep = pl.col("report").cast(pl.Int64) if "report" in s.columns else pl.lit(0, pl.Int64)
    parents = res.instances.filter(pl.col("rank").is_not_null()).select("rank", parent="range_id",
                                                                        _parent="range")
    spans = s.filter(pl.col("b") > pl.col("a")).join(parents, on=["rank", "parent"], how="left").select(
        "rank", rep.alias("report"), pl.col("_parent").alias("parent"), pl.col("prev_range").alias("from"),
        pl.col("range").alias("to"), start="a", end="b")
    m = _measure(res, spans, got)
    if m.height == 0:
        return pl.DataFrame()
    ms = _metric_names(res)
    out = _aggregate(m, ["parent", "from", "to"], ms)
    return (_finish(out, ms, period_ns(res), ("parent", "from", "to"))
            .sort("sampled_ns", "parent", "from", "to", descending=[True, False, False, False], nulls_last=True))
