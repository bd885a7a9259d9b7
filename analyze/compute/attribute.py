"""Attribute GPU operations to NVTX ranges.

An operation belongs to the innermost *selected* range that was open on the thread that launched
it while its CUDA API call ran (graph-node kernels share their ``cudaGraphLaunch`` call's
correlation id, so they follow the range around the replay). Ranges on one thread nest (push/pop),
so the innermost open range is found with a sweep: a timeline per thread of "current innermost
range", built from the range starts (current = range) and ends (current = parent), then an as-of
join of API start times onto it. Parents come from nesting depth, also by an as-of join.
"""

from __future__ import annotations

import polars as pl

from nvtx_hooks import phases as ph

from .intervals import rising
from .regex import check_regex
from .scalars import to_int

__all__ = ["select_ranges", "nest", "timeline", "innermost", "ancestors", "launching_calls", "join_calls", "per_call"]

_CYCLE_RANGE = r"(^|[.:/ ])(cycle|decode_step)$"  # the cycle ranges (analyze.compute.tokens.CYCLE_NAMES), any prefix


def select_ranges(ranges: pl.DataFrame, regex: str | None) -> tuple[pl.DataFrame, str]:
    """The ranges that are phases, and how they were chosen.

    ``regex`` is searched in ``text`` and in ``domain:text``. Without it, the ranges of the
    ``spectrace`` domain are phases; if there are none, ranges whose text names a spectrace
    phase with any prefix (``eagle3.verify``).
    """
    usable = ranges  # a range ended on another thread is attributed on the one that started it (CROSS_THREAD_RANGE)
    full = pl.concat_str([pl.col("domain"), pl.lit(":"), pl.col("range")])
    if regex is not None:
        check_regex(regex, "--ranges")
        chosen = pl.col("range").str.contains(regex) | full.str.contains(regex)
        sel = usable.filter(chosen)
        how = f"ranges matching {regex!r}"
        # The cycle ranges (cycle, decode_step, any prefix) stay selected whatever the regex chose: they say which
        # cycle each phase belongs to (steady state, budget, cross-rank pairing, findings).
        cyc = usable.filter(~chosen & pl.col("range").str.contains(_CYCLE_RANGE)
                            & pl.col("pid").is_in(sel["pid"].unique().implode()))
        if sel.height and cyc.height:
            names = ", ".join(repr(n) for n in sorted(cyc["range"].unique().to_list()))
            sel = pl.concat([sel, cyc]).sort("range_id")
            how += f" and the cycle ranges ({names}: which cycle each phase belongs to)"
    else:
        sel = usable.filter(pl.col("domain") == ph.DOMAIN)
        how = f"ranges of the {ph.DOMAIN!r} NVTX domain"
        if sel.height == 0:
            rx = ph.prefixed_phase_regex()
            sel = usable.filter(pl.col("range").str.contains(rx))
            how = f"ranges named after spectrace phases, any prefix (no {ph.DOMAIN!r} NVTX domain in this trace)"
    return sel, how


def nest(sel: pl.DataFrame) -> pl.DataFrame:
    """Selected ranges with ``depth`` (1 = outermost) and ``parent`` (range_id of the enclosing one).

    Zero-length ranges take no part in nesting (they can hold no API call); they get depth 0.
    """
    r = sel.select("range_id", "gtid", "start", "end")
    pos = r.filter(pl.col("end") > pl.col("start"))
    ev = pl.concat([
        pos.select("gtid", t="start", k=pl.lit(1, pl.Int8), tie=-pl.col("end"), range_id="range_id", d=pl.lit(1)),
        pos.select("gtid", t="end", k=pl.lit(0, pl.Int8), tie=-pl.col("start"), range_id="range_id", d=pl.lit(-1)),
    ]).sort("gtid", "t", "k", "tie", "range_id")
    ev = ev.with_columns(seq=pl.int_range(pl.len()), depth=pl.col("d").cum_sum().over("gtid"))
    starts = ev.filter(pl.col("k") == 1).select("gtid", "seq", "depth", "range_id")
    look = starts.select("gtid", "seq", "depth", parent="range_id")
    with_parent = (
        starts.with_columns(pdepth=pl.col("depth") - 1)
        .sort("seq")
        .join_asof(look.sort("seq"), on="seq", by_left=["gtid", "pdepth"], by_right=["gtid", "depth"],
                   strategy="backward", allow_exact_matches=False, check_sortedness=False)
        .select("range_id", "depth", "parent")
    )
    out = sel.join(with_parent, on="range_id", how="left").with_columns(pl.col("depth").fill_null(0))
    return out


def timeline(nested: pl.DataFrame) -> pl.DataFrame:
    """Per thread, the innermost open selected range from each time on: ``gtid, t, current``."""
    pos = nested.filter(pl.col("end") > pl.col("start"))
    ev = pl.concat([
        pos.select("gtid", t="start", k=pl.lit(1, pl.Int8), tie=-pl.col("end"), current="range_id"),
        pos.select("gtid", t="end", k=pl.lit(0, pl.Int8), tie=-pl.col("start"), current="parent"),
    ]).sort("gtid", "t", "k", "tie")
    # Several boundaries at one instant: the last one in push/pop order holds from then on (the rows are sorted by
    # thread and time: the last row of each run of one (thread, time), no group-by).
    last = (pl.col("gtid").ne_missing(pl.col("gtid").shift(-1)) | pl.col("t").ne_missing(pl.col("t").shift(-1)))
    return ev.filter(last.fill_null(True)).select("gtid", "t", "current").sort("t")


def innermost(api: pl.DataFrame, nested: pl.DataFrame, tl: pl.DataFrame | None = None) -> pl.DataFrame:
    """API calls with ``range_id``: the innermost selected range open on their thread when they ran (``tl``: the
    :func:`timeline` of ``nested`` if already made)."""
    tl = timeline(nested) if tl is None else tl
    ends = nested.select(range_id="range_id", _rend="end")
    s = api["start"]
    return (
        (api if s.null_count() == 0 and s.is_sorted() else api.sort("start"))
        .join_asof(tl.rename({"t": "_t"}), left_on="start", right_on="_t", by="gtid", strategy="backward",
                   check_sortedness=False)
        .rename({"current": "range_id"})
        .join(ends, on="range_id", how="left")
        # A call must end inside the range too (only broken nesting or clock ties violate this).
        .with_columns(range_id=pl.when(pl.col("end") <= pl.col("_rend")).then("range_id"))
        .drop("_t", "_rend")
    )


def ancestors(nested: pl.DataFrame) -> pl.DataFrame:
    """Every (range, ancestor-or-self) pair of the selected nesting: ``range_id, anc``."""
    par = nested.select(pl.col("range_id").alias("anc"), pl.col("parent").alias("_up"))
    level = nested.select(range_id="range_id", anc="range_id")
    out = [level]
    for _ in range(to_int(nested["depth"].max() or 0)):
        level = level.join(par, on="anc").select("range_id", anc="_up").drop_nulls("anc")
        if level.height == 0:
            break
        out.append(level)
    return pl.concat(out)


def launching_calls(ops: pl.DataFrame, api: pl.DataFrame, nested: pl.DataFrame,
                    tl: pl.DataFrame | None = None) -> pl.DataFrame:
    """The API calls that launched ``ops``, one per (pid, correlation id), with their innermost range:
    ``pid, corr, gtid, range_id, api_start, api_end, api_name_id``.

    Correlation ids are unique only within a process: the match is on (pid, corr), on corr alone when
    everything is one process (a one-key match is ~3x cheaper).
    """
    if _one_pid(ops, api):
        on = ["corr"]
        calls = api.filter(pl.col("corr").is_in(ops["corr"].implode()))
        first = pl.col("corr").is_first_distinct()
    else:
        on = ["pid", "corr"]
        calls = api.join(ops.select(on).unique(), on=on, how="semi")
        first = pl.struct(on).is_first_distinct()
    out = innermost(calls, nested, tl).select(
        "pid", "corr", "gtid", "range_id", api_start="start", api_end="end", api_name_id="name_id"
    )
    if on == ["corr"] and rising(out["corr"]):
        return out  # one call per id already (ids rising with their calls' starts): no hash of every id
    return out.filter(first)


def per_call(ops: pl.DataFrame, api: pl.DataFrame, nested: pl.DataFrame,
             tl: pl.DataFrame | None = None) -> tuple[pl.DataFrame, pl.Series]:
    """One process's ops attributed by their launching calls, a call at a time: one row per correlation id of
    ``ops`` (``pid, corr, ops, first, last``: how many ops it launched, the earliest start, the latest end) with its
    call (``gtid, range_id, api_start, api_end, api_name_id`` of :func:`launching_calls`, null when the call is not
    in ``api``), and each op's ``range_id`` in the order of ``ops``.

    The calls are looked up and their ranges found once per call, not once per op. When the correlation ids of
    ``ops`` are sorted (ops sorted by start usually have them in launch order) the group-by takes polars' sorted
    path and each op's range is a gather by its run of one id; otherwise a group-by and a join on the id."""
    if ops.height == 0 or not _one_pid(ops):
        on = ["pid", "corr"]
        per = ops.lazy().group_by(on).agg(ops=pl.len().cast(pl.UInt32), first=pl.col("start").min(),
                                          last=pl.col("end").max()).collect()
        per = per.join(launching_calls(per, api, nested, tl), on=on, how="left", maintain_order="left")
        return per, ops.select(on).join(per.select(*on, "range_id"), on=on, how="left",
                                        maintain_order="left")["range_id"]
    corr = ops["corr"]
    runs = corr.null_count() == 0 and corr.is_sorted()  # each call's ops one run of rows
    lf = ops.lazy().select(pl.col("corr").set_sorted() if runs else "corr", "start", "end")
    per = (lf.group_by("corr", maintain_order=runs)
           .agg(ops=pl.len().cast(pl.UInt32), first=pl.col("start").min(), last=pl.col("end").max()).collect()
           .select(pl.lit(ops["pid"][0], pl.Int64).alias("pid"), "corr", "ops", "first", "last"))
    calls = launching_calls(per, api, nested, tl).drop("pid")
    if calls.height == per.height and calls["corr"].equals(per["corr"]):  # every call found, in the same order
        per = per.hstack(calls.drop("corr"))
    else:
        per = per.join(calls, on="corr", how="left", maintain_order="left")
    if runs:  # the calls in the order of the runs: an op's call is its run's
        return per, per["range_id"].gather(corr.rle_id())
    return per, ops.select("corr").join(per.select("corr", "range_id"), on="corr", how="left",
                                        maintain_order="left")["range_id"]


def _one_pid(*frames: pl.DataFrame) -> bool:
    """Whether the rows of all ``frames`` have at most one distinct process id (null counting as one)."""
    vals: set[object] = set()
    for f in frames:
        col = f["pid"]
        if col.null_count():
            vals.add(None)
        if col.null_count() < f.height:
            vals.update((col.min(), col.max()))
    return len(vals) <= 1


def join_calls(ops: pl.DataFrame, calls: pl.DataFrame) -> pl.DataFrame:
    """``ops`` with their launching call's ``gtid, range_id, api_start, api_end, api_name_id`` (:func:`launching_calls`)."""
    if _one_pid(calls, ops):
        return ops.join(calls.drop("pid"), on="corr", how="left")
    return ops.join(calls, on=["pid", "corr"], how="left")


def _attribute_ops(ops: pl.DataFrame, api: pl.DataFrame, nested: pl.DataFrame) -> pl.DataFrame:
    """GPU ops with their launching call's thread (``gtid``), ``api_name_id`` and range ``range_id``."""
    return join_calls(ops, launching_calls(ops, api, nested))
