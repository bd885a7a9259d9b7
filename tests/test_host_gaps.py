"""Host-gap anatomy (analyze/compute/host_windows.py, host_gaps.py) on hand-computed synthetic traces: nesting, a
range crossing the window's edges, a second thread, CUDA calls inside and outside ranges, no ranges at all."""

from __future__ import annotations

import polars as pl
import pytest

from analyze import analyze
from analyze.compute import host_gaps
from tests.helpers.synth import Synth

PID = 100
N = 5  # cycles, 10 000 ns apart


def build(path, ranges: bool = True):
    """Cycles at B = 0, 10 000, ... (``cycle`` [B+50, B+4000] ⊃ phase ``a``: launch [B+100, B+150] → op [B+200,
    B+1000]). Each gap's host window on the launching thread runs from the previous op's end P+1000 (P = B − 10 000)
    to the next launch B+100 = P+10 100: 9 100 ns. On that thread, in the default domain:

    - scheduler.process_batch_result [P+500, P+3000]: crosses the window's start: 2 000 ns inside; a
      cudaStreamSynchronize [P+2000, P+2200] in it (its wait: 200)
    - cudaStreamSynchronize [P+3000, P+3500] outside every range: CUDA API: wait 500
    - scheduler.get_next_batch_to_run [P+4000, P+7000] ⊃ scheduler.recv_requests [P+5000, P+6000]: 2 000 and 1 000
    - scheduler.run_batch [P+9000, B+200]: crosses the window's end (B+100): 1 100
    - the rest: 9 100 − 2 000 − 500 − 3 000 − 1 100 = 2 500 unattributed

    A second thread holds scheduler.recv_requests over every window: not the launching thread's, it counts nowhere.
    ``ranges=False``: no range but the cycles and phases (the two syncs: 700 of wait, 8 400 unattributed)."""
    s = Synth(path, duration=100_000)
    s.device(0)
    s.domain(PID, PID, "spectrace", 1)
    corr = 0
    for i in range(N):
        b = i * 10_000
        s.range(PID, PID, "cycle", b + 50, b + 4000, domain_id=1)
        s.range(PID, PID, "a", b + 60, b + 160, domain_id=1)
        corr += 1
        s.launch(PID, PID, "cudaLaunchKernel_v7000", (b + 100, b + 150), corr, [(b + 200, b + 1000, "gemm")])
        if i == N - 1:
            break
        p = b
        for a0, a1 in ((2000, 2200), (3000, 3500)):
            corr += 1
            s.api(PID, PID, "cudaStreamSynchronize_v3020", p + a0, p + a1, corr)
        if ranges:
            for name, r0, r1 in (("scheduler.process_batch_result", 500, 3000),
                                 ("scheduler.get_next_batch_to_run", 4000, 7000),
                                 ("scheduler.recv_requests", 5000, 6000), ("scheduler.run_batch", 9000, 10_200)):
                s.range(PID, PID, name, p + r0, p + r1)
            s.range(PID, PID + 1, "scheduler.recv_requests", p + 900, p + 10_200)
    return s.save()


@pytest.fixture(scope="module")
def hg(tmp_path_factory):
    res = analyze(build(tmp_path_factory.mktemp("hg") / "h.sqlite"), skip_cycles=0)
    return res, res.steady.host_gaps


@pytest.fixture(scope="module")
def bare(tmp_path_factory):
    res = analyze(build(tmp_path_factory.mktemp("hg") / "bare.sqlite", ranges=False), skip_cycles=0)
    return res, res.steady.host_gaps


def _items(h: host_gaps.HostGaps) -> dict:
    it = h.items.filter(pl.col("scope") == "steady")
    return {r["item"]: (r["ns"], r["wait_ns"]) for r in it.iter_rows(named=True)}


def test_items_per_cycle(hg):
    _, h = hg
    assert _items(h) == {"scheduler.process_batch_result": (2000, 200), "CUDA API: wait": (500, 500),
                         "scheduler.get_next_batch_to_run": (2000, 0), "scheduler.recv_requests": (1000, 0),
                         "scheduler.run_batch": (1100, 0), "unattributed": (2500, 0)}
    w = h.windows.row(0, named=True)
    assert (w["gap"], w["window_ns"], w["cycles"], w["host_bound"]) == ("between cycles", 9100, N - 1, N - 1)
    assert h.has_ranges and not h.sampled
    assert abs(h.items["share"].sum() - 1.0) < 1e-9


def test_no_ranges(bare):
    res, h = bare
    assert _items(h) == {"CUDA API: wait": (700, 700), "unattributed": (8400, 0)}
    assert not h.has_ranges and any("SGLANG_ENABLE_NVTX_SCHEDULER=1" in n for n in h.notes)
    gap = [f for f in res.steady.findings if f.code == "GAP_HOST_BOUND"]
    assert gap and "SGLANG_ENABLE_NVTX_SCHEDULER=1" in gap[0].action and "--cpu-sampling" in gap[0].action


def test_finding_names_items(hg):
    res, _ = hg
    f = [f for f in res.steady.findings if f.code == "GAP_HOST_BOUND"][0]
    assert "scheduler.process_batch_result 2.0 µs" in f.evidence
    assert "scheduler.get_next_batch_to_run 2.0 µs" in f.evidence
    assert "`scheduler.process_batch_result`: " in f.action and "--disable-overlap-schedule" in f.action
    assert "nsys profile -s cpu" not in f.action  # the generic list is replaced


def test_outputs(hg):
    from analyze.output import data, text

    res, h = hg
    d = data.document(res)
    assert d["host_gaps"]["items"] and d["host_gaps"]["windows"][0]["window_ns"] == 9100
    assert any("scheduler.recv_requests" in line for line in text.host_gap_lines(res))
    assert data.frame(res, "host_gaps").height == h.items.height


def test_seam_and_straddling_sync(tmp_path):
    """tests/test_host.py's trace: the seam c → d is host-bound (window [B+3000, B+3500], nothing in it); the gap
    between the cycles runs from 3 700 (cycle 1's last op) to 10 100 (cycle 2's first launch): the sync [3560, 3800]
    reaches into it (100 of wait), the sync [3900, 3905] is inside (5), the rest 6 295 is unattributed. One steady
    cycle (the second)."""
    from tests.test_host import build as host_trace

    res = analyze(host_trace(tmp_path / "h.sqlite"), skip_cycles=0)
    h = res.steady.host_gaps
    it = {(r["gap"], r["item"]): r["ns"] for r in h.items.iter_rows(named=True)}
    assert it == {("c → d", "unattributed"): 500, ("between cycles", "CUDA API: wait"): 105,
                  ("between cycles", "unattributed"): 6295}
    seam = [f for f in res.steady.findings if f.code == "SEAM_HOST_BOUND"]
    assert seam and "unattributed 0.5 µs" in seam[0].evidence
