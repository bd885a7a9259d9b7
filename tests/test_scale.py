"""The streamed (per-process, from the parquet cache) path equals the in-memory one; many reports.

Small inputs only: speed and memory targets live in ``make bench`` (BENCHMARKS.md), not here.
"""

from __future__ import annotations

import json
import sqlite3

import polars as pl
import pytest
from test_collectives_real import split_probe

from analyze import analyze
from analyze.cli import main
from analyze.compute.pipeline import result_of as analyze_store
from analyze.read.store import open_store
from tests.helpers.paths import PROBE, need

SAMPLES = ["tp1_node", "tp1_graph", "tp1_eager"]


def _canon(res) -> dict:
    """The JSON document, ``report`` aside; rows of tied sort keys in a fixed order."""
    d = res.to_dict()
    d.pop("report")
    for k, v in d.items():
        if isinstance(v, list) and v and isinstance(v[0], dict):
            d[k] = sorted(v, key=lambda r: json.dumps(r, sort_keys=True, default=str))
    d["coverage"]["per_rank"] = sorted(d["coverage"]["per_rank"], key=lambda r: r["rank"])
    return d


def _same(a, b) -> None:
    assert _canon(a) == _canon(b)
    for f in ("instances", "coverage", "ranks"):
        x, y = getattr(a, f), getattr(b, f)
        assert x.columns == y.columns, f
        assert x.sort("rank", *x.columns[:2]).equals(y.sort("rank", *y.columns[:2])), f
    key = ["rank", "parent", "range_id"]
    assert a.seam_instances.sort(key).equals(b.seam_instances.sort(key))
    k2 = ["rank", "corr", "start"]
    assert a.comm_kernels.columns == b.comm_kernels.columns
    assert a.comm_kernels.sort(k2).equals(b.comm_kernels.sort(k2))


def test_stream_equals_memory_on_probe(tmp_path):
    a = analyze(need(PROBE), store=False)
    b = analyze_store(open_store(PROBE, cache_dir=tmp_path / "c"), workers=1)
    _same(a, b)
    assert b.phases.filter(pl.col("phase") == "eagle3.draft").sort("rank")["comm_wait_ns"].to_list() == [
        11_950_987, 17_312]
    assert b.trace.graph_trace_mode == "Node"
    assert {d.code for d in b.diagnostics} == {d.code for d in a.diagnostics}


def test_store_read_in_row_ranges_equals_one_pass(tmp_path, monkeypatch):
    """Large tables are read in rowid ranges by several threads: same rows, same order per process."""
    from analyze.read.store import copy_build

    p = need(PROBE)
    whole = open_store(p, cache_dir=tmp_path / "whole")
    monkeypatch.setattr(copy_build, "PIECE_ROWS", 997)  # ~16 pieces of the kernel table, ~30 of the API calls
    monkeypatch.setattr(copy_build, "FLUSH_ROWS", 500)  # several parts per piece
    cut = open_store(p, cache_dir=tmp_path / "cut")
    assert len(list((tmp_path / "cut" / "ops").rglob("*.parquet"))) > 3 * len(list((tmp_path / "whole" / "ops").rglob("*.parquet")))
    assert cut.meta["ops_rows"] == whole.meta["ops_rows"] and cut.meta["api_rows"] == whole.meta["api_rows"]
    for kind in ("ops", "api"):
        for pid in whole.pids:
            assert cut.scan(kind, [pid]).collect().equals(whole.scan(kind, [pid]).collect()), (kind, pid)
    _same(analyze_store(whole), analyze_store(cut))


@pytest.mark.parametrize("name", SAMPLES)
def test_stream_equals_memory_on_samples(tmp_path, name):
    from nvtx_hooks.capture import samples

    p = samples.path(name)
    _same(analyze(p, store=False), analyze_store(open_store(p, cache_dir=tmp_path / "c"), workers=2))


def test_stream_with_ranges_and_odd_processes(tmp_path):
    """Another selection, and a trace where some processes have ranges or API calls but no GPU work."""
    p = need(PROBE)
    a = analyze(p, ranges=r"eagle3\.(draft|verify)$", store=False)
    _same(a, analyze_store(open_store(p, cache_dir=tmp_path / "c"), ranges=r"eagle3\.(draft|verify)$"))


def test_cache_is_reused_and_invalidated(tmp_path):
    src = tmp_path / "r.sqlite"
    src.write_bytes(need(PROBE).read_bytes())
    s1 = open_store(src)
    assert s1.root == tmp_path / "r.sqlite.spectrace"
    stamp = (s1.root / "meta.json").stat().st_mtime_ns
    assert open_store(src).root == s1.root and (s1.root / "meta.json").stat().st_mtime_ns == stamp
    # the report changes (size and mtime): the cache is rebuilt, the report itself untouched
    con = sqlite3.connect(src)
    con.execute("DELETE FROM CUPTI_ACTIVITY_KIND_KERNEL WHERE rowid % 2 = 0")
    con.commit()
    con.close()
    before = src.read_bytes()
    s2 = open_store(src)
    assert (s2.root / "meta.json").stat().st_mtime_ns != stamp
    assert sum(s2.meta["ops_rows"].values()) < sum(s1.meta["ops_rows"].values())
    assert src.read_bytes() == before
    assert {p.name for p in tmp_path.iterdir()} == {"r.sqlite", "r.sqlite.spectrace"}  # no temporary left
    t = s2.trace()
    assert t.ops.height == sum(s2.meta["ops_rows"].values())


def test_cache_goes_elsewhere_when_report_dir_is_read_only(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv("SPECTRACE_CACHE_DIR", raising=False)
    s = open_store(need(PROBE))  # the shared traces are read-only
    assert str(s.root).startswith(str(tmp_path / "xdg" / "spectrace"))
    res = analyze(PROBE, cache=True)
    assert res.phases.height == analyze(PROBE).phases.height


def test_many_reports_merge_and_realign(tmp_path):
    a = split_probe(tmp_path, 1412)
    b = split_probe(tmp_path, 1413, shift=50_000, utc_delta=-20_000)
    one = analyze(need(PROBE))
    m = analyze([str(a), str(b)], jobs=2)
    assert m.ranks.select("rank", "pid", "report").rows() == [(0, 1412, 0), (1, 1413, 1)]
    assert m.clock["alignment"] == "session start (utcEpochNs) + median skew of collective end times"
    # per-report numbers are those of the one-report capture; wait/transfer are matched across reports
    cols = ["rank", "phase", "span_ns", "busy_ns", "comm_ns", "idle_ns", "instances"]
    assert m.phases.select(cols).sort("rank", "phase").equals(one.phases.select(cols).sort("rank", "phase"))
    draft = m.phases.filter(pl.col("phase") == "eagle3.draft").sort("rank")
    assert (draft["comm_wait_ns"] + draft["comm_transfer_ns"]).to_list() == (
        one.phases.filter(pl.col("phase") == "eagle3.draft").sort("rank").select(
            pl.col("comm_wait_ns") + pl.col("comm_transfer_ns")).to_series().to_list())
    d = m.to_dict()
    assert d["reports"] == [str(a), str(b)] and len(d["ranks"]) == 2


def test_cli_many_reports_and_stream(tmp_path, capsys):
    a = split_probe(tmp_path, 1412)
    b = split_probe(tmp_path, 1413)
    assert main(["analyze", str(a), str(b), "--format", "json", "-q", "-j", "1"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert [r["rank"] for r in d["ranks"]] == [0, 1] and len(d["reports"]) == 2
    assert main(["analyze", str(a), "--store", "--no-cache", "--format", "json", "-q"]) == 0
    s = json.loads(capsys.readouterr().out)
    assert main(["analyze", str(a), "--format", "json", "-q"]) == 0
    m = json.loads(capsys.readouterr().out)
    assert s["phases"] == m["phases"] and s["seams_all_ranks"] == m["seams_all_ranks"]
    assert not (tmp_path / "probe_1412.sqlite.spectrace").exists()
    assert main(["analyze", str(a), "--cache", "--format", "json", "-q"]) == 0
    assert (tmp_path / "probe_1412.sqlite.spectrace" / "meta.json").exists()
    assert json.loads(capsys.readouterr().out)["phases"] == m["phases"]


@pytest.mark.parametrize("extra", [False, True])
def test_stream_equals_memory_with_comm_mismatch(tmp_path, extra):
    """Hand-computed cross-rank trace: matched and mismatched collectives, both paths."""
    from test_collectives import one_report

    p = one_report(tmp_path / "m.sqlite", extra=extra)
    a, b = analyze(p, store=False), analyze_store(open_store(p, cache_dir=tmp_path / "c"))
    _same(a, b)
    assert [d.as_dict() for d in a.diagnostics if d.code.startswith("COMM")] == [
        d.as_dict() for d in b.diagnostics if d.code.startswith("COMM")]


def test_many_reports_on_any_executor(tmp_path):
    """The adapter for Ray/Dask: any Executor-like object runs the per-report map."""
    from concurrent.futures import ThreadPoolExecutor

    a, b = split_probe(tmp_path, 1412), split_probe(tmp_path, 1413)
    with ThreadPoolExecutor(2) as ex:
        m = analyze([str(a), str(b)], executor=ex)
    assert m.ranks["rank"].to_list() == [0, 1] and m.clock["reports"] == 2


def test_inflated_million_kernel_trace_projection_equals_nsys_stats(tmp_path):
    """At 1 M kernels (the probe inflated 4 x 17, as ``make bench`` makes it), streamed: every phase's
    projected span, GPU ops, instances and range time equal NVIDIA's ``nsys stats --report
    nvtx_gpu_proj_sum``, run on the lent H200 host by tests/device/scale_bench.sh."""
    import csv
    from pathlib import Path

    from bench.inflate import inflate

    dst = tmp_path / "inflated.sqlite"
    counts = inflate(need(PROBE), dst, 4, 17)
    assert counts["CUPTI_ACTIVITY_KIND_KERNEL"] == 1_023_672
    res = analyze_store(open_store(dst, cache_dir=tmp_path / "c"))
    ours = {r["range"]: r for r in res.to_dict()["ranges_all_ranks"]}
    with open(Path(__file__).parent / "data" / "inflated_4x17_nvtx_gpu_proj_sum.csv") as f:
        nsys = {r["Range"]: r for r in csv.DictReader(f) if r["Range"].startswith(":eagle3.")}
    assert len(nsys) == 5
    for name, row in nsys.items():
        o = ours[name[1:]]
        assert (o["proj_span_ns"], o["launches"], o["instances"], o["range_ns"]) == (
            int(row["Total Proj Time (ns)"]), int(row["Total GPU Ops"]), int(row["Range Instances"]),
            int(row["Total Range Time (ns)"])), name


@pytest.mark.parametrize("name", ["tp1_steps3", "tp1_node"])
def test_whatif_and_plot_inputs_same_from_memory_and_store(tmp_path, name):
    """One Result shape: the what-if fit and the figures' op windows do not depend on where rows live.

    Once the streamed Result kept only communication kernels, and on tp1_steps3 its fit lost the
    verify→draft_extend launch seam."""
    from analyze.compute.whatif_fit import fit
    from analyze.output import plots
    from nvtx_hooks.capture import samples

    p = samples.path(name)
    mem = analyze(p, store=False)
    sto = analyze_store(open_store(p, cache_dir=tmp_path / "c"))
    kept = analyze(p, store=False, keep_ops=True)
    fm, fs = fit(mem, 3), fit(sto, 3)  # both samples ran the workload at 3 draft steps
    assert "verify→draft_extend" in fm.seams(1) and fm.seams(1) == fs.seams(1) and fm.seams(3) == fs.seams(3)
    assert fm.predictions() == fs.predictions()
    t0 = int(mem.instances["start"].median())
    t1 = t0 + 5_000_000
    win = mem.ops_between(t0, t1)
    assert win.height > 0
    assert win.equals(sto.ops_between(t0, t1))
    assert win.equals(kept.ops_between(t0, t1))
    for r in (mem, sto):
        assert plots.timeline(r).axes[0].has_data()
