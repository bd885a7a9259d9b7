"""The headline numbers: a Result's tables over its steady-state cycles only, and the cycle budget.

The Result's own ``phases``, ``ranges`` and ``seams`` count everything captured (they equal NVIDIA's
``nsys stats`` projections); the functions here recompute them over the steady state chosen by
:func:`analyze.compute.tokens.cycles` (warm-up and rare stalls left out, or the user's ``--skip-cycles`` /
``--window``). An instance counts when its outermost selected range is a steady cycle, or, outside any
cycle (prefill, unknown ranges), when it starts between the first and the last steady cycle of its rank.

**Cycle budget** (:func:`budget`): per rank, the mean steady cycle cut into consecutive pieces on the
GPU clock that add up to the cycle period exactly (previous cycle's last GPU op → this cycle's last): the
gap between cycles (previous cycle's last op → this cycle's first op, less any prefill), the prefill
batches that ran in that gap (``prefill``: first → last GPU op of each), each phase inside the cycle (first
→ last GPU op of what it launched), each seam between consecutive phases (last op of one → first op of the
next; negative when they overlap), and the cycle's head and tail (cycle's first op → first phase, last
phase → cycle's last op). :func:`cycle_pieces` has the same pieces for every cycle, :func:`mean_budget`
their mean over any set of cycles (a class of slower cycles, a segment).
"""

from __future__ import annotations

import polars as pl

from ..model import CommResult, Result, bound_expr
from ..read import packed_keys
from . import breakdown, collectives, host, straggler, view, windows
from .tokens import base_expr, cycles, prefill_rows, selection, summary

__all__ = ["GAP", "instances_marked_steady", "steady_marks", "keys", "matched", "per_collective", "steady_phases",
           "steady_phases_all_ranks", "steady_seam_instances", "steady_seams", "steady_seams_all_ranks",
           "matching", "stragglers", "straggler_verdict", "ranges", "kernels", "kernel_sums", "cycles_per_rank",
           "main_cycles", "cycle_pieces", "budget", "steady_keys", "mean_budget", "comm_inputs", "comm_document"]

GAP = "between cycles"




def _ids(inst: pl.DataFrame) -> list[str]:
    """Columns that identify a range instance: ``range_id`` within a report (``report`` when merged)."""
    return ["report", "range_id"] if "report" in inst.columns else ["range_id"]


def instances_marked_steady(res: Result) -> pl.DataFrame:
    """``res.instances`` with ``steady`` (bool) and ``top`` (the range_id of its outermost selected range)."""
    # Only the two columns are kept (with the result in the cache too): the instance frame is the Result's own.
    return res.instances.with_columns(steady_marks(res).get_columns())


@view.table()
def steady_marks(res: Result) -> pl.DataFrame:
    """``top, steady`` of each of ``res.instances`` (:func:`instances_marked_steady`), row for row."""
    inst = res.instances
    ids = _ids(inst)
    rep = ids[:-1]
    # Outermost ancestor: one join per nesting level (a handful), never a loop over instances.
    # Row for row with the instances (each level's join keeps the left order; a range id is one instance), with the
    # top's rank and start carried along: what the steady flags below ask of it.
    cur = inst.select(*rep, "rank", top=pl.col("range_id"), up=pl.col("parent"), _trank="rank", _tstart="start")
    up = inst.select(*rep, up="range_id", _up2="parent", _r2="rank", _s2="start")
    for _ in range(64):
        if cur["up"].null_count() == cur.height:
            break
        cur = (cur.join(up, on=[*rep, "up"], how="left", maintain_order="left")
               .with_columns(top=pl.coalesce("up", "top"), up=pl.col("_up2"),
                             _trank=pl.when(pl.col("up").is_null()).then("_trank").otherwise("_r2"),
                             _tstart=pl.when(pl.col("up").is_null()).then("_tstart").otherwise("_s2"))
               .drop("_up2", "_r2", "_s2"))
    # Worked out on a narrow copy and added as two columns: the wide instance frame is never copied.
    top = cur["top"]
    cyc = cycles(res)
    if cyc.height == 0:
        return pl.DataFrame({"top": top}).with_columns(steady=pl.lit(True))
    flags = cyc.select("rank", top="range_id", _cyc=pl.col("steady"))
    env = (cyc.filter("steady").group_by("rank")
           .agg(_a=pl.col("start").min(), _b=pl.col("end").max()))
    # the top's start where the top is of the instance's rank (a join on rank, as a null rank matches none)
    narrow = (cur.select("rank", "top", _tstart=pl.when(pl.col("_trank") == pl.col("rank")).then("_tstart"))
              .join(flags, on=["rank", "top"], how="left", maintain_order="left")
              .join(env, on="rank", how="left", maintain_order="left")
              .with_columns(_has=pl.col("rank").is_in(cyc["rank"].unique().implode())))
    inside = (pl.col("_tstart") >= pl.col("_a")) & (pl.col("_tstart") <= pl.col("_b"))
    steady = (pl.when(pl.col("_cyc").is_not_null()).then(pl.col("_cyc"))
              .when(pl.col("rank").is_null() | ~pl.col("_has")).then(True)
              .otherwise(inside.fill_null(False)))
    return narrow.select(top="top", steady=steady)


@view.table()
def keys(res: Result) -> pl.DataFrame:
    """``rank, range_id`` of the steady instances with GPU work (ranks are unique across merged reports)."""
    return (instances_marked_steady(res).select("rank", "range_id", "steady")
            .filter(pl.col("steady") & pl.col("rank").is_not_null()).select("rank", "range_id"))


# Not kept in the cache (200 MB at 10 M kernels): the tables made from it are (phases' split, stragglers, the cycle
# classes), and a second command reads those; let go once they are made (the tables that release it).
@view.table(kept=False)
def matched(res: Result) -> pl.DataFrame:
    """The matched collectives (:func:`analyze.compute.collectives.match`) of steady phase instances."""
    # Matched once by the analysis over the counted instances, kept packed (70 MB at 10 M kernels, not 200: its rows
    # of the communication kernels and what matching worked out); taken once narrowed to these cycles: another cycle
    # choice on this Result matches them again.
    k = res.comm_kernels
    packed = view.take(res, "counted_matches")
    if packed is not None:
        at = k.select(pl.col("rank", "range_id").gather(packed["_row"]))
        packed = packed.select(pl.all().gather(_steady_rows(res, at)))
        del at
        return collectives.unpacked(k, packed)
    m = collectives.match(collectives.with_group_ids(collectives.usable(k)))
    if m.height == 0:
        return m.select(collectives.MATCHED_COLUMNS)
    rows = _steady_rows(res, m.select("rank", "range_id"))
    # The steady rows gathered a column at a time, each counted column let go once gathered: the two frames
    # (200 MB each at 10 M kernels) are never whole at once.
    steady = {}
    m = m.select(collectives.MATCHED_COLUMNS)  # (the columns the counted match has: one shape whichever way)
    for c in m.columns:
        steady[c] = m[c].gather(rows)
        m = m.drop(c)
    return pl.DataFrame(steady)


def _steady_rows(res: Result, at: pl.DataFrame) -> pl.Series:
    """The rows of ``at`` (``rank, range_id``) of steady instances (:func:`keys`), as row numbers in their order."""
    return packed_keys.semi_join(at.with_row_index("_i"), keys(res), ["rank", "range_id"])["_i"]


def _steady_instances(res: Result, prefix: str, *more: str) -> pl.DataFrame:
    """The steady instances' ``rank, domain, range``, ``more`` and the metrics starting with ``prefix`` (``x_``:
    exclusive, ``i_``: inclusive): chosen before the rows are, so that only those columns are copied."""
    inst = instances_marked_steady(res)
    cols = ["rank", "domain", "range", *more, *[c for c in inst.columns if c.startswith(prefix)]]
    return inst.select(*cols, "steady").filter("steady").drop("steady")


@view.table()
def steady_phases(res: Result) -> pl.DataFrame:
    """Per rank and phase over the steady state: sums, per-instance mean/p50/p90, the comm wait/transfer split."""
    p = breakdown.sum_phases(_steady_instances(res, "x_"))
    split = collectives.phase_split(matched(res)) if res.comm_kernels.height else None
    if split is None or split.height == 0:
        return p.with_columns(pl.lit(0, pl.Int64).alias(c) for c in collectives.SPLIT)
    return p.join(split, on=["rank", "domain", "phase"], how="left", maintain_order="left").with_columns(
        pl.col(*collectives.SPLIT).fill_null(0).cast(pl.Int64))


@view.table()
def steady_phases_all_ranks(res: Result) -> pl.DataFrame:
    """Per phase over all ranks' steady instances: sums and per-instance mean/p50/p90 (``ranks`` = ranks with it)."""
    inst = _steady_instances(res, "x_")
    p = breakdown.sum_phases(inst, by=())
    n = inst.filter(pl.col("x_ops") > 0).group_by("domain", range="range").agg(ranks=pl.col("rank").n_unique())
    return p.join(n.rename({"range": "phase"}), on=["domain", "phase"], how="left")


@view.table()
def steady_seam_instances(res: Result) -> pl.DataFrame:
    """Seam instances that lead into a steady instance (the wait before a cycle belongs to that cycle's period)."""
    s = res.seam_instances
    if s.height == 0:
        return s
    return packed_keys.semi_join(s, keys(res), ["rank", "range_id"])


@view.table()
def steady_seams(res: Result) -> pl.DataFrame:
    """Seams per rank over the steady state (as :func:`analyze.compute.breakdown.sum_seams`)."""
    s = steady_seam_instances(res)
    if s.height == 0:
        return res.seams.head(0)
    return breakdown.sum_seams(s, res.instances)


@view.table()
def steady_seams_all_ranks(res: Result) -> pl.DataFrame:
    """Seams over all ranks, steady state: sums and per-instance idle mean/p50/p90."""
    s = steady_seam_instances(res)
    if s.height == 0:
        return pl.DataFrame()
    parents = res.instances.filter(pl.col("rank").is_not_null()).select("rank", parent="range_id",
                                                                        parent_range="range")
    causes = host.seam_aggs() if "cause" in s.columns else []
    out = (s.join(parents, on=["rank", "parent"], how="left")
           .group_by(pl.col("parent_range").alias("parent"), pl.col("prev_range").alias("from"),
                     pl.col("range").alias("to"))
           .agg(pl.col("rank").n_unique().alias("ranks"), pl.len().alias("instances"),
                *[pl.col(c).sum() for c in ("gap_ns", "idle_ns", "busy_ns", "overlap_ns")],
                *breakdown.spread("idle_ns", "idle"), *causes)
           .sort("idle_ns", "from", "to", descending=[True, False, False]))
    return out.with_columns(bound_expr()) if causes else out


@view.table()
def matching(res: Result) -> pl.DataFrame:
    """Per phase: ``collectives`` matched and the p50 spread of their end times across ranks (``end_spread_p50_ns``);
    ``trusted`` when it is within :data:`analyze.compute.windows.END_SPREAD_BOUND_NS`, the bound of
    :func:`analyze.compute.collectives.refused` (collectives of one job end together; far more means instances
    were paired wrongly, and wait/straggler numbers are not shown)."""
    m = matched(res)
    if m.height == 0:
        return pl.DataFrame(schema={"phase": pl.String, "collectives": pl.UInt32, "end_spread_p50_ns": pl.Int64,
                                    "trusted": pl.Boolean})
    per = per_collective(res)
    return (per.group_by("phase").agg(collectives=pl.len(),
                                      end_spread_p50_ns=pl.col("end_spread_ns").quantile(0.5, "nearest"))
            .with_columns(trusted=pl.col("end_spread_p50_ns") <= windows.END_SPREAD_BOUND_NS).sort("phase"))


# Not kept in the cache, let go with matched (30 MB at 10 M kernels): matching and stragglers, made from it, are.
@view.table(kept=False)
def per_collective(res: Result) -> pl.DataFrame:
    """One row per matched collective of the steady state (:func:`analyze.compute.collectives.per_collective`)."""
    return collectives.per_collective(matched(res))


@view.table()
def stragglers(res: Result) -> pl.DataFrame:
    """Per phase and rank over the steady state: last arrivals at matched collectives (see collectives)."""
    if matched(res).height == 0:
        return pl.DataFrame(schema=straggler.STRAGGLERS)
    return collectives.stragglers(matched(res), coll=per_collective(res))


def straggler_verdict(res: Result, min_collectives: int = 0) -> pl.DataFrame:
    """The straggler of each phase over the steady cycles (:func:`analyze.compute.straggler.verdict`, the one rule:
    its share of the waiting, ``per_cycle_ns`` against the cycle period, none in a phase whose collectives do not end
    together): the one verdict that ``analyze``'s findings (with ``min_collectives``), ``comm``, ``compare`` and the
    report name."""
    return _straggler_verdict(res, min_collectives=min_collectives)


@view.table(name="straggler_verdict", params=("min_collectives",))
def _straggler_verdict(res: Result, min_collectives: int) -> pl.DataFrame:
    st = stragglers(res)
    if st.height == 0:  # no matched collectives: no straggler
        return pl.DataFrame(schema=straggler.VERDICT)
    c = cycles(res)  # the matched collectives are those of every steady cycle, the first one too
    main = c["kind"].mode().sort()[0] if c.height else None
    n = max(c.filter((pl.col("kind") == main) & pl.col("steady")).select("key").unique().height, 1)
    untrusted = matching(res).filter(~pl.col("trusted"))["phase"].to_list()
    return straggler.verdict(st, straggler.PerCycle(n, summary(res).period_ns or 0.0), untrusted, min_collectives)


@view.table(kept=False, releases=(matched, per_collective))
def comm_inputs(res: Result) -> tuple[pl.DataFrame, pl.DataFrame]:
    """What ``comm`` reads of the steady view: the straggler verdict and the steady keys, made before it matches the
    collectives across the reports again (:func:`comm_document`): the steady matched collectives (hundreds of MB at
    10 M kernels) they are made from are let go of once they are (declared: ``releases``)."""
    return straggler_verdict(res), keys(res)


@view.table(inputs=("reports",))
def comm_document(res: Result, reports: list[Result]) -> CommResult:
    """``spectrace comm``'s result over the steady cycles: the collectives of ``reports`` (``res`` is their merge,
    or the one) matched across ranks (:func:`analyze.compute.collectives.cross_rank`), the phases' collectives
    narrowed to the steady cycles' instances, with the straggler verdict of :func:`straggler_verdict` (the same
    rule and cycles as ``analyze``'s findings). Without cycle ranges: the whole run, and its own verdict."""
    info = selection(res)
    if info.get("how") == "none":  # no cycles: no cycle period to weigh the waiting against (the share rule alone)
        cr = collectives.cross_rank(reports)
        cr.straggler = straggler.verdict(cr.stragglers)
        return cr
    verdict, steady = comm_inputs(res)
    out = collectives.cross_rank(reports, keys=steady, cycles=info["text"])
    out.straggler = verdict
    return out


@view.table()
def ranges(res: Result) -> pl.DataFrame:
    """NVIDIA-style inclusive projections (:func:`analyze.compute.breakdown.projections`) over the steady state."""
    return breakdown.projections(_steady_instances(res, "i_", "start", "end"))


def kernels(res: Result, top: int | None = None) -> pl.DataFrame:
    """GPU operations per phase over the steady state, all ranks: ``phase, name, count, kernel_ns, ranks,
    per_cycle_ns, count_per_cycle, share`` (of the phase's kernel time), biggest first; ``top`` per phase."""
    k = kernel_sums(res)
    n = max(_steady_cycles(res), 1)
    k = k.with_columns(per_cycle_ns=pl.col("kernel_ns") / n, count_per_cycle=pl.col("count") / n,
                       share=pl.col("kernel_ns") / pl.col("kernel_ns").sum().over("phase"))
    k = k.sort("phase", "kernel_ns", "name", descending=[False, True, False])
    return k.group_by("phase", maintain_order=True).head(top) if top else k


@view.table()
def kernel_sums(res: Result) -> pl.DataFrame:
    """GPU operations per phase and name over the steady state, all ranks: ``phase, name, count, kernel_ns, ranks``
    by phase and name (:func:`kernels` sorts them its way)."""
    k = res.kernels
    if k is None or k.height == 0:
        return pl.DataFrame(schema={"phase": pl.String, "name": pl.String, "count": pl.Int64,
                                    "kernel_ns": pl.Int64, "ranks": pl.UInt32})
    # the phase as a categorical (a handful of names): joined and grouped on as an integer, a string at the end
    names = (res.instances.select("rank", "range_id", phase=pl.col("range").cast(pl.Categorical))
             .filter(pl.col("rank").is_not_null()))
    (names, ks, k), on = packed_keys.with_key((names, keys(res), k), ["rank", "range_id"])
    steady = names.join(ks.select(on), on=on, how="semi")
    # streamed: the join is summed as it is made, never whole (1.6 M rows at 10 M kernels); the sums are exact
    # (integers), the groups (a few thousand) sorted once made: the same table however it was made
    return (k.lazy().join(steady.lazy().select(*on, "phase"), on=on)
            .group_by("phase", "name").agg(pl.col("count").sum(), pl.col("kernel_ns").sum(),
                                           ranks=pl.col("rank").n_unique())
            .with_columns(pl.col("phase", "name").cast(pl.String)).collect(engine="streaming")
            .sort("phase", "name"))


@view.table()
def cycles_per_rank(res: Result) -> pl.DataFrame:
    """``rank, cycles``: steady cycles of the trace's cycle kind on each rank (the divisor of per-cycle numbers)."""
    c = cycles(res)
    if c.height == 0:
        return pl.DataFrame(schema={"rank": pl.Int64, "cycles": pl.UInt32})
    main = c["kind"].mode().sort()[0]
    return c.filter(pl.col("steady") & (pl.col("kind") == main)).group_by("rank").agg(cycles=pl.len()).sort("rank")


def _steady_cycles(res: Result) -> int:
    """Steady cycles of the trace's cycle kind, summed over ranks."""
    return int(cycles_per_rank(res)["cycles"].sum())


_PIECE_KIND = pl.Enum(["gap", "prefill", "head", "phase", "seam", "tail"])
# segment/item: a handful of names repeated for every cycle: categorical (a third of the strings' memory)
_PIECE_SCHEMA: dict[str, pl.DataType | type[pl.DataType]] = {
    "rank": pl.Int64, "key": pl.Int64, "segment": pl.Categorical, "item": pl.Categorical, "kind": _PIECE_KIND,
    "order": pl.Float64, "ns": pl.Float64, "compute_ns": pl.Float64, "comm_ns": pl.Float64, "idle_ns": pl.Float64,
    "gpu_idle_ns": pl.Float64}
_BUDGET_SCHEMA = {"rank": pl.Int64, "segment": pl.String, "kind": pl.String, "order": pl.Float64, "ns": pl.Float64,
                  "share": pl.Float64, "compute_ns": pl.Float64, "comm_ns": pl.Float64, "idle_ns": pl.Float64,
                  "gpu_idle_ns": pl.Float64, "cycles": pl.UInt32}
_PREFILL = "prefill"


def main_cycles(res: Result) -> pl.DataFrame:
    """The cycles of the trace's cycle kind that have a period (every one but each rank's first)."""
    c = cycles(res)
    if c.height == 0:
        return c
    main = c["kind"].mode().sort()[0]
    return c.filter((pl.col("kind") == main) & pl.col("period_ns").is_not_null())


@view.table()
def cycle_pieces(res: Result) -> pl.DataFrame:
    """Every cycle with a period cut into consecutive pieces on its rank's GPU clock that add up to its period
    exactly (module docstring): ``rank, key, segment, item, kind, order, ns, compute_ns, comm_ns, idle_ns,
    gpu_idle_ns``; ``kind``: gap (between cycles), prefill, head, phase, seam, tail; ``item``: the piece by base
    names (``verify``, ``seam:draft→verify``), the same across traces whatever the ranges' prefix."""
    c = main_cycles(res)
    if c.height == 0:
        return pl.DataFrame(schema=_PIECE_SCHEMA)
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
    cols = ["rank", "cycle_id", *[c for c in _PIECE_SCHEMA if c not in ("rank", "key")]]
    pieces = pl.concat([x.select(cols) for x in parts], how="vertical_relaxed")
    return (pieces.join(cyc.select("rank", "cycle_id", "key"), on=["rank", "cycle_id"])
            .select(list(_PIECE_SCHEMA))
            .cast(_PIECE_SCHEMA)  # type: ignore[arg-type]  # polars' stub: a dict keyed by str is not its key union
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
    return c.filter("steady").select("rank", "key") if c.height else pl.DataFrame(
        schema={"rank": pl.Int64, "key": pl.Int64})


def mean_budget(res: Result, which: pl.DataFrame, by_rank: bool = True) -> pl.DataFrame:
    """The mean cycle over the cycles ``which`` (``rank, key``) cut into its pieces, per rank (``by_rank``) or
    over all ranks' cycles (``rank`` null); ``ns`` add up to the mean period of those cycles."""
    p = cycle_pieces(res)
    if p.height == 0 or which.height == 0:
        return pl.DataFrame(schema=_BUDGET_SCHEMA)
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
