"""The steady-state tables: a Result's phases, seams, kernels and collectives over its steady cycles only.

The Result's own ``phases``, ``ranges`` and ``seams`` count everything captured (they equal NVIDIA's
``nsys stats`` projections); the tables here recompute them over the steady state chosen by
:func:`analyze.compute.cycles.cycles` (warm-up and rare stalls left out, or the user's ``--skip-cycles`` /
``--window``). An instance counts when its outermost selected range is a steady cycle, or, outside any
cycle (prefill, unknown ranges), when it starts between the first and the last steady cycle of its rank.

The steady matched collectives (:func:`matched`, not kept in the result cache: 200 MB at 10 M kernels) feed the
phases' wait/transfer split, the matching, the stragglers and the slower cycles' late ranks; the tables made
from them declare that they let go of them (:func:`analyze.compute.findings.rule_inputs`, :func:`comm_inputs`).
The straggler of each phase is named by the one rule (:mod:`analyze.compute.straggler`). Each table is a derived
table (:mod:`analyze.compute.view`): made once per result and cycle choice.
"""

from __future__ import annotations

import polars as pl

from ..model import CommResult, Result, bound_expr
from ..read import packed_keys
from . import breakdown, collectives, host, straggler, view, windows
from .cycles import cycles, selection
from .tokens import summary

__all__ = ["instances_marked_steady", "steady_marks", "keys", "matched", "per_collective", "steady_phases",
           "steady_phases_all_ranks", "steady_seam_instances", "steady_seams", "steady_seams_all_ranks",
           "matching", "MATCHING", "stragglers", "straggler_verdict", "comm_inputs", "comm_document", "ranges",
           "kernels", "kernel_sums", "KERNEL_SUMS", "cycles_per_rank", "CYCLES_PER_RANK"]

# The schemas of the tables that may be empty (a trace without matched collectives, kernels or cycles).
MATCHING = pl.Schema({"phase": pl.String, "collectives": pl.UInt32, "end_spread_p50_ns": pl.Float64,
                      "trusted": pl.Boolean})
KERNEL_SUMS = pl.Schema({"phase": pl.String, "name": pl.String, "count": pl.Int64, "kernel_ns": pl.Int64,
                         "ranks": pl.UInt32})
CYCLES_PER_RANK = pl.Schema({"rank": pl.Int64, "cycles": pl.UInt32})


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
    cur = inst.select(*rep, "rank", top=pl.col("range_id"), up=pl.col("parent"), _top_rank="rank", _top_start="start")
    up = inst.select(*rep, up="range_id", _up_parent="parent", _up_rank="rank", _up_start="start")
    for _ in range(64):
        if cur["up"].null_count() == cur.height:
            break
        cur = (cur.join(up, on=[*rep, "up"], how="left", maintain_order="left")
               .with_columns(top=pl.coalesce("up", "top"), up=pl.col("_up_parent"),
                             _top_rank=pl.when(pl.col("up").is_null()).then("_top_rank").otherwise("_up_rank"),
                             _top_start=pl.when(pl.col("up").is_null()).then("_top_start").otherwise("_up_start"))
               .drop("_up_parent", "_up_rank", "_up_start"))
    # Worked out on a narrow copy and added as two columns: the wide instance frame is never copied.
    top = cur["top"]
    cyc = cycles(res)
    if cyc.height == 0:
        return pl.DataFrame({"top": top}).with_columns(steady=pl.lit(True))
    flags = cyc.select("rank", top="range_id", _cycle_steady=pl.col("steady"))
    env = (cyc.filter("steady").group_by("rank")
           .agg(_first_start=pl.col("start").min(), _last_end=pl.col("end").max()))
    # the top's start where the top is of the instance's rank (a join on rank, as a null rank matches none)
    narrow = (cur.select("rank", "top", _top_start=pl.when(pl.col("_top_rank") == pl.col("rank")).then("_top_start"))
              .join(flags, on=["rank", "top"], how="left", maintain_order="left")
              .join(env, on="rank", how="left", maintain_order="left")
              .with_columns(_rank_has_cycles=pl.col("rank").is_in(cyc["rank"].unique().implode())))
    inside = (pl.col("_top_start") >= pl.col("_first_start")) & (pl.col("_top_start") <= pl.col("_last_end"))
    steady = (pl.when(pl.col("_cycle_steady").is_not_null()).then(pl.col("_cycle_steady"))
              .when(pl.col("rank").is_null() | ~pl.col("_rank_has_cycles")).then(True)
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
        return pl.DataFrame(schema=MATCHING)
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
    if info.how == "none":  # no cycles: no cycle period to weigh the waiting against (the share rule alone)
        cr = collectives.cross_rank(reports)
        cr.straggler = straggler.verdict(cr.stragglers)
        return cr
    verdict, steady = comm_inputs(res)
    out = collectives.cross_rank(reports, keys=steady, cycles=info.text)
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
        return pl.DataFrame(schema=KERNEL_SUMS)
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
        return pl.DataFrame(schema=CYCLES_PER_RANK)
    main = c["kind"].mode().sort()[0]
    return c.filter(pl.col("steady") & (pl.col("kind") == main)).group_by("rank").agg(cycles=pl.len()).sort("rank")


def _steady_cycles(res: Result) -> int:
    """Steady cycles of the trace's cycle kind, summed over ranks."""
    return int(cycles_per_rank(res)["cycles"].sum())
