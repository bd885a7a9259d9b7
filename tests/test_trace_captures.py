"""The bundled H200 captures: the analyzer's projection against NVIDIA's own `nsys stats` numbers."""

from __future__ import annotations

import csv
import json
import sqlite3

import pytest

from nvtx_hooks.capture import samples
from nvtx_hooks.phases import decode_payload

NAMES = samples.names()
STATS = [n for n in NAMES if samples.stats_csv(n).exists()]  # with NVIDIA's nsys stats CSVs beside them
SHARED = {"tp2_rank0_window", "tp2_workload_captureall"}
PHASES = ("cycle", "draft", "verify", "draft_extend", "host_overhead")


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("samples")


def nvidia(name: str) -> dict[str, dict]:
    """``nvtx_gpu_proj_sum`` rows by range text (domain prefix removed)."""
    with open(samples.stats_csv(name)) as f:
        return {r["Range"].split(":", 1)[1]: r for r in csv.DictReader(f)}


def test_bundle_is_complete():
    first = {"tp1_node", "tp1_graph", "tp1_eager", "tp1_baseline", "tp1_delay", "tp1_steps1", "tp1_steps2",
             "tp1_steps3", "tp1_steps4"}
    assert first <= set(NAMES) and first <= set(STATS)
    for n in STATS:
        assert samples.stats_csv(n).exists() and samples.stats_csv(n, "nvtx_sum").exists()
    for n in NAMES:
        d = samples.data_dir(n)
        assert (d / f"{n}.sqlite.xz").stat().st_size < 5_000_000
        if n in SHARED:  # captures of ../shared/traces, bundled for tests: their README says how they were made
            continue
        m = json.loads((d / f"{n}.manifest.json").read_text())
        assert m["exit_code"] == 0 and m["exported"] and m["env_added"]["SPECTRACE_HOOKS"] == "1"
        assert set(m["env_added"]) <= {"SPECTRACE_HOOKS", "NCCL_PROTO"}  # the NCCL pair sets the protocol


@pytest.mark.parametrize("name", STATS)
def test_projection_equals_nsys_stats(name, cache):
    from analyze import api as analysis
    res = analysis.analyze(samples.path(name, cache))
    ours: dict[str, dict] = {}
    for r in res.ranges.iter_rows(named=True):
        o = ours.setdefault(r["range"], {"proj": 0, "ops": 0, "inst": 0, "range_ns": 0})
        o["proj"] += r["proj_span_ns"]
        o["ops"] += r["launches"]
        o["inst"] += r["instances"]
        o["range_ns"] += r["range_ns"]
    nv = nvidia(name)
    assert nv, name
    # graph mode: NVIDIA's report projects no CUDA-graph replay (GRAPH_TRACE rows); the analyzer does
    graph_launches = {"cycle": 2 * 65, "verify": 65, "draft": 65} if name == "tp1_graph" else {}
    for rng, row in nv.items():
        assert rng in ours, (name, rng)
        assert ours[rng]["inst"] == int(row["Range Instances"]), (name, rng)
        assert ours[rng]["range_ns"] == int(row["Total Range Time (ns)"]), (name, rng)
        if rng in graph_launches:
            assert ours[rng]["ops"] == int(row["Total GPU Ops"]) + graph_launches[rng], (name, rng)
            assert ours[rng]["proj"] > 50 * int(row["Total Proj Time (ns)"]) or rng == "cycle", (name, rng)
            continue
        assert ours[rng]["proj"] == int(row["Total Proj Time (ns)"]), (name, rng)
        assert ours[rng]["ops"] == int(row["Total GPU Ops"]), (name, rng)
    assert set(ours) - set(nv) == ({"draft"} if graph_launches else set()), name


def test_graph_mode_nsys_drops_graph_only_ranges(cache):
    from analyze import api as analysis
    nv = nvidia("tp1_graph")
    assert "draft" not in nv  # only a graph launch inside: NVIDIA's report omits it
    res = analysis.analyze(samples.path("tp1_graph", cache))
    assert "draft" in set(res.ranges["range"].to_list())


def _ranges(path) -> list[tuple[str, int | None]]:
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    q = """SELECT coalesce(e.text, s.value), coalesce(e.uint64Value, e.int64Value) FROM NVTX_EVENTS e
           LEFT JOIN StringIds s ON s.id = e.textId WHERE e.eventType = 59 ORDER BY e.start"""
    rows = con.execute(q).fetchall()
    con.close()
    return rows


def test_node_capture_phases_and_payloads(cache):
    rows = _ranges(samples.path("tp1_node", cache))
    names = [t for t, _ in rows]
    assert [names.count(p) for p in PHASES] == [65] * 5  # 5 warmup + 60 measured cycles
    cyc = [decode_payload(v) for t, v in rows if t == "cycle"]
    assert [c["cycle_index"] for c in cyc] == list(range(65))
    assert all(c["batch_size"] == 4 and 0 <= c["accept_length"] <= 4 * 3 for c in cyc)


def test_baseline_has_decode_steps_only(cache):
    names = {t for t, _ in _ranges(samples.path("tp1_baseline", cache))}
    assert names == {"decode_step"}


def _api_window(name: str) -> bool:
    """Captured with the cudaProfilerApi window (per its manifest; the shared tp2_rank0_window was too)."""
    mp = samples.data_dir(name) / f"{name}.manifest.json"
    if not mp.exists():
        return name == "tp2_rank0_window"
    cmd = (json.loads(mp.read_text()).get("nsys") or {}).get("profile_command", [])
    return any("cudaProfilerApi" in a for a in cmd)


def test_whole_run_captures_are_complete(cache):
    for n in NAMES:
        con = sqlite3.connect(f"file:{samples.path(n, cache)}?mode=ro", uri=True)
        texts = [t for (t,) in con.execute("SELECT text FROM DIAGNOSTIC_EVENT")]
        con.close()
        incomplete = any("Not all" in t for t in texts)
        # the cudaProfilerApi window loses the tail; the whole-run captures are complete, except the shared one
        # whose ranks ended with os._exit before CUPTI flushed (the workload flushes now)
        assert incomplete == (_api_window(n) or n == "tp2_workload_captureall"), n


@pytest.mark.parametrize("name", NAMES)
def test_bundled_exports_are_scrubbed(name, cache):
    from nvtx_hooks.capture.scrub import find_strings

    p = samples.path(name, cache)
    assert find_strings(p, ["PATH=", "HOME=", "PYTHONPATH", "LD_LIBRARY_PATH", "NCCL_NVLS_ENABLE="]) == {}
    con = sqlite3.connect(f"file:{p}?mode=ro", uri=True)
    # only the processes with events (one on a GPU; at TP2 the launcher and the ranks): no other process listed
    pids = {r[0] for t in ("NVTX_EVENTS", "CUPTI_ACTIVITY_KIND_RUNTIME", "ThreadNames") for r in con.execute(
        f"SELECT DISTINCT (globalTid >> 24) & 16777215 FROM {t}")} - {0}
    n = con.execute("SELECT count(*) FROM PROCESSES").fetchone()[0]
    assert n == 1 if name.startswith("tp1_") else 2 <= n <= len(pids) + 1
    assert con.execute("SELECT count(*) FROM META_DATA_CAPTURE WHERE name LIKE '%ENVIRONMENT%'").fetchone()[0] == 0
    con.close()
