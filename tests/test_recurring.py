"""Recurring slow cycles: every number tells the true story of every cycle, on captures whose truth is known.

- 1 GPU, real H200 captures (tests/data/h200_tp1, `tests/device/recurring_slow_cycles.sh`): host work before every 5th cycle,
  a 500 µs late draft every 4th cycle, a serving schedule (batch 1→4→16→64→16→4, prefills, 1 ms of host work
  every 10th cycle). The workload's record in each manifest says which cycles and how long (measured).
- 2 ranks, *built* from real TP2 captures by `bench/inject.py` (only one GPU was lent): rank 1 late 500 µs
  before draft every 4th cycle (whole run, node and graph level), and the same on the rank-0 profiler window
  capture, with rank 0 late 300 µs every 3rd cycle too. The injection's JSON is the ground truth.

Each test checks one of these criteria: the steady state keeps ≥ 90 % of the cycles after warm-up; a finding
names the right rank, phase and `every` N with `extra_ns` within 20 % of what was injected; analyze's straggler
is comm's; per-segment p50 periods within 3 % of the workload's own per-size median; the prefill shows as
`prefill`; compare of the clean run against the straggler run fails a 2 % gate, and its per-cycle rows are
analyze's.
"""

from __future__ import annotations

import json

import polars as pl
import pytest

from analyze import analyze, comm
from analyze.cli import main
from analyze.compute import anatomy, cycle_budget, findings, steady_tables
from analyze.compute.compare import compare_results
from analyze.compute.cycles import selection
from analyze.compute.findings import Finding
from analyze.compute.tokens import summary
from bench.inject import inject
from nvtx_hooks.capture import samples
from tests.helpers.paths import tp2

US = 1_000


def record(name: str) -> dict:
    """The workload's JSON record of a bundled capture (its manifest's program_output)."""
    m = json.loads((samples.data_dir(name) / f"{name}.manifest.json").read_text())
    return m["program_output"][0]


def kept_share(res) -> float:
    """Steady cycles / cycles after warm-up, per rank (≥ 90 % wanted)."""
    info = selection(res)
    return info["steady"] / (info["cycles"] - info["warmup"])


def one(found: list[Finding], code: str, **want) -> Finding:
    hits = [f for f in found if f.code == code and all(getattr(f, k) == v for k, v in want.items())]
    assert len(hits) == 1, (code, want, [(f.code, f.rank, f.phase, f.every) for f in found])
    return hits[0]


# ---- one GPU, real captures ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def stall():
    return analyze(samples.path("tp1_stall_every5"))


def test_host_work_every_5th_cycle(stall):
    truth = record("tp1_stall_every5")["stall"]
    assert (truth["every"], truth["us"]) == (5, 400)
    assert kept_share(stall) >= 0.9
    cl = [c for c in anatomy.cycle_classes(stall) if c.kind == "every"]
    assert len(cl) == 1 and (cl[0].every, cl[0].offset) == (5, 0)
    # the class is exactly the stalled cycles the capture holds (all of them slower than typical)
    stalled = sorted(i for i in truth["cycles"] if i <= max(stall.instances["cycle"].drop_nulls()))
    assert cl[0].keys == stalled[:20] and cl[0].affected == len(stalled) == 20
    assert cl[0].piece == "between cycles"  # outside any range, before the cycle
    f = one(findings.find(stall), "RECURRING_SLOW_CYCLES", every=5)
    assert f.extra_ns == pytest.approx(truth["measured_us_mean"] * US, rel=0.2)
    assert "between cycles" in f.evidence
    assert not [x for x in findings.find(stall) if x.code == "STALLS" and x.every]


def test_late_draft_every_4th_cycle_one_gpu():
    res = analyze(samples.path("tp1_delay_every4"))
    truth = record("tp1_delay_every4")["delay"]
    assert kept_share(res) >= 0.9
    (c,) = [c for c in anatomy.cycle_classes(res) if c.kind == "every"]
    assert (c.every, c.offset) == (4, 0) and set(c.keys) <= set(truth["cycles"])
    assert c.extra_ns == pytest.approx(truth["measured_us_mean"] * US, rel=0.2)
    # the host started draft late: on one GPU the wait sits before the cycle's first op
    assert c.piece == "between cycles"


@pytest.fixture(scope="module")
def serve():
    return {m: analyze(samples.path(f"tp1_serve_{m}")) for m in ("graph", "node")}


def test_mean_budget_on_packed_keys_as_on_two_columns(stall, serve, monkeypatch):
    """mean_budget keeps and counts the cycles on (rank, key) packed into one integer: the same tables, to the bit, as
    the two-column join it falls back to (per rank and over all ranks, every steady cycle and a subset)."""
    from analyze.read import packed_keys

    for res in (stall, serve["graph"], serve["node"]):
        keys = cycle_budget.steady_keys(res)
        some = keys.filter(pl.col("key") % 3 == 0)
        got = [cycle_budget.mean_budget(res, k, by_rank=b) for k in (keys, some) for b in (True, False)]
        monkeypatch.setattr(packed_keys, "KEYS", 0)  # nothing packs: the plain two-column operations
        want = [cycle_budget.mean_budget(res, k, by_rank=b) for k in (keys, some) for b in (True, False)]
        monkeypatch.undo()
        assert all(g.height and g.equals(w) for g, w in zip(got, want, strict=True))


@pytest.mark.parametrize("mode", ["graph", "node"])
def test_serving_segments_match_the_workloads_own_medians(serve, mode):
    res, truth = serve[mode], record(f"tp1_serve_{mode}")["segments"]
    seg = anatomy.segments(res)
    assert [s.batch_size for s in seg] == [t["batch"] for t in truth]
    # the warm-up cycles run at the first size too (captured: the whole run)
    assert [s.first_cycle for s in seg[1:]] == [t["first_cycle"] for t in truth[1:]] and seg[0].first_cycle == 0
    for s, t in zip(seg, truth):
        assert s.period_p50_ns == pytest.approx(t["period_median_us"] * US, rel=0.03), s.key
    # a change of batch size is neither a stall nor warm-up: each segment keeps ≥ 90 % of its cycles
    assert all(s.cycles >= 0.9 * t["cycles"] for s, t in zip(seg, truth))
    assert kept_share(res) >= 0.9


@pytest.mark.parametrize("mode", ["graph", "node"])
def test_prefill_is_its_own_budget_piece(serve, mode):
    res, truth = serve[mode], record(f"tp1_serve_{mode}")
    b = cycle_budget.budget(res)
    pre = b.filter(pl.col("kind") == "prefill")
    assert pre.height == 1
    pieces = cycle_budget.cycle_pieces(res).filter(pl.col("kind") == "prefill")
    # one prefill piece before the first cycle of each segment whose batch grew, of the GPU span of its range
    grew = [t["first_cycle"] for t in truth["segments"] if t["prefill"]]
    assert sorted(pieces["key"].to_list()) == grew
    spans = (res.instances.filter((pl.col("range") == "prefill") & (pl.col("i_ops") > 0))
             .sort("i_first")["i_span_ns"].to_list())
    assert pieces.sort("key")["ns"].to_list() == spans
    # host-measured prefill (with its sync) ≥ its GPU span; the 64-request prefill dominates
    for t, ns in zip([t for t in truth["segments"] if t["prefill"]], spans):
        assert ns <= t["prefill_ms"] * 1e6 * 1.02
    # never "between cycles": the gap before those cycles is their typical size, not milliseconds
    gaps = cycle_budget.cycle_pieces(res).filter((pl.col("kind") == "gap") & pl.col("key").is_in(grew))
    assert gaps["ns"].max() < 2_000 * US
    # and never a stall
    assert not set(grew) & {s["key"] for s in selection(res)["stalls"]}


@pytest.mark.parametrize("mode", ["graph", "node"])
def test_serving_host_work_every_10th_cycle(serve, mode):
    res, truth = serve[mode], record(f"tp1_serve_{mode}")["stall"]
    (c,) = [c for c in anatomy.cycle_classes(res) if c.kind == "every"]
    assert (c.every, c.offset) == (10, 0) and c.piece == "between cycles"
    f = one(findings.find(res), "RECURRING_SLOW_CYCLES", every=10)
    assert f.extra_ns == pytest.approx(truth["measured_us_mean"] * US, rel=0.2)


# ---- two ranks, built from real TP2 captures ---------------------------------------------------------


@pytest.fixture(scope="module")
def tp2_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("tp2")


def _built(tp2_dir, src: str, name: str, *specs: str):
    out = tp2_dir / f"{name}.sqlite"
    truth = inject(tp2(src, tp2_dir), out, list(specs))
    return out, truth


@pytest.fixture(scope="module")
def straggler_node(tp2_dir):
    return _built(tp2_dir, "tp2_s3_node", "every4_node", "1:draft:4:0:500")


@pytest.mark.parametrize("src", ["tp2_s3_node", "tp2_s3_graph"])
def test_straggler_every_4th_cycle_whole_run(tp2_dir, src):
    path, truth = _built(tp2_dir, src, f"every4_{src}", "1:draft:4:0:500")
    res = analyze(path)
    assert kept_share(res) >= 0.9
    f = one(findings.find(res), "STRAGGLER_RANK", rank=1, phase="draft", every=4)
    assert f.extra_ns == pytest.approx(500 * US, rel=0.2)
    (c,) = [c for c in anatomy.cycle_classes(res) if c.kind == "every"]
    assert c.offset == 0 and c.waiting_ranks == [0]
    assert set(c.keys) <= {t["cycle"] for t in truth}
    # no finding names the rank that was on time
    assert not [x for x in findings.find(res) if x.code == "STRAGGLER_RANK" and x.rank == 0]
    # the headline period is the mean over every steady cycle: the straggler cycles are in it
    whole = summary(analyze(path, skip_cycles=0)).period_ns
    assert summary(res).period_ns == pytest.approx(whole, rel=0.02)


def test_analyzes_straggler_is_comms(straggler_node):
    path, _ = straggler_node
    res = analyze(path)
    v = steady_tables.straggler_verdict(res).select("phase", "rank").rows()
    c = comm(path)
    assert c.straggler.select("phase", "rank").rows() == v == [("draft", 1)]
    assert c.cycles == selection(res)["text"]
    # the whole run, asked for both ways, names the same rank too
    assert comm(path, skip_cycles=0).straggler.select("phase", "rank").rows() == [("draft", 1)]


@pytest.mark.parametrize(("specs", "late", "every", "us"), [
    (["1:draft:4:0:500"], 1, 4, 500),
    (["0:draft:3:0:300"], 0, 3, 300),
])
def test_straggler_with_rank0_profiler_window(tp2_dir, specs, late, every, us):
    """One rank opens the profiler window (ragged per-rank windows, no payload: cycles paired by collectives)."""
    path, truth = _built(tp2_dir, "tp2_rank0_window", f"win_{late}_{every}", *specs)
    res = analyze(path)
    assert kept_share(res) >= 0.9
    f = one(findings.find(res), "STRAGGLER_RANK", rank=late, every=every)
    assert f.phase.endswith("draft")
    # within 20 % of what the waiting ranks actually got (the injection's measured wait on them)
    added = sum(t["wait_added_ns"] for t in truth) / len(truth)
    assert f.extra_ns == pytest.approx(added, rel=0.2) and added == pytest.approx(us * US, rel=0.2)
    assert not [x for x in findings.find(res) if x.code == "STRAGGLER_RANK" and x.rank != late]
    assert comm(path).straggler.select("rank").to_series().to_list() == [late]


def test_two_stragglers_at_once(tp2_dir):
    path, _ = _built(tp2_dir, "tp2_rank0_window", "win_both", "1:draft:4:0:500", "0:draft:3:1:300")
    res = analyze(path)
    found = findings.find(res)
    one(found, "STRAGGLER_RANK", rank=1, every=4)
    one(found, "STRAGGLER_RANK", rank=0, every=3)
    assert kept_share(res) >= 0.9


# ---- compare -----------------------------------------------------------------------------------------


def test_compare_fails_the_gate_on_the_straggler_run(straggler_node, tmp_path, capsys):
    path, _ = straggler_node
    clean = path.with_name("tp2_s3_node.sqlite")
    a, b = analyze(clean), analyze(path)
    doc = compare_results(a, b).to_dict()
    assert doc["verdict"]["result"] == "slower" and doc["verdict"]["metric"] == "cycle period"
    # 16 of 64 cycles 500 µs late (less where rank 0 was late itself): ≈ +5 %
    assert 3 < doc["verdict"]["change_pct"] < 8
    assert main(["compare", str(clean), str(path), "--fail-if-slower", "2"]) == 1
    assert doc["stragglers"]["b"] and doc["stragglers"]["b"][0]["rank"] == 1
    # each row's per-cycle value is analyze's budget piece for the same cycles (mean over ranks)
    for res, side in ((a, "a"), (b, "b")):
        bud = cycle_budget.mean_budget(res, cycle_budget.steady_keys(res), by_rank=False)
        want = {r["segment"]: r["ns"] for r in bud.iter_rows(named=True)}
        rows = {r["phase"]: r[f"{side}_ns_per_cycle"] for r in doc["rows"]}
        assert rows["between cycles"] == pytest.approx(want["between cycles"])
        assert rows["seam:draft→verify"] == pytest.approx(want["draft → verify"])
        assert rows["verify"] == pytest.approx(want["verify"])
        assert sum(rows.values()) == pytest.approx(doc["cycle_period"][f"{side}_ns"])
    # every interval is of its Δ's quantity and contains it
    for r in doc["rows"]:
        assert r["ci_low_ns"] <= r["delta_ns"] <= r["ci_high_ns"]
        assert r["ci_low_ns_per_token"] <= r["delta_ns_per_token"] <= r["ci_high_ns_per_token"]
    v = doc["verdict"]
    assert v["ci_low_pct"] <= v["change_pct"] <= v["ci_high_pct"]


def test_compare_one_gpu_delay_fails_the_gate():
    a, b = samples.path("tp1_clean"), samples.path("tp1_delay_every4")
    assert main(["compare", str(a), str(b), "--fail-if-slower", "2"]) == 1
    assert main(["compare", str(a), str(a.with_name("tp1_clean.sqlite")), "--fail-if-slower", "2"]) == 0


def test_compare_warns_when_captures_differ(tp2_dir, capsys):
    node, graph = tp2("tp2_s3_node", tp2_dir), tp2("tp2_s3_graph", tp2_dir)
    doc = compare_results(analyze(node), analyze(graph)).to_dict()
    assert any("trace levels differ" in w for w in doc["warnings"])
    doc = compare_results(analyze(samples.path("tp1_clean")), analyze(node)).to_dict()
    assert any("rank counts (TP size) differ" in w for w in doc["warnings"])
    assert main(["compare", str(node), str(graph)]) == 0
    assert "Warning: CUDA-graph trace levels differ" in capsys.readouterr().out
    for bad in ("nan", "-1", "inf"):
        assert main(["compare", str(node), str(graph), f"--fail-if-slower={bad}"]) == 2


@pytest.mark.parametrize("mode", ["graph", "node"])
def test_segments_without_a_payload_by_the_graphs_replayed(serve, mode, tmp_path):
    """Without the hooks' payload, cycles are grouped by the CUDA graphs they replay (each batch size has its
    own): the same segments as the payload's batch sizes, at graph level (the replay rows' graph exec id) and
    at node level (the graph id in each kernel's graphNodeId)."""
    import shutil
    import sqlite3

    bare = tmp_path / f"bare_{mode}.sqlite"
    shutil.copyfile(samples.path(f"tp1_serve_{mode}"), bare)
    con = sqlite3.connect(bare)
    con.execute("UPDATE NVTX_EVENTS SET uint64Value = NULL, int64Value = NULL")
    con.commit()
    con.close()
    res = analyze(bare)
    seg, ref = anatomy.segments(res), anatomy.segments(serve[mode])
    assert [s.key for s in ref] == ["batch 1", "batch 4", "batch 16", "batch 64", "batch 16", "batch 4"]
    assert all(s.key.startswith("graphs ") and s.batch_size is None for s in seg)
    assert [(s.first_cycle, s.last_cycle) for s in seg] == [(s.first_cycle, s.last_cycle) for s in ref]
    # the same batch size is the same graphs wherever it recurs
    assert seg[1].key == seg[5].key and seg[2].key == seg[4].key and len({s.key for s in seg}) == 4
    assert [s.period_p50_ns for s in seg] == [s.period_p50_ns for s in ref]


def test_a_chosen_window_describes_only_its_cycles(straggler_node):
    path, _ = straggler_node
    res = analyze(path, window="10:20")
    info = selection(res)
    assert info["steady"] == 10 and "--window 10:20" in info["text"]
    (c,) = anatomy.cycle_classes(res)
    assert (c.every, c.keys) == (4, [12, 16]) and c.rank == 1  # the class's cycles inside the window only
    assert not info["stalls"]  # the whole run's rare stall (cycle 23) lies outside the window
    assert comm(path, window="10:20").straggler.select("phase", "rank").rows() == [("draft", 1)]


def test_cycle_classes_whatever_the_order_of_the_pieces(stall, serve, monkeypatch):
    """A class's pieces are summed unsorted (their ns and order are whole numbers: exact in any order): the classes
    of a result whose cycle pieces come in another order are the same, to the bit."""
    for res in (stall, serve["graph"], serve["node"]):
        want = [c.as_dict() for c in anatomy.cycle_classes.make(res)]
        pieces = cycle_budget.cycle_pieces(res)
        assert want and pieces.select(((pl.col("ns").round(0) == pl.col("ns"))
                                       & (pl.col("order").round(0) == pl.col("order"))).all()).item()
        shuffled = pieces.sample(fraction=1.0, shuffle=True, seed=5)
        with monkeypatch.context() as m:
            m.setattr(cycle_budget, "cycle_pieces", lambda r, shuffled=shuffled: shuffled)
            assert [c.as_dict() for c in anatomy.cycle_classes.make(res)] == want
