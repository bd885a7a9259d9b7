"""Hand-computed answers on synthetic exports built from nsys's real DDL (see tests/helpers/synth.py).

Every expected number below is derived by hand in the comments, not by running the analyzer.
"""

from __future__ import annotations

import polars as pl
import pytest

from analyze import analyze
from tests.helpers.synth import Synth

NCCL = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<(unsigned long)4096>)"
CAR = "void vllm::cross_device_reduce_1stage<__nv_bfloat16, 8>(vllm::RankData*, vllm::RankSignals, vllm::Signal*, __nv_bfloat16*, int, int)"


def two_rank_trace(path, version="2025.3"):
    """pid 100 on device 1 (rank 1) and pid 200 on device 0 (rank 0); spectrace domain is id 1 in both."""
    s = Synth(path, version=version, duration=100_000)
    s.device(0)
    s.device(1)
    # ---- pid 100, device 1: one cycle with draft / verify / draft_extend, launches on thread 100.
    s.domain(100, 100, "spectrace", 1)
    s.range(100, 100, "cycle", 1000, 10000, domain_id=1)
    s.range(100, 100, "draft", 1100, 3000, domain_id=1)
    s.range(100, 100, "verify", 3100, 6000, domain_id=1, registered=True)  # registered string: textId
    s.range(100, 100, "draft_extend", 6100, 9000, domain_id=1)
    s.launch(100, 100, "cudaLaunchKernel_v7000", (1200, 1300), 1, [(2000, 2500, "gemm")], device=1)
    # a CUDA graph replay (node mode): four kernels share the launch's correlation id; k4 overlaps k3 on stream 8
    s.launch(100, 100, "cudaGraphLaunch_v10000", (3200, 3400), 2,
             [(3500, 4000, "gemm"), (4000, 4400, NCCL), (4300, 4800, "attn", 8), (5000, 5200, "gemm")], device=1)
    s.launch(100, 100, "cudaLaunchKernel_v7000", (6200, 6300), 3, [(6500, 6600, CAR)], device=1)
    s.api(100, 100, "cudaMemcpyAsync_v3020", 6400, 6450, 4)
    s.memcpy(100, 1, 7, 4, 6700, 6900)
    s.launch(100, 100, "cudaLaunchKernel_v7000", (9500, 9600), 5, [(9700, 9800, "glue")], device=1)
    # another thread of the same process, outside any range: GPU work inside the verify→draft_extend seam
    s.launch(100, 101, "cudaLaunchKernel_v7000", (3300, 3350), 6, [(5600, 5800, "other", 9)], device=1)
    # ---- pid 200, device 0: the same correlation ids 1..3 (ids are per process), plus an unclosed cycle.
    s.domain(200, 200, "spectrace", 1)
    s.range(200, 200, "cycle", 1000, 5000, domain_id=1)
    s.range(200, 200, "draft", 1100, 2000, domain_id=1)
    s.range(200, 200, "verify", 2100, 4000, domain_id=1)
    s.launch(200, 200, "cudaLaunchKernel_v7000", (1200, 1300), 1, [(1500, 1700, "gemm")], device=0)
    s.launch(200, 200, "cudaLaunchKernel_v7000", (2200, 2300), 2, [(2400, 3000, NCCL)], device=0)
    s.range(200, 200, "cycle", 6000, 100_000, domain_id=1)  # never popped: nsys writes the session end
    s.range(200, 200, "draft", 6100, 6500, domain_id=1)
    s.launch(200, 200, "cudaLaunchKernel_v7000", (6200, 6300), 3, [(6400, 6600, "gemm")], device=0)
    # a range that launches nothing, and a default-domain range that is not selected
    s.range(200, 200, "verify", 6600, 6700, domain_id=1)
    s.range(200, 200, "aten::mm", 6150, 6450)
    s.diagnostic("Not all CUDA events might have been collected.", 200)
    return s.save()


@pytest.fixture(scope="module")
def res(tmp_path_factory):
    return analyze(two_rank_trace(tmp_path_factory.mktemp("s") / "two.sqlite"))


def row(df, **eq):
    out = df.filter(pl.all_horizontal([pl.col(k) == v for k, v in eq.items()]))
    assert out.height == 1, (eq, out)
    return out.row(0, named=True)


def test_ranks_follow_device_ids(res):
    assert res.ranks.select("rank", "pid", "device").rows() == [(0, 200, 0), (1, 100, 1)]


def test_graph_replay_phase_with_overlapping_streams(res):
    v = row(res.phases, rank=1, phase="verify")
    # ops [3500,4000] [4000,4400]nccl [4300,4800] [5000,5200]: span 5200-3500; union [3500,4800]+[5000,5200]
    assert (v["span_ns"], v["busy_ns"], v["comm_ns"], v["compute_ns"], v["idle_ns"]) == (1700, 1500, 400, 1100, 200)
    assert (v["kernel_ns"], v["ops"], v["launches"], v["instances"]) == (1600, 4, 1, 1)
    assert v["gpu_idle_ns"] == 200  # the gap [4800, 5000] held no other work


def test_custom_allreduce_and_memcpy(res):
    d = row(res.phases, rank=1, phase="draft_extend")
    # custom AR [6500,6600] is communication; memcpy DtoD [6700,6900] is not
    assert (d["span_ns"], d["busy_ns"], d["comm_ns"], d["compute_ns"], d["idle_ns"], d["ops"]) == (400, 300, 100, 200, 100, 2)


def test_innermost_range_takes_the_op(res):
    assert row(res.phases, rank=1, phase="draft")["span_ns"] == 500
    c = row(res.phases, rank=1, phase="cycle")  # only the kernel launched outside the children
    assert (c["span_ns"], c["busy_ns"], c["ops"]) == (100, 100, 1)


def test_correlation_ids_are_per_process(res):
    d = row(res.phases, rank=0, phase="draft")
    assert (d["span_ns"], d["instances"]) == (200 + 200, 2)  # [1500,1700] and [6400,6600]
    v = row(res.phases, rank=0, phase="verify")
    assert (v["span_ns"], v["comm_ns"], v["compute_ns"], v["instances"]) == (600, 600, 0, 1)


def test_identity_holds_everywhere(res):
    p = res.phases
    assert (p["span_ns"] == p["compute_ns"] + p["comm_ns"] + p["idle_ns"]).all()
    i = res.instances
    assert (i["x_span_ns"] == i["x_compute_ns"] + i["x_comm_ns"] + i["x_idle_ns"]).all()
    assert (i["i_span_ns"] == i["i_compute_ns"] + i["i_comm_ns"] + i["i_idle_ns"]).all()


def test_inclusive_projection(res):
    c = row(res.ranges, rank=1, range="cycle")
    # everything launched in the cycle by thread 100: [2000, 9800]; union 500+1300+200+100+200+100
    assert (c["proj_span_ns"], c["busy_ns"], c["comm_ns"], c["idle_ns"], c["ops"], c["launches"]) == (
        7800, 2400, 500, 5400, 8, 5)  # k1-k7 and the memcpy
    c0 = row(res.ranges, rank=0, range="cycle")
    assert (c0["instances"], c0["proj_span_ns"], c0["range_instances"]) == (2, 1500 + 200, 2)


def test_seams(res):
    s = res.seams
    dv = row(s, rank=1, **{"from": "draft", "to": "verify"})
    assert (dv["gap_ns"], dv["idle_ns"], dv["busy_ns"], dv["parent"]) == (1000, 1000, 0, "cycle")
    ve = row(s, rank=1, **{"from": "verify", "to": "draft_extend"})
    # window [5200, 6500]; thread 101's kernel [5600,5800] ran in it
    assert (ve["gap_ns"], ve["idle_ns"], ve["busy_ns"]) == (1300, 1100, 200)
    cc = row(s, rank=0, **{"from": "cycle", "to": "cycle"})
    assert (cc["parent"], cc["idle_ns"]) == (None, 6400 - 3000)


def test_coverage(res):
    c = row(res.coverage, rank=1)
    # window [2000, 9800]: busy 2400 attributed + 200 from thread 101
    assert (c["gpu_ns"], c["attributed_ns"]) == (2600, 2400)


def test_diagnostics(res):
    codes = {(d.code, d.level) for d in res.diagnostics}
    assert ("UNCLOSED_RANGE", "warning") in codes  # the unclosed cycle is counted: its span runs to the session end
    assert "span and idle include the time to the session end" in \
        next(d.message for d in res.diagnostics if d.code == "UNCLOSED_RANGE")
    # nsys's "not all events" changes no number by itself (GPU_TAIL_LOST / WINDOW_CUT say when one is): a note
    assert ("INCOMPLETE_COLLECTION", "info") in codes
    assert ("RANGE_NO_GPU", "info") in codes  # 1 of 3 verify ranges launched nothing
    assert ("COVERAGE", "info") in codes
    assert not any(d.code == "GRAPH_LEVEL_TRACE" for d in res.diagnostics)


@pytest.mark.parametrize("version", ["2022.4", "2024.2", "2026.2"])
def test_same_answer_across_schemas(tmp_path, version, res):
    other = analyze(two_rank_trace(tmp_path / f"{version}.sqlite", version=version))
    cols = ["rank", "phase", "span_ns", "busy_ns", "comm_ns", "idle_ns", "ops"]
    assert other.phases.select(cols).sort("rank", "phase").equals(res.phases.select(cols).sort("rank", "phase"))


def test_graph_level_trace(tmp_path):
    s = Synth(tmp_path / "g.sqlite", version="2024.2", mode="Graph")
    s.range(1, 1, "cycle", 1000, 5000)
    s.range(1, 1, "verify", 1100, 3000)
    s.api(1, 1, "cudaGraphLaunch_v10000", 1200, 1300, 1)
    s.graph(1, 0, 7, 1, 1500, 2500)
    s.api(1, 1, "cudaGraphLaunch_v10000", 3100, 3200, 2)  # no GPU rows for this one
    s.api(1, 1, "cudaLaunchKernel_v7000", 3300, 3400, 3)
    s.kernel(1, 0, 7, 3, 3600, 3700, NCCL)
    r = analyze(s.save(), ranges=r"^(cycle|verify)$")
    v = row(r.phases, phase="verify")
    assert (v["span_ns"], v["busy_ns"], v["comm_ns"]) == (1000, 1000, 0)
    codes = {d.code for d in r.diagnostics}
    assert {"GRAPH_LEVEL_TRACE", "GRAPH_LAUNCH_NO_GPU"} <= codes
    # the launch without GPU rows lies between the process's first and last GPU op: lost work, a warning
    lost = next(d for d in r.diagnostics if d.code == "GRAPH_LAUNCH_NO_GPU")
    assert lost.level == "warning" and "1 of 2 cudaGraphLaunch calls" in lost.message and "1 of them inside" in lost.message
    assert r.trace.graph_trace_mode == "Graph"


def test_nested_unselected_and_two_threads(tmp_path):
    """Thread 2's ranges never take thread 1's ops; an unselected inner range is transparent."""
    s = Synth(tmp_path / "t.sqlite")
    s.range(1, 1, "eagle3.verify", 100, 1000)
    s.range(1, 1, "inner", 200, 300)
    s.range(1, 2, "eagle3.draft", 100, 1000)
    s.launch(1, 1, "cudaLaunchKernel_v7000", (210, 220), 1, [(400, 500, "k")])
    s.launch(1, 2, "cudaLaunchKernel_v7000", (210, 220), 2, [(450, 650, "k")])
    r = analyze(s.save())
    assert row(r.phases, phase="eagle3.verify")["span_ns"] == 100
    assert row(r.phases, phase="eagle3.draft")["span_ns"] == 200
    assert "named after spectrace phases" in r.selection


def test_start_end_range_ended_elsewhere_is_ignored(tmp_path):
    s = Synth(tmp_path / "x.sqlite")
    s.range(1, 1, "verify", 100, 1000, event_type=60, end_tid=2)
    s.range(1, 1, "draft", 100, 1000, event_type=60)
    s.launch(1, 1, "cudaLaunchKernel_v7000", (210, 220), 1, [(400, 500, "k")])
    r = analyze(s.save(), ranges="verify|draft")
    assert r.phases["phase"].to_list() == ["draft"]
    assert any(d.code == "CROSS_THREAD_RANGE" for d in r.diagnostics)


def test_gpu_idle_excludes_gaps_filled_by_other_work(tmp_path):
    """verify's ops leave a 200 ns gap; another thread's kernel fills 100 ns of it."""
    s = Synth(tmp_path / "g.sqlite")
    s.range(1, 1, "verify", 100, 1000)
    s.launch(1, 1, "cudaLaunchKernel_v7000", (110, 120), 1, [(1000, 1100, "a"), (1300, 1400, "b")])
    s.launch(1, 2, "cudaLaunchKernel_v7000", (110, 120), 2, [(1150, 1250, "c", 8)])
    r = analyze(s.save())
    v = row(r.phases, phase="verify")
    assert (v["span_ns"], v["busy_ns"], v["idle_ns"], v["gpu_idle_ns"]) == (400, 200, 200, 100)


def test_diagnostics_by_consequence(tmp_path):
    """nsys's "not all events" once for every process (a launcher process that is not a rank said once); a graph
    launch after the last GPU op changes no number (info); full coverage says nothing."""
    s = Synth(tmp_path / "c.sqlite", version="2025.3")
    for pid, dev in ((1, 0), (2, 1)):
        s.range(pid, pid, "cycle", 1000, 5000)
        s.range(pid, pid, "verify", 1100, 3000)
        s.api(pid, pid, "cudaLaunchKernel_v7000", 1200, 1300, 1)
        s.kernel(pid, dev, 7, 1, 1500, 2500, "gemm")
        s.api(pid, pid, "cudaGraphLaunch_v10000", 4000, 4100, 2)  # after the process's last GPU op
    for pid in (1, 2, 9):  # 9: a launcher that ran no GPU work
        s.diagnostic("Not all CUDA events might have been collected.", pid)
    r = analyze(s.save(), ranges=r"^(cycle|verify)$")
    by = {}
    for d in r.diagnostics:
        by.setdefault(d.code, []).append(d)
    assert [d.level for d in by["INCOMPLETE_COLLECTION"]] == ["info"]
    assert "(processes 1, 2, 9)" in by["INCOMPLETE_COLLECTION"][0].message
    assert [d.message for d in by["NOT_A_RANK"]] == ["process 9 ran no GPU work: not a rank (e.g. the launcher)"]
    assert [(d.level, d.message.endswith("(no number is affected)")) for d in by["GRAPH_LAUNCH_NO_GPU"]] == \
        [("info", True)]
    assert "COVERAGE" not in by  # phases received all the GPU time
    assert not [d for d in r.diagnostics if d.level != "info"]
