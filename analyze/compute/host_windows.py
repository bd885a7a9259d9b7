"""The host windows of a process: where its launching thread was while the GPU waited for it (per process).

A *host window* is the launching thread's time inside a host-bound gap: for every seam instance whose cause is
``host`` (:func:`analyze.compute.host.seam_causes`: the next range's first launch call began after the earlier GPU
work ended; between cycles too, where the seam leads into a cycle), the window runs from ``a`` (the end of the
earlier range's last GPU op) to ``launch_start`` (the start of the call that launched the next range's first GPU
op), on the thread ``gtid`` of that call. The GPU idle of the seam is this window plus the launch's own latency
(``launch_start`` → the op's start ``b``), which is not host time.

:func:`host_windows` returns one row per window (``what = "window"``) and one per CUDA API call of that thread that
overlaps it, clipped to it, with its kind (``what``): ``wait`` (a call that returns when earlier GPU work is done:
:data:`analyze.model.SYNC_API`), ``launch`` (kernel and graph launches), ``copy`` (asynchronous copies and memsets).
Only the calls the parquet store keeps (:data:`analyze.model.KEPT_API`) are read, from the store and from memory
alike: calls that launch nothing (``cudaEventQuery``, ``cudaStreamIsCapturing``, ...) are not, and their time is in
the rest. A call that spans two windows is clipped to each. :mod:`analyze.compute.host_gaps` splits the windows
by the host ranges and CPU samples of the thread (over the whole run).
"""

from __future__ import annotations

import polars as pl

from ..model import GRAPH_LAUNCH, KEPT_API, SYNC_API

__all__ = ["WINDOWS", "API_KINDS", "api_kinds", "host_windows"]

WINDOWS = pl.Schema({"pid": pl.Int64, "range_id": pl.Int64, "gtid": pl.Int64, "start": pl.Int64, "end": pl.Int64,
                     "what": pl.String})
API_KINDS = ("wait", "launch", "copy")  # the kinds of CUDA API call in a host window (module docstring)
_LAUNCH = rf"{GRAPH_LAUNCH}|^(cuda|cu)(Launch|GraphLaunch)"


def api_kinds(names: pl.DataFrame) -> pl.DataFrame:
    """``name_id, what`` of the API names the store keeps (:data:`KEPT_API`), each with its kind (:data:`API_KINDS`)."""
    n = names.select("name_id", "name").filter(pl.col("name").str.contains(KEPT_API))
    return n.select("name_id", what=pl.when(pl.col("name").str.contains(SYNC_API)).then(pl.lit("wait"))
                    .when(pl.col("name").str.contains(_LAUNCH)).then(pl.lit("launch"))
                    .otherwise(pl.lit("copy")))


def host_windows(seams: pl.DataFrame, firsts: pl.DataFrame, api: pl.DataFrame, kinds: pl.DataFrame,
                 pid: int) -> pl.DataFrame | None:
    """One process's host windows and the kept API calls in them (:data:`WINDOWS`, module docstring); None when no
    seam of it is host-bound. ``seams``: :func:`analyze.compute.host.seam_causes`; ``firsts``: the first launch of
    each range instance (``first, corr, launch_start``); ``api``: the process's calls (``corr, gtid, start, end,
    name_id``); ``kinds``: :func:`api_kinds`."""
    if seams.height == 0 or "cause" not in seams.columns:
        return None
    late = seams.filter((pl.col("cause") == "host") & pl.col("launch_start").is_not_null())
    if late.height == 0:
        return None
    # the call behind each seam's launch_start: the earliest-starting first launch of the op at b (as seam_causes)
    at_b = firsts.select("first", "launch_start", "corr").sort("first", "launch_start").unique("first", keep="first")
    win = (late.select("range_id", "a", "b").join(at_b, left_on="b", right_on="first", how="inner")
           .join(api.filter(pl.col("corr").is_in(at_b["corr"].implode())).select("corr", "gtid"), on="corr",
                 how="inner")
           .filter(pl.col("gtid").is_not_null() & (pl.col("launch_start") > pl.col("a")))
           .select(pid=pl.lit(pid, pl.Int64), range_id="range_id", gtid="gtid", start="a", end="launch_start",
                   what=pl.lit("window"))
           .unique("range_id").sort("gtid", "start"))
    if win.height == 0:
        return None
    parts = [_calls_in(t, win.filter(pl.col("gtid") == g), kinds)
             for (g,), t in api.select("gtid", "start", "end", "name_id")
             .filter(pl.col("gtid").is_in(win["gtid"].unique().implode())
                     & pl.col("name_id").is_in(kinds["name_id"].implode()))
             .partition_by("gtid", as_dict=True).items()]
    found = pl.concat(parts).with_columns(pid=pl.lit(pid, pl.Int64)).select(list(WINDOWS)) if parts else win.head(0)
    return pl.concat([win, found.cast(WINDOWS)]).cast(WINDOWS).sort("range_id", "start")  # type: ignore[arg-type]


_BACK = 2  # calls on one thread nest at most this deep (a runtime call and the driver call inside it)


def _calls_in(calls: pl.DataFrame, win: pl.DataFrame, kinds: pl.DataFrame) -> pl.DataFrame:
    """One thread's kept calls that overlap its windows (disjoint, sorted), clipped to them: ``range_id, gtid,
    start, end, what``. No pass over the calls: the rows that start inside a window are found by binary search on the
    starts, and those that reach into it from before are among the :data:`_BACK` calls started last before it (calls
    on one thread follow each other or nest, a runtime call around its driver call)."""
    if not calls["start"].is_sorted():
        calls = calls.sort("start")
    lo = calls["start"].search_sorted(win["start"], side="left")
    hi = calls["start"].search_sorted(win["end"], side="left")
    w = win.select("range_id", "gtid", _ws="start", _we="end").with_columns(_lo=lo.cast(pl.Int64),
                                                                             _hi=hi.cast(pl.Int64))
    back = [w.select("range_id", "gtid", "_ws", "_we", _i=pl.col("_lo") - k) for k in range(1, _BACK + 1)]
    rows = pl.concat([w.select("range_id", "gtid", "_ws", "_we", _i=pl.int_ranges("_lo", "_hi")).explode("_i"),
                      *back]).filter(pl.col("_i").is_not_null() & (pl.col("_i") >= 0))
    got = calls.select("start", "end", "name_id")[rows["_i"]]
    return (pl.concat([rows, got], how="horizontal").join(kinds, on="name_id", how="inner")
            .filter((pl.col("end") > pl.col("_ws")) & (pl.col("start") < pl.col("_we")))
            .select("range_id", "gtid", start=pl.max_horizontal("start", "_ws"), end=pl.min_horizontal("end", "_we"),
                    what="what"))
