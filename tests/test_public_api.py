"""The public API reaches what the CLI prints: ``res.steady``, ``Comparison``, ``Finding``; the notebooks use it only."""

from __future__ import annotations

import ast
import dataclasses
import json
from pathlib import Path

import polars as pl
import pytest

import analyze as api
from analyze import Comparison, Finding, InputError, SteadyState, analyze, comm, compare, whatif
from analyze.cli import main
from analyze.compute import pipeline
from analyze.output import data
from nvtx_hooks.capture import samples

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def node():
    return samples.path("tp1_node")


@pytest.fixture(scope="module")
def res(node):
    return analyze(node)


def test_every_public_name_resolves():
    missing = [n for n in api.__all__ if getattr(api, n, None) is None]
    assert missing == [] and not [n for n in api.__all__ if n.startswith("_")]
    assert api.plots.budget is not None and api.findings_text is not None  # a module and a renderer


def test_steady_state_is_what_analyze_json_prints(res, node, capsys):
    assert main(["analyze", str(node), "--format", "json", "-q"]) == 0
    doc = json.loads(capsys.readouterr().out)
    s = res.steady
    assert isinstance(s, SteadyState) and s.selection["text"] == doc["steady"]["text"]
    assert json.loads(data.doc_json({"x": s.budget.to_dicts()}))["x"] == doc["budget"]
    assert json.loads(data.doc_json({"x": s.phases.to_dicts()}))["x"] == doc["phases_steady"]
    assert json.loads(data.doc_json({"x": s.phases_all.to_dicts()}))["x"] == doc["phases_steady_all_ranks"]
    assert json.loads(data.doc_json({"x": s.seams.to_dicts()}))["x"] == doc["seams_steady"]
    assert json.loads(data.doc_json({"x": [f.to_dict() for f in s.findings]}))["x"] == doc["findings"]
    assert json.loads(data.doc_json({"x": [c.as_dict() for c in s.segments]}))["x"] == doc["segments"]
    assert json.loads(data.doc_json({"x": [c.as_dict() for c in s.cycle_classes]}))["x"] == doc["cycle_classes"]
    assert json.loads(data.doc_json(s.tokens.as_dict())) == doc["tokens"]


def test_steady_state_numbers_hold_together(res):
    """Independent of how they are computed: the budget's pieces add up to each rank's cycle period, the steady
    phases count fewer instances than all of them, findings are ranked and sized against the period."""
    s = res.steady
    per_rank = s.budget.group_by("rank").agg(pl.col("ns").sum())["ns"].to_list()
    assert per_rank and all(ns == pytest.approx(s.tokens.period_ns, rel=0.02) for ns in per_rank)
    assert 0 < s.phases["instances"].sum() <= res.phases["instances"].sum()
    assert s.selection["text"].startswith("steady state:") and s.cycles["steady"].sum() > 0
    imp = [f.impact_ns for f in s.findings]
    assert imp == sorted(imp, reverse=True) and imp
    assert all(f.share == pytest.approx(f.impact_ns / s.tokens.period_ns) for f in s.findings)
    assert s.findings is s.findings  # kept in the result's memo: asked twice, computed once


def test_finding_json_keys_are_the_dataclass_fields(res):
    f = res.steady.findings[0]
    assert isinstance(f, Finding) and tuple(f.to_dict()) == data.FINDING_KEYS
    assert tuple(x.name for x in dataclasses.fields(Finding)) == data.FINDING_KEYS
    with pytest.raises(dataclasses.FrozenInstanceError):
        f.code = "X"


def test_a_result_made_elsewhere_has_its_steady_state_by_hand(node):
    raw = pipeline.result_of(str(node))
    with pytest.raises(AttributeError, match="SteadyState"):
        raw.steady  # noqa: B018
    assert SteadyState(raw).phases.equals(analyze(node).steady.phases)


def test_comparison_is_the_json_document(res, node, capsys):
    cmp = compare(res, res)
    assert isinstance(cmp, Comparison)
    assert main(["compare", str(node), str(node), "--format", "json"]) == 0
    assert data.doc_json(cmp.to_dict()) == capsys.readouterr().out
    d = cmp.to_dict()
    assert list(d) == ["a", "b", "a_cycles", "b_cycles", "per_token", "definition", "steady", "warnings", "rows",
                       "phases", "seams", "per_rank", "cycle_period", "verdict", "stragglers", "kernels", "tokens"]
    assert sorted(map(str, cmp.phases + cmp.seams)) == sorted(map(str, cmp.rows)) and cmp.phases and cmp.seams
    assert all(r["delta_ns"] == 0 for r in cmp.rows) and cmp.verdict["result"] == "no clear change"
    assert not cmp.slower_than(0.0)
    slower = dataclasses.replace(cmp, verdict={"result": "slower", "change_pct": 4.0})
    assert slower.slower_than(3.0) and not slower.slower_than(5.0)


def test_a_result_is_taken_where_a_report_is(res):
    assert analyze(res) is res
    assert whatif(res, 3).steps_now == 3
    with pytest.raises(InputError, match="skip_cycles"):
        analyze(res, skip_cycles=2)
    with pytest.raises(InputError, match="stands alone"):
        analyze([res, res])
    with pytest.raises(InputError, match="comm"):
        comm(res)


def test_notebooks_import_only_the_public_api():
    for nb in sorted((ROOT / "notebooks").glob("*.py")):
        for node in ast.walk(ast.parse(nb.read_text())):
            if isinstance(node, ast.ImportFrom):
                names = [a.name for a in node.names]
                if node.module == "analyze":
                    assert set(names) <= set(api.__all__), (nb.name, names)
                else:
                    assert node.module == "nvtx_hooks.capture" and names == ["samples"], (nb.name, node.module)
            elif isinstance(node, ast.Import):
                assert {a.name for a in node.names} <= {"os", "polars"}, nb.name
