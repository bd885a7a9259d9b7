"""Two-pass captures: the combined result and the probe effect (analyze/compute/probe.py), on the synthetic
chained pair (tests/helpers/eagle_synth.py) and on the bundled real pair tp1_graph + tp1_node."""

from __future__ import annotations

import json

import polars as pl
import pytest

from analyze import analyze, probe_effect
from analyze.cli import main
from analyze.compute import probe
from analyze.compute.tokens import summary
from analyze.compute.whatif_fit import fit
from bench.probe_check import median_cycle_period
from nvtx_hooks.capture import samples
from tests.helpers import eagle_synth as es


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    d = tmp_path_factory.mktemp("pair")
    return es.chained(d / "x_node.sqlite", "Node"), es.chained(d / "x_graph.sqlite", "Graph")


def test_combined_result(pair):
    node, graph = pair
    res = analyze(node, timing=graph)
    v = res.phases.filter(pl.col("phase") == "verify").row(0, named=True)
    # span from the graph pass (5 × 1000, one graph row each), split from the node pass (1 all-reduce node of 10)
    assert (v["span_ns"], v["compute_ns"], v["comm_ns"], v["idle_ns"], v["ops"]) == (5000, 4500, 500, 0, 50)
    assert res.reports == [str(node), str(graph)] and res.trace.graph_trace_mode == "Graph"
    seam = res.seams.filter(pl.col("from") == "draft")["bound"][0]
    assert seam == "gpu"  # the graph pass's seams
    assert {d.code for d in res.diagnostics} >= {"TIMING"} and "TIMING_MODES" not in {d.code for d in res.diagnostics}


def test_combined_instances_carry_the_node_split(pair):
    """The steady-state tables (built from the range instances) show the node pass's split too, not the graph
    pass's (which sees one graph row and no communication inside it)."""
    from analyze.compute import steady_tables

    node, graph = pair
    res = analyze(node, timing=graph)
    inst = res.instances.filter((pl.col("range") == "verify") & (pl.col("x_ops") > 0))
    assert inst.height == 5 and inst["x_span_ns"].to_list() == [1000] * 5
    # each verify: 1000 ns span, the node pass's 1 all-reduce node of 10 → 900 compute + 100 comm + 0 idle
    assert set(inst.select("x_compute_ns", "x_comm_ns", "x_idle_ns", "x_busy_ns").rows()) == {(900, 100, 0, 1000)}
    cyc = res.instances.filter(pl.col("range") == "cycle")
    assert (cyc["i_span_ns"] == cyc["i_compute_ns"] + cyc["i_comm_ns"] + cyc["i_idle_ns"]).all()
    assert cyc["i_comm_ns"].sum() > 0 and analyze(graph).instances.filter(pl.col("range") == "cycle")["i_comm_ns"].sum() == 0
    v = steady_tables.steady_phases(res).filter(pl.col("phase") == "verify").row(0, named=True)
    assert (v["compute_mean_ns"], v["comm_mean_ns"], v["idle_mean_ns"]) == (900, 100, 0)


def test_probe_effect_numbers(pair):
    node, graph = pair
    pe = probe_effect(node, graph, unprofiled_cycles_per_s=1e9 / 1800)
    assert pe["period_ns"] == {"graph": 1895, "node": 2000}
    assert pe["inflation"] == pytest.approx(100 * (2000 / 1895 - 1))
    ph = {p["phase"]: p for p in pe["phases"]}
    assert [p["phase"] for p in pe["phases"]] == ["draft", "verify", "draft_extend", "host_overhead"]
    assert ph["verify"]["launch_ns"] == {"graph": 20, "node": 400} and ph["verify"]["span_inflation"] == 0
    seams = {s["transition"]: s for s in pe["seams"]}
    assert seams["draft→verify"]["bound"] == {"graph": "gpu", "node": "launch"}
    assert seams["draft→verify"]["idle_ns"] == {"graph": 5, "node": 110}
    u = pe["unprofiled"]
    assert u["period_vs_unprofiled"]["graph"] == pytest.approx(100 * (1895 / 1800 - 1))
    assert u["period_vs_unprofiled"]["node"] == pytest.approx(100 * (2000 / 1800 - 1))
    assert u["source"] == "given" and u["own_cycles_per_s"] == {"graph": None, "node": None}


def test_plain_pass_and_own_lines(pair, tmp_path):
    node, graph = pair
    mf = lambda p: p.with_name(p.name[: -len(".sqlite")] + ".manifest.json")  # noqa: E731
    for p, own in ((node, 400.0), (graph, 450.0)):
        m = json.loads(mf(p).read_text())
        m |= {"passes": {"graph": "x_graph", "node": "x_node", "plain": "x_plain"},
              "program_output": [{"rank": 0, "cycles_per_s": own}, {"rank": 1, "cycles_per_s": own + 2}]}
        mf(p).write_text(json.dumps(m))
    node.with_name("x_plain.manifest.json").write_text(json.dumps(
        {"pass": "plain", "program_output": [{"cycles_per_s": 500.0}, "not a record", {"cycles_per_s": 520.0}]}))
    assert probe.unprofiled_rate(node) == 510 and probe.own_rate(graph) == 451
    u = probe_effect(node, graph)["unprofiled"]
    assert u["source"] == "plain pass" and u["cycles_per_s"] == 510
    assert u["own_vs_unprofiled"]["node"] == pytest.approx(100 * (510 / 401 - 1))


def test_cli(pair, capsys):
    node, graph = map(str, pair)
    assert main(["analyze", node, "--timing", graph, "--format", "json", "-q"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert set(doc["probe_effect"]) >= {"period_ns", "inflation", "phases"}
    assert main(["analyze", node, "--timing", graph]) == 0
    out = capsys.readouterr().out
    assert "Probe effect" in out and "+5.5%" in out and "x_node.sqlite (split) + x_graph.sqlite (timing)" in out
    assert main(["whatif", node, "--timing", graph]) == 0
    assert "Fitted on the graph-level pass" in capsys.readouterr().out
    assert main(["whatif", node, "--timing", graph, "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["predictions"][0]["cycle_ns"] == 1695 and doc["probe_effect"]["period_ns"]["node"] == 2000
    assert main(["analyze", node, "--unprofiled-cycles-per-s", "5"]) == 2
    assert main(["analyze", node, "--timing", graph, "--unprofiled-cycles-per-s", "0"]) == 2


def test_report_shows_the_probe_section(pair, tmp_path, capsys):
    node, graph = map(str, pair)
    assert main(["report", node, "--timing", graph, "-o", str(tmp_path / "out")]) == 0
    page = (tmp_path / "out" / "index.html").read_text()
    assert "<h2>Probe effect</h2>" in page and "node-level tracing +5.5%" in page and "launch" in page


def test_mismatched_pair(pair, tmp_path, capsys):
    two = es.eagle(tmp_path / "two.sqlite")
    assert main(["analyze", str(pair[0]), "--timing", str(two)]) == 2
    assert "rank(s)" in capsys.readouterr().err


# ---- the bundled real pair ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def real():
    return samples.path("tp1_node"), samples.path("tp1_graph")


# tp1: the first bundled pair (16 layers, separate runs); tp1_s3/tp2_s3: the step sweep's two-pass captures
# once bundled
@pytest.mark.parametrize("pair_name", ["tp1", "tp1_s3", "tp2_s3"])
def test_real_inflation_is_the_ratio_of_median_periods(pair_name):
    node, graph = samples.path(f"{pair_name}_node"), samples.path(f"{pair_name}_graph")
    pe = analyze(node, timing=graph).probe_effect
    ratio = 100 * (median_cycle_period(node) / median_cycle_period(graph) - 1)
    assert abs(pe["inflation"] - ratio) < 0.5
    # the median over the steady cycles (the independent median takes every cycle), the mean beside it
    s = summary(analyze(graph))
    assert pe["period_ns"]["graph"] == s.period_p50_ns and pe["period_mean_ns"]["graph"] == s.period_ns
    assert pe["period_ns"]["graph"] == pytest.approx(median_cycle_period(graph), rel=0.01)
    verify = next(p for p in pe["phases"] if p["phase"] == "verify")
    assert verify["launch_ns"]["node"] > 2 * verify["launch_ns"]["graph"]  # node tracing's launch cost


@pytest.mark.parametrize("tp", ["tp1", "tp2"])
def test_real_sweep_done_when(tp):
    """The step sweep's criterion on its device captures, once bundled: fitted at 3 steps, the 1-step cycle within 3 %
    (graph-level fit) and 5 % (node-level fit) of the measured 1-step graph-level capture."""
    names = [f"{tp}_s3_graph", f"{tp}_s3_node", f"{tp}_s1_graph"]
    g3, n3, g1 = (analyze(samples.path(n)) for n in names)
    measured = fit(g1, 1).period_ns
    assert fit(g3, 3).cycle(1) == pytest.approx(measured, rel=0.03)
    assert fit(n3, 3).cycle(1) == pytest.approx(measured, rel=0.05)


def test_real_node_fit_matches_graph_fit(real):
    """Node tracing's graph-launch cost removed, the node-mode fit predicts what the graph-mode fit does."""
    node, graph = map(analyze, real)
    mn, mg = fit(node, 3), fit(graph, 3)
    assert mn.launch_cut_ns > 0 and mg.launch_cut_ns == 0
    for s in (1, 2, 3, 4):
        assert mn.cycle(s) == pytest.approx(mg.cycle(s), rel=0.01)
    assert mg.cycle(3) == mg.period_ns


def test_real_graph_sweep_cross_predictions():
    """The step sweep on one H200 (32 layers, graph-level tracing, 1..4 steps, separate runs): each fitted model predicts
    every other step count's measured cycle period within 3 %."""
    runs = {s: analyze(samples.path(f"tp1_s{s}_graph")) for s in (1, 2, 3, 4)}
    models = {s: fit(r, s) for s, r in runs.items()}
    for s0, m in models.items():
        for s, other in models.items():
            assert m.cycle(s) == pytest.approx(other.period_ns, rel=0.03), (s0, s)


@pytest.mark.parametrize("name,frm,bound", [("tp1_s3_node", "draft", "launch"), ("tp1_s3_graph", "draft", "gpu"),
                                            ("tp1_sleep_graph", "cycle", "host"), ("tp1_sleep_node", "cycle", "host"),
                                            ("tp2_s3_node", "draft", "launch"), ("tp2_s3_graph", "draft", "gpu")])
def test_real_seam_causes_at_32_layers(name, frm, bound):
    """The step sweep's seam criterion on its captures: under node-level tracing the 32-layer verify graph's launch
    returns after the draft ended (launch); queued in time under graph-level tracing (gpu); a host that syncs and
    sleeps between cycles (host)."""
    row = analyze(samples.path(name)).seams_all.filter(pl.col("from") == frm).row(0, named=True)
    assert row["bound"] == bound and row[f"{bound}_bound_inst"] >= 0.9 * row["instances"]
