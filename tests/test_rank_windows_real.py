"""Ranks paired by cycle on real TP=2 captures: ragged API windows, a lost GPU tail, and cut copies of whole captures.

``tp2_rank0_window`` and ``tp2_workload_captureall`` are bundled (tests/data/h200_tp2); the cut copies of
``tp2_probe_node`` need the shared traces. Reference numbers come from the export itself (SQL) or from the
analysis of the uncut capture restricted to the same cycles, never from the analysis under test.
"""

from __future__ import annotations

import json
import sqlite3
import sys

import polars as pl
import pytest
from test_rank_windows import codes, cut_copy

from analyze import analyze
from analyze.compute.collectives import cross_rank
from nvtx_hooks.capture import complete
from nvtx_hooks.phases import decode_payload
from tests.helpers.paths import PROBE, need, tp2

OPS = ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET")


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return tmp_path_factory.mktemp("tp2")


@pytest.fixture(scope="module")
def window(data):
    return analyze(tp2("tp2_rank0_window", data))


@pytest.fixture(scope="module")
def captureall(data):
    return analyze(tp2("tp2_workload_captureall", data))


def sql(path, q, *args):
    con = sqlite3.connect(path)
    try:
        return con.execute(q, args).fetchall()
    finally:
        con.close()


def gpu_span(path, pid: int) -> tuple[int, int]:
    """(first start, last end) of the process's GPU ops, from the export."""
    have = {t for (t,) in sql(path, "SELECT name FROM sqlite_master WHERE type='table'")}
    rows = [sql(path, f"SELECT MIN(start), MAX(end) FROM {t} WHERE ((globalPid >> 24) & 16777215) = ?", pid)[0]
            for t in OPS if t in have]
    return min(r[0] for r in rows if r[0] is not None), max(r[1] for r in rows if r[1] is not None)


def cycles_sql(path, pid: int) -> list[tuple[int, int, int]]:
    """(start, end, cycle index) of the process's ``cycle`` ranges, from the export's payload."""
    rows = sql(path, "SELECT n.start, n.end, n.int64Value FROM NVTX_EVENTS n JOIN StringIds s ON s.id = n.textId "
                     "WHERE s.value = 'cycle' AND ((n.globalTid >> 24) & 16777215) = ? ORDER BY n.start", pid)
    return [(a, b, decode_payload(v)["cycle_index"]) for a, b, v in rows]


def same_phase_rows(res) -> None:
    """Every phase's all-rank row sums the same number of instances on every rank."""
    per = res.phases.group_by("phase").agg(pl.col("instances").n_unique().alias("n"), pl.len().alias("ranks"))
    assert (per["n"] == 1).all() and (per["ranks"] == res.ranks.height).all(), res.phases


# ---- the API window opened by rank 0 only ------------------------------------------------------------------


def test_rank0_window_no_false_straggler(window):
    c = cross_rank([window])
    assert c.mismatches.height == 0 and c.refused.height == 0
    # done-when: no collective has a skew p50 above 20 µs, no phase names a straggler with ms delays
    assert c.collectives["skew_p50_ns"].max() <= 20_000
    assert c.stragglers["max_delay_ns"].max() < 1_000_000
    # the old ordinal pairing put rank 1 2.2 ms late at every draft all-reduce (100 % wait on rank 0)
    d0 = c.collectives.filter((pl.col("phase") == "eagle3.draft") & (pl.col("rank") == 0)).row(0, named=True)
    assert d0["wait_ns"] < 0.7 * d0["duration_ns"]
    msg = codes(window.diagnostics)
    assert "'eagle3.draft' (rank 1's n-th = rank 0's (n+1)-th" in msg["INSTANCE_PAIRING"][0]
    same_phase_rows(window)
    assert window.phases["instances"].unique().to_list() == [58]


def test_rank0_window_edges(window, data):
    path = data / "tp2_rank0_window.sqlite"
    for rk in window.ranks.iter_rows(named=True):
        first_api = sql(path, "SELECT MIN(start) FROM CUPTI_ACTIVITY_KIND_RUNTIME WHERE ((globalTid >> 24) & 16777215) = ?",
                        rk["pid"])[0][0]
        g0, g1 = gpu_span(path, rk["pid"])
        assert (rk["window_start_ns"], rk["window_end_ns"]) == (min(first_api, g0), g1)
    cut = window.instances.filter(pl.col("cut").is_not_null()).sort("start")
    # rank 1: the cycle open when its window opened, the cycle (and its draft) running when it closed, and
    # that cycle's phases that began after its last GPU op (ranges without GPU rows; its verify began before)
    g1 = window.ranks.filter(pl.col("rank") == 1)["window_end_ns"][0]
    assert cut.select("rank", "range", "cut").rows() == [
        (1, "eagle3.cycle", "window_start"), (1, "eagle3.draft", "window_start"),
        (1, "eagle3.cycle", "window_end"), (1, "eagle3.draft", "window_end"),
        (1, "eagle3.draft_extend", "tail_lost"), (1, "eagle3.host_overhead", "tail_lost")]
    assert (cut.filter(pl.col("cut") == "tail_lost")["start"] > g1).all()
    assert "GPU_TAIL_LOST" not in codes(window.diagnostics)  # a window edge, not a lost tail


def test_rank0_window_split_per_rank_reports(window, data, tmp_path):
    """Each rank in its own report: the merge pairs the cycles across reports by the same offset, without a
    false straggler. Another report's clock is not trusted to say that rank 1's first cycle began before its
    capture, so that (whole) cycle is counted here: one more cycle than in the one-report analysis."""
    import test_collectives_real

    orig, test_collectives_real.PROBE = test_collectives_real.PROBE, data / "tp2_rank0_window.sqlite"
    try:
        parts = [str(test_collectives_real.split_probe(tmp_path, pid)) for pid in (790, 791)]
    finally:
        test_collectives_real.PROBE = orig
    m = analyze(parts)
    assert "'eagle3.draft' (rank 1's n-th = rank 0's (n+1)-th" in codes(m.diagnostics)["INSTANCE_PAIRING"][0]
    same_phase_rows(m)
    assert m.phases["instances"].unique().to_list() == [59]
    starts = {r: set(counted_starts(r_, 0)) for r, r_ in (("one", window), ("merged", m))}
    assert starts["one"] < starts["merged"] and len(starts["merged"] - starts["one"]) == 5  # one cycle's 5 ranges
    c = cross_rank([analyze(p) for p in parts])
    assert c.collectives["skew_p50_ns"].max() <= 20_000 and c.stragglers["max_delay_ns"].max() < 1_000_000


def counted_starts(res, rank: int) -> list[int]:
    return res.instances.filter((pl.col("rank") == rank) & pl.col("left_out").is_null()
                                & (pl.col("i_ops") > 0))["start"].to_list()


# ---- the whole-run capture whose ranks lost their GPU tails ------------------------------------------------


def test_captureall_tail_lost_and_same_cycles(captureall, data):
    path = data / "tp2_workload_captureall.sqlite"
    msg = codes(captureall.diagnostics)["GPU_TAIL_LOST"]
    assert [m.split(":")[0] for m in msg] == ["rank 0", "rank 1"]
    stop = {pid: gpu_span(path, pid)[1] for pid in (1943, 1944)}
    cyc = {pid: cycles_sql(path, pid) for pid in (1943, 1944)}
    lost0 = [c for c in cyc[1943] if c[0] > stop[1943]]
    end0 = max(c[1] for c in cyc[1943])
    assert msg[0].startswith(f"rank 0: its GPU rows stop at {stop[1943] / 1e6:,.3f} ms but the run goes on to "
                             f"{end0 / 1e6:,.3f} ms ({(end0 - stop[1943]) / 1e6:,.3f} ms lost): {len(lost0)} "
                             "top-level instance(s) ('cycle') have ranges but no GPU work")
    assert len(lost0) == 48 and len([c for c in cyc[1944] if c[0] > stop[1944]]) == 7
    # all-rank rows over the same cycles: those whose range ended before the last GPU op on both ranks
    whole = set.intersection(*({i for a, b, i in cyc[p] if b < stop[p]} for p in (1943, 1944)))
    got = captureall.instances.filter((pl.col("range") == "cycle") & pl.col("left_out").is_null()
                                      & (pl.col("i_ops") > 0))
    assert {r: set(g["cycle"].to_list()) for (r,), g in got.group_by("rank")} == {0: whole, 1: whole}
    assert len(whole) == 36
    same_phase_rows(captureall)
    assert captureall.phases["instances"].unique().to_list() == [36]


def test_complete_check_lines_and_strict_trace(data, tmp_path, monkeypatch):
    path = data / "tp2_workload_captureall.sqlite"
    assert complete.lines(complete.ranks(path)) == [
        "rank 0 (pid 1943, GPU 0): 37 of 85 cycles with GPU work; GPU rows stop at 9,362.089 ms, 48 cycle(s) "
        "after it: GPU tail lost (86.098 ms)",
        "rank 1 (pid 1944, GPU 1): 78 of 85 cycles with GPU work; GPU rows stop at 9,434.768 ms, 7 cycle(s) "
        "after it: GPU tail lost (13.386 ms)"]
    assert complete.lines(complete.ranks(data / "tp2_rank0_window.sqlite")) == [
        "rank 0 (pid 790, GPU 0): 60 of 60 cycles with GPU work, no lost tail",
        "rank 1 (pid 791, GPU 1): 60 of 60 cycles with GPU work, no lost tail"]
    # spectrace trace (a fake nsys that exports this capture): one line per rank, exit 3 with --strict
    from pathlib import Path

    from analyze.cli import main

    fake = Path(__file__).parent / "data" / "fake_nsys.py"
    exe = tmp_path / "nsys"
    exe.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{fake}" "$@"\n')
    exe.chmod(0o755)
    monkeypatch.setenv("FAKE_NSYS_EXPORT_FROM", str(path))
    cmd = ["trace", "--nsys", str(exe), "-o", str(tmp_path / "r"), "--", sys.executable, "-c", "pass"]
    assert main(cmd) == 0
    assert main([*cmd[:1], "--strict", "--force", *cmd[1:]]) == 3
    man = json.loads((tmp_path / "r.manifest.json").read_text())
    assert [(r["pid"], r["cycles"], r["with_gpu"], r["lost"]) for r in man["ranks"]] == [
        (1943, 85, 37, 48), (1944, 85, 78, 7)]


# ---- cut copies of whole captures: the same cycles give the same numbers ---------------------------------


def labelled(res, phase: str) -> pl.DataFrame:
    """The matched collectives of ``phase`` (one row per rank), each with ``s0``: the start of its rank-0 instance."""
    m = cross_rank([res]).matched.filter(pl.col("phase") == phase)
    lab = (m.filter(pl.col("rank") == 0).join(res.instances.select("range_id", s0="start"), on="range_id")
           .select("_g", "j", "s0"))
    return m.join(lab, on=["_g", "j"])


def check_same_cycles(whole, cut, phase: str, cycles: int) -> None:
    """``cut`` counts ``cycles`` instances of ``phase``, and per rank its wait is the uncut capture's wait over
    the same instances (within 5 %; here exact), with the same straggler and maximum delay."""
    kept = (cut.instances.filter((pl.col("range") == phase) & (pl.col("rank") == 0) & pl.col("left_out").is_null()
                                 & (pl.col("i_ops") > 0))["start"])
    assert kept.len() == cycles
    ref = labelled(whole, phase).filter(pl.col("s0").is_in(kept.implode()))
    want = ref.group_by("rank").agg(pl.col("wait_ns").sum()).sort("rank")["wait_ns"].to_list()
    got = cut.phases.filter(pl.col("phase") == phase).sort("rank")["comm_wait_ns"].to_list()
    assert all(abs(g - w) <= 0.05 * max(w, 1) for g, w in zip(got, want)) and got == want
    last = ref.filter("is_last").group_by("rank").agg(n=pl.len(), max_delay_ns=pl.col("delay_ns").max())
    top = last.sort("n", descending=True).row(0, named=True)
    st = cross_rank([cut]).stragglers.filter(pl.col("phase") == phase).sort("last_arrivals", descending=True)
    assert (st["rank"][0], st["last_arrivals"][0], st["max_delay_ns"][0]) == (top["rank"], top["n"], top["max_delay_ns"])


@pytest.mark.parametrize("phase", ["draft", "verify"])
def test_captureall_cut_mid_cycle_keeps_the_injected_straggler(captureall, data, tmp_path, phase):
    """Payload path: rank 1 (which sleeps 400 µs before each verify) cut inside cycle 10's verify."""
    path = data / "tp2_workload_captureall.sqlite"
    c10 = next(c for c in cycles_sql(path, 1944) if c[2] == 10)
    t = c10[0] + (c10[1] - c10[0]) // 2
    cut = analyze(cut_copy(path, tmp_path / "cut.sqlite", 1944, before=t, ranges_ending_before=t))
    assert "at its start 'cycle' ×1, 'draft_extend' ×1;" in codes(cut.diagnostics)["WINDOW_CUT"][0]
    same_phase_rows(cut)
    check_same_cycles(captureall, cut, phase, 36 - 11)
    if phase == "verify":
        st = cross_rank([cut]).stragglers.filter(pl.col("phase") == "verify").sort("last_arrivals", descending=True)
        assert st["rank"][0] == 1 and 400_000 <= st["max_delay_ns"][0] < 1_000_000


@pytest.fixture(scope="module")
def probe():
    return analyze(need(PROBE))


def probe_cycles(res, rank: int) -> pl.DataFrame:
    return res.instances.filter((pl.col("rank") == rank) & (pl.col("range") == "eagle3.cycle")).sort("start")


def test_probe_cut_mid_cycle_at_the_start(probe, tmp_path):
    """Time path: rank 1 (the draft straggler) cut in the middle of its cycle 10."""
    c = probe_cycles(probe, 1).row(10, named=True)
    t = (c["start"] + c["end"]) // 2
    cut = analyze(cut_copy(PROBE, tmp_path / "cut.sqlite", 1413, before=t, ranges_ending_before=t))
    same_phase_rows(cut)
    for phase in ("eagle3.draft", "eagle3.verify"):
        check_same_cycles(probe, cut, phase, 49)
    st = cross_rank([cut]).stragglers.filter(pl.col("phase") == "eagle3.draft").sort("last_arrivals", descending=True)
    assert st["rank"][0] == 1


def test_probe_lost_tail(probe, tmp_path):
    """Rank 0's CUDA rows stop in the middle of its cycle 50: cycles 50-59 are out on both ranks."""
    c = probe_cycles(probe, 0).row(50, named=True)
    t = (c["start"] + c["end"]) // 2
    path = cut_copy(PROBE, tmp_path / "tail.sqlite", 1412, after=t)
    cut = analyze(path)
    msg = codes(cut.diagnostics)["GPU_TAIL_LOST"]
    stop = gpu_span(path, 1412)[1]
    assert len(msg) == 1 and msg[0].startswith(f"rank 0: its GPU rows stop at {stop / 1e6:,.3f} ms")
    assert "9 top-level instance(s) ('eagle3.cycle') have ranges but no GPU work" in msg[0]
    same_phase_rows(cut)
    assert cut.phases["instances"].unique().to_list() == [50]
    for phase in ("eagle3.draft", "eagle3.verify"):
        check_same_cycles(probe, cut, phase, 50)


def test_probe_window_opening_a_whole_cycle_late(probe, tmp_path):
    """Rank 1's rows (CUDA and ranges) begin at its cycle 5: the time alignment finds the offset of 5 cycles."""
    t = probe_cycles(probe, 1)["start"][5]
    cut = analyze(cut_copy(PROBE, tmp_path / "late.sqlite", 1413, before=t, ranges_starting_before=t))
    how = codes(cut.diagnostics)["INSTANCE_PAIRING"][0]
    assert "'eagle3.draft' (rank 1's n-th = rank 0's (n+5)-th" in how
    same_phase_rows(cut)
    # rank 1's first recorded cycle began before its first CUDA call: nothing shows that it is whole, so it is
    # left out with its rank-0 partner
    assert codes(cut.diagnostics)["WINDOW_CUT"][0].startswith("rank 1: 2 instance(s)")
    for phase in ("eagle3.draft", "eagle3.verify"):
        check_same_cycles(probe, cut, phase, 54)


def test_rank0_window_warns_only_of_what_changes_a_number(window):
    """On the rank-0-window capture the one warning is WINDOW_CUT (rank 1's cut cycles are left out of
    the sums); nsys's "not all events" is one note for the three processes, the launcher said once not to be a
    rank; the unclosed ranges and the graph launch without GPU rows lie outside every counted number."""
    warn = [d.code for d in window.diagnostics if d.level != "info"]
    assert warn == ["WINDOW_CUT"]
    c = codes(window.diagnostics)
    assert len(c["INCOMPLETE_COLLECTION"]) == 1 and "(processes 749, 790, 791)" in c["INCOMPLETE_COLLECTION"][0]
    assert c["NOT_A_RANK"] == ["process 749 ran no GPU work: not a rank (e.g. the launcher)"]
    assert sorted(window.ranks["pid"].to_list()) == [790, 791]
    assert all(m.endswith("(not counted in any number)") for m in c["UNCLOSED_RANGE"])
    assert "COVERAGE" not in c  # phases received all of it (the text's Coverage line: 100.0%)


def test_text_wraps_prose_at_120(window):
    """Prose (diagnostics, notes) wraps at 120 columns when not on a terminal, under its own indent;
    only table rows (columns two spaces apart) may be wider. Before: 22 of 114 lines, the longest 589."""
    from analyze.compute.findings import find
    from analyze.output.text import TABLE_GAP, analyze_table

    lines = analyze_table(window, find(window)).splitlines()
    wide = [x for x in lines if len(x) > 120]
    assert all(TABLE_GAP.search(x.strip()) for x in wide), [x for x in wide if not TABLE_GAP.search(x.strip())]
    diag = lines[lines.index("Diagnostics") + 1:]
    assert diag[0].startswith("  warning WINDOW_CUT: rank 1: 4 instance(s)")  # the warning first
    assert all(len(x) <= 120 for x in diag[:diag.index("")])
    assert any(x.startswith(" " * 10 + "'eagle3.cycle' ×1") for x in diag)  # continued under the message


def test_ranges_that_skip_the_cycle_keep_the_cycles(window, data):
    """--ranges 'verify|draft' (no cycle range in it) still knows the cycles from the trace's cycle
    ranges: the same steady cycles, period and per-phase steady numbers as the default selection, and findings."""
    from analyze.compute import steady_tables
    from analyze.compute.cycles import selection
    from analyze.compute.findings import find
    from analyze.compute.tokens import summary

    some = analyze(tp2("tp2_rank0_window", data), ranges="verify|draft")
    assert "and the cycle ranges ('eagle3.cycle'" in some.selection
    assert selection(some)["how"] == selection(window)["how"] != "none"
    assert summary(some).period_ns == summary(window).period_ns
    cols = ["phase", "instances", "span_mean_ns", "comm_mean_ns", "idle_mean_ns"]
    mine = steady_tables.steady_phases_all_ranks(some).select(cols).sort("phase")
    # the cycle itself now holds the work of the phase not selected (host_overhead's .item() copy, 2.4 µs)
    assert mine["phase"].to_list() == ["eagle3.cycle", "eagle3.draft", "eagle3.draft_extend", "eagle3.verify"]
    mine = mine.filter(pl.col("phase") != "eagle3.cycle")
    assert mine.equals(steady_tables.steady_phases_all_ranks(window).select(cols).filter(pl.col("phase").is_in(mine["phase"].implode()))
                       .sort("phase"))
    assert {"GAP_HOST_BOUND", "STRAGGLER_RANK"} <= {f.code for f in find(some)}
