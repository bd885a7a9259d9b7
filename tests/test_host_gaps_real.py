"""Host-gap anatomy on the real H200 captures of the workload's scheduler emulation (tests/data/h200_tp1: SGLang's
range names, the hooks', CPU sampling), against the trace's own ranges and the workload's record (the truth).

The truth is computed here without the anatomy's code: per steady cycle, the host window runs from the previous
cycle's last GPU op (its instance's ``i_last``) to this cycle's first launch call (``i_first_launch``); each
scheduler range of the launching thread (read from the SQLite export) is clipped to it (the emulation's ranges do
not nest among themselves); the rest of the window outside every range and kept CUDA call is what no item covers.
"""

from __future__ import annotations

import json
import sqlite3

import polars as pl
import pytest

from analyze import analyze
from analyze.compute import host_gaps
from nvtx_hooks.capture import samples

CAPTURES = ("tp1_sched_sglang", "tp1_sched_hooks", "tp1_sched_cpu")
TOL = 0.10


def _record(name: str) -> dict:
    m = json.loads((samples.data_dir(name) / f"{name}.manifest.json").read_text())
    return m["program_output"][0]


def _truth(res, path) -> tuple[dict[str, float], float, int]:
    """Per steady cycle: each scheduler range's time inside the host windows, the part no range or kept call covers,
    and the steady cycles."""
    cyc = res.steady.cycles.filter(pl.col("kind") == "cycle").sort("start")
    inst = res.instances.select("range_id", "i_last", "i_first_launch")
    cyc = cyc.join(inst, on="range_id").sort("start")
    prev_last = cyc["i_last"].shift(1)
    steady = cyc.with_columns(prev_last=prev_last).filter(pl.col("steady") & pl.col("period_ns").is_not_null())
    con = sqlite3.connect(path)
    rows = con.execute("SELECT COALESCE(n.text, s.value), n.start, n.end, n.globalTid FROM NVTX_EVENTS n LEFT JOIN "
                       "StringIds s ON s.id = n.textId WHERE n.eventType = 59 AND n.end IS NOT NULL").fetchall()
    con.close()
    sched = [(t, a, b) for t, a, b, _ in rows if t and t.startswith("scheduler.")]
    kept = res.host_windows.filter(pl.col("what") != "window")
    calls = list(zip(kept["start"].to_list(), kept["end"].to_list()))
    per: dict[str, float] = {}
    rest = 0
    for w0, w1 in zip(steady["prev_last"].to_list(), steady["i_first_launch"].to_list()):
        if w1 <= w0:
            continue
        covered = []
        for t, a, b in sched:
            lo, hi = max(a, w0), min(b, w1)
            if hi > lo:
                per[t] = per.get(t, 0) + hi - lo
                covered.append((lo, hi))
        covered += [(max(a, w0), min(b, w1)) for a, b in calls if min(b, w1) > max(a, w0)]
        covered.sort()
        union, end = 0, w0
        for lo, hi in covered:
            lo = max(lo, end)
            if hi > lo:
                union += hi - lo
                end = hi
        rest += (w1 - w0) - union
    n = steady.height
    return {k: v / n for k, v in per.items()}, rest / n, n


@pytest.fixture(scope="module", params=CAPTURES)
def capture(request):
    path = samples.path(request.param)
    res = analyze(path)
    return request.param, res, res.steady.host_gaps, path


def test_items_against_the_ranges(capture):
    name, res, hg, path = capture
    per, rest, n = _truth(res, path)
    got = {r["item"]: r["ns"] for r in hg.items.filter((pl.col("scope") == "steady")
                                                        & (pl.col("gap") == "between cycles")).iter_rows(named=True)}
    assert hg.has_ranges
    for item, ns in per.items():
        assert abs(got[item] - ns) <= TOL * ns, (name, item, got[item], ns)
    assert abs(got[host_gaps.UNATTRIBUTED] - rest) <= TOL * rest, (name, got[host_gaps.UNATTRIBUTED], rest)


def test_injected_functions(capture):
    """The functions wholly inside the gap against the workload's own µs (perf_counter around each function's body;
    the range adds its push/pop), get_next_batch_to_run with its every-8th extra."""
    name, res, hg, _ = capture
    rec = _record(name)
    got = {r["item"]: r["ns"] / 1e3 for r in hg.items.filter(pl.col("scope") == "steady").iter_rows(named=True)}
    meas = rec["scheduler"]["measured_us"]
    for fn in ("process_input_requests", "get_next_batch_to_run"):
        want = sum(meas[fn]) / len(meas[fn])
        assert abs(got[f"scheduler.{fn}"] - want) <= TOL * want, (name, fn, got[f"scheduler.{fn}"], want)


def test_periodic_class_names_its_function(capture):
    name, _, hg, _ = capture
    extra = _record(name)["extras"][0]
    top = [c for c in hg.classes if c["label"] == "every 8th cycle"]
    assert top and top[0]["item"] == f"scheduler.{extra['piece']}"
    assert abs(top[0]["delta_ns"] / 1e3 - extra["measured_us_mean"]) <= 0.2 * extra["measured_us_mean"]
    assert f"every 8th cycle: +{top[0]['delta_ns'] / 1e3:,.1f} µs in scheduler.get_next_batch_to_run" in top[0]["text"]


def test_samples_where_the_busy_function_runs(capture):
    """tp1_sched_cpu: the busy Python function runs in process_batch_result; that item holds most of the gap's CPU
    samples. (The export holds native frames only: nsys 2025.3.1 exported the Python sampling marks without their
    frames, so the function's own name is not in it.)"""
    name, _, hg, _ = capture
    if name != "tp1_sched_cpu":
        assert not hg.sampled
        return
    assert hg.sampled and hg.frames.height
    it = hg.items.filter((pl.col("scope") == "steady") & (pl.col("gap") == "between cycles")).sort("samples",
                                                                                                   descending=True)
    assert it["item"][0] == "scheduler.process_batch_result"
