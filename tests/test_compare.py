"""spectrace compare on hand-computed synthetic traces (see tests/helpers/eagle_synth.py)."""

from __future__ import annotations

import json

import pytest

from analyze import analyze
from analyze.cli import main
from analyze.compute.compare import compare_results
from analyze.output.text import compare_table
from tests.helpers import eagle_synth as es


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    d = tmp_path_factory.mktemp("cmp")
    return es.baseline(d / "base.sqlite"), es.eagle(d / "eagle.sqlite", prefix="eagle3.")


def rows(doc, section="phases"):
    return {r["phase"]: r for r in doc[section]}


def test_phase_per_cycle_and_per_token(paths):
    doc = compare_results(analyze(paths[0]), analyze(paths[1])).to_dict()
    r = rows(doc)
    # B per cycle, over the cycles with a period (1..3: the first has none), mean over ranks: draft (1100 + 700) / 2
    # = 900; verify 3000; extend (200 + 250 + 300) / 3 = 250
    assert r["draft"]["b_ns_per_cycle"] == 900 and r["draft"]["a_ns_per_cycle"] == 0
    assert r["verify"]["b_ns_per_cycle"] == 3000 and r["draft_extend"]["b_ns_per_cycle"] == 250
    assert r["decode_step"]["a_ns_per_cycle"] == 1500 and r["decode_step"]["delta_ns"] == -1500
    # per token: A 2 tokens/step, B (4 + 6 + 8) / 3 = 6 tokens/cycle
    assert r["decode_step"]["a_ns_per_token"] == 750 and r["verify"]["b_ns_per_token"] == 500
    assert r["draft"]["delta_ns_per_token"] == 150
    assert [x["phase"] for x in doc["phases"]][:2] == ["decode_step", "verify"]  # |−750| > |+500|
    assert doc["cycle_period"]["a_ns"] == 3000 and doc["cycle_period"]["b_ns"] == 10_000
    assert doc["cycle_period"]["b_ns_per_token"] == pytest.approx(10_000 / 6)
    assert doc["cycle_period"]["a_ns_per_token"] == 1500
    s = rows(doc, "seams")
    # draft→verify: rank 0 2500−2100, rank 1 2500−1700 → (400 + 800) / 2
    assert s["seam:draft→verify"]["b_ns_per_cycle"] == 600
    # the rows are the cycle budget's pieces: they add up to the cycle period on each side
    assert sum(x["b_ns_per_cycle"] for x in doc["rows"]) == pytest.approx(10_000)
    assert sum(x["a_ns_per_cycle"] for x in doc["rows"]) == pytest.approx(3_000)


def test_cli_json_matches_by_base_name(paths, capsys):
    e2 = es.eagle(paths[1].with_name("plain.sqlite"))  # no prefix
    assert main(["compare", str(paths[1]), str(e2), "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    r = rows(doc)
    assert set(r) == {"draft", "verify", "draft_extend", "host_overhead"}
    assert all(x["delta_ns"] == 0 for x in doc["phases"])
    assert {"phase", "a_ns_per_cycle", "b_ns_per_cycle", "delta_ns"} <= set(doc["phases"][0])


def test_cli_table_and_bad_input(paths, capsys, tmp_path):
    assert main(["compare", str(paths[0]), str(paths[1])]) == 0
    assert "cycle period" in capsys.readouterr().out
    assert main(["compare", str(paths[0]), str(tmp_path / "missing.sqlite")]) == 2


@pytest.fixture(scope="module")
def comm_pair(tmp_path_factory):
    """The same EAGLE trace with verify's all-reduce 100 ns (A) and 400 ns (B) long: the change is communication."""
    d = tmp_path_factory.mktemp("nccl")
    return es.eagle(d / "simple.sqlite", verify_comm=400, cycles=8), es.eagle(d / "ll.sqlite", verify_comm=100, cycles=8)


def test_change_split_into_compute_comm_idle(comm_pair):
    doc = compare_results(analyze(comm_pair[0]), analyze(comm_pair[1])).to_dict()
    r = rows(doc, "rows")
    v = r["verify"]
    # verify: gemm 2500 + all-reduce 400 → 100: the whole −300 ns per cycle is communication
    assert (v["a_ns_per_cycle"], v["b_ns_per_cycle"], v["delta_ns"]) == (2_900, 2_600, -300)
    assert (v["delta_compute_ns"], v["delta_comm_ns"], v["delta_idle_ns"]) == (0, -300, 0)
    # tokens per cycle over cycles 1..7 (accept 2, 4, 6, 0, 2, 4, 6 + batch 2), the same on both sides
    assert v["delta_comm_ns_per_token"] == pytest.approx(-300 / (38 / 7))
    assert v["ci_low_ns"] == v["ci_high_ns"] == -300 and v["significant"]
    # the GPU then idles 300 ns longer before draft_extend: a seam, all idle, ranked with the phases
    s = r["seam:verify→draft_extend"]
    assert (s["kind"], s["delta_ns"], s["delta_idle_ns"], s["delta_comm_ns"]) == ("seam", 300, 300, 0)
    assert {x["phase"] for x in doc["rows"][:2]} == {"seam:verify→draft_extend", "verify"}  # the largest |Δ|
    for x in doc["rows"]:
        assert x["delta_ns"] == pytest.approx(x["delta_compute_ns"] + x["delta_comm_ns"] + x["delta_idle_ns"])
    per = {(x["phase"], x["rank"]): x for x in doc["per_rank"]}
    assert per[("verify", 0)]["delta_comm_ns"] == per[("verify", 1)]["delta_comm_ns"] == -300
    assert doc["verdict"]["result"] == "no clear change" and doc["verdict"]["change_pct"] == 0
    k = {(x["phase"], x["name"]): x for x in doc["kernels"]}
    assert k[("verify", es.NCCL)]["delta_ns"] == -300 and k[("verify", es.NCCL)]["b_count_per_cycle"] == 1


def test_missing_side_shows_a_dash(paths):
    cmp = compare_results(analyze(paths[0]), analyze(paths[1]))
    r = rows(cmp.to_dict(), "rows")
    assert (r["draft"]["in_a"], r["draft"]["in_b"], r["decode_step"]["in_b"]) == (False, True, False)
    line = next(ln for ln in compare_table(cmp).splitlines() if ln.startswith("draft "))
    assert line.split()[1] == "–"


def _periodic(path, periods):
    """Cycles with these periods and a constant accept length (so per token = per cycle / 6)."""
    return es.eagle(path, cycles=len(periods) + 1, starts=[10_000 + sum(periods[:i]) for i in range(len(periods) + 1)],
                    accept=(4,))


def test_verdict_and_fail_if_slower(tmp_path, capsys):
    jitter = [10_000, 10_400] * 6
    a = _periodic(tmp_path / "a.sqlite", jitter)
    same = _periodic(tmp_path / "same.sqlite", jitter[1:] + jitter[:1])  # the same periods in another order
    slow = _periodic(tmp_path / "slow.sqlite", [p + 600 for p in jitter])  # +5.9 %
    doc = compare_results(analyze(a), analyze(same)).to_dict()
    assert doc["verdict"]["result"] == "no clear change" and doc["verdict"]["ci_low_pct"] < 0 < doc["verdict"]["ci_high_pct"]
    doc = compare_results(analyze(a), analyze(slow)).to_dict()
    assert doc["verdict"]["result"] == "slower" and doc["verdict"]["change_pct"] == pytest.approx(100 * 600 / 10_200)
    assert main(["compare", str(a), str(slow), "--fail-if-slower", "3"]) == 1
    assert "exit 1" in capsys.readouterr().err
    assert main(["compare", str(a), str(slow), "--fail-if-slower", "8"]) == 0
    assert main(["compare", str(a), str(same), "--fail-if-slower", "0"]) == 0


def test_several_reports_per_side(tmp_path, capsys):
    """compare B1 B2 --vs A: each side merged (ranks numbered across its reports), then compared (--vs names the
    run compared with, A, as in report)."""
    from test_scale import split_probe

    from tests.helpers.paths import PROBE, need

    need(PROBE)
    a0, a1 = split_probe(tmp_path, 1412), split_probe(tmp_path, 1413)
    assert main(["compare", str(a0), str(a1), "--vs", str(PROBE), "--format", "json", "-j", "1"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["b"].count(",") == 1 and doc["a"] == str(PROBE) and {x["rank"] for x in doc["per_rank"]} == {0, 1}
    assert all(abs(x["delta_ns"]) < 1e-6 for x in doc["rows"] if x["kind"] == "phase")
    assert main(["compare", str(a0)]) == 2  # one report and no --vs: nothing to compare with


def test_api_compare_lets_go_of_a_before_b_is_read(paths, monkeypatch):
    """``api.compare`` reads B only once A's Result is gone (what the comparison reads of it made first: at 10 M
    kernels the two Results together were 0.7 GB over one), and gives the document ``compare_results`` gives."""
    import gc
    import weakref

    from analyze import api

    real, refs, a_alive_when_b_read = api.analyze, [], []

    def spy(report, *a, **kw):
        if refs:
            gc.collect()
            a_alive_when_b_read.append(refs[0]() is not None)
        res = real(report, *a, **kw)
        refs.append(weakref.ref(res))
        return res

    monkeypatch.setattr(api, "analyze", spy)
    doc = api.compare(paths[0], paths[1]).to_dict()
    assert a_alive_when_b_read == [False]
    assert doc == compare_results(real(paths[0]), real(paths[1])).to_dict()


def test_vs_names_side_a_in_every_verb(tmp_path, capsys):
    """`compare X --vs Y` and `report X --vs Y` give the same verdict: Y is A, X is B in both (issue 37: compare
    made Y the B side, report the A side). compare's old meaning is `--b` for one release, with a one-line note."""
    import html as h
    import re

    from nvtx_hooks.capture import samples

    x, y = samples.path("tp1_delay_every4"), samples.path("tp1_clean")
    assert main(["compare", str(x), "--vs", str(y), "--format", "json"]) == 0
    out = capsys.readouterr()
    doc = json.loads(out.out)
    assert doc["a"] == str(y) and doc["b"] == str(x) and doc["verdict"]["result"] == "slower"
    assert out.err.count("spectrace: note: compare X --vs Y now compares X (B) with Y (A)") == 1
    assert main(["report", str(x), "--vs", str(y), "-o", str(tmp_path / "r")]) == 0
    page = (tmp_path / "r" / "index.html").read_text()
    got = h.unescape(re.search(r'<p class="verdict">(.*?)</p>', page).group(1))
    assert got == doc["verdict"]["text"] and got.startswith("B is slower")
    # the positional form and the old meaning (--b) agree with it: A = y, B = x
    assert main(["compare", str(y), str(x), "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["verdict"] == doc["verdict"]
    assert main(["compare", str(y), "--b", str(x), "--format", "json"]) == 0
    out = capsys.readouterr()
    assert json.loads(out.out)["verdict"] == doc["verdict"] and out.err.count("--b is compare's old --vs") == 1
    assert main(["compare", str(y), "--b", str(x), "--vs", str(x)]) == 2


def test_compare_says_the_step_counts_differ(capsys):
    """A 1-step and a 3-step capture: the warning says so (text, JSON and the gate's message); with tokens per cycle
    unknown on a side it says the verdict is on the cycle period."""
    from analyze.compute import compare as cmp
    from nvtx_hooks.capture import samples

    one, three = samples.path("tp1_s1_graph"), samples.path("tp1_s3_graph")
    assert main(["compare", str(one), str(three), "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    (w,) = [w for w in doc["warnings"] if "draft step counts differ" in w]
    assert w.startswith("draft step counts differ (A: 1, B: 3)")
    assert main(["compare", str(one), str(three)]) == 0
    text = capsys.readouterr().out
    assert "Warning: draft step counts differ (A: 1, B: 3)" in text
    # one count of cycles, per rank, in the steady sentence (issue 37: "198 steady cycles over ranks" beside "100 of
    # 100 cycles per rank")
    assert "steady cycles over ranks" not in text and "cycles per rank" in text
    code = main(["compare", str(one), str(three), "--fail-if-slower", "0"])
    err = capsys.readouterr().err
    if code == 1:
        assert "but the runs differ: draft step counts differ (A: 1, B: 3)" in err
    # unknown tokens on one side while the steps differ: said
    a = cmp._Capture("graph", 1, ["H200"], None, 1, "recorded", (4,), True)  # type: ignore[arg-type]
    b = cmp._Capture("graph", 1, ["H200"], None, 3, "inferred", (8,), False)  # type: ignore[arg-type]
    ws = cmp._warnings_between(a, b)
    assert any(w.startswith("draft step counts differ (A: 1, B: 3) (inferred from the draft's structure on B)")
               and "tokens per cycle are unknown on B" in w for w in ws)
    assert any(w.startswith("decode batch sizes differ (A: 4; B: 8)") for w in ws)
