"""Cross-rank communication: match collectives across ranks, split wait from transfer, name stragglers.

Small pure functions over frames. The input is ``kernels``: one row per communication *kernel*
(comm family not null; peer-to-peer memcpy rows are left out, one rank issues them) with ``rank,
domain, phase, range_id, start, end, corr, name, comm`` on one clock.

Matching. A phase instance's key ``k`` is the same on every rank for the same instance (the same
cycle): :func:`analyze.compute.windows.pair` sets it from the hooks' payload cycle index or by time,
and leaves out (``left_out``) instances cut by a rank's capture window or missing on some rank. In
instance ``k`` the ``j``-th kernel of a name (by GPU start) is one collective, the same on every rank:
key ``(domain, phase, k, name, j)``. Kernels outside any phase get ``k = -1`` and are numbered per rank
and name over the whole run. A group ``(domain, phase, k, name)`` is matched only when every
participating rank (a rank with any communication kernel) has the same number of kernels in it; other
groups are mismatches, reported with where they start.

Split. For a matched collective, ``last`` = the latest start over ranks (last arrival). A rank's
``skew = last - start`` (>= 0), ``wait = min(duration, skew)``, ``transfer = duration - wait``:
integers, so ``wait + transfer == duration`` exactly. The straggler of a collective is the rank
that started last, when it started strictly after every other rank; its ``delay`` is how much
later than the next-latest rank.

Refusal. Matched collectives end together (within µs on one node). When those of a phase do not (p50
end spread above :data:`~analyze.compute.windows.END_SPREAD_BOUND_NS`), the pairing or the clocks are
wrong, and wait, skew and straggler numbers of that phase would be fiction: :func:`refused` names the
phase, and the tables give no such numbers for it.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import polars as pl

from ..model import CommResult, Diagnostic
from ..read import packed_keys
from . import align, straggler, windows
from .intervals import rising
from .scalars import to_int

__all__ = ["SPLIT", "comm_kernels", "usable", "with_group_ids", "match", "per_collective", "stragglers",
           "phase_split", "MATCHED_COLUMNS", "with_split", "refused", "short_name",
           "phase_comm_split", "packed", "unpacked", "cross_rank", "within"]

_GROUP = ["domain", "phase", "k", "name"]
_KEY = [*_GROUP, "j"]
SPLIT = ("comm_wait_ns", "comm_transfer_ns")  # the columns ``spectrace analyze`` gains per phase


def comm_kernels(ops: pl.DataFrame, instances: pl.DataFrame) -> pl.DataFrame:
    """Communication kernels with their phase and per-name ordinal ``j`` in their phase instance.

    ``phase`` is the innermost selected range (null outside any); ``k``, the instance's cross-rank key, is
    left null here and set by :func:`analyze.compute.windows.pair` once every rank is in. Everything
    here is per rank: the kernels of each process can be done on their own and concatenated.
    """
    c = ops.filter((pl.col("kind") == "kernel") & pl.col("comm").is_not_null()).select(
        "rank", "range_id", "corr", "start", "end", "name", "comm"
    )
    c = c.join(instances.select("range_id", "domain", phase="range"), on="range_id", how="left", maintain_order="left")
    # (rank, range_id, name) is the group (rank, domain, phase, k, name): a range instance is one rank's
    # (domain, phase, k); kernels outside phases (range_id null) group per rank and name.
    if not rising(c["start"]):
        c = c.sort("start", "corr")  # (kernels in start order, no two starting together, are sorted already)
    if c["rank"].n_unique() <= 1:  # one process: numbered per (range_id, name) without a window
        c = windows.ordinal(c, "range_id", "name", "j", by=(), keep_order=True)
    else:
        c = c.with_columns(j=pl.int_range(pl.len(), dtype=pl.Int64).over("rank", "range_id", "name"))
    return c.with_columns(k=pl.lit(None, pl.Int64)).select("rank", *_KEY, "range_id", "corr", "comm", "start", "end")


def usable(kernels: pl.DataFrame) -> pl.DataFrame:
    """The kernels that take part in matching: not in an instance left out by the cross-rank pairing."""
    if "left_out" not in kernels.columns or kernels["left_out"].null_count() == kernels.height:
        return kernels  # none left out: the frame itself, not a filtered copy (hundreds of MB at 10 M kernels)
    return kernels.filter(pl.col("left_out").is_null())


def with_group_ids(kernels: pl.DataFrame) -> pl.DataFrame:
    """``kernels`` with ``_g``: an integer per group ``(domain, phase, k, name)``, one to one.

    Grouping, sorting and joining on one integer instead of three strings and an integer is what
    keeps matching fast at millions of kernels. The id packs small dense codes of ``(domain, phase)``
    and ``name`` with ``k`` (:func:`analyze.read.packed_keys.bounded`; a null ``k``: a null id); when they do not
    fit in one integer, groups are numbered by a group-by.
    """
    kernels = kernels.drop("_g", strict=False)
    if kernels.height == 0:
        return kernels.with_columns(_g=pl.lit(0, pl.Int64))
    dp = kernels.select("domain", "phase").unique(maintain_order=True).with_row_index("_p")
    names = kernels.select("name").unique(maintain_order=True).with_row_index("_n")
    # The ids worked out on the four key columns and added as one: the wide frame is never copied by a join.
    c = (kernels.select("domain", "phase", "k", "name")
         .join(dp, on=["domain", "phase"], how="left", nulls_equal=True, maintain_order="left")
         .join(names, on="name", how="left", maintain_order="left"))
    k_lo, k_hi = c["k"].min(), c["k"].max()  # (the codes' bounds are their counts: no pass over the rows for them)
    group = packed_keys.bounded(["_p", "k", "_n"], [(0, dp.height - 1), (to_int(k_lo or 0), to_int(k_hi or 0)),
                                                    (0, names.height - 1)])
    if group is not None:
        return kernels.with_columns(c.select(group.key("_g"))["_g"])
    ids = c.select("_p", "k", "_n").unique(maintain_order=True).with_row_index("_g").with_columns(pl.col("_g").cast(pl.Int64))
    return kernels.with_columns(c.join(ids, on=["_p", "k", "_n"], how="left", maintain_order="left")["_g"])


def _group_counts(kernels: pl.DataFrame) -> pl.DataFrame:
    """Per group ``(domain, phase, k, name)``: kernels per rank, where it starts, and whether it matches."""
    participants = kernels["rank"].n_unique()
    per = kernels.group_by("_g", "rank").agg(*[pl.col(c).first() for c in _GROUP], n=pl.len(),
                                               first=pl.col("start").min())
    return (
        per.group_by("_g")
        .agg(
            *[pl.col(c).first() for c in _GROUP],
            ranks=pl.len(),
            n_min=pl.col("n").min(),
            n_max=pl.col("n").max(),
            first=pl.col("first").min(),
            counts=pl.struct("rank", "n").sort_by("rank"),
        )
        .with_columns(matched=(pl.col("ranks") == participants) & (pl.col("n_min") == pl.col("n_max")))
        .sort("first", "_g")
    )


def match(kernels: pl.DataFrame, counts: pl.DataFrame | None = None, ordered: bool = True) -> pl.DataFrame:
    """One row per (matched collective, rank): last arrival, skew, wait, transfer, straggler flag.

    ``kernels`` carry group ids (:func:`with_group_ids`); ``counts`` is :func:`_group_counts` of
    them if already computed. ``ordered``: rows by first arrival, then rank.
    """
    counts = _group_counts(kernels) if counts is None else counts
    # Computed on the few columns it reads, with each row's index in ``kernels``; the other columns are gathered
    # once at the end, in the final order: one wide copy of the matched rows, not one per filter and sort
    # (at 10 M kernels each is hundreds of MB).
    m = (kernels.select("_g", "j", "start", "end", "rank").with_row_index("_i")
         .filter(pl.col("_g").is_in(counts.filter("matched")["_g"].implode())))
    # Each collective's rows contiguous, by arrival: first, last and second-latest arrivals are
    # read off its first and last rows (no window per collective). Sorted on packed keys (at 10 M kernels two,
    # (_g, j) and (start, rank): a sort on four columns compares them one by one).
    m = packed_keys.sort_by(m, ["_g", "j", "start", "rank"])
    new = ((pl.col("_g") != pl.col("_g").shift(1)) | (pl.col("j") != pl.col("j").shift(1))).fill_null(True)
    m = m.with_columns(_new=new).with_columns(_last=pl.col("_new").shift(-1).fill_null(True),
                                               _c=pl.col("_new").cum_sum())
    dur = pl.col("end") - pl.col("start")
    m = (
        m.with_columns(
            duration_ns=dur,
            last=pl.when("_last").then("start").backward_fill(),
            _second=pl.when("_last").then(pl.when("_new").then("start").otherwise(pl.col("start").shift(1)))
            .backward_fill(),
            first_arrival=pl.when("_new").then("start").forward_fill(),
            end_spread_ns=(pl.col("end").max() - pl.col("end").min()).over("_c"),
        )
        .with_columns(skew_ns=pl.col("last") - pl.col("start"))
        .with_columns(wait_ns=pl.min_horizontal("duration_ns", "skew_ns"))
        .with_columns(
            transfer_ns=pl.col("duration_ns") - pl.col("wait_ns"),
            delay_ns=pl.col("last") - pl.col("_second"),
        )
        .with_columns(is_last=(pl.col("start") == pl.col("last")) & (pl.col("delay_ns") > 0))
        .drop("_second", "_new", "_last", "_c")
        .pipe(lambda df: df.sort("first_arrival", "_g", "j", "rank") if ordered else df)
    )
    return kernels.select(pl.all().gather(m["_i"])).hstack(m.drop("_i", "_g", "j", "start", "end", "rank"))


def per_collective(matched: pl.DataFrame) -> pl.DataFrame:
    """One row per matched collective: its straggler rank (null on a tie) and delay, start spread, end spread."""
    collective = packed_keys.packing((matched,), ["_g", "j"], nulls="first")
    if collective is None:
        by, ids = [pl.col("_g"), pl.col("j")], []
    else:  # one integer per collective: a one-key group-by
        by, ids = [collective.key("_c")], [pl.col("_g", "j").first()]
    return (
        matched.group_by(*by)
        .agg(
            *ids,
            *[pl.col(c).first() for c in _GROUP],
            ranks=pl.len(),
            first_arrival=pl.col("first_arrival").first(),
            last_arrival=pl.col("last").first(),
            straggler=pl.col("rank").filter(pl.col("is_last")).first(),
            delay_ns=pl.col("delay_ns").first(),
            end_spread_ns=pl.col("end_spread_ns").first(),
            max_wait_ns=pl.col("wait_ns").max(),
            caused_wait_ns=pl.col("wait_ns").sum(),
        )
        .with_columns(start_spread_ns=pl.col("last_arrival") - pl.col("first_arrival"), name=pl.col("name").cast(pl.String))
        .sort("first_arrival", "_g", "j")
        .select(*_KEY, pl.exclude(*_KEY, "_g", "_c"))
    )


def _q(col: str, q: float) -> pl.Expr:
    return pl.col(col).quantile(q, "nearest").cast(pl.Int64)


def _refused_flag(df: pl.DataFrame, refused_phases: pl.DataFrame | None) -> pl.DataFrame:
    """``df`` with ``_ref``: its (domain, phase) is refused."""
    if refused_phases is None or refused_phases.height == 0:
        return df.with_columns(_ref=pl.lit(False))
    r = refused_phases.select("domain", "phase", _ref=pl.lit(True))
    return df.join(r, on=["domain", "phase"], how="left", nulls_equal=True).with_columns(pl.col("_ref").fill_null(False))


def _summary(matched: pl.DataFrame, refused_phases: pl.DataFrame | None = None) -> pl.DataFrame:
    """Per rank, phase and kernel name: count, duration, wait, transfer, p50/p99 arrival skew.

    In a phase of ``refused_phases`` (:func:`refused`) wait, transfer, skew and last arrivals are null.
    """
    out = (
        matched.with_columns(outside=pl.col("k") < 0)
        .group_by("rank", "domain", "phase", "outside", "name")
        .agg(
            family=pl.col("comm").first(),
            instances=pl.col("k").n_unique(),
            count=pl.len(),
            duration_ns=pl.col("duration_ns").sum(),
            wait_ns=pl.col("wait_ns").sum(),
            transfer_ns=pl.col("transfer_ns").sum(),
            skew_p50_ns=_q("skew_ns", 0.5),
            skew_p99_ns=_q("skew_ns", 0.99),
            last_arrivals=pl.col("is_last").sum().cast(pl.Int64),
        )
        .with_columns(phase=pl.when(~pl.col("outside")).then("phase"), name=pl.col("name").cast(pl.String))
        .drop("outside")
    )
    split = ("wait_ns", "transfer_ns", "skew_p50_ns", "skew_p99_ns", "last_arrivals")
    return (_refused_flag(out, refused_phases)
            .with_columns(pl.when(~pl.col("_ref")).then(pl.col(c)).alias(c) for c in split).drop("_ref")
            .sort("phase", "name", "rank", "domain", nulls_last=True))


def stragglers(matched: pl.DataFrame, refused_phases: pl.DataFrame | None = None,
               coll: pl.DataFrame | None = None) -> pl.DataFrame:
    """Per phase and rank: how often the rank arrived last (strictly), by how much, and the waiting it caused:
    ``caused_wait_ns``, the other ranks' wait at the collectives it arrived last at, and ``wait_share``, its
    share of all the waiting in the phase's collectives. Rows by phase, the rank that caused most first: a rank
    late by 500 µs once in 16 collectives is the straggler, not the rank last by 1 µs at the other 15.

    Phases of ``refused_phases`` (:func:`refused`) have no rows. ``coll``: :func:`per_collective` of
    ``matched`` if already made (without refused phases).
    """
    if coll is None or (refused_phases is not None and refused_phases.height):
        matched = _refused_flag(matched, refused_phases).filter(~pl.col("_ref")).drop("_ref")
        coll = per_collective(matched)
    coll = coll.with_columns(outside=pl.col("k") < 0)
    totals = coll.group_by("domain", "phase", "outside").agg(collectives=pl.len(), _all=pl.col("caused_wait_ns").sum())
    ranks = matched.select("rank").unique()
    per = (
        coll.filter(pl.col("straggler").is_not_null())
        .group_by("domain", "phase", "outside", rank="straggler")
        .agg(last_arrivals=pl.len(), total_delay_ns=pl.col("delay_ns").sum(), max_delay_ns=pl.col("delay_ns").max(),
             caused_wait_ns=pl.col("caused_wait_ns").sum())
    )
    return (
        totals.join(ranks, how="cross")
        .join(per, on=["domain", "phase", "outside", "rank"], how="left", nulls_equal=True)
        .with_columns(
            pl.col("last_arrivals", "total_delay_ns", "max_delay_ns", "caused_wait_ns").fill_null(0).cast(pl.Int64),
        )
        .with_columns(
            mean_delay_ns=pl.when(pl.col("last_arrivals") > 0)
            .then((pl.col("total_delay_ns") / pl.col("last_arrivals")).round(0))
            .otherwise(0)
            .cast(pl.Int64),
            share=pl.col("last_arrivals") / pl.col("collectives"),
            wait_share=pl.when(pl.col("_all") > 0).then(pl.col("caused_wait_ns") / pl.col("_all")).otherwise(0.0),
            phase=pl.when(~pl.col("outside")).then("phase"),
        )
        .drop("outside", "_all")
        .select("domain", "phase", "rank", "collectives", "last_arrivals", "share", "mean_delay_ns",
                "total_delay_ns", "max_delay_ns", "caused_wait_ns", "wait_share")
        .sort(["phase", "caused_wait_ns", "last_arrivals", "rank", "domain"],
              descending=[False, True, True, False, False], nulls_last=True)
    )


def _mismatches(kernels: pl.DataFrame, counts: pl.DataFrame | None = None) -> pl.DataFrame:
    """Groups whose kernel counts differ across ranks, in order of their first kernel."""
    g = (_group_counts(kernels) if counts is None else counts).filter(~pl.col("matched"))
    return g.with_columns(phase=pl.when(pl.col("k") >= 0).then("phase"), name=pl.col("name").cast(pl.String)).select(
        "domain", "phase", "k", "name", "first", "counts"
    )


def phase_split(matched: pl.DataFrame) -> pl.DataFrame:
    """Per (rank, domain, phase): the matched collectives' wait and transfer time (phases only)."""
    return (
        matched.filter(pl.col("k") >= 0)
        .group_by("rank", "domain", "phase")
        .agg(comm_wait_ns=pl.col("wait_ns").sum(), comm_transfer_ns=pl.col("transfer_ns").sum())
    )


def with_split(phases: pl.DataFrame, matched: pl.DataFrame, refused_phases: pl.DataFrame) -> pl.DataFrame:
    """``phases`` with ``comm_wait_ns``/``comm_transfer_ns`` (0 without matched collectives; null when refused)."""
    out = phases.drop(*SPLIT, strict=False).join(phase_split(matched), on=["rank", "domain", "phase"], how="left",
                                                  maintain_order="left")
    out = _refused_flag(out, refused_phases)
    return out.with_columns(pl.when(~pl.col("_ref")).then(pl.col(c).fill_null(0)).cast(pl.Int64).alias(c)
                            for c in SPLIT).drop("_ref")


def refused(matched: pl.DataFrame, bound: int = windows.END_SPREAD_BOUND_NS, grouped: bool = False) -> pl.DataFrame:
    """Phases whose matched collectives do not end together: ``domain, phase, collectives,
    end_spread_p50_ns, bound_ns`` (p50 over the phase's collectives of latest end - earliest end).
    ``grouped``: each collective's rows are contiguous (:func:`match` with ``ordered=False``), so its first row
    stands for it (no group-by per collective)."""
    if grouped:
        new = ((pl.col("_g") != pl.col("_g").shift(1)) | (pl.col("j") != pl.col("j").shift(1))).fill_null(True)
        pc = matched.filter(new).select("domain", "phase", "end_spread_ns")
    else:
        pc = per_collective(matched)
    return (pc.group_by("domain", "phase").agg(collectives=pl.len(), end_spread_p50_ns=_q("end_spread_ns", 0.5))
            .filter(pl.col("end_spread_p50_ns") > bound)
            .with_columns(bound_ns=pl.lit(bound, pl.Int64))
            .sort("phase", "domain", nulls_last=True))


def short_name(name: pl.Expr) -> pl.Expr:
    """A kernel name without its argument list and ``void`` prefix, for tables."""
    return name.str.replace(r"^void\s+", "").str.replace(r"\(.*$", "")


# ---- diagnostics, the per-phase split, and the cross-report driver -----------------------------------

def _diag(level: str, code: str, message: str) -> Diagnostic:
    return Diagnostic(level, code, message)


def _where(row: dict) -> str:
    phase = f"phase {row['phase']!r} instance {row['k']}" if row["phase"] is not None else "outside any phase"
    counts = ", ".join(f"rank {c['rank']}: {c['n']}" for c in row["counts"])
    return f"{phase}, {row['name'][:60]!r} ({counts}) at {row['first'] / 1e6:,.6f} ms on the first report's session clock"


def _diagnostics(kernels: pl.DataFrame, matched: pl.DataFrame, counts: pl.DataFrame | None = None,
                 refused_phases: pl.DataFrame | None = None) -> list:
    """Notes on matching: no communication, a single rank, count mismatches (with where they start), refusals."""
    out = []
    if kernels.height == 0:
        return [_diag("info", "COMM_NONE", "no communication kernels: nothing to match across ranks")]
    if kernels["rank"].n_unique() < 2:
        return [_diag("info", "COMM_ONE_RANK", "communication kernels on one rank only: nothing to match across ranks")]
    mm = _mismatches(kernels, counts)
    if mm.height:
        left = kernels.height - matched.height
        first = mm.row(0, named=True)
        out.append(_diag(
            "warning", "COMM_MISMATCH",
            f"{mm.height} group(s) of collectives have different counts across ranks; their {left} kernels are "
            f"not matched (no wait/transfer split). First: {_where(first)}",
        ))
    for r in (refused_phases if refused_phases is not None else refused(matched)).iter_rows(named=True):
        phase = repr(r["phase"]) if r["phase"] is not None else "outside any phase"
        out.append(_diag(
            "warning", "COMM_REFUSED",
            f"{phase}: its {r['collectives']} matched collectives do not end together (p50 end spread "
            f"{r['end_spread_p50_ns'] / 1e3:,.1f} µs > {r['bound_ns'] / 1e3:,.0f} µs): they are not the same "
            "collectives on every rank, or the clocks disagree; no wait, skew or straggler numbers for it"))
    return out


def phase_comm_split(phases: pl.DataFrame, kernels: pl.DataFrame
                     ) -> tuple[pl.DataFrame, list, pl.DataFrame, pl.DataFrame]:
    """``phases`` with ``comm_wait_ns`` / ``comm_transfer_ns`` (matched collectives, one report), diagnostics,
    the refused phases (:func:`refused`), and the matched collectives (:func:`match`, with ``range_id``, and
    ``_row``: each one's row in ``kernels``).

    ``kernels``: :func:`comm_kernels` of the report (of all its processes, ranks numbered, keyed by
    :func:`analyze.compute.windows.pair`).
    """
    # Only what matching, the split and the diagnostics read: at 10 M kernels every copy of the frame counts. Each
    # row's row in ``kernels`` as given (``_row``) goes with it: :func:`packed` keeps the matched rows by it.
    cols = ["rank", *_KEY, "range_id", "start", "end", *(["left_out"] if "left_out" in kernels.columns else [])]
    kernels = with_group_ids(usable(kernels.select(cols).with_row_index("_row")).drop("left_out", strict=False))
    counts = _group_counts(kernels)
    matched = match(kernels, counts, ordered=False)
    ref = refused(matched, grouped=True)
    out = with_split(phases, matched, ref)
    diags = [d for d in _diagnostics(kernels, matched, counts, ref) if d.code not in ("COMM_NONE", "COMM_ONE_RANK")]
    return out, diags, ref, matched


_PACKED = ("_row", "_g", "last", "first_arrival", "end_spread_ns", "delay_ns", "is_last")
# The columns of the steady view's matched collectives (:func:`unpacked`, or :func:`match` narrowed to them).
MATCHED_COLUMNS = ("rank", *_KEY, "range_id", "start", "end", "_g", "duration_ns", "last", "first_arrival",
                   "end_spread_ns", "skew_ns", "wait_ns", "transfer_ns", "delay_ns", "is_last")


def packed(matched: pl.DataFrame) -> pl.DataFrame:
    """:func:`phase_comm_split`'s matched collectives as :func:`unpacked` takes them: each row's row in the
    communication kernels and what :func:`match` worked out that is not a sum of them (a third of the frame)."""
    return matched.select(_PACKED)


def unpacked(kernels: pl.DataFrame, p: pl.DataFrame) -> pl.DataFrame:
    """:func:`phase_comm_split`'s matched collectives (without ``_row``) from (rows of) their :func:`packed` form
    ``p`` and the ``kernels`` they were matched in."""
    out = kernels.select(pl.col("rank", *_KEY, "range_id", "start", "end").gather(p["_row"])).with_columns(p["_g"])
    dur = pl.col("end") - pl.col("start")
    return (out.with_columns(duration_ns=dur, last=p["last"], first_arrival=p["first_arrival"],
                             end_spread_ns=p["end_spread_ns"])
            .with_columns(skew_ns=pl.col("last") - pl.col("start"))
            .with_columns(wait_ns=pl.min_horizontal("duration_ns", "skew_ns"))
            .with_columns(transfer_ns=pl.col("duration_ns") - pl.col("wait_ns"), delay_ns=p["delay_ns"],
                          is_last=p["is_last"])
            .select(MATCHED_COLUMNS))


def cross_rank(results: list, paired: windows.Paired | None = None, keys: pl.DataFrame | None = None,
               cycles: str | None = None) -> CommResult:
    """Match, align and split the communication of one or several analysed reports (ranks numbered in order).

    Several reports' instances are paired across all their ranks again (:func:`windows.pair_reports`;
    ``paired`` if already done); one report's come keyed from its analysis. ``keys`` (``rank, range_id``) and
    ``cycles``: the result narrowed as :func:`within` narrows it, without the whole run's tables (the refused
    phases, the clock and the diagnostics are the whole run's either way).
    """
    rank_rows, base = [], 0
    for i, r in enumerate(results):
        rank_rows.append(r.ranks.select(rank=pl.col("rank") + base, report=pl.lit(i), path=pl.lit(r.trace.path),
                                        pid="pid", device="device"))
        base += r.ranks.height
    if len(results) == 1:
        every = results[0].comm_kernels.drop("_g", "report", strict=False).with_columns(report=pl.lit(0))
        pairing = [d for d in results[0].diagnostics if d.code in windows.CODES]
    else:
        paired = paired or windows.pair_reports(results)
        every, pairing = paired.kernels, paired.diagnostics
    # Names Categorical while matching: every copy of the frame (joined, filtered, sorted) then holds 4 bytes a
    # row for them, not the string (131 MB of 313 at 10 M kernels); the tables cast them back to strings.
    kernels = with_group_ids(usable(every).with_columns(pl.col("name").cast(pl.Categorical)))  # ids over all reports
    ranks = pl.concat(rank_rows)
    clock: dict[str, Any] = {"reports": len(results)}
    if len(results) == 1:
        clock["alignment"] = align.ONE_CLOCK
    else:
        utc = [r.trace.utc_epoch_ns for r in results]
        offs = align.session_offsets(utc)
        steps, table = [], pl.DataFrame({"report": range(len(results)), "utc_epoch_ns": utc},
                                        schema={"report": pl.Int32, "utc_epoch_ns": pl.Int64})
        if offs is not None:
            sess = pl.DataFrame({"report": range(len(results)), "offset_ns": offs},
                                schema={"report": pl.Int32, "offset_ns": pl.Int64})
            kernels = align.shift(kernels, sess)
            steps.append("session start (utcEpochNs)")
            table = table.join(sess.rename({"offset_ns": "session_offset_ns"}), on="report")
        else:
            table = table.with_columns(session_offset_ns=pl.lit(None, pl.Int64))
        good = kernels.filter(pl.col("_g").is_in(_group_counts(kernels).filter("matched")["_g"].implode()))
        clock.update({f"before_refine_{k}": v for k, v in align.end_spread(good, ["_g", "j"]).items()})
        if good.height:
            sk = align.end_skew(good, ["_g", "j"]).with_columns(pl.col("report").cast(pl.Int32))
            kernels = align.shift(kernels, sk.select("report", offset_ns=-pl.col("offset_ns")))
            steps.append("median skew of collective end times")
            table = table.join(sk.select("report", refine_ns=-pl.col("offset_ns"), refine_collectives="collectives"),
                               on="report", how="left")
        clock["alignment"] = " + ".join(steps) or "none (a report lacks utcEpochNs and no collective matched)"
        clock["per_report"] = table.with_columns(path=pl.Series([r.trace.path for r in results])).to_dicts()
    counts = _group_counts(kernels)
    matched = match(kernels, counts)
    clock.update(align.end_spread(matched, ["_g", "j"]))
    ref = refused(matched)
    diags = [_diag("info", "COMM_CLOCK", f"clock: {clock['alignment']}"), *pairing,
             *_diagnostics(kernels, matched, counts, ref)]
    out = CommResult(
        reports=[r.trace.path for r in results],
        selection=results[0].selection if results else "",
        ranks=ranks,
        kernels=kernels,
        matched=matched,
        collectives=pl.DataFrame(),
        stragglers=pl.DataFrame(),
        mismatches=_mismatches(kernels, counts),
        clock=clock,
        diagnostics=diags,
        refused=ref,
        left_out_kernels=every.height - kernels.height,
        matched_collectives=_collectives_in(matched),
    )
    del matched
    if keys is None or out.matched.height == 0:  # else the whole run's tables are not made: within makes its own
        out.collectives, out.stragglers = _summary(out.matched, ref), stragglers(out.matched, ref)
    return out if keys is None else within(out, keys, cycles or "")


def within(cr: CommResult, keys: pl.DataFrame, cycles: str) -> CommResult:
    """``cr`` with its phases' collectives narrowed to the phase instances ``keys`` (``rank, range_id``: the steady
    cycles'); collectives outside any phase stay. Tables and the straggler verdict are recomputed over them.

    ``cr`` is consumed: its matched rows move into the returned result a column at a time (``cr.matched`` is left
    empty), so that the two frames (200 MB each at 10 M kernels) are never whole at once."""
    if cr.matched.height == 0:
        return dataclasses.replace(cr, cycles=cycles, straggler=straggler.verdict(cr.stragglers))
    # The rows kept in their order (by first arrival, _g, j, rank: one row each): no concatenation, no sort.
    full, n = cr.matched, cr.matched.height
    steady = keys.select("rank", "range_id").unique().with_columns(_in=pl.lit(True))
    rows = ((full.select("rank", "range_id").join(steady, on=["rank", "range_id"], how="left",
                                                  maintain_order="left")["_in"].fill_null(False)
             | (full["k"] < 0)).arg_true())
    cr.matched = full.clear()
    kept = {}
    for c in full.columns:
        kept[c] = full[c].gather(rows)
        full = full.drop(c)
    m = pl.DataFrame(kept)
    st = stragglers(m, cr.refused)
    return dataclasses.replace(cr, matched=m, collectives=_summary(m, cr.refused), stragglers=st, cycles=cycles,
                               outside_cycles=n - m.height, straggler=straggler.verdict(st),
                               matched_collectives=_collectives_in(m))


def _collectives_in(matched: pl.DataFrame) -> int:
    """How many collectives ``matched`` (one row per collective and rank) holds."""
    return matched.select(pl.struct("_g", "j").n_unique()).item() if matched.height else 0
