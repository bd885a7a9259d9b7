"""Real exports: the analyzer against NVIDIA's own `nsys stats` numbers, and every shared export."""

from __future__ import annotations

import hashlib

import polars as pl
import pytest

from analyze import analyze
from analyze.model import InputError
from tests.helpers.paths import EXTERNAL, PROBE, PROBE_STATS, need


@pytest.fixture(scope="module")
def probe():
    return analyze(need(PROBE), keep_ops=True)


def nvidia_proj_sum() -> pl.DataFrame:
    df = pl.read_csv(need(PROBE_STATS / "nvtx_gpu_proj_sum.csv"))
    return df.with_columns(pl.col("Range").str.strip_prefix(":"))


@pytest.mark.parametrize("name", ["eagle3.draft", "eagle3.verify", "eagle3.draft_extend", "eagle3.host_overhead",
                                  "eagle3.cycle"])
def test_projection_matches_nsys_stats(probe, name):
    nv = nvidia_proj_sum().filter(pl.col("Range") == name).row(0, named=True)
    ours = probe.ranges.filter(pl.col("range") == name)
    assert ours["proj_span_ns"].sum() == nv["Total Proj Time (ns)"]
    assert ours["launches"].sum() == nv["Total GPU Ops"]
    assert ours["instances"].sum() == nv["Range Instances"]
    assert ours["range_ns"].sum() == nv["Total Range Time (ns)"]


def test_kernel_time_matches_cuda_gpu_kern_sum(probe):
    ks = pl.read_csv(need(PROBE_STATS / "cuda_gpu_kern_sum.csv"))
    kernels = probe.ops.filter(pl.col("kind") == "kernel")
    assert int((kernels["end"] - kernels["start"]).sum()) == ks["Total Time (ns)"].sum()
    assert kernels.height == ks["Instances"].sum()


def test_probe_phases_add_up_and_are_complete(probe):
    p = probe.phases
    assert set(p["phase"]) == {"eagle3.draft", "eagle3.verify", "eagle3.draft_extend", "eagle3.host_overhead"}
    assert (p["instances"] == 60).all()
    assert (p["span_ns"] == p["compute_ns"] + p["comm_ns"] + p["idle_ns"]).all()
    # leaf phases: the exclusive view equals NVIDIA's inclusive projection
    leaf = probe.ranges.filter(pl.col("range") != "eagle3.cycle").join(
        p, left_on=["rank", "range"], right_on=["rank", "phase"])
    assert (leaf["proj_span_ns"] == leaf["span_ns"]).all()
    # every NCCL all-reduce kernel launched in a phase is communication
    nccl = probe.ops.filter(pl.col("name").str.starts_with("ncclDevKernel") & pl.col("range_id").is_not_null())
    assert nccl.height > 0 and (nccl["comm"] == "nccl").all()
    codes = {d.code for d in probe.diagnostics}
    assert "INCOMPLETE_COLLECTION" in codes and "GRAPH_LEVEL_TRACE" not in codes
    assert probe.trace.graph_trace_mode == "Node"
    assert probe.ranks.select("rank", "pid", "device").rows() == [(0, 1412, 0), (1, 1413, 1)]


def test_graph_kernels_follow_their_launch(probe):
    """All 13,200 graph-node kernels join a cudaGraphLaunch call; verify's are all in eagle3.verify."""
    nodes = probe.ops.filter(pl.col("in_graph"))
    assert nodes.height == 13200
    assert nodes["gtid"].null_count() == 0


@pytest.mark.parametrize("name", ["h100_2gpu_1s", "mfu_2gpu_before", "mfu_2gpu_after"])
def test_nsys_ai_fixtures_analyze(name):
    path = need(EXTERNAL / "nsys-ai" / f"{name}.sqlite")
    before = hashlib.sha256(path.read_bytes()).hexdigest()
    r = analyze(path, ranges=".")
    assert r.ranks.height == 2 and r.phases.height > 0
    assert (r.phases["span_ns"] == r.phases["compute_ns"] + r.phases["comm_ns"] + r.phases["idle_ns"]).all()
    assert hashlib.sha256(path.read_bytes()).hexdigest() == before


def test_nccl_sendrecv_is_comm_in_mfu_fixture():
    r = analyze(need(EXTERNAL / "nsys-ai" / "mfu_2gpu_before.sqlite"), ranges=".", keep_ops=True)
    sr = r.ops.filter(pl.col("name").str.contains("ncclDevKernel_SendRecv"))
    assert sr.height > 0 and (sr["comm"] == "nccl").all()


@pytest.mark.parametrize("name,code", [("nsys-ai/mock.sqlite", "NO_NVTX"), ("nsys-versions/c2022.sqlite", "NO_CUDA"),
                                       ("nsys-versions/c2023.sqlite", "NO_CUDA"), ("nsys-versions/c2024.sqlite", "NO_CUDA")])
def test_other_exports_load_and_refuse_cleanly(name, code):
    """They load (every schema version); analysis needs NVTX *and* CUDA, so it says which is missing."""
    from analyze.read.export import load

    path = need(EXTERNAL / name)
    t = load(path)
    assert t.nsys_version.startswith(("2022.4", "2023.4", "2024.2", "2026.1"))
    with pytest.raises(InputError) as e:
        analyze(t)
    assert e.value.code == code


def test_nvtx_only_exports_decode_domains_and_unclosed():
    from analyze.read.export import load

    for v in ("c2022", "c2023", "c2024"):
        t = load(need(EXTERNAL / "nsys-versions" / f"{v}.sqlite"))
        assert t.ranges.height > 0
        assert t.ranges.filter(pl.col("domain") != "")["domain"].n_unique() >= 1
        assert t.ranges["unclosed"].any()  # nvtxapp.c leaves one push open
        assert t.ranges["cross_thread"].any()  # and ends one start/end range on another thread
