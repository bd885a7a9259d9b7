"""Per-rank, per-phase time: span = compute + comm + idle, per instance and summed.

Small pure functions over the frames of :mod:`analyze.attribute`. ``ops`` carries ``range_id`` (the
innermost selected range) and ``comm`` (communication family or null).
"""

from __future__ import annotations

import dataclasses

import polars as pl

from ..model import bound_expr
from ..read import packed_keys
from . import host
from .intervals import busy_between, busy_function, group_parts, one_group, union_blocks, union_length
from .scalars import to_int

__all__ = ["ranks", "instance_metrics", "measure_instances", "spread", "sum_phases", "projections",
           "add_gpu_idle", "gpu_blocks", "measure_seams", "sum_seams", "coverage"]

_METRICS = ("span_ns", "busy_ns", "compute_ns", "comm_ns", "idle_ns", "kernel_ns", "ops", "launches")


def ranks(ops: pl.DataFrame, devices: pl.DataFrame) -> pl.DataFrame:
    """One rank per process with GPU work, numbered in device order: ``rank, pid, device, ...``."""
    length = (pl.col("end") - pl.col("start")).sum()
    if one_group(["pid", "device"], ops):  # one process on one device (the usual body): sums, no group-by
        per_device = ops.select(pl.col("pid", "device").first(), n=pl.len(), kernel_ns=length)
    else:
        per_device = ops.lazy().group_by("pid", "device").agg(n=pl.len(), kernel_ns=length).collect()
    per = per_device.sort("pid", "n", "device", descending=[False, True, False]).group_by("pid").agg(
        device=pl.col("device").first(),  # the most used device (the lowest on a tie)
        devices=pl.col("device").sort(),
        gpu_ops=pl.col("n").sum().cast(pl.UInt32),
        kernel_ns=pl.col("kernel_ns").sum(),
    )
    per = per.sort("device", "pid").with_columns(rank=pl.int_range(pl.len()).cast(pl.Int64))
    per = per.join(devices, on="device", how="left")
    return per.select("rank", "pid", "device", "device_name", "devices", "gpu_ops", "kernel_ns")


def _parts(rows: pl.DataFrame, key: str) -> pl.DataFrame:
    """``rows`` (``key, start, end, _c``: communication or not; sorted by start) with ``_p``/``_q``: each row's
    share of its group's busy and communication union lengths (:func:`analyze.compute.intervals.group_parts`)."""
    # A stable sort by key keeps each group's rows in start order: groups contiguous, no windows. Ops sorted by
    # start usually are by range too (ranges follow each other): then the sort would only copy them.
    k = rows[key]
    if not (k.null_count() == 0 and k.is_sorted()):
        rows = rows.sort(key, maintain_order=True)
    else:  # flagged sorted: the group-bys over the result then take polars' sorted path (a third less CPU)
        rows = rows.with_columns(pl.col(key).set_sorted())
    parts = group_parts(rows, key, only="_c")
    if parts is None:  # times too wide for the shift: one window per group
        past = pl.col("end") - pl.max_horizontal(pl.col("start"), pl.col("end").shift(1).cum_max().over(key))
        past_comm = pl.col("end") - pl.max_horizontal(pl.col("start"), pl.col("end").shift(1).cum_max().over(key, "_c"))
        parts = rows.with_columns(_p=past.clip(lower_bound=0),
                                  _q=pl.when("_c").then(past_comm.clip(lower_bound=0)).otherwise(0))
    return parts


def _is_comm(ops: pl.DataFrame) -> pl.Expr:
    """Whether an op is communication: its ``_c`` flag where ``ops`` have one, else a ``comm`` family."""
    return pl.col("_c") if "_c" in ops.columns else pl.col("comm").is_not_null()


def _sums() -> dict[str, pl.Expr]:
    """The per-instance aggregates that are plain sums and extremes of its ops."""
    return dict(first=pl.col("start").min(), last=pl.col("end").max(), kernel_ns=(pl.col("end") - pl.col("start")).sum(),
                ops=pl.len())


def _launches(per_call: pl.DataFrame, key: str) -> pl.LazyFrame:
    """``launches`` and ``first_launch`` per ``key`` from the ops' launching calls (one row a call)."""
    return (per_call.lazy().filter(pl.col(key).is_not_null()).group_by(key)
            .agg(launches=pl.len(), first_launch=pl.col("api_start").min()))


def instance_metrics(ops: pl.DataFrame, key: str, per_call: pl.DataFrame | None = None) -> pl.DataFrame:
    """Metrics of each group of ops keyed by ``key`` (a range instance): first/last op, span, busy, ...,
    and ``first_launch`` (the start of the earliest CUDA API call that launched one of them).

    ``ops`` must be sorted by start. Busy and comm are union lengths: each op adds the part of it
    past the latest end of earlier ops in its group (communication ops among themselves). Communication ops are
    those with a ``comm`` family, or with ``_c`` true when ``ops`` have that flag instead. ``per_call``: the ops'
    launching calls (:func:`analyze.compute.attribute.per_call`, keyed by ``key``): ``launches`` and
    ``first_launch`` are then counted per call, not per op.
    """
    is_comm, sums = _is_comm(ops), _sums()
    unions = dict(busy_ns=pl.col("_p").sum(), comm_ns=pl.col("_q").sum())
    if per_call is not None:  # the launches and their first start from the calls (one row each)
        rows = ops.select(key, "start", "end", _c=is_comm).filter(pl.col(key).is_not_null())
        return (_parts(rows, key).lazy().group_by(key).agg(**sums, **unions)
                .join(_launches(per_call, key), on=key, how="left")
                .select(key, *sums, "launches", *unions, "first_launch")
                .pipe(_derived).collect())
    launch = pl.col("api_start") if "api_start" in ops.columns else pl.lit(None, pl.Int64).alias("api_start")
    rows = ops.select(key, "start", "end", "corr", launch, _c=is_comm).filter(pl.col(key).is_not_null())
    return (
        _parts(rows, key).lazy()
        .group_by(key)
        .agg(**sums, launches=pl.col("corr").n_unique(), **unions, first_launch=pl.col("api_start").min())
        .pipe(_derived)
        .collect()
    )


def _derived(lf: pl.LazyFrame) -> pl.LazyFrame:
    return (lf.with_columns(span_ns=pl.col("last") - pl.col("first"))
            .with_columns(compute_ns=pl.col("busy_ns") - pl.col("comm_ns"), idle_ns=pl.col("span_ns") - pl.col("busy_ns")))


def measure_instances(nested: pl.DataFrame, ops: pl.DataFrame, anc: pl.DataFrame,
                      per_call: pl.DataFrame | None = None) -> pl.DataFrame:
    """Every selected range instance with its exclusive (``x_``) and inclusive (``i_``) metrics.

    Exclusive: the ops whose innermost selected range it is (the phase view). Inclusive: the ops
    launched anywhere inside it, nested ranges included (NVIDIA's projection). ``per_call``: as in
    :func:`instance_metrics`. The ops of one process sorted by start: an instance whose ops are one run of rows
    that no earlier op reaches into has its union lengths from running sums over all the ops (:func:`_prefix`,
    one pass for every instance and both views) instead of worked out op by op.
    """
    pre = (_prefix(ops) if ops.height and one_group(["pid"], ops) and ops["start"].is_sorted()
           and not ops["end"].null_count() else None)
    if pre is None:
        ex, spans = instance_metrics(ops, "range_id", per_call), None
    else:
        ex, spans = _exclusive(ops, per_call, pre)
    # Inclusive metrics differ from exclusive ones only for ranges with selected children: compute
    # those from their whole subtree, and copy the exclusive ones for leaves.
    proper = anc.filter(pl.col("anc") != pl.col("range_id"))
    internal = proper.select(pl.col("anc").alias("range_id")).unique()
    sub = pl.concat([proper, internal.with_columns(anc=pl.col("range_id"))])
    # Counts, sums, first and last add up over the subtree's exclusive rows (launches too: the ops of one
    # launching call share its range); only the union lengths need the ops themselves.
    added = (ex.join(sub, on="range_id").group_by("anc")
             .agg(pl.col("first").min(), pl.col("last").max(), pl.col("kernel_ns", "ops", "launches").sum(),
                  pl.col("first_launch").min()))
    if spans is None or pre is None:
        unions = _inclusive_unions(nested, ops, sub)
    else:  # a subtree's ops that are one run of rows from the running sums, the others (if any) op by op
        ends = spans.join(sub, on="range_id").group_by("anc").agg(pl.col("lo").min(), pl.col("hi").max())
        unions, crowded = _prefix_unions(pre, added.select(range_id="anc", a="first", n="ops").join(
            ends.rename({"anc": "range_id"}), on="range_id", how="left"))
        if crowded.len():
            unions = pl.concat([unions, _inclusive_unions(nested, ops, sub.filter(pl.col("anc").is_in(crowded.implode())))])
    inner = (added.rename({"anc": "range_id"}).join(unions, on="range_id", how="left").lazy().pipe(_derived)
             .collect().select(ex.columns))
    is_internal = pl.col("range_id").is_in(internal["range_id"].implode())
    inc = pl.concat([ex.filter(~is_internal), inner], how="vertical_relaxed")
    cols = ["first", "last", *_METRICS, "first_launch"]
    out = (
        nested.join(ex.select("range_id", *[pl.col(c).alias(f"x_{c}") for c in cols]), on="range_id", how="left")
        .join(inc.select("range_id", *[pl.col(c).alias(f"i_{c}") for c in cols]), on="range_id", how="left")
    )
    return out.with_columns(pl.col(f"x_{c}").fill_null(0) for c in _METRICS).with_columns(
        pl.col(f"i_{c}").fill_null(0) for c in _METRICS
    )


@dataclasses.dataclass
class _Prefix:
    """Running sums over one process's ops sorted by start: ``reach``, the latest end up to each op; ``busy``, the
    union length of the ops up to each op, each op adding the part of it past the latest end before it (the
    per-group shares of :func:`group_parts`, with the whole process as one group); ``comm``, the same over the
    communication ops alone, which are the ops at positions ``comm_at``."""

    reach: pl.Series
    busy: pl.Series
    comm_at: pl.Series
    comm: pl.Series


def _running_union(rows: pl.DataFrame, reach: pl.Series) -> pl.Series:
    """The running union length of ``rows`` (sorted by start; ``reach``: the running maximum of their ends)."""
    past = pl.col("end") - pl.max_horizontal(pl.col("start"), pl.lit(reach).shift(1))
    return rows.select(past.clip(lower_bound=0).cum_sum()).to_series()


def _prefix(ops: pl.DataFrame) -> _Prefix:
    reach = ops["end"].cum_max()
    comm = ops.with_row_index("_i").select("_i", "start", "end", _c=_is_comm(ops)).filter("_c")
    return _Prefix(reach, _running_union(ops, reach), comm["_i"].cast(pl.Int64).set_sorted(),
                   _running_union(comm, comm["end"].cum_max()))


def _prefix_unions(pre: _Prefix, w: pl.DataFrame) -> tuple[pl.DataFrame, pl.Series]:
    """``busy_ns`` and ``comm_ns`` of each group of ops in ``w`` (``range_id``; ``a``: its first start; ``lo``, ``hi``:
    the positions of its first and last op among the process's ops; ``n``: its op count) whose ops are one run of
    rows that no earlier op reaches into, and the ``range_id`` of the others.

    The union of such a run is the difference of the running union lengths at its ends: every earlier op ends by
    its first start, so the running maximum restarts there as it would in a group of its own (so does the
    communication ops' maximum: they are some of the ops)."""
    lo, hi = w["lo"].cast(pl.Int64), w["hi"].cast(pl.Int64)
    w = w.with_columns(
        _lo=lo, _hi=hi,
        _k=pre.comm_at.search_sorted(lo, "left").cast(pl.Int64),  # the run's communication ops: rows _k .. _m - 1
        _m=pre.comm_at.search_sorted(hi, "right").cast(pl.Int64))

    def before(v: pl.Series, i: str) -> pl.Expr:  # the running value just before row i (0 before the first)
        if v.len() == 0:  # (no communication op: every run has none)
            return pl.lit(0, pl.Int64)
        return pl.when(pl.col(i) > 0).then(pl.lit(v).gather((pl.col(i) - 1).clip(lower_bound=0))).otherwise(0)

    w = w.with_columns(_run=((pl.col("_hi") - pl.col("_lo") + 1) == pl.col("n").cast(pl.Int64))
                       & ((pl.col("_lo") == 0) | (before(pre.reach, "_lo") <= pl.col("a"))))
    runs = w.filter("_run").select(
        "range_id",
        busy_ns=pl.lit(pre.busy).gather("_hi") - before(pre.busy, "_lo"),
        comm_ns=before(pre.comm, "_m") - before(pre.comm, "_k"))
    return runs, w.filter(~pl.col("_run"))["range_id"]


def _exclusive(ops: pl.DataFrame, per_call: pl.DataFrame | None, pre: _Prefix) -> tuple[pl.DataFrame, pl.DataFrame]:
    """:func:`instance_metrics` by ``range_id`` of one process's ops sorted by start, the union lengths of each
    instance whose ops are one run of rows from the running sums (:func:`_prefix_unions`), of the others op by op;
    and each instance's ``lo``, ``hi`` (the positions of its first and last op)."""
    key = "range_id"
    is_comm, sums = _is_comm(ops), _sums()
    if per_call is None:
        launch = pl.col("api_start") if "api_start" in ops.columns else pl.lit(None, pl.Int64)
        rows = ops.with_row_index("_i").select(key, "start", "end", "_i", "corr", _l=launch, _c=is_comm)
        counted = dict(launches=pl.col("corr").n_unique(), first_launch=pl.col("_l").min())
    else:
        rows = ops.with_row_index("_i").select(key, "start", "end", "_i", _c=is_comm)
        counted = {}
    rows = rows.filter(pl.col(key).is_not_null())
    k = rows[key]
    grouped = rows.with_columns(pl.col(key).set_sorted()) if k.null_count() == 0 and k.is_sorted() else rows
    agg = grouped.lazy().group_by(key).agg(**sums, **counted, lo=pl.col("_i").min(), hi=pl.col("_i").max()).collect()
    unions, crowded = _prefix_unions(pre, agg.select(key, "lo", "hi", a="first", n="ops"))
    if crowded.len():
        few = _parts(rows.filter(pl.col(key).is_in(crowded.implode())).drop("_i"), key)
        unions = pl.concat([unions, few.group_by(key).agg(busy_ns=pl.col("_p").sum(), comm_ns=pl.col("_q").sum())])
    lf = agg.lazy().join(unions.lazy(), on=key, how="left")
    if per_call is not None:
        lf = lf.join(_launches(per_call, key), on=key, how="left")
    ex = lf.select(key, *sums, "launches", "busy_ns", "comm_ns", "first_launch").pipe(_derived).collect()
    return ex, agg.select(key, "lo", "hi")


def _inclusive_unions(nested: pl.DataFrame, ops: pl.DataFrame, sub: pl.DataFrame) -> pl.DataFrame:
    """``busy_ns`` and ``comm_ns`` (union lengths) of the ops of each internal range's subtree (``sub``: its
    ``range_id, anc`` pairs, ``anc`` the internal range): an op counts towards each internal range around it.

    A range has one ancestor-or-self at each depth of the nesting, so the ops are keyed once per depth by a gather
    (range ids index an array), each depth's rows still in start order: no join that repeats each op per ancestor
    and no sort. A join when ids are too large for an array (or the depths do not say the nesting)."""
    is_comm = _is_comm(ops)
    agg = dict(busy_ns=pl.col("_p").sum(), comm_ns=pl.col("_q").sum())
    levels = sub.join(nested.select(anc="range_id", _d="depth"), on="anc", how="left")
    hi = max(to_int(nested["range_id"].max() or 0), to_int(ops["range_id"].max() or 0),
             to_int(sub["range_id"].max() or 0))
    depths = levels["_d"].unique().sort().to_list()
    if (levels["_d"].null_count() == 0 and to_int(levels["range_id"].min() or 0) >= 0 and hi < _DENSE_RANGES
            and not levels.select(pl.struct("range_id", "_d").is_duplicated().any()).item()):
        parts = []
        for d in depths:
            at = levels.filter(pl.col("_d") == d)
            table = pl.Series([None], dtype=pl.Int64).extend_constant(None, hi).scatter(at["range_id"], at["anc"])
            rows = (ops.select("start", "end", range_id=pl.lit(table).gather(pl.col("range_id")), _c=is_comm)
                    .filter(pl.col("range_id").is_not_null()))
            parts.append(_parts(rows, "range_id").group_by("range_id").agg(**agg))
        return pl.concat(parts) if parts else pl.DataFrame(schema={"range_id": pl.Int64, "busy_ns": pl.Int64,
                                                                   "comm_ns": pl.Int64})
    inc_ops = (  # one plan: only the columns it keeps are filtered and joined
        ops.lazy().filter(pl.col("range_id").is_not_null())
        .join(sub.lazy(), on="range_id", maintain_order="left")  # keeps ops sorted by start
        .select("start", "end", range_id="anc", _c=is_comm)
        .collect()
    )
    return _parts(inc_ops, "range_id").group_by("range_id").agg(**agg)


_DENSE_RANGES = 1 << 21  # range ids below this index an array (16 MB at most) in _inclusive_unions


def _sum_metrics(prefix: str) -> list[pl.Expr]:
    return [pl.col(f"{prefix}{c}").sum().alias(c) for c in _METRICS]


# Per-instance figures that get a mean, p50 and p90 over instances (``span_mean_ns``, ``span_p50_ns``, ...).
_STAT_METRICS = ("span", "compute", "comm", "idle", "gpu_idle")


def spread(col: str, name: str) -> list[pl.Expr]:
    """Mean, median and 90th percentile (nearest rank) of ``col`` as ``{name}_mean_ns`` etc."""
    c = pl.col(col)
    return [c.mean().alias(f"{name}_mean_ns"), c.median().alias(f"{name}_p50_ns"),
            c.quantile(0.9, "nearest").alias(f"{name}_p90_ns")]


def sum_phases(inst: pl.DataFrame, by: tuple[str, ...] = ("rank",)) -> pl.DataFrame:
    """Per rank (``by``) and phase name, summed over the instances that received GPU work (exclusive view),
    with each per-instance figure's mean, p50 and p90."""
    x = inst.filter(pl.col("x_ops") > 0)
    return (
        x.group_by(*by, "domain", "range")
        .agg(
            pl.len().alias("instances"),
            *_sum_metrics("x_"),
            pl.col("x_gpu_idle_ns").sum().alias("gpu_idle_ns"),
            *[e for m in _STAT_METRICS for e in spread(f"x_{m}_ns", m)],
            span_max_ns=pl.col("x_span_ns").max(),
        )
        .rename({"range": "phase"})
        .sort(*by, "span_ns", "domain", "phase", descending=[False] * len(by) + [True, False, False])
    )


def projections(inst: pl.DataFrame) -> pl.DataFrame:
    """Per rank and range name, NVIDIA-style inclusive projection: instances with GPU work, span sums."""
    i = inst.filter(pl.col("i_ops") > 0)
    return (
        i.group_by("rank", "domain", "range")
        .agg(
            pl.len().alias("instances"),
            pl.col("i_span_ns").sum().alias("proj_span_ns"),
            *[pl.col(f"i_{c}").sum().alias(c) for c in _METRICS if c != "span_ns"],
            pl.col("i_gpu_idle_ns").sum().alias("gpu_idle_ns"),
            (pl.col("end") - pl.col("start")).sum().alias("range_ns"),
        )
        .join(
            inst.group_by("rank", "domain", "range").agg(range_instances=pl.len()),
            on=["rank", "domain", "range"],
        )
        .sort("rank", "proj_span_ns", "domain", "range", descending=[False, True, False, False])
    )


def add_gpu_idle(inst: pl.DataFrame, blocks: pl.DataFrame) -> pl.DataFrame:
    """Add ``x_gpu_idle_ns``/``i_gpu_idle_ns``: the part of each span in which the GPU ran nothing at all.

    ``idle_ns`` counts gaps between the phase's own ops; some of those gaps may be filled by other
    work (another phase's ops on another stream, other threads). ``gpu_idle_ns <= idle_ns``.
    """
    # Both views' windows in one query: exclusive rows first, then the inclusive ones that differ (a leaf's are the
    # same window: its exclusive busy time is its inclusive one).
    win = [inst.select("pid", a=pl.col(f"{p}_first").fill_null(0), b=pl.col(f"{p}_last").fill_null(0))
           for p in ("x", "i")]
    other = (win[0]["a"] != win[1]["a"]) | (win[0]["b"] != win[1]["b"])
    at = other.arg_true()
    busy = busy_between(blocks, pl.concat([win[0], win[1].filter(other)]), ["pid"], "a", "b", "_all")
    busy_ns = busy.collect()["_all"]
    n = inst.height
    x_busy = busy_ns.slice(0, n)
    i_busy = x_busy.clone().scatter(at, busy_ns.slice(n, at.len())) if at.len() else x_busy
    return inst.with_columns(
        (pl.col(f"{p}_span_ns") - b).clip(lower_bound=0).alias(f"{p}_gpu_idle_ns")
        for p, b in (("x", x_busy), ("i", i_busy))
    )


def gpu_blocks(ops: pl.DataFrame) -> pl.DataFrame:
    """Per process, the disjoint intervals in which its GPU ran anything (ops sorted by start).

    With ``before`` (busy time of the process's earlier blocks), ready for repeated window queries.
    """
    return busy_function(union_blocks(ops, ["pid"], presorted=True).collect(), ["pid"]).collect()


def measure_seams(inst: pl.DataFrame, blocks: pl.DataFrame) -> pl.DataFrame:
    """Each transition between consecutive sibling ranges with GPU work, on the GPU.

    The window runs from the last op of the earlier sibling to the first op of the next (inclusive
    views). ``idle_ns`` is the part of it in which the rank's GPU ran nothing at all; ``busy_ns``
    is other work in it; ``overlap_ns`` is how far the next one started before the earlier ended.
    """
    # Sorted by (thread, parent): the previous row is the previous sibling when it has the same thread and parent.
    same = pl.col("gtid").eq_missing(pl.col("gtid").shift(1)) & pl.col("parent").eq_missing(pl.col("parent").shift(1))
    sib = (
        inst.filter(pl.col("i_ops") > 0)
        .select("rank", "pid", "gtid", "parent", "range_id", "start", "range", "i_first", "i_last")
        .sort("gtid", "parent", "start")
        .with_columns(
            prev_range=pl.when(same).then(pl.col("range").shift(1)),
            a=pl.when(same).then(pl.col("i_last").shift(1)),
            prev_range_id=pl.when(same).then(pl.col("range_id").shift(1)),
        )
        .filter(pl.col("a").is_not_null())
        .select("rank", "pid", "parent", "prev_range_id", "range_id", "prev_range", "range", "a", b="i_first")
    )
    out = busy_between(blocks, sib, ["pid"], "a", "b", "busy_ns").collect()
    return out.with_columns(
        gap_ns=(pl.col("b") - pl.col("a")).clip(lower_bound=0),
        overlap_ns=(pl.col("a") - pl.col("b")).clip(lower_bound=0),
    ).with_columns(idle_ns=pl.col("gap_ns") - pl.col("busy_ns"))


def sum_seams(seam_inst: pl.DataFrame, inst: pl.DataFrame) -> pl.DataFrame:
    """Seams summed per rank and transition (parent, from, to), with their causes when the instances have them
    (:func:`analyze.compute.host.seam_causes`: ``bound`` and per-cause time)."""
    # A seam's parent runs on its thread, so in its process and rank: (rank, parent) also tells merged reports apart.
    parents = inst.filter(pl.col("rank").is_not_null()).select("rank", parent="range_id", parent_range="range")
    causes = host.seam_aggs() if "cause" in seam_inst.columns else []
    out = (
        packed_keys.join(seam_inst, parents, ["rank", "parent"], how="left")
        .group_by("rank", "parent_range", "prev_range", "range")
        .agg(
            *causes,
            pl.len().alias("instances"),
            *[pl.col(c).sum() for c in ("gap_ns", "idle_ns", "busy_ns", "overlap_ns")],
            *spread("idle_ns", "idle"),
            *spread("gap_ns", "gap"),
            pl.col("idle_ns").max().alias("idle_max_ns"),
        )
        .rename({"parent_range": "parent", "prev_range": "from", "range": "to"})
        .sort("rank", "idle_ns", "parent", "from", "to", descending=[False, True, False, False, False])
    )
    if not causes:
        return out
    names = [e.meta.output_name() for e in causes]  # after the columns every seam row has
    return out.select(pl.exclude(names), *names).with_columns(bound_expr())


def coverage(inst: pl.DataFrame, ops: pl.DataFrame, blocks: pl.DataFrame) -> pl.DataFrame:
    """Per rank: GPU busy time inside the phased window, and how much of it phases received."""
    tops = inst.filter((pl.col("i_ops") > 0) & pl.col("parent").is_null())
    win = tops.group_by("rank", "pid").agg(a=pl.col("i_first").min(), b=pl.col("i_last").max())
    gpu = busy_between(blocks, win, ["pid"], "a", "b", "gpu_ns").collect()
    attributed = ops.select("pid", "range_id", "start", "end").filter(pl.col("range_id").is_not_null())  # 4 columns
    att = union_length(attributed, ["pid"], "attributed_ns", presorted=True).collect()
    return (
        gpu.join(att, on="pid", how="left")
        .with_columns(pl.col("attributed_ns").fill_null(0), window_ns=pl.col("b") - pl.col("a"))
        .select("rank", "pid", "window_ns", "gpu_ns", "attributed_ns")
        .sort("rank")
    )
