"""The shortcuts that replace a many-column sort or a per-group median by packed integers or counts: each
checked against the plain polars operation it stands for, on random frames (ties, nulls, wide values)."""

from __future__ import annotations

import polars as pl
from hypothesis import example, given, settings
from hypothesis import strategies as st

from analyze.compute.windows import _median_above
from analyze.read.packed_keys import sort_by

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
def test_collectives_sort_is_the_four_column_sort(rows, wide):
    # (_g, j, start, rank) unique per row as in matching (one kernel per rank and collective); ``wide`` pushes the
    # start times past what packs with the others, so several keys (or the columns) are sorted on
    df = (pl.DataFrame(rows, schema={"_g": pl.Int64, "j": pl.Int64, "start": pl.Int64, "rank": pl.Int64,
                                     "end": pl.Int64}, orient="row")
          .unique(["_g", "j", "rank"], keep="first", maintain_order=True)
          .with_columns(start=pl.col("start") * pl.when(pl.col("rank") == 1).then(wide + 1).otherwise(1)))
    assert sort_by(df, ["_g", "j", "start", "rank"]).equals(df.sort("_g", "j", "start", "rank"))


pairs = st.lists(st.tuples(st.one_of(st.none(), st.integers(-1, 4)), st.one_of(st.none(), st.integers(0, 9)),
                           st.integers(0, 99)), max_size=40)


@settings(max_examples=300, deadline=None)
@given(pairs, pairs, st.sampled_from([1, 2**40, 2**59]))
@example([(0, 9, 1), (1, 0, 2)], [(1, 0, 3)], 1)  # (0, 9) and (1, 0) must stay apart
def test_rank_and_range_id_join_as_the_two_columns(left, right, wide):
    """(rank, range_id) packed (as breakdown.sum_seams and findings.launch_timing join them): the semi, left and
    inner joins of the two columns."""
    from analyze.read.packed_keys import join, semi_join

    schema = {"rank": pl.Int64, "range_id": pl.Int64, "v": pl.Int64}
    a = pl.DataFrame(left, schema=schema, orient="row").with_columns(pl.col("range_id") * wide)
    b = (pl.DataFrame(right, schema=schema, orient="row").with_columns(pl.col("range_id") * wide)
         .unique(["rank", "range_id"], keep="first"))
    on = ["rank", "range_id"]
    assert semi_join(a, b, on).equals(a.join(b, on=on, how="semi", maintain_order="left"))
    for how in ("left", "inner"):
        want = a.join(b, on=on, how=how, maintain_order="left")
        assert join(a, b, on, how=how, maintain_order="left").equals(want), how


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


dense_rows = st.lists(st.tuples(st.integers(0, 2), st.integers(0, 2), st.integers(-3, 3), st.integers(0, 3),
                                st.one_of(st.none(), st.sampled_from(["", "a", "b:1", "b:10", "b:9"]))), max_size=60)


@settings(max_examples=300, deadline=None)
@given(dense_rows, st.sampled_from([1, 2**20, 2**61]))
def test_dense_is_the_sorted_distinct_number(rows, wide):
    """:func:`windows._dense` (one dense rank of the packed columns; the sort on every column when they do not pack):
    per group, the index of the row's values among the group's distinct values in sorted order, nulls last (an
    independent computation in Python); strings by their own order ('b:10' < 'b:9')."""
    from analyze.compute.windows import _dense

    df = pl.DataFrame(rows, schema={"g": pl.Int64, "s": pl.Int64, "a": pl.Int64, "b": pl.Int64, "p": pl.String},
                      orient="row").with_columns(pl.col("a") * wide)
    got = _dense(df, ["g"], ["s", "a", "b", "p"]).to_list()

    def order(r):
        return (r[1], r[2] * wide, r[3], (1, "") if r[4] is None else (0, r[4]))

    distinct = {g: sorted({order(r) for r in rows if r[0] == g}) for g in {r[0] for r in rows}}
    assert got == [distinct[r[0]].index(order(r)) for r in rows]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.one_of(st.none(), st.integers(0, 4)), st.sampled_from(["x", "y", "z"]),
                          st.integers(0, 6)), max_size=50), st.sampled_from([1, 2**58]))
def test_ordinal_is_the_window_ordinal(rows, wide):
    """:func:`windows.ordinal` (one packed sort key where it fits): each row's order by start among the rows of its
    (key, name), ties in their given order, as a window over the stably sorted rows numbers them."""
    from analyze.compute.windows import ordinal

    df = pl.DataFrame(rows, schema={"key": pl.Int64, "name": pl.String, "start": pl.Int64}, orient="row")
    df = df.with_columns(pl.col("start") * wide).with_row_index("i")
    want = (df.sort("start", maintain_order=True)
            .with_columns(o=pl.int_range(pl.len(), dtype=pl.Int64).over("key", "name")).sort("i"))
    assert ordinal(df, "key", "name", "o").sort("i").equals(want)
    in_order = df.with_columns(o=pl.int_range(pl.len(), dtype=pl.Int64).over("key", "name"))  # as comm_kernels
    assert ordinal(df, "key", "name", "o", by=(), keep_order=True).equals(in_order)


presence_rows = st.lists(st.tuples(st.integers(0, 2), st.integers(0, 1), st.integers(0, 3), st.integers(0, 1),
                                   st.booleans(), st.booleans(), st.integers(0, 100)), max_size=40)


@settings(max_examples=200, deadline=None)
@given(presence_rows)
def test_presence_packed_is_the_presence_on_the_columns(rows):
    """:func:`windows._presence` on packed (phase, key, rank) integers gives what it gives on the columns (the packing
    turned off: :data:`analyze.read.packed_keys.KEYS` 0): missing keys (the rank-by-rank branch), cut, misaligned and
    GPU-less instances."""
    import analyze.compute.windows as w

    x = (pl.DataFrame(rows, schema={"rank": pl.Int64, "_ph": pl.Int64, "key": pl.Int64, "i_ops": pl.UInt32,
                                    "_cut": pl.Boolean, "misaligned": pl.Boolean, "start": pl.Int64}, orient="row")
         .unique(["rank", "_ph", "key"], keep="first", maintain_order=True)
         .with_row_index("range_id").with_columns(pl.col("range_id").cast(pl.Int64), _phj="_ph",
                                                  cut=pl.when("_cut").then(pl.lit("window_start"))).drop("_cut"))
    ranks = pl.DataFrame({"rank": [0, 1, 2], "window_start_ns": [10, 0, 0], "window_end_ns": [100, 90, 100]})
    from analyze.read import packed_keys

    got = w._presence(x, ranks).sort("range_id")
    keys = packed_keys.KEYS
    try:
        packed_keys.KEYS = 0  # nothing packs
        want = w._presence(x, ranks).sort("range_id")
    finally:
        packed_keys.KEYS = keys
    assert got.equals(want)


def test_phase_codes_one_per_phase_nulls_apart():
    """:func:`windows._phase_codes`: one code per (domain, range), a null a value of its own (as in a group-by);
    ``_phj`` null where either is null (as a join on the two strings matches nothing there); rows in their order."""
    from analyze.compute.windows import _phase_codes

    x = pl.DataFrame({"domain": ["", "", None, "", None, "", "d"], "range": ["a", "b", "a", None, "a", "a", "a"],
                      "i": range(7)})
    y = _phase_codes(x)
    assert y["i"].to_list() == list(range(7))
    ph = y["_ph"].to_list()
    assert ph[0] == ph[5] and ph[2] == ph[4] and len({ph[0], ph[1], ph[2], ph[3], ph[6]}) == 5
    assert y["_phj"].to_list() == [ph[0], ph[1], None, None, None, ph[5], ph[6]]


pairs = st.lists(st.tuples(st.one_of(st.none(), st.integers(-2, 4)), st.one_of(st.none(), st.integers(0, 2**40))),
                 max_size=40)


@settings(max_examples=300, deadline=None)
@given(pairs, pairs, st.sampled_from([0, 2**61]))
def test_steady_rows_are_the_semi_join(rows, keys, wide):
    """packed_keys.semi_join as the steady tables use it (headline's steady rows, compare's steady pieces, a class's
    collectives): a filter on the two key columns packed into one integer, or the semi join when they do not pack (a
    value too wide), keeps the rows the semi join keeps, in their order; a null matches nothing."""
    from analyze.read.packed_keys import semi_join

    schema = {"rank": pl.Int64, "range_id": pl.Int64}
    df = pl.DataFrame(rows, schema=schema, orient="row").with_row_index("i")
    ks = pl.DataFrame(keys, schema=schema, orient="row").with_columns(pl.col("range_id") + wide)
    want = df.join(ks, on=["rank", "range_id"], how="semi", maintain_order="left")
    assert semi_join(df, ks, ["rank", "range_id"]).equals(want)


# ---- the one packer: analyze.read.packed_keys, each operation against the plain polars operation ----------------

cells = st.one_of(st.none(), st.integers(-3, 6))
rows3 = st.lists(st.tuples(cells, cells, cells, st.integers(0, 99)), max_size=50)
widths = st.sampled_from([1, 2**20, 2**40, 2**61])  # a column's values times this: 2**40 and up do not pack with others


def _frame(rows, wide, dtype=pl.Int64):
    return (pl.DataFrame(rows, schema={"a": pl.Int64, "b": pl.Int64, "c": pl.Int64, "v": pl.Int64}, orient="row")
            .with_columns(pl.col("b") * wide).with_columns(pl.col("a", "c").cast(dtype)))


@settings(max_examples=300, deadline=None)
@given(rows3, rows3, widths, st.sampled_from([pl.Int64, pl.Int16, pl.UInt64]))
def test_packed_join_is_the_join_on_the_columns_nulls_negatives_and_wide_values(left, right, wide, dtype):
    """:func:`packed_keys.join` (and :func:`with_key`, which it joins on) gives the rows and columns of the plain join
    on the columns, inner and left, in the left frame's order: nulls match nothing, negative values, other integer
    types, values too wide to pack (then the plain join itself)."""
    from analyze.read import packed_keys as pk

    if dtype == pl.UInt64:
        left = [(None if a is None else abs(a), b, None if c is None else abs(c), v) for a, b, c, v in left]
        right = [(None if a is None else abs(a), b, None if c is None else abs(c), v) for a, b, c, v in right]
    a = _frame(left, wide, dtype)
    b = _frame(right, wide, dtype).rename({"v": "w"})
    on = ["a", "b", "c"]
    for how in ("inner", "left"):
        want = a.join(b, on=on, how=how, maintain_order="left")
        assert pk.join(a, b, on, how=how, maintain_order="left").equals(want), how
    (pa, pb), by = pk.with_key((a, b), on)
    if wide < 2**40:  # small values always pack
        assert by == ["_key"]
    got = pa.join(pb.drop(*on) if by == ["_key"] else pb, on=by, how="left", maintain_order="left")
    assert got.drop("_key", strict=False).equals(a.join(b, on=on, how="left", maintain_order="left"))


@settings(max_examples=300, deadline=None)
@given(rows3, rows3, widths)
def test_semi_join_is_the_semi_join(rows, keys, wide):
    """:func:`packed_keys.semi_join`: the rows the semi join keeps, in their order (a null matches nothing)."""
    from analyze.read.packed_keys import semi_join

    df, ks = _frame(rows, wide), _frame(keys, wide)
    for on in (["a", "b"], ["a", "b", "c"], ["c"]):
        assert semi_join(df, ks, on).equals(df.join(ks, on=on, how="semi", maintain_order="left")), on


@settings(max_examples=300, deadline=None)
@given(rows3, widths, st.booleans())
def test_group_by_on_a_key_with_null_codes_is_the_group_by_on_the_columns(rows, wide, first):
    """A key with a code for null (``nulls="first"``/``"last"``) groups as the columns do: a null is a value of its
    own; and the columns come back from it (:meth:`Packing.unpacked`)."""
    from analyze.read.packed_keys import packing

    df = _frame(rows, wide)
    on = ["a", "b", "c"]
    p = packing((df,), on, "first" if first else "last")
    want = df.group_by(on).agg(pl.col("v").sum()).sort(on, nulls_last=True)
    if p is None:
        assert wide >= 2**40
        return
    keyed = df.with_columns(p.key())
    got = keyed.group_by("_key").agg(pl.col("v").sum()).select(*p.unpacked(), "v").sort(on, nulls_last=True)
    assert got.equals(want)
    assert keyed.select(*p.unpacked()).equals(df.select(on))


strings = st.one_of(st.none(), st.sampled_from(["", "a", "b:1", "b:10", "b:9"]))
sort_rows = st.lists(st.tuples(cells, strings, cells, st.integers(0, 3)), max_size=60)


@settings(max_examples=300, deadline=None)
@given(sort_rows, st.sampled_from([1, 2**20, 2**58, 2**60]), st.booleans())
@example([(None, None, -(2**63), 0), (None, None, None, 0)], 1, True)  # the lowest Int64 and a null before it
def test_sort_by_is_the_sort_on_the_columns(rows, wide, stable):
    """:func:`packed_keys.sort_by`: the sort on the columns (nulls first, strings in their own order: 'b:10' < 'b:9'),
    stable when asked: one key, or several sorted by the last first (2**58 makes two keys, 2**60 a column that packs
    only alone), or the columns themselves; and every row is there once (ties kept apart: ``i``)."""
    from analyze.read.packed_keys import sort_by

    df = (pl.DataFrame(rows, schema={"x": pl.Int64, "s": pl.String, "t": pl.Int64, "u": pl.Int64}, orient="row")
          .with_columns(pl.col("t") * wide).with_row_index("i"))
    cols = ["x", "s", "t", "u"]
    got = sort_by(df, cols, maintain_order=stable)
    if stable:
        assert got.equals(df.sort(cols, maintain_order=True))
    else:  # ties in any order: the same rows, in the columns' order
        assert got.select(cols).equals(df.sort(cols).select(cols)) and sorted(got["i"]) == sorted(df["i"])


@settings(max_examples=200, deadline=None)
@given(sort_rows, st.sampled_from([1, 2**60]), st.booleans())
def test_sort_key_sorts_as_the_columns(rows, wide, last):
    """:func:`packed_keys.sort_key`: a stable sort on it is the stable sort on the columns, nulls first or last; None
    when the values do not fit in one key."""
    from analyze.read.packed_keys import sort_key

    df = (pl.DataFrame(rows, schema={"x": pl.Int64, "s": pl.String, "t": pl.Int64, "u": pl.Int64}, orient="row")
          .with_columns(pl.col("t") * wide))
    key = sort_key(df, ["x", "s", "t"], "last" if last else "first")
    if key is None:
        assert wide == 2**60 and df["t"].drop_nulls().n_unique() > 1
        return
    assert df.sort(key, maintain_order=True).equals(df.sort("x", "s", "t", nulls_last=last, maintain_order=True))


def test_categorical_columns_pack_by_their_codes_for_joins_not_for_sorts():
    from analyze.read.packed_keys import packing, semi_join, sort_by

    df = pl.DataFrame({"n": ["b", "a", None, "b"], "r": [1, 2, 3, 1]}, schema={"n": pl.Categorical, "r": pl.Int64})
    assert packing((df,), ["n", "r"]) is not None and packing((df,), ["n", "r"], sorting=True) is None
    assert semi_join(df, df.head(1), ["n", "r"])["r"].to_list() == [1, 1]
    assert sort_by(df, ["n", "r"]).equals(df.sort("n", "r"))
    assert packing((df.with_columns(pl.col("n").cast(pl.String)),), ["n"]) is None  # strings: only to sort one frame


def test_values_too_wide_do_not_pack_and_nothing_packs_with_no_room(monkeypatch):
    from analyze.read import packed_keys as pk

    a = pl.DataFrame({"x": [-(2**40), 2**40], "y": [0, 2**30], "z": [0, 2**62]})
    assert pk.packing((a,), ["x", "y"]) is None and pk.packing((a,), ["x"]) is not None
    assert pk.packing((a,), ["z"]) is not None and pk.packing((a,), ["z", "y"]) is None
    assert pk.with_key((a,), ["x", "y"])[1] == ["x", "y"]
    monkeypatch.setattr(pk, "KEYS", 0)  # what the tests of the plain paths do
    assert pk.packing((a,), ["y"]) is None and pk.sort_by(a, ["y", "x"]).equals(a.sort("y", "x"))


def test_a_fixed_packing_holds_only_values_in_its_range():
    """:func:`packed_keys.fixed`: (pid, corr) as the store packs them; :meth:`Packing.holds` refuses nulls and values
    out of range; the widths must fit in one key; the columns come back from the key."""
    from analyze.read.packed_keys import fixed

    p = fixed(("pid", "corr"), (1 << 31, 1 << 32))
    ok = pl.DataFrame({"pid": [0, (1 << 31) - 1], "corr": [(1 << 32) - 1, 0]})
    assert p.holds(ok) and p.holds(ok.head(0))
    keyed = ok.select(p.key())
    assert keyed["_key"].to_list() == [(1 << 32) - 1, ((1 << 31) - 1) << 32]
    assert keyed.select(p.unpacked()).equals(ok)
    for bad in ({"pid": [1 << 31], "corr": [0]}, {"pid": [-1], "corr": [0]}, {"pid": [0], "corr": [1 << 32]},
                {"pid": [None, 1], "corr": [0, 1]}):
        assert not p.holds(pl.DataFrame(bad, schema={"pid": pl.Int64, "corr": pl.Int64}))
    try:
        fixed(("a", "b"), (1 << 32, 1 << 32))
    except ValueError:
        pass
    else:
        raise AssertionError("widths over 2**63 accepted")


def _outputs(path) -> str:
    """What analyze, comm and compare print as JSON, from a fresh analysis (no cache)."""
    from analyze import api
    from analyze.output import data

    res = api.analyze(str(path), store=False, cache=False, progress=False)
    comm = api.comm(str(path), store=False, cache=False, progress=False)
    return "\n".join([data.to_json(res), data.doc_json(comm.to_dict()), data.doc_json(api.compare(res, res).to_dict())])


def test_every_output_is_the_same_with_nothing_packed(tmp_path, monkeypatch):
    """Every packed key of the analysis and its tables (the per-process kernel sums, the cross-rank pairing, the
    collectives' ids, sorts and groups, the steady rows, the cycle classes' pieces, compare's cycles) against the
    plain polars operations (packing turned off: :data:`analyze.read.packed_keys.KEYS` 0): the JSON of analyze, comm
    and compare, to the byte, on a TP2 capture with a straggler and on a TP1 one with a recurring slow cycle."""
    from analyze.read import packed_keys
    from nvtx_hooks.capture import samples
    from tests.helpers.paths import tp2

    for path in (tp2("tp2_straggler", tmp_path), samples.path("tp1_stall_every5")):
        packed = _outputs(path)
        monkeypatch.setattr(packed_keys, "KEYS", 0)
        plain = _outputs(path)
        monkeypatch.undo()
        assert packed == plain, path


@settings(max_examples=200, deadline=None)
@given(rows3, st.integers(0, 5), st.integers(0, 5), st.sampled_from([1, 2**20, 2**61]))
def test_a_bounded_packing_groups_as_the_columns(rows, below, above, wide):
    """:func:`packed_keys.bounded`: columns packed from bounds known beforehand (wider than the values: ``below``,
    ``above``) group the non-null rows as the columns do; None when the bounds do not fit in one key."""
    from analyze.read.packed_keys import bounded

    df = _frame(rows, wide)
    on = ["a", "b", "c"]
    ends = [(df[c].min(), df[c].max()) for c in on]
    bounds = [((lo if lo is not None else 0) - below, (hi if hi is not None else 0) + above) for lo, hi in ends]
    p = bounded(on, bounds)
    total = 1
    for lo, hi in bounds:
        total *= hi - lo + 1
    # (a bound below Int64's lowest value, a low value less ``below``, cannot be a key's origin: no packing)
    assert (p is None) == (total > 2**63 or min(lo for lo, _ in bounds) < -(2**63))
    if p is None:
        return
    full = df.drop_nulls(on)
    want = full.group_by(on).agg(pl.col("v").sum()).sort(on)
    got = full.group_by(p.key()).agg(pl.col("v").sum()).select(*p.unpacked(), "v").sort(on)
    assert got.equals(want)
    assert df.select(p.key())["_key"].is_null().equals(df.select(pl.any_horizontal(pl.col(on).is_null()))["a"])
