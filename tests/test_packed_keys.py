"""The shortcuts that replace a many-column sort or a per-group median by packed integers or counts: each
checked against the plain polars operation it stands for, on random frames (ties, nulls, wide values)."""

from __future__ import annotations

import polars as pl
from hypothesis import example, given, settings
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


pairs = st.lists(st.tuples(st.one_of(st.none(), st.integers(-1, 4)), st.one_of(st.none(), st.integers(0, 9)),
                           st.integers(0, 99)), max_size=40)


@settings(max_examples=300, deadline=None)
@given(pairs, pairs, st.sampled_from([1, 2**40, 2**59]))
@example([(0, 9, 1), (1, 0, 2)], [(1, 0, 3)], 1)  # (0, 9) and (1, 0) must stay apart
def test_one_key_joins_as_the_two_columns(left, right, wide):
    from analyze.compute.breakdown import one_key

    schema = {"rank": pl.Int64, "range_id": pl.Int64, "v": pl.Int64}
    a = pl.DataFrame(left, schema=schema, orient="row").with_columns(pl.col("range_id") * wide)
    b = (pl.DataFrame(right, schema=schema, orient="row").with_columns(pl.col("range_id") * wide)
         .unique(["rank", "range_id"], keep="first"))
    (pa, pb), on = one_key(a, b)
    for how in ("semi", "left", "inner"):
        want = a.join(b, on=["rank", "range_id"], how=how, maintain_order="left")
        right_side = pb.drop("rank", "range_id") if on == ["_key"] else pb
        got = pa.join(right_side, on=on, how=how, maintain_order="left").drop("_key", strict=False)
        assert got.equals(want), how



op_keys = st.lists(st.tuples(st.one_of(st.none(), st.integers(-2, 40)), st.one_of(st.none(), st.sampled_from("abc"))),
                   max_size=30)


@settings(max_examples=300, deadline=None)
@given(op_keys, op_keys, st.sampled_from([0, 2**20]))
@example([(5, None), (7, None), (None, "a"), (None, "b"), (3, None)],
         [(7, None), (None, "b"), (3, None), (5, None), (None, "a"), (9, None), (-1, None), (None, "c")], 0)
def test_kind_codes_are_the_lookup_of_both_keys(kinds, ops, shift):
    """Each op's row in the kinds (by name id through an array; by label for the ops without one) equals the lookup
    it replaces (a hashed replace, or a join on both keys when a name id repeats under two labels) and, for ops
    with a name id, a join on it: ids unknown, negative or too wide for the array, null labels."""
    from analyze.compute.pipeline import _add_kinds, _kind_codes

    schema = {"name_id": pl.Int64, "label": pl.String}
    wide = pl.col("name_id") + pl.when(pl.col("name_id") > 20).then(shift).otherwise(0)
    k = pl.DataFrame(kinds, schema=schema, orient="row").unique(maintain_order=True).with_columns(wide)
    o = pl.DataFrame(ops, schema=schema, orient="row").with_columns(wide)
    codes = k.with_row_index("_kind").with_columns(pl.col("_kind").cast(pl.Int64))
    got = _kind_codes(o, k)
    assert got.equals(_add_kinds(o, codes, ["_kind"])["_kind"])
    by_id = codes.filter(pl.col("name_id").is_not_null())
    if not by_id["name_id"].is_duplicated().any():
        joined = (o.with_row_index("_o").join(by_id.select("name_id", "_kind"), on="name_id", how="left")
                  .sort("_o").with_columns(got=got))
        assert joined.filter(pl.col("name_id").is_not_null()).select(pl.col("_kind").eq_missing(pl.col("got")).all()).item()


four = st.lists(st.tuples(st.integers(0, 3), st.one_of(st.none(), st.integers(-5, 5)), st.sampled_from("xyz"),
                          st.integers(0, 3), st.integers(0, 99)), max_size=40)


@settings(max_examples=300, deadline=None)
@given(four, four, st.sampled_from([0, 2**20, 2**61]))
def test_packed_join_is_the_join_on_the_columns(left, right, wide):
    """A join on the packed key (:func:`analyze.compute.windows._packed`) matches the rows the join on the four
    columns does: negative and null values, a Categorical, values too wide to pack (then the columns themselves)."""
    from analyze.compute.windows import _packed

    schema = {"p": pl.Int64, "a": pl.Int64, "name": pl.Categorical, "j": pl.Int64, "v": pl.Int64}
    a, b = (pl.DataFrame(rows, schema=schema, orient="row").with_columns(pl.col("a") * (1 + wide))
            for rows in (left, right))
    cols = ["p", "a", "name", "j"]
    want = a.join(b.select(*cols, w="v"), on=cols).select("v", "w").sort("v", "w")
    (pa, pb), on = _packed((a, b), cols)
    if wide < 2**61:  # small values always pack
        assert on == ["_key"]
    got = pa.join(pb.select(*on, w="v"), on=on).select("v", "w").sort("v", "w")
    assert got.equals(want)


def test_values_too_wide_to_pack_are_joined_on_the_columns():
    from analyze.compute.windows import _packed

    a = pl.DataFrame({"x": [-(2**40), 2**40], "y": [0, 2**30]})
    assert _packed((a,), ["x", "y"])[1] == ["x", "y"]
    assert _packed((a,), ["y"])[1] == ["_key"]
    assert _packed((a.with_columns(pl.col("y").cast(pl.String)),), ["y"])[1] == ["y"]  # not integers


pairs = st.lists(st.tuples(st.one_of(st.none(), st.integers(-2, 4)), st.one_of(st.none(), st.integers(0, 2**40))),
                 max_size=40)


@settings(max_examples=300, deadline=None)
@given(pairs, pairs, st.sampled_from([0, 2**61]))
def test_rows_in_is_the_semi_join(rows, keys, wide):
    """headline.rows_in (a filter on the two key columns packed into one integer, or the semi join when they do not
    pack: a negative or too wide value) keeps the rows the semi join keeps, in their order; a null matches nothing."""
    from analyze.compute.headline import rows_in

    schema = {"rank": pl.Int64, "range_id": pl.Int64}
    df = pl.DataFrame(rows, schema=schema, orient="row").with_row_index("i")
    ks = pl.DataFrame(keys, schema=schema, orient="row").with_columns(pl.col("range_id") + wide)
    want = df.join(ks, on=["rank", "range_id"], how="semi", maintain_order="left")
    assert rows_in(df, ks).equals(want)
