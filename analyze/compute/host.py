"""The host side of the timeline, per process: what each seam waited for, and when the host waited on the GPU.

Small pure functions over one process's frames (:func:`analyze.compute.pipeline.process` calls them):
its GPU ``ops`` (attributed: ``range_id``, ``api_start``) and its CUDA API calls ``api``
(``pid, gtid, corr, start, end, name_id``).

- **Seam causes.** For each transition between sibling ranges (:func:`analyze.compute.breakdown.measure_seams`:
  the earlier one's last GPU op ends at ``a``, the next one's first GPU op starts at ``b``), the API call
  that launched the op at ``b`` says why the GPU waited:

  - ``gpu``: the call had returned by ``a`` (the op was queued before the earlier work ended: the gap
    is device-side);
  - ``launch``: the call began before ``a`` but returned after it (a slow or blocked launch);
    ``block_ns`` = its end − ``a``;
  - ``host``: the call began after ``a`` (the CPU was late); ``late_ns`` = its start − ``a``.

- **Host waits.** A sync-like call (:data:`analyze.model.SYNC_API`: stream/device/event synchronize, synchronous
  memcpy/memset) waits for the GPU work launched before it (same process, any stream: ``wait_end``
  = the latest end of the ops launched by calls that started no later than it). Its wait is the part
  of the call before that work ended: ``clip(min(wait_end, end) − start, 0)``.

- **Key calls** (``Result.host_calls``): the calls the what-if replays (:mod:`analyze.compute.whatif`):
  each range instance's first launch (the call of its earliest GPU op), every sync-like call and
  every graph launch, with what they launched (``unit``, ``ops``) or waited for (``wait_end``).
"""

from __future__ import annotations

import polars as pl

from ..model import SEAM_CAUSES
from .attribute import innermost
from .intervals import rising

__all__ = ["CALL_SCHEMA", "calls", "add_instance_cols", "seam_causes", "seam_aggs", "phase_host"]

CALL_SCHEMA = pl.Schema({"pid": pl.Int64, "gtid": pl.Int64, "corr": pl.Int64, "start": pl.Int64, "end": pl.Int64,
                         "name_id": pl.Int64, "sync": pl.Boolean, "graph": pl.Boolean, "unit": pl.Int64,
                         "ops": pl.UInt32, "range_id": pl.Int64, "wait_end": pl.Int64, "wait_range_id": pl.Int64,
                         "wait_ns": pl.Int64})
_INSTANCE_COLS = ("x_launch_api_ns", "x_host_wait_ns", "x_syncs")


def _per_call(ops: pl.DataFrame) -> pl.DataFrame:
    """One row per launching call (``corr``): its op count, range, start and end, first op start, last op end.

    ``ops`` carry their launching call's ``api_start``/``api_end`` (:func:`analyze.compute.attribute.join_calls`;
    null for an op whose call is not in the trace)."""
    # Lazy: only the six columns it reads go into the group-by (not the whole width of the ops).
    return (ops.lazy().group_by("corr")
            .agg(ops=pl.len().cast(pl.UInt32), range_id=pl.col("range_id").first(), first=pl.col("start").min(),
                 last=pl.col("end").max(), start=pl.col("api_start").first(), end=pl.col("api_end").first())
            .collect())


def _first_launches(per_corr: pl.DataFrame) -> pl.DataFrame:
    """Per range instance with GPU work (exclusive view): its earliest op's start, the call that launched it
    (``corr, launch_start, launch_end``) and ``x_launch_api_ns``, the time in all the calls that launched its
    ops (a call's ops share its range: the innermost one open while it ran)."""
    at = pl.col("first").arg_min()
    return (per_corr.filter(pl.col("range_id").is_not_null()).group_by("range_id")
            .agg(pl.col("first").min(), corr=pl.col("corr").get(at), launch_start=pl.col("start").get(at),
                 launch_end=pl.col("end").get(at), x_launch_api_ns=(pl.col("end") - pl.col("start")).sum()))


def _waits(calls: pl.DataFrame, per_corr: pl.DataFrame) -> pl.DataFrame:
    """``calls`` with ``wait_end`` (latest end of the ops launched by calls that started no later) and
    ``wait_range_id`` (the range of that op), both null before the first launch."""
    launched = per_corr.filter(pl.col("start").is_not_null())
    # Calls in launch order with no two starting together (ids rising with their starts): no sort, no group-by.
    ordered = rising(launched["start"])
    launched = ((launched if ordered else launched.sort("start", "last"))
                .select("start", "range_id", end="last")
                .with_columns(wait_end=pl.col("end").cum_max()))
    launched = launched.with_columns(
        wait_range_id=pl.when(pl.col("end") == pl.col("wait_end")).then("range_id").forward_fill())
    last = (launched.select("start", "wait_end", "wait_range_id") if ordered
            else launched.group_by("start", maintain_order=True).agg(pl.col("wait_end", "wait_range_id").last()))
    return calls.sort("start").join_asof(last.rename({"start": "_s"}), left_on="start", right_on="_s",
                                         strategy="backward", check_sortedness=False).drop("_s")


def calls(ops: pl.DataFrame, api: pl.DataFrame, nested: pl.DataFrame, sync_ids: pl.Series,
          launch_ids: pl.Series, tl: pl.DataFrame | None = None,
          per_call: pl.DataFrame | None = None) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame]:
    """One process's key calls (:data:`CALL_SCHEMA`), the first launch of each range instance
    (:func:`_first_launches`) and per range instance ``x_launch_api_ns``, ``x_host_wait_ns`` and ``x_syncs``
    (its sync-like calls' wait and count). ``tl``: the timeline of ``nested``
    (:func:`analyze.compute.attribute.timeline`) if already made. ``per_call``: the ops' launching calls of
    :func:`analyze.compute.attribute.per_call` if already made (then ``ops`` are not read again)."""
    per_corr = _per_call(ops) if per_call is None else per_call.select(
        "corr", "ops", "range_id", "first", "last", start="api_start", end="api_end")
    firsts = _first_launches(per_corr)
    is_sync, is_graph = pl.col("name_id").is_in(sync_ids.implode()), pl.col("name_id").is_in(launch_ids.implode())
    key = api.filter(is_sync | is_graph | pl.col("corr").is_in(firsts["corr"].implode()))
    mine = per_corr.select("corr", "ops", "range_id").filter(pl.col("corr").is_in(key["corr"].implode()))
    key = (key.join(mine, on="corr", how="left")
           .join(firsts.select("corr", unit="range_id"), on="corr", how="left")
           .with_columns(sync=is_sync, graph=is_graph, ops=pl.col("ops").fill_null(0)))
    # A call that launched nothing (a stream synchronize) belongs to the range open around it.
    bare = key.filter(pl.col("range_id").is_null())
    if bare.height:
        open_at = innermost(bare.select("pid", "gtid", "corr", "start", "end"), nested, tl).select("corr", _open="range_id")
        key = key.join(open_at, on="corr", how="left").with_columns(range_id=pl.coalesce("range_id", "_open"))
    key = _waits(key, per_corr).with_columns(
        wait_ns=pl.when("sync").then((pl.min_horizontal("wait_end", "end") - pl.col("start")).clip(lower_bound=0))
        .otherwise(0).fill_null(0))
    key = key.select(list(CALL_SCHEMA)).cast(CALL_SCHEMA).sort("start")
    waited = (key.filter(pl.col("sync") & pl.col("range_id").is_not_null()).group_by("range_id")
              .agg(x_host_wait_ns=pl.col("wait_ns").sum(), x_syncs=pl.len().cast(pl.UInt32)))
    per_inst = firsts.select("range_id", "x_launch_api_ns").join(waited, on="range_id", how="full", coalesce=True)
    return key, firsts.drop("x_launch_api_ns"), per_inst


def add_instance_cols(inst: pl.DataFrame, per_inst: pl.DataFrame | None) -> pl.DataFrame:
    """``inst`` with :data:`_INSTANCE_COLS` (0 where a range launched nothing and waited for nothing)."""
    if per_inst is None:
        per_inst = pl.DataFrame(schema={"range_id": pl.Int64, "x_launch_api_ns": pl.Int64,
                                        "x_host_wait_ns": pl.Int64, "x_syncs": pl.UInt32})
    out = inst.join(per_inst, on="range_id", how="left")
    return out.with_columns(pl.col(c).fill_null(0) for c in _INSTANCE_COLS)


def seam_causes(seam: pl.DataFrame, firsts: pl.DataFrame) -> pl.DataFrame:
    """Seam instances with ``cause`` (gpu/launch/host, null when the launch is unknown), ``launch_start``,
    ``launch_end`` (the call that launched the next range's first op), ``block_ns`` and ``late_ns``."""
    at_b = firsts.select("first", "launch_start", "launch_end").sort("first", "launch_start").unique(
        "first", keep="first")
    out = seam.join(at_b, left_on="b", right_on="first", how="left")
    ls, le, a = pl.col("launch_start"), pl.col("launch_end"), pl.col("a")
    cause = (pl.when(ls.is_null() | le.is_null()).then(None).when(le <= a).then(pl.lit("gpu"))
             .when(ls <= a).then(pl.lit("launch")).otherwise(pl.lit("host")))
    return out.with_columns(
        cause=cause,
        block_ns=pl.when(cause == "launch").then(le - a).otherwise(0),
        late_ns=pl.when(cause == "host").then(ls - a).otherwise(0),
    )


def seam_aggs() -> list[pl.Expr]:
    """Per-cause aggregates of seam instances: idle time and count by cause, block and late time."""
    out = []
    for c in SEAM_CAUSES:
        out += [pl.col("idle_ns").filter(pl.col("cause") == c).sum().alias(f"{c}_bound_ns"),
                (pl.col("cause") == c).sum().cast(pl.UInt32).alias(f"{c}_bound_inst")]
    return out + [pl.col("block_ns").sum().alias("launch_block_ns"), pl.col("late_ns").sum().alias("host_late_ns")]


def phase_host(inst: pl.DataFrame) -> pl.DataFrame:
    """Per rank and phase: time in launching API calls, host wait in sync-like calls and their count."""
    return (inst.group_by("rank", "domain", "range")
            .agg(launch_api_ns=pl.col("x_launch_api_ns").sum(), host_wait_ns=pl.col("x_host_wait_ns").sum(),
                 syncs=pl.col("x_syncs").sum().cast(pl.Int64))
            .rename({"range": "phase"}))
