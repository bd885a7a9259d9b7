"""Interval algebra over frames of ``start``/``end`` (integer ns, half-open ``[start, end)``).

All functions are polars expressions over groups (``by``); none loops over rows.
"""

from __future__ import annotations

from collections.abc import Sequence

import polars as pl

from .scalars import real

__all__ = ["group_parts", "one_group", "rising", "union_blocks", "union_length", "busy_function", "busy_between"]


def _prev_end(by: list[str]) -> pl.Expr:
    """The latest end among earlier intervals of the group (rows sorted by start)."""
    prev = pl.col("end").shift(1).cum_max()
    return prev.over(by) if by else prev


def group_parts(df: pl.DataFrame, key: str, only: str | None = None) -> pl.DataFrame | None:
    """Add ``_p`` (and ``_q`` with ``only``): each row's share of its group's union length.

    A row adds the part of it past the latest end of the group's earlier rows (``_q``: among the
    rows where the boolean column ``only`` holds; 0 elsewhere), so ``_p`` summed per group is the
    group's busy time. ``df`` must be sorted by ``key`` and then by ``start``. Rows are shifted by
    ``group index * (the frame's span)`` (the group index: a run-length id of ``key``), so that one
    running maximum over the frame never carries from one group into the next: no window per group.
    Where that could overflow (or with nulls), by ``group index * (longest group)`` from their group's
    first start. None when that could overflow too.
    """
    if df.height == 0:
        return df.with_columns(_p=pl.lit(0, pl.Int64), **({"_q": pl.lit(0, pl.Int64)} if only else {}))
    lo, hi = df["start"].min(), df["end"].max()
    if not any(df[c].null_count() for c in (key, "start", "end")) and isinstance(lo, int) and isinstance(hi, int):
        span = hi - lo + 1  # every group's rows fit in it: one pass, no group's first start to carry down
        run = pl.col(key).rle_id()
        if span > 0 and (real(df.select(run.max()).item()) + 2) * span < 2**62:
            g = run.cast(pl.Int64) * span - lo
            return _shifted_parts(df.lazy(), pl.col("start") + g, pl.col("end") + g, only).collect()
    new = (pl.col(key) != pl.col(key).shift(1)).fill_null(True)
    base = pl.when(new).then(pl.col("start")).forward_fill()  # the group's first start
    out = df.with_columns(_g=new.cum_sum().cast(pl.Int64), _s=pl.col("start") - base, _e=pl.col("end") - base)
    width = real(out["_e"].max() or 0) + 1
    if width * (out["_g"][-1] + 1) >= 2**62:
        return None
    g = pl.col("_g") * width
    return _shifted_parts(out.lazy(), pl.col("_s") + g, pl.col("_e") + g, only).drop("_g").collect()


def _shifted_parts(lf: pl.LazyFrame, s: pl.Expr, e: pl.Expr, only: str | None) -> pl.LazyFrame:
    """``_p`` (and ``_q``) of :func:`group_parts` from each row's start ``s`` and end ``e`` shifted apart by group
    (all >= 0)."""
    lf = lf.with_columns(_s=s, _e=e)
    prev = pl.col("_e").shift(1).cum_max().fill_null(0)
    cols = {"_p": (pl.col("_e") - pl.max_horizontal("_s", prev)).clip(lower_bound=0)}
    if only:
        # Offsets are >= 0, so 0 stands for "no earlier row" in the running maximum.
        prev_c = pl.when(only).then("_e").otherwise(0).cum_max().shift(1).fill_null(0)
        cols["_q"] = pl.when(only).then((pl.col("_e") - pl.max_horizontal("_s", prev_c)).clip(lower_bound=0)).otherwise(0)
    return lf.with_columns(**cols).drop("_s", "_e")


def one_group(by: list[str], *frames: pl.DataFrame | pl.LazyFrame) -> bool:
    """Whether these frames are eager, hold rows, and all share one non-null value of ``by``: then
    no grouping is needed. The streamed analysis works one process at a time, so its ``pid``
    groups are always one.
    """
    seen = set()
    for f in frames:
        if not isinstance(f, pl.DataFrame):
            return False
        if f.height == 0:
            continue
        for c in by:
            col = f[c]
            if col.null_count() or col.min() != col.max():
                return False
        seen.add(tuple(f[c][0] for c in by))
    return len(seen) == 1


def rising(values: pl.Series) -> bool:
    """Whether ``values`` rise strictly (no null, no repeat): rows already in the order a sort on them would give,
    each its own group."""
    return (values.null_count() == 0 and values.is_sorted()
            and not values.to_frame("v").select((pl.col("v").diff() == 0).any()).item())


def union_blocks(df: pl.DataFrame | pl.LazyFrame, by: Sequence[str] = (), presorted: bool = False) -> pl.LazyFrame:
    """The union of the intervals of each group, as disjoint sorted blocks ``by..., start, end``.

    HTA's idiom: a new block starts where ``start`` passes the running maximum of earlier ends. With
    the rows of each group contiguous and sorted by start, block starts are the rows that open a block
    and block ends the running maximum at the rows that close one: two filters, no group-by.
    ``presorted`` says the rows are already sorted by ``start``.
    """
    by = list(by)
    single = not by or one_group(by, df)
    lf = df.lazy().select(*by, "start", "end")
    if not single:
        lf = lf.sort([*by, "start"])  # groups contiguous
    elif not presorted:
        lf = lf.sort("start")
    running = pl.col("end").cum_max()
    if not single:
        running = running.over(by)
    opens = pl.col("start") > pl.col("_run").shift(1)
    if not single:
        opens = opens | pl.any_horizontal([pl.col(c) != pl.col(c).shift(1) for c in by])
    lf = (
        lf.with_columns(_run=running)
        .with_columns(_open=opens.fill_null(True))
        .with_columns(_close=pl.col("_open").shift(-1).fill_null(True))
    )
    starts = lf.filter("_open").select(*by, "start")
    ends = lf.filter("_close").select(end="_run")
    return pl.concat([starts, ends], how="horizontal")


def union_length(df: pl.DataFrame | pl.LazyFrame, by: Sequence[str] = (), name: str = "busy",
                 presorted: bool = False) -> pl.LazyFrame:
    """Total length of the union of each group's intervals (overlaps counted once).

    Each interval adds the part of it past the running maximum of earlier ends; no blocks are built.
    """
    by = list(by)
    lf = df.lazy().select(*by, "start", "end")
    if not presorted:
        lf = lf.sort("start")
    if by and one_group(by, df):
        part = (pl.col("end") - pl.max_horizontal(pl.col("start"), _prev_end([]))).clip(lower_bound=0)
        return lf.select(*[pl.col(c).first() for c in by], part.sum().alias(name))  # one group: no window
    part = (pl.col("end") - pl.max_horizontal(pl.col("start"), _prev_end(by))).clip(lower_bound=0)
    return lf.group_by(by).agg(part.sum().alias(name)) if by else lf.select(part.sum().alias(name))


def busy_function(blocks: pl.DataFrame | pl.LazyFrame, by: Sequence[str]) -> pl.LazyFrame:
    """Blocks with ``before``: the busy time of all earlier blocks of the group.

    Busy time in ``[0, t]`` is then ``before + clip(t - start, 0, end - start)`` for the last block
    starting at or before ``t`` (see :func:`busy_between`).
    """
    by = [] if one_group(list(by), blocks) else list(by)
    length = pl.col("end") - pl.col("start")
    lf = blocks.lazy()
    # Sorted by start across groups (what the as-of joins need); within a group that is block order.
    if not (isinstance(blocks, pl.DataFrame) and blocks["start"].is_sorted()):
        lf = lf.sort("start")
    return lf.with_columns(before=(length.cum_sum() - length).over(by) if by else length.cum_sum() - length)


def _busy_at(fn: pl.LazyFrame, points: pl.LazyFrame, t: str, by: Sequence[str], out: str) -> pl.LazyFrame:
    """Add column ``out``: busy time of the group in ``[0, points[t]]`` (``fn`` from :func:`busy_function`)."""
    by = list(by)
    right = fn.select(*by, pl.col("start").alias("_bs"), pl.col("end").alias("_be"), "before")
    joined = (
        points.sort(t)
        .join_asof(right, left_on=t, right_on="_bs", by=by or None, strategy="backward",
                   check_sortedness=False)
    )
    val = pl.col("before") + (pl.min_horizontal(pl.col(t), pl.col("_be")) - pl.col("_bs")).clip(lower_bound=0)
    return joined.with_columns(val.fill_null(0).alias(out)).drop("_bs", "_be", "before")


def busy_between(
    blocks: pl.DataFrame | pl.LazyFrame, windows: pl.DataFrame | pl.LazyFrame, by: Sequence[str],
    a: str = "a", b: str = "b", out: str = "busy",
) -> pl.LazyFrame:
    """Add column ``out`` to ``windows``: busy time of the group's ``blocks`` inside ``[a, b]`` (0 if b <= a).

    ``blocks`` may already be a :func:`busy_function` (a ``before`` column): it is then used as is.
    """
    if one_group(list(by), blocks, windows):
        by = []
    lf = blocks.lazy()
    fn = lf if "before" in lf.collect_schema().names() else busy_function(blocks, by)
    w = windows.lazy().with_row_index("_w")
    w = _busy_at(fn, w, a, by, "_fa")
    w = _busy_at(fn, w, b, by, "_fb")
    return (
        w.with_columns(
            pl.when(pl.col(b) > pl.col(a)).then(pl.col("_fb") - pl.col("_fa")).otherwise(0).alias(out)
        )
        .sort("_w")
        .drop("_w", "_fa", "_fb")
    )
