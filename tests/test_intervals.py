"""Property tests for the interval algebra against brute force over integer time points."""

from __future__ import annotations

import polars as pl
from hypothesis import given, settings
from hypothesis import strategies as st

from analyze.compute import breakdown
from analyze.compute.intervals import busy_between, group_parts, union_blocks, union_length

ivs = st.lists(st.tuples(st.integers(0, 60), st.integers(0, 15), st.integers(0, 2)), min_size=0, max_size=25)


def frame(items):
    return pl.DataFrame({"g": [g for _, _, g in items], "start": [s for s, _, _ in items],
                         "end": [s + d for s, d, _ in items]}, schema={"g": pl.Int64, "start": pl.Int64, "end": pl.Int64})


def covered(items, g):
    return {t for s, d, gg in items if gg == g for t in range(s, s + d)}


@settings(max_examples=200, deadline=None)
@given(ivs)
def test_union_length_is_number_of_covered_points(items):
    got = dict(union_length(frame(items), ["g"]).collect().rows())
    for g in {gg for _, _, gg in items}:
        assert got.get(g, 0) == len(covered(items, g))


@settings(max_examples=200, deadline=None)
@given(ivs)
def test_merge_gives_disjoint_sorted_blocks_covering_the_same_points(items):
    blocks = union_blocks(frame(items), ["g"]).collect()
    for g, b in blocks.group_by("g"):
        s, e = b["start"].to_list(), b["end"].to_list()
        assert all(e[i] < s[i + 1] for i in range(len(s) - 1))  # disjoint, not touching
        pts = {t for a, z in zip(s, e) for t in range(a, z)}
        assert pts == covered(items, g[0])


@settings(max_examples=200, deadline=None)
@given(ivs, st.lists(st.tuples(st.integers(-5, 80), st.integers(-10, 40)), min_size=1, max_size=8))
def test_busy_between_is_covered_points_in_window(items, windows):
    blocks = union_blocks(frame(items), ["g"]).collect()
    w = pl.DataFrame({"g": [0] * len(windows), "a": [a for a, _ in windows], "b": [a + d for a, d in windows]},
                     schema={"g": pl.Int64, "a": pl.Int64, "b": pl.Int64})
    got = busy_between(blocks, w, ["g"]).collect()
    pts = covered(items, 0)
    for a, b, busy in got.select("a", "b", "busy").rows():
        assert busy == len([t for t in pts if a <= t < b])


flagged = st.lists(st.tuples(st.integers(0, 60), st.integers(0, 15), st.integers(0, 2), st.booleans()),
                   min_size=0, max_size=25)


@settings(max_examples=200, deadline=None)
@given(flagged, st.integers(0, 2**40))
def test_group_parts_sum_to_union_lengths(items, shift):
    """Per group: ``_p`` sums to the union, ``_q`` to the union of the flagged rows; any absolute time."""
    df = pl.DataFrame({"g": [g for _, _, g, _ in items], "start": [s + shift for s, _, _, _ in items],
                       "end": [s + d + shift for s, d, _, _ in items], "f": [f for *_, f in items]},
                      schema={"g": pl.Int64, "start": pl.Int64, "end": pl.Int64, "f": pl.Boolean})
    got = group_parts(df.sort("start").sort("g", maintain_order=True), "g", only="f")
    sums = {g: (p, q) for g, p, q in got.group_by("g").agg(pl.col("_p").sum(), pl.col("_q").sum()).rows()}
    for g in {gg for _, _, gg, _ in items}:
        flagged_pts = {t for s, d, gg, f in items if gg == g and f for t in range(s, s + d)}
        assert sums[g] == (len(covered([(s, d, gg) for s, d, gg, _ in items], g)), len(flagged_pts))


def test_instance_metrics_fall_back_when_the_shift_would_overflow():
    """Groups far apart in time (span * groups >= 2**62): the windowed path gives the same sums."""
    far = 2**61
    ops = pl.DataFrame({"range_id": [1, 2, 1, 2, 3], "start": [0, 5, 10, far, far + 1], "end": [20, 8, 15, far + 9, far + 4],
                        "corr": [1, 2, 3, 4, 5], "comm": [None, "nccl", None, "nccl", None]},
                       schema_overrides={"comm": pl.String})
    assert group_parts(ops.sort("range_id", maintain_order=True), "range_id") is None
    got = breakdown.instance_metrics(ops, "range_id").sort("range_id")
    assert got["busy_ns"].to_list() == [20, 3 + 9, 3]  # range_id 2: [5, 8) and [far, far + 9)
    assert got["comm_ns"].to_list() == [0, 12, 0]
    assert got["span_ns"].to_list() == [20, far + 4, 3]


ops_st = st.lists(st.tuples(st.integers(1, 3), st.integers(0, 400), st.integers(1, 60), st.booleans(),
                            st.integers(7, 8)), min_size=1, max_size=12)


@settings(max_examples=40, deadline=None)
@given(ops_st)
def test_phase_metrics_on_random_traces(tmp_path_factory, ops):
    """Random kernels launched from three nested phases; every metric against brute force."""
    from analyze import analyze
    from tests.helpers.synth import Synth

    s = Synth(tmp_path_factory.mktemp("h") / "r.sqlite")
    s.range(1, 1, "cycle", 10, 5000)
    s.range(1, 1, "draft", 20, 1000)
    s.range(1, 1, "verify", 1100, 2000)
    api = {1: 30, 2: 1200, 3: 4000}  # 3 = in the cycle, outside both children
    for corr, (ph, start, dur, is_comm, stream) in enumerate(ops, 1):
        name = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL" if is_comm else "gemm"
        s.launch(1, 1, "cudaLaunchKernel_v7000", (api[ph] + corr, api[ph] + corr + 1), corr,
                 [(2000 + start, 2000 + start + dur, name, stream)])
    r = analyze(s.save())
    names = {1: "draft", 2: "verify", 3: "cycle"}
    for ph, name in names.items():
        mine = [(st, st + d, c) for p, st, d, c, _ in ops if p == ph]
        got = r.phases.filter(pl.col("phase") == name)
        if not mine:
            assert got.height == 0
            continue
        g = got.row(0, named=True)
        pts = {t for a, z, _ in mine for t in range(a, z)}
        cpts = {t for a, z, c in mine if c for t in range(a, z)}
        span = max(z for _, z, _ in mine) - min(a for a, _, _ in mine)
        assert (g["span_ns"], g["busy_ns"], g["comm_ns"]) == (span, len(pts), len(cpts))
        assert g["span_ns"] == g["compute_ns"] + g["comm_ns"] + g["idle_ns"]
        assert g["kernel_ns"] == sum(z - a for a, z, _ in mine) and g["ops"] == len(mine)


def test_group_parts_of_groups_far_apart_shift_each_from_its_first_start():
    """Short groups far apart in time (the frame's span * rows >= 2**62, each group's width small): the shift from
    each group's first start still parts them, and the shares are the same as for the groups alone."""
    far = 2**61
    df = pl.DataFrame({"g": [1, 1, 2, 2, 3], "start": [0, 5, far, far + 2, far + 100], "end": [10, 20, far + 5, far + 4,
                                                                                             far + 101],
                       "f": [True, False, False, True, True]})
    got = group_parts(df, "g", only="f")
    assert got["_p"].to_list() == [10, 10, 5, 0, 1] and got["_q"].to_list() == [10, 0, 0, 2, 1]
    alone = pl.concat([group_parts(df.filter(pl.col("g") == g), "g", only="f") for g in (1, 2, 3)])
    assert got.equals(alone)
