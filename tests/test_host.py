"""Seam causes, host waits and key calls (analyze/compute/host.py) on a hand-computed synthetic trace."""

from __future__ import annotations

import polars as pl
import pytest

from analyze import analyze
from analyze.model import SYNC_API, bound_expr
from analyze.output.text import analyze_table
from tests.helpers.synth import Synth

PID = 100


def build(path):
    """Two cycles ``cycle ⊃ a, b, c, d`` at B = 0 and 10 000 (ns from B):

    - a: launch [100, 150] → op [200, 1000]
    - b: launch [300, 350] → op [1100, 2000]: returned before a ended → gpu, idle 100
    - c: launch [1500, 2300] → op [2400, 3000]: began before b ended (2000), returned after → launch, block 300,
      idle 400
    - d: launch [3500, 3550] → op [3600, 3700]: began after c ended (3000) → host, late 500, idle 600;
      cudaStreamSynchronize [3560, 3800] waits for op 3700: 140; another [3900, 3905] waits 0
    - cycle → cycle: cycle 1 ends at 3700, cycle 2's first launch starts at 10 100 → host, late 6400, idle 6500
    """
    s = Synth(path, duration=100_000)
    s.device(0)
    s.domain(PID, PID, "spectrace", 1)
    corr = 0
    for b in (0, 10_000):
        s.range(PID, PID, "cycle", b + 50, b + 4000, domain_id=1)
        for name, r0, r1, api, op in (("a", 60, 160, (100, 150), (200, 1000)),
                                      ("b", 200, 400, (300, 350), (1100, 2000)),
                                      ("c", 1400, 2350, (1500, 2300), (2400, 3000)),
                                      ("d", 3400, 3950, (3500, 3550), (3600, 3700))):
            s.range(PID, PID, name, b + r0, b + r1, domain_id=1)
            corr += 1
            s.launch(PID, PID, "cudaLaunchKernel_v7000", (b + api[0], b + api[1]), corr,
                     [(b + op[0], b + op[1], "gemm")])
        for a0, a1 in ((3560, 3800), (3900, 3905)):
            corr += 1
            s.api(PID, PID, "cudaStreamSynchronize_v3020", b + a0, b + a1, corr)
    return s.save()


@pytest.fixture(scope="module")
def res(tmp_path_factory):
    return analyze(build(tmp_path_factory.mktemp("host") / "h.sqlite"))


def test_seam_causes_per_instance(res):
    si = res.seam_instances.sort("b")
    got = {(r["prev_range"], r["range"]): (r["cause"], r["idle_ns"], r["block_ns"], r["late_ns"])
           for r in si.filter(pl.col("b") < 10_000).iter_rows(named=True)}
    assert got == {("a", "b"): ("gpu", 100, 0, 0), ("b", "c"): ("launch", 400, 300, 0),
                   ("c", "d"): ("host", 600, 0, 500)}
    top = si.filter(pl.col("range") == "cycle").row(0, named=True)
    assert (top["cause"], top["idle_ns"], top["late_ns"]) == ("host", 6500, 6400)


def test_seam_rows_bound_and_time(res):
    s = res.seams.sort("from").select("from", "to", "bound", "gpu_bound_ns", "launch_bound_ns", "host_bound_ns",
                                      "launch_block_ns", "host_late_ns", "gpu_bound_inst").rows()
    assert s == [("a", "b", "gpu", 200, 0, 0, 0, 0, 2), ("b", "c", "launch", 0, 800, 0, 600, 0, 0),
                 ("c", "d", "host", 0, 0, 1200, 0, 1000, 0), ("cycle", "cycle", "host", 0, 0, 6500, 0, 6400, 0)]
    sa = res.seams_all.filter(pl.col("from") == "b")
    assert sa["bound"][0] == "launch" and sa["launch_block_ns"][0] == 600
    text = analyze_table(res)
    assert "launch 2/2" in text and "block µs" in text


def test_host_waits_and_launch_time(res):
    p = {r["phase"]: (r["launch_api_ns"], r["host_wait_ns"], r["syncs"]) for r in res.phases.iter_rows(named=True)}
    assert p == {"a": (100, 0, 0), "b": (100, 0, 0), "c": (1600, 0, 0), "d": (100, 280, 4)}
    assert res.phases_all.filter(pl.col("phase") == "d")["host_wait_ns"][0] == 280
    c = res.host_calls.filter(pl.col("sync")).sort("start")
    assert c.select("wait_end", "wait_ns").rows()[:2] == [(3700, 140), (3700, 0)]
    units = res.host_calls.filter(pl.col("unit").is_not_null())
    assert units.height == 8 and (units["ops"] == 1).all()


def test_bound_ties():
    df = pl.DataFrame({"gpu_bound_inst": [2, 2, 1, 0], "gpu_bound_ns": [5, 5, 0, 0],
                       "launch_bound_inst": [2, 2, 1, 0], "launch_bound_ns": [5, 9, 0, 0],
                       "host_bound_inst": [1, 0, 1, 0], "host_bound_ns": [99, 0, 1, 0]})
    assert df.select(bound_expr())["bound"].to_list() == ["gpu", "launch", "host", None]


@pytest.mark.parametrize("name,sync", [("cudaStreamSynchronize_v3020", True), ("cudaDeviceSynchronize_v3020", True),
                                       ("cudaMemcpy_v3020", True), ("cudaMemcpyAsync_v3020", False),
                                       ("cuStreamSynchronize", True), ("cudaEventSynchronize_v3020", True),
                                       ("cudaLaunchKernel_v7000", False), ("cudaStreamWaitEvent_v3020", False)])
def test_sync_names(name, sync):
    assert pl.select(pl.lit(name).str.contains(SYNC_API)).item() is sync


@pytest.mark.parametrize("name,frm,bound", [("tp1_graph", "draft", "gpu"), ("tp1_node", "draft", "gpu"),
                                            ("tp1_steps1", "draft", "launch"), ("tp1_node", "cycle", "host"),
                                            ("tp1_graph", "cycle", "host")])
def test_real_seam_causes(name, frm, bound):
    """The bundled H200 captures: between cycles the host syncs (.item()), sleeps and launches late; at 1 draft
    step under node-level tracing the 168 µs verify launch returns after the 64 µs draft."""
    from nvtx_hooks.capture import samples

    res = analyze(samples.path(name))
    row = res.seams_all.filter(pl.col("from") == frm).row(0, named=True)
    assert row["bound"] == bound and row[f"{bound}_bound_inst"] >= 0.95 * row["instances"]
    ho = res.phases_all.filter(pl.col("phase") == "host_overhead").row(0, named=True)
    assert ho["syncs"] == ho["instances"] and ho["host_wait_ns"] > 0
