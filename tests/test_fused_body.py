"""The fused per-process body: launching calls looked up once per call (attribute.per_call) and union lengths from
running sums over the ops sorted by start (breakdown._prefix), against brute force and the op-by-op computation."""

from __future__ import annotations

import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from analyze.compute import attribute, breakdown, host

PID = 7

# Three threads' nesting: cycle(1) > draft(2), verify(3) > inner(4); cycle(5) > draft(6); a lone range 7 on thread 2.
RANGES = [(1, 1, 0, 1000), (2, 1, 10, 400), (3, 1, 450, 900), (4, 1, 500, 600), (5, 1, 1000, 2000),
          (6, 1, 1100, 1500), (7, 2, 0, 3000)]


def nested() -> pl.DataFrame:
    sel = pl.DataFrame({"range_id": [r for r, *_ in RANGES], "gtid": [g for _, g, _, _ in RANGES],
                        "start": [a for *_, a, _ in RANGES], "end": [b for *_, b in RANGES]},
                       schema={"range_id": pl.Int64, "gtid": pl.Int64, "start": pl.Int64, "end": pl.Int64})
    return attribute.nest(sel.with_columns(pid=pl.lit(PID, pl.Int64), domain=pl.lit("d"),
                                           range=pl.format("r{}", "range_id")))


# An op: (call time on thread 1 or 2 (range open then), GPU start offset, duration, communication?)
ops_st = st.lists(st.tuples(st.sampled_from([(1, 5), (1, 20), (1, 460), (1, 550), (1, 950), (1, 1200), (1, 1800),
                                             (2, 100), (1, 2500)]),
                            st.integers(0, 300), st.integers(0, 40), st.booleans()), min_size=1, max_size=30)


def frames(items, missing: set[int] = frozenset()) -> tuple[pl.DataFrame, pl.DataFrame]:
    """GPU ops (two per call when the offset is even: a graph-like launch) and their calls (``missing``: left out)."""
    ops, api = [], []
    for corr, ((gtid, t), off, dur, comm) in enumerate(items, 1):
        if corr not in missing:
            api.append((PID, gtid, corr, t, t + 1, 11))
        ops.append((PID, corr, 3000 + off, 3000 + off + dur, comm))
        if off % 2 == 0:
            ops.append((PID, corr, 3000 + off + 5, 3000 + off + 5 + dur // 2, comm))
    o = pl.DataFrame(ops, schema={"pid": pl.Int64, "corr": pl.Int64, "start": pl.Int64, "end": pl.Int64,
                                  "_c": pl.Boolean}, orient="row")
    a = pl.DataFrame(api, schema={"pid": pl.Int64, "gtid": pl.Int64, "corr": pl.Int64, "start": pl.Int64,
                                  "end": pl.Int64, "name_id": pl.Int64}, orient="row")
    return o, a


def reference(ops: pl.DataFrame, api: pl.DataFrame, n: pl.DataFrame) -> pl.DataFrame:
    """The op-by-op attribution: every op joined to its launching call."""
    calls = attribute.launching_calls(ops, api, n).drop("pid")
    return ops.join(calls, on="corr", how="left", maintain_order="left")


@settings(max_examples=60, deadline=None)
@given(ops_st, st.sets(st.integers(1, 30), max_size=4), st.booleans())
def test_per_call_is_the_op_by_op_attribution(items, missing, by_start):
    n = nested()
    ops, api = frames(items, missing)
    ops = ops.sort("start", "corr") if by_start else ops.sort("end", descending=True)  # calls' runs, or not
    per, range_id = attribute.per_call(ops, api, n)
    ref = reference(ops, api, n)
    assert range_id.to_list() == ref["range_id"].to_list()
    # one row per call, as the host's per-call table of the op-by-op attribution
    want = host._per_call(ref).sort("corr")
    got = per.select("corr", "ops", "range_id", "first", "last", start="api_start", end="api_end").sort("corr")
    assert got.to_dicts() == want.to_dicts()
    assert int(per.filter(pl.col("gtid").is_null())["ops"].sum()) == ref["gtid"].null_count()


def test_per_call_of_ops_without_a_correlation_id():
    n = nested()
    ops, api = frames([((1, 20), 0, 10, False), ((1, 460), 30, 10, True)])
    ops = pl.concat([ops, pl.DataFrame({"pid": [PID], "corr": [None], "start": [3100], "end": [3110], "_c": [False]},
                                       schema=ops.schema)]).sort("start")
    per, range_id = attribute.per_call(ops, api, n)
    assert range_id.to_list() == [2, 2, 3, 3, None]
    assert per.filter(pl.col("corr").is_null())["ops"].to_list() == [1]


def brute(ops: list[tuple[int, int, int, bool]], ids: set[int]) -> tuple[int, int]:
    """(busy, comm) union lengths of the ops of ranges ``ids``, as counted time points."""
    pts = {t for r, a, z, _ in ops if r in ids for t in range(a, z)}
    cpts = {t for r, a, z, c in ops if r in ids and c for t in range(a, z)}
    return len(pts), len(cpts)


@settings(max_examples=80, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([None, 1, 2, 3, 4, 5, 6, 7]), st.integers(0, 200), st.integers(0, 30),
                          st.booleans()), min_size=1, max_size=40),
       st.booleans())
def test_instance_unions_from_running_sums(items, apart):
    """Random ops of the nested ranges, overlapping or each range's ops in a time slot of its own (``apart``: every
    instance then one run of rows); union lengths against counted time points, and every column against the
    op-by-op computation."""
    n = nested()
    ops = [(r, (r or 0) * 1000 + a if apart else a, ((r or 0) * 1000 + a if apart else a) + d, c)
           for r, a, d, c in items]
    df = pl.DataFrame(ops, schema={"range_id": pl.Int64, "start": pl.Int64, "end": pl.Int64, "_c": pl.Boolean},
                      orient="row").with_columns(pid=pl.lit(PID, pl.Int64), corr=pl.int_range(pl.len(), dtype=pl.Int64),
                                                 api_start=pl.col("start") - 5).sort("start")
    anc = attribute.ancestors(n)
    got = breakdown.measure_instances(n, df, anc)
    kids = {p: {r for r, a in anc.iter_rows() if a == p} for p in n["range_id"].to_list()}
    for row in got.iter_rows(named=True):
        r = row["range_id"]
        assert (row["x_busy_ns"], row["x_comm_ns"]) == brute(ops, {r}), r
        assert (row["i_busy_ns"], row["i_comm_ns"]) == brute(ops, kids[r]), r
    old = breakdown._prefix
    try:
        breakdown._prefix = lambda ops: None  # type: ignore[assignment]  # the op-by-op computation
        ref = breakdown.measure_instances(n, df, anc)
    finally:
        breakdown._prefix = old
    assert got.equals(ref)


def test_running_sums_take_the_runs_and_leave_the_crowded():
    """Range 2's ops are one run no earlier op reaches into; range 3's first op starts while an unattributed op
    (range null) still runs; range 6's ops are split by another's op: both crowded, worked out op by op."""
    ops = pl.DataFrame({"range_id": [2, 2, None, 3, 3, 6, 4, 6], "start": [10, 15, 40, 45, 60, 100, 110, 120],
                        "end": [20, 30, 50, 55, 70, 105, 115, 130], "_c": [False, True, False, True, True, False,
                                                                          False, True]},
                       schema={"range_id": pl.Int64, "start": pl.Int64, "end": pl.Int64, "_c": pl.Boolean})
    pre = breakdown._prefix(ops)
    w = pl.DataFrame({"range_id": [2, 3, 6], "lo": [0, 3, 5], "hi": [1, 4, 7], "a": [10, 45, 100], "n": [2, 2, 2]})
    runs, crowded = breakdown._prefix_unions(pre, w)
    assert runs.to_dicts() == [{"range_id": 2, "busy_ns": 20, "comm_ns": 15}]
    assert sorted(crowded.to_list()) == [3, 6]
    assert pre.comm_at.to_list() == [1, 3, 4, 7] and pre.busy.to_list()[-1] == 20 + 5 + 20 + 5 + 5 + 10


@pytest.mark.parametrize("devices", [[0, 0, 0], [0, 1, 1]])
def test_ranks_of_one_device_as_of_several(devices):
    ops = pl.DataFrame({"pid": [PID] * 3, "device": devices, "start": [0, 10, 20], "end": [5, 30, 21]})
    dev = pl.DataFrame({"device": [0, 1], "device_name": ["A", "B"]})
    r = breakdown.ranks(ops, dev).row(0, named=True)
    assert (r["device"], r["devices"], r["gpu_ops"], r["kernel_ns"]) == (
        devices[-1] if devices[0] != devices[-1] else 0, sorted(set(devices)), 3, 5 + 20 + 1)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 200), st.integers(0, 30)), min_size=1, max_size=25),
       st.lists(st.tuples(st.integers(0, 230), st.integers(0, 60), st.integers(0, 230), st.integers(0, 60),
                          st.booleans()), min_size=1, max_size=8))
def test_gpu_idle_of_both_views(items, windows):
    """Each instance's GPU idle time in its exclusive and inclusive windows (the inclusive one the same window for
    some, as a leaf's), against the counted time points of every op; null windows are empty."""
    ops = pl.DataFrame({"pid": [PID] * len(items), "start": [a for a, _ in items], "end": [a + d for a, d in items]},
                       schema={"pid": pl.Int64, "start": pl.Int64, "end": pl.Int64}).sort("start")
    rows = [(xa, xa + xd, xa if same else ia, (xa + xd) if same else ia + idur) for xa, xd, ia, idur, same in windows]
    inst = pl.DataFrame(rows, schema={"x_first": pl.Int64, "x_last": pl.Int64, "i_first": pl.Int64,
                                      "i_last": pl.Int64}, orient="row").with_columns(
        pid=pl.lit(PID, pl.Int64), x_span_ns=pl.col("x_last") - pl.col("x_first"),
        i_span_ns=pl.col("i_last") - pl.col("i_first"))
    inst = pl.concat([inst, inst.head(1).with_columns(pl.lit(None, pl.Int64).alias(c) for c in (
        "x_first", "x_last", "x_span_ns"))])  # an instance with no op of its own: its window null
    got = breakdown.add_gpu_idle(inst, breakdown.gpu_blocks(ops))
    pts = {t for a, d in items for t in range(a, a + d)}
    for r in got.iter_rows(named=True):
        for p in ("x", "i"):
            a, b = r[f"{p}_first"], r[f"{p}_last"]
            want = None if a is None else max(0, (b - a) - len({t for t in pts if a <= t < b}))
            assert r[f"{p}_gpu_idle_ns"] == want
