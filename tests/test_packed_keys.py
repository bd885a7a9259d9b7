"""The shortcuts that replace a many-column sort or a per-group median by packed integers or counts: each
checked against the plain polars operation it stands for, on random frames (ties, nulls, wide values)."""

from __future__ import annotations

import polars as pl
from hypothesis import given, settings
from hypothesis import strategies as st

from analyze.compute.collectives import _sorted_by_collective
from analyze.compute.windows import _median_above

values = st.lists(st.tuples(st.integers(0, 6), st.one_of(st.none(), st.integers(0, 30))), max_size=60)


@settings(max_examples=300, deadline=None)
@given(values, st.integers(-1, 31))
def test_median_above_is_the_median_compared_to_the_bound(rows, bound):
    df = pl.DataFrame(rows, schema={"g": pl.Int64, "x": pl.Int64}, orient="row")
    got = _median_above(df, "g", "x", bound, "above").sort("g")
    want = df.group_by("g").agg(m=pl.col("x").median()).select("g", above=pl.col("m") > bound).sort("g")
    assert got.equals(want)


kernels = st.lists(st.tuples(st.integers(0, 5), st.integers(0, 3), st.integers(0, 50), st.integers(0, 3),
                             st.integers(0, 9)), max_size=80)


@settings(max_examples=300, deadline=None)
@given(kernels, st.sampled_from([0, 2**20, 2**55]))
def test_sorted_by_collective_is_the_four_column_sort(rows, wide):
    # (_g, j, start, rank) unique per row as in matching (one kernel per rank and collective); ``wide`` pushes the
    # start times past what packs with the rank, so the four-column sort is taken instead
    df = (pl.DataFrame(rows, schema={"_g": pl.Int64, "j": pl.Int64, "start": pl.Int64, "rank": pl.Int64,
                                     "end": pl.Int64}, orient="row")
          .unique(["_g", "j", "rank"], keep="first", maintain_order=True)
          .with_columns(start=pl.col("start") * pl.when(pl.col("rank") == 1).then(wide + 1).otherwise(1)))
    assert _sorted_by_collective(df).equals(df.sort("_g", "j", "start", "rank"))
