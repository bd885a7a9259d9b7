"""spectrace compare on hand-computed synthetic traces (see tests/eagle_synth.py)."""

from __future__ import annotations

import json

import eagle_synth as es
import pytest

from analyze import analyze
from analyze.cli import main
from analyze.compute.compare import compare


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    d = tmp_path_factory.mktemp("cmp")
    return es.baseline(d / "base.sqlite"), es.eagle(d / "eagle.sqlite", prefix="eagle3.")


def rows(doc, section="phases"):
    return {r["phase"]: r for r in doc[section]}


def test_phase_per_cycle_and_per_token(paths):
    doc = compare(analyze(paths[0]), analyze(paths[1]))
    r = rows(doc)
    # B per cycle: draft (1100 + 700) * 4 / 8 cycles = 900; verify 3000; extend (150+200+250+300)/4 = 225
    assert r["draft"]["b_ns_per_cycle"] == 900 and r["draft"]["a_ns_per_cycle"] == 0
    assert r["verify"]["b_ns_per_cycle"] == 3000 and r["draft_extend"]["b_ns_per_cycle"] == 225
    assert r["decode_step"]["a_ns_per_cycle"] == 1500 and r["decode_step"]["delta_ns"] == -1500
    # per token: A 2 tokens/step, B 5 tokens/cycle
    assert r["decode_step"]["a_ns_per_token"] == 750 and r["verify"]["b_ns_per_token"] == 600
    assert r["draft"]["delta_ns_per_token"] == 180
    assert [x["phase"] for x in doc["phases"]][:2] == ["decode_step", "verify"]  # |−750| > |+600|
    assert doc["cycle_period"]["a_ns"] == 3000 and doc["cycle_period"]["b_ns"] == 10_000
    assert doc["cycle_period"]["b_ns_per_token"] == 2000 and doc["cycle_period"]["a_ns_per_token"] == 1500
    s = rows(doc, "seams")
    # draft→verify: rank 0 2500−2100, rank 1 2500−1700 → (400 + 800) * 4 / 8
    assert s["seam:draft→verify"]["b_ns_per_cycle"] == 600


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
