"""The cycle budget: where one steady cycle goes, cut into pieces that add up to the cycle period exactly.

**Cycle budget** (:func:`budget`): per rank, the mean steady cycle cut into consecutive pieces on the
GPU clock that add up to the cycle period exactly (previous cycle's last GPU op → this cycle's last): the
gap between cycles (previous cycle's last op → this cycle's first op, less any prefill), the prefill
batches that ran in that gap (``prefill``: first → last GPU op of each), each phase inside the cycle (first
→ last GPU op of what it launched), each seam between consecutive phases (last op of one → first op of the
next; negative when they overlap), and the cycle's head and tail (cycle's first op → first phase, last
phase → cycle's last op). :func:`cycle_pieces` has the same pieces for every cycle (a table, kept with the
result), :func:`mean_budget` their mean over any set of cycles (a class of slower cycles, a segment).
"""

from __future__ import annotations

import polars as pl

from ..model import Result
from ..read import packed_keys
from . import view
from .cycles import cycles, prefill_rows
from .payload import base_expr

__all__ = ["kind_cycles", "GAP", "PIECES", "BUDGET", "STEADY_KEYS", "main_cycles", "cycle_pieces", "budget", "steady_keys",
           "mean_budget"]

GAP = "between cycles"

_PIECE_KIND = pl.Enum(["gap", "prefill", "head", "phase", "seam", "tail"])
# The tables' columns (an empty one's too). segment/item: a handful of names repeated for every cycle:
# categorical (a third of the strings' memory).
PIECES: dict[str, pl.DataType | type[pl.DataType]] = {
    "rank": pl.Int64, "key": pl.Int64, "segment": pl.Categorical, "item": pl.Categorical, "kind": _PIECE_KIND,
    "order": pl.Float64, "ns": pl.Float64, "compute_ns": pl.Float64, "comm_ns": pl.Float64, "idle_ns": pl.Float64,
    "gpu_idle_ns": pl.Float64}
BUDGET = {"rank": pl.Int64, "segment": pl.String, "kind": pl.String, "order": pl.Float64, "ns": pl.Float64,
                  "share": pl.Float64, "compute_ns": pl.Float64, "comm_ns": pl.Float64, "idle_ns": pl.Float64,
                  "gpu_idle_ns": pl.Float64, "cycles": pl.UInt32}
STEADY_KEYS = pl.Schema({"rank": pl.Int64, "key": pl.Int64})
_PREFILL = "prefill"


def kind_cycles(res: Result) -> pl.DataFrame:
    """Every cycle per rank of the trace's cycle kind (the commonest: ``cycle`` ranges, else the inferred ones)."""
    c = cycles(res)
    if c.height == 0:
        return c
    main = c["kind"].mode().sort()[0]
    return c.filter(pl.col("kind") == main)


def main_cycles(res: Result) -> pl.DataFrame:
    """The cycles of the trace's cycle kind that have a period (every one but each rank's first)."""
    return kind_cycles(res).filter(pl.col("period_ns").is_not_null())


@view.table()
def cycle_pieces(res: Result) -> pl.DataFrame:
    """Every cycle with a period cut into consecutive pieces on its rank's GPU clock that add up to its period
    exactly (module docstring): ``rank, key, segment, item, kind, order, ns, compute_ns, comm_ns, idle_ns,
    gpu_idle_ns``; ``kind``: gap (between cycles), prefill, head, phase, seam, tail; ``item``: the piece by base
    names (``verify``, ``seam:draft→verify``), the same across traces whatever the ranges' prefix."""
    c = main_cycles(res)
    if c.height == 0:
        return pl.DataFrame(schema=PIECES)
    cyc_e = c.select("rank", "key", cycle_id="range_id", cycle_range="range", cycle_first="i_first",
                     cycle_last="i_last", lead_ns="lead_ns", prefill_ns="prefill_ns")
    # the columns the pieces and prefill_rows use, then the rows (a filter copies every column it is given)
    inst_e = (res.instances.select("rank", "range_id", "parent", "range", "start", "i_ops", "i_first", "i_last",
                                   "i_span_ns", "i_busy_ns", "i_comm_ns", "i_idle_ns", "i_gpu_idle_ns")
              .filter((pl.col("i_ops") > 0) & pl.col("rank").is_not_null()))
    # a handful of prefills, each on the cycle that ran next (a rank's first cycle has no period: its prefill
    # is no piece)
    pre = prefill_rows(inst_e, cycles(res)).join(cyc_e.select("rank", "cycle_id"), on=["rank", "cycle_id"],
                                                  how="semi")
    # One lazy plan for the rest (a few hundred thousand rows at 10 M kernels): polars runs the branches together.
    cyc, inst = cyc_e.lazy(), inst_e.lazy()
    kids = (inst.join(cyc.select("rank", parent="cycle_id"), on=["rank", "parent"], how="semi")
            .select("rank", "range_id", cycle_id="parent", name="range", start="start", gpu_first="i_first",
                    gpu_last="i_last",
                    compute=pl.col("i_busy_ns") - pl.col("i_comm_ns"), comm="i_comm_ns", idle="i_idle_ns",
                    gpu_idle="i_gpu_idle_ns"))
    # A cycle without child phases is one piece: itself (a baseline decode step).
    alone = (cyc.join(kids.select("rank", "cycle_id").unique(), on=["rank", "cycle_id"], how="anti")
             .join(inst.select("rank", cycle_id="range_id", start="start",
                               compute=pl.col("i_busy_ns") - pl.col("i_comm_ns"),
                               comm="i_comm_ns", idle="i_idle_ns", gpu_idle="i_gpu_idle_ns"), on=["rank", "cycle_id"])
             .select("rank", range_id="cycle_id", cycle_id="cycle_id", name="cycle_range", start="start",
                     gpu_first="cycle_first", gpu_last="cycle_last",
                     compute="compute", comm="comm", idle="idle", gpu_idle="gpu_idle"))
    kids = pl.concat([kids, alone], how="vertical_relaxed").sort("rank", "cycle_id", "start")
    # Sorted by cycle: a child's position and its previous sibling are read off the rows (no window per cycle).
    same = (pl.col("rank") == pl.col("rank").shift(1)) & (pl.col("cycle_id") == pl.col("cycle_id").shift(1))
    i = pl.int_range(pl.len())
    kids = kids.with_columns(pos=i - pl.when(~same.fill_null(False)).then(i).forward_fill()).cache()
    none = pl.lit(None, pl.Float64)
    ph = kids.select("rank", "cycle_id", segment="name", item=base_expr("name"), kind=pl.lit("phase"),
                     order=2.0 * pl.col("pos"),
                     ns=(pl.col("gpu_last") - pl.col("gpu_first")).cast(pl.Float64), compute_ns="compute",
                     comm_ns="comm",
                     idle_ns="idle", gpu_idle_ns="gpu_idle")
    # Seams between consecutive children: gpu_first(next) − gpu_last(previous), signed, so pieces telescope.
    nxt = (kids.with_columns(prev_name=pl.when(same).then(pl.col("name").shift(1)),
                             prev_base=pl.when(same).then(base_expr("name").shift(1)),
                             prev_gpu_last=pl.when(same).then(pl.col("gpu_last").shift(1)))
           .filter(pl.col("prev_gpu_last").is_not_null()))
    si = res.seam_instances
    idle_of = (si.select("rank", "range_id", seam_gpu_idle="idle_ns") if si.height else
               pl.DataFrame(schema={"rank": pl.Int64, "range_id": pl.Int64, "seam_gpu_idle": pl.Int64})).lazy()
    sm = (nxt.join(idle_of, on=["rank", "range_id"], how="left")
          .select("rank", "cycle_id", segment=pl.format("{} → {}", "prev_name", "name"),
                  item=pl.format("seam:{}→{}", "prev_base", base_expr("name")), kind=pl.lit("seam"),
                  order=2.0 * pl.col("pos") - 1, ns=(pl.col("gpu_first") - pl.col("prev_gpu_last")).cast(pl.Float64),
                  compute_ns=none, comm_ns=none,
                  idle_ns=(pl.col("gpu_first") - pl.col("prev_gpu_last")).clip(lower_bound=0).cast(pl.Float64),
                  gpu_idle_ns=pl.col("seam_gpu_idle").cast(pl.Float64)))
    ends = kids.group_by("rank", "cycle_id").agg(first_child_gpu=pl.col("gpu_first").first(),
                                                 last_child_gpu=pl.col("gpu_last").last(),
                                            first=pl.col("name").first(), last=pl.col("name").last())
    cc = cyc.join(ends, on=["rank", "cycle_id"])
    # The top-level seams from the previous cycle's last op to this cycle's first (through any prefill): the GPU
    # idle between cycles.
    before = cyc.select("rank", "cycle_id", target="cycle_id")
    if pre.height:
        before = pl.concat([before, pre.lazy().select("rank", "cycle_id", target="range_id")])
    between_idle = (si.lazy().filter(pl.col("parent").is_null()).select("rank", target="range_id", seam_idle="idle_ns")
                    .join(before, on=["rank", "target"]).group_by("rank", "cycle_id")
                    .agg(gpu_idle=pl.col("seam_idle").sum())
                    if si.height else pl.LazyFrame(schema={"rank": pl.Int64, "cycle_id": pl.Int64, "gpu_idle": pl.Int64}))
    cc = cc.join(between_idle, on=["rank", "cycle_id"], how="left").cache()
    head = cc.select("rank", "cycle_id", segment=pl.format("cycle start → {}", "first"), item=pl.lit("head"),
                     kind=pl.lit("head"),
                     order=pl.lit(-1.0), ns=(pl.col("first_child_gpu") - pl.col("cycle_first")).cast(pl.Float64),
                     compute_ns=none,
                     comm_ns=none, idle_ns=none, gpu_idle_ns=none)
    tail = cc.select("rank", "cycle_id", segment=pl.format("{} → cycle end", "last"), item=pl.lit("tail"),
                     kind=pl.lit("tail"),
                     order=pl.lit(1e6), ns=(pl.col("cycle_last") - pl.col("last_child_gpu")).cast(pl.Float64),
                     compute_ns=none,
                     comm_ns=none, idle_ns=none, gpu_idle_ns=none)
    gap_ns = (pl.col("lead_ns") - pl.col("prefill_ns")).cast(pl.Float64)
    gap = cc.select("rank", "cycle_id", segment=pl.lit(GAP), item=pl.lit(GAP), kind=pl.lit("gap"), order=pl.lit(-3.0),
                    ns=gap_ns,
                    compute_ns=none, comm_ns=none, idle_ns=gap_ns, gpu_idle_ns=pl.col("gpu_idle").cast(pl.Float64))
    parts = [gap, head.filter(pl.col("ns") != 0), ph, sm, tail.filter(pl.col("ns") != 0)]  # heads/tails: mostly 0
    if pre.height:
        parts.append(pre.lazy().group_by("rank", "cycle_id").agg(
            ns=pl.col("span").sum(), compute_ns=pl.col("compute").sum(), comm_ns=pl.col("comm").sum(),
            idle_ns=pl.col("idle").sum(), gpu_idle_ns=pl.col("gpu_idle").sum())
            .select("rank", "cycle_id", *[pl.col(x).cast(pl.Float64) for x in ("ns", "compute_ns", "comm_ns", "idle_ns",
                                                                           "gpu_idle_ns")])
            .with_columns(segment=pl.lit(_PREFILL), item=pl.lit(_PREFILL), kind=pl.lit("prefill"), order=pl.lit(-2.0)))
    cols = ["rank", "cycle_id", *[c for c in PIECES if c not in ("rank", "key")]]
    pieces = pl.concat([x.select(cols) for x in parts], how="vertical_relaxed")
    return (pieces.join(cyc.select("rank", "cycle_id", "key"), on=["rank", "cycle_id"])
            .select(list(PIECES))
            .cast(PIECES)  # type: ignore[arg-type]  # polars' stub: a dict keyed by str is not its key union
            .sort("rank", "key", "order")  # (one piece per order in a cycle: the same table however it was made)
            .collect())


@view.table()
def budget(res: Result) -> pl.DataFrame:
    """Per rank and piece of the mean steady cycle (module docstring): ``rank, segment, kind, order, ns, share,
    compute_ns, comm_ns, idle_ns, gpu_idle_ns, cycles``; a rank's ``ns`` add up to its mean cycle period."""
    return mean_budget(res, steady_keys(res))


def steady_keys(res: Result) -> pl.DataFrame:
    """``rank, key`` of the steady cycles that have a period (what the budget and per-cycle means average over)."""
    c = main_cycles(res)
    return c.filter("steady").select("rank", "key") if c.height else pl.DataFrame(schema=STEADY_KEYS)


def mean_budget(res: Result, which: pl.DataFrame, by_rank: bool = True) -> pl.DataFrame:
    """The mean cycle over the cycles ``which`` (``rank, key``) cut into its pieces, per rank (``by_rank``) or
    over all ranks' cycles (``rank`` null); ``ns`` add up to the mean period of those cycles."""
    p = cycle_pieces(res)
    if p.height == 0 or which.height == 0:
        return pl.DataFrame(schema=BUDGET)
    grp = ["rank"] if by_rank else []
    (pk, wk), on = packed_keys.with_key((p.select("rank", "key"), which.select("rank", "key")), ["rank", "key"])
    if on == ["_key"]:  # (rank, key) packed into one integer: the cycles' rows kept by it, and counted on it
        keep = pk["_key"].is_in(wk["_key"].implode())
        p = p.filter(keep)
        pk = pk.filter(keep)
        n = (pk.group_by("rank").agg(cycles=pl.col("_key").n_unique()) if by_rank
             else pl.DataFrame({"cycles": [pk["_key"].n_unique()]}, schema={"cycles": pl.UInt32}))
    else:
        p = p.join(which.select("rank", "key").unique(), on=["rank", "key"], how="semi")
        cyc = p.select("rank", "key").unique()
        n = (cyc.group_by("rank").agg(cycles=pl.len()) if by_rank
             else pl.DataFrame({"cycles": [cyc.height]}, schema={"cycles": pl.UInt32}))
    del pk, wk
    period = p.group_by(*grp).agg(period=pl.col("ns").sum())
    out = (p.group_by(*grp, "segment", "kind")
           .agg(order=pl.col("order").mean(), ns=pl.col("ns").sum(), compute_ns=pl.col("compute_ns").sum(),
                comm_ns=pl.col("comm_ns").sum(), idle_ns=pl.col("idle_ns").sum(),
                gpu_idle_ns=pl.col("gpu_idle_ns").sum(), _has_compute=pl.col("compute_ns").is_not_null().any(),
                _has_gpu_idle=pl.col("gpu_idle_ns").is_not_null().any(),
                _has_idle=pl.col("idle_ns").is_not_null().any()))
    out = (out.join(n, on=grp, how="left") if grp else out.join(n, how="cross"))
    out = (out.join(period, on=grp, how="left") if grp else out.join(period, how="cross"))
    out = (out.with_columns(pl.col("ns", "compute_ns", "comm_ns", "idle_ns", "gpu_idle_ns", "period") / pl.col("cycles"))
           .with_columns(compute_ns=pl.when("_has_compute").then("compute_ns"),
                         comm_ns=pl.when("_has_compute").then("comm_ns"), idle_ns=pl.when("_has_idle").then("idle_ns"),
                         gpu_idle_ns=pl.when("_has_gpu_idle").then("gpu_idle_ns"),
                         share=pl.col("ns") / pl.col("period"))
           .filter((pl.col("ns") != 0) | (pl.col("kind") == "phase")))
    if not by_rank:
        out = out.with_columns(rank=pl.lit(None, pl.Int64))
    return (out.with_columns(pl.col("segment", "kind").cast(pl.String))
            .sort("rank", "order", "segment", nulls_last=True)
            .select("rank", "segment", "kind", "order", "ns", "share", "compute_ns", "comm_ns", "idle_ns",
                    "gpu_idle_ns", pl.col("cycles").cast(pl.UInt32)))
