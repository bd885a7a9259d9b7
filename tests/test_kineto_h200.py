"""Issue 41's done-when on real H200 runs (tests/data/h200_tp1/tp1_kineto_*, made by tests/device/torch_profiler.sh):
the same workload profiled twice with nsys and twice with torch.profiler (a straggler-free TP1 run and the serving
schedule 1:40,2:40,4:40), and once with SGLang's native span names only. The numbers are checked against the other
tool's reading, against the raw files read here without the reader, and against the workload's own JSON record (the
host-measured period and the accept histograms it drew): docs/torch-profiler.md, "Validation on the H200"."""

from __future__ import annotations

import json
import lzma
import sqlite3

import polars as pl
import pytest

from bench.torch_vs_nsys import NATIVE, RUNS, Run, host_periods, metrics, open_run, record
from nvtx_hooks import phases as ph
from nvtx_hooks.capture import samples

# GPU time of a phase per instance, nsys against torch.profiler: 0.5 % of the value (+ 0.05 µs for the 1.6 µs
# host_overhead copy). Measured on these runs: the two runs of one tool differ by up to 0.16 % per phase, but the
# GEMMs that make up nearly all of a phase's GPU time (nvjet_*) change their mean duration from run to run by up
# to 0.38 % (tp1 nsys r1 → r2, verify's splitK GEMM), the short kernels and copies by up to 3 %; nsys and torch
# differ by at most 0.35 % (sched draft, +0.7 µs). The GPU operations per instance must be equal, exactly.
GPU_REL, GPU_ABS_US = 0.005, 0.05
# Cycle period p50 against the workload's own median period on the host (its record): at most 0.53 % apart
# (tp1 torch r2, 3 rare stalls left out by the reader, kept by the host median); the tools differ by 2-5 %.
PERIOD_REL = 0.01


@pytest.fixture(scope="module")
def runs():
    from analyze import api
    from analyze.output.data import document

    res = {r: api.analyze(open_run(r)) for r in [*RUNS, NATIVE]}
    return res, {r: metrics(document(x)) for r, x in res.items()}


def _mean(m: dict, shape: str, tool: str, q: str) -> float:
    return (m[Run(shape, tool, 1)][q] + m[Run(shape, tool, 2)][q]) / 2


def test_bundle():
    names = set(samples.names()) | set(samples.trace_names())
    assert {r.bundled for r in [*RUNS, NATIVE]} <= names
    total = sum(p.stat().st_size for p in samples.DATA.glob("tp1_kineto_*"))
    assert total < 3_000_000


@pytest.mark.parametrize("run", [r for r in RUNS if r.tool == "torch"] + [NATIVE], ids=lambda r: r.name)
def test_torch_gpu_ops_equal_the_raw_trace(runs, run):
    """Every kernel and copy of the trace, read here with json (no reader), is in the analysis, with its time."""
    ev = json.loads(open_run(run).read_text())["traceEvents"]
    gpu = [e for e in ev if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    rank = runs[0][run].ranks.row(0, named=True)
    assert rank["gpu_ops"] == len(gpu)
    assert rank["kernel_ns"] == sum(round(e["dur"] * 1000) for e in gpu)


@pytest.mark.parametrize("run", [r for r in RUNS if r.tool == "nsys"], ids=lambda r: r.name)
def test_nsys_gpu_ops_equal_the_export(runs, run):
    with sqlite3.connect(f"file:{open_run(run)}?mode=ro", uri=True) as con:
        n, ns = con.execute("SELECT sum(n), sum(ns) FROM (SELECT count(*) n, sum(end - start) ns FROM "
                            "CUPTI_ACTIVITY_KIND_KERNEL UNION ALL SELECT count(*), sum(end - start) FROM "
                            "CUPTI_ACTIVITY_KIND_MEMCPY)").fetchone()
    rank = runs[0][run].ranks.row(0, named=True)
    assert (rank["gpu_ops"], rank["kernel_ns"]) == (n, ns)


@pytest.mark.parametrize("shape", ["tp1", "sched"])
def test_phase_gpu_time_and_ops_agree(runs, shape):
    m = runs[1]
    phases = [q for q in m[Run(shape, "nsys", 1)] if q.startswith("gpu_us")]
    assert len(phases) == (4 if shape == "tp1" else 6)
    for r in RUNS:
        if r.shape == shape:
            assert [q for q in m[r] if q.startswith("gpu_us")] == phases
            for q in phases:  # the same GPU operations per instance in every run
                assert m[r][q.replace("gpu_us", "ops")] == m[Run(shape, "nsys", 1)][q.replace("gpu_us", "ops")], (r, q)
    for q in phases:
        a, b = _mean(m, shape, "nsys", q), _mean(m, shape, "torch", q)
        assert abs(b - a) <= GPU_REL * a + GPU_ABS_US, (q, a, b)


@pytest.mark.parametrize("run", [*RUNS, NATIVE], ids=lambda r: r.name)
def test_period_is_the_workloads_own(runs, run):
    """Each run's cycle period p50 (per segment on the schedule) is the workload's host-measured median."""
    got = runs[1][run]
    for q, us in host_periods(record(run)).items():
        assert got[q] == pytest.approx(us, rel=PERIOD_REL), q


@pytest.mark.parametrize("shape", ["tp1", "sched"])
def test_torch_profiler_slows_the_host_not_the_reader(runs, shape):
    """The period differs between the tools by the torch profiler's own cost on the host (the workload's record
    says so without any reader): the readers' difference is the records' difference, within 1 % of the period."""
    m = runs[1]
    host = {r: host_periods(record(r)) for r in RUNS if r.shape == shape}
    for q in host[Run(shape, "nsys", 1)]:
        read = _mean(m, shape, "torch", q) - _mean(m, shape, "nsys", q)
        truth = sum(host[Run(shape, "torch", i)][q] - host[Run(shape, "nsys", i)][q] for i in (1, 2)) / 2
        assert truth > 0.015 * host[Run(shape, "nsys", 1)][q]  # torch.profiler's cost: 2-5 % of the period
        assert read == pytest.approx(truth, abs=PERIOD_REL * host[Run(shape, "nsys", 1)][q]), q


@pytest.mark.parametrize("shape", ["tp1", "sched"])
def test_steady_state_classes_and_segments_agree(runs, shape):
    m = runs[1]
    these = [m[r] for r in RUNS if r.shape == shape]
    cycles = 60 if shape == "tp1" else 120
    for x in these:
        steady, n, warmup, stalls = x["steady"]
        assert (n, warmup) == (cycles, 0) and steady == n - len(stalls) and len(stalls) <= 0.05 * n
    assert len({x["segments"] for x in these}) == 1
    segs = these[0]["segments"]
    assert segs == (((4, 0, 59, 0),) if shape == "tp1" else ((1, 0, 39, 0), (2, 40, 79, 1), (4, 80, 119, 1)))
    prefill_cycles = {first for _, first, _, prefills in segs if prefills}
    for x in these:
        kinds = dict(x["classes"])
        if shape == "tp1":
            assert kinds == {}
        else:  # the slower cycle after each batch change, and a prefill's cycle when its extra time passes 10 %
            assert set(kinds) == {"prefill", "batch change"} and kinds["batch change"] == (81,)
            assert set(kinds["prefill"]) <= prefill_cycles and kinds["prefill"]


def test_native_spans_give_the_same_phases(runs):
    m = runs[1]
    nat, hooks = m[NATIVE], [m[Run("tp1", "torch", i)] for i in (1, 2)]
    phases = [q for q in nat if q.startswith("gpu_us")]
    # SGLang has no span for the host's bookkeeping: the workload's 1.6 µs copy there belongs to no phase
    assert phases == [q for q in hooks[0] if q.startswith("gpu_us") and q != "gpu_us host_overhead"]
    for q in phases:
        ref = (hooks[0][q] + hooks[1][q]) / 2
        assert nat[q.replace("gpu_us", "ops")] == hooks[0][q.replace("gpu_us", "ops")]
        assert abs(nat[q] - ref) <= GPU_REL * ref + GPU_ABS_US, q
    assert nat["segments"] == hooks[0]["segments"] and nat["steady"][1:3] == (60, 0)


@pytest.mark.parametrize("run", [r for r in RUNS if r.shape == "tp1"], ids=lambda r: r.name)
def test_accept_histogram_marks_are_the_workloads(runs, run):
    """The workload's accept_histogram marks (NVTX marks under nsys, `spectrace:accept_histogram #0x…`
    annotations under torch.profiler) decode to the histograms its record says it drew."""
    marks = runs[0][run].marks.filter((pl.col("domain") == ph.DOMAIN) & (pl.col("mark") == ph.ACCEPT_HISTOGRAM.name))
    got = ph.accept_histograms(marks["int64"].to_list())
    want = {int(k): v for k, v in record(run)["accept_histograms"].items()}
    assert len(want) == 60 and got == want


def test_bundled_trace_is_xz_of_json():
    with lzma.open(samples.DATA / f"{NATIVE.bundled}.trace.json.xz") as f:
        assert f.read(1) == b"{"
