"""The JSON document's memory-saving order changes no number, on a bundled real TP=2 capture with a straggler.

``data.document`` makes the findings' inputs first (``findings.rule_inputs``), which let go of the steady matched
collectives (declared: their table ``releases`` them) before the what-if fit; a what-if model keeps each replay
reduced. Checked here against independent computations: the document built in the old order (every headline table
first, the findings last) on a second analysis of the same capture, the matched collectives made again after they
were let go of against those the analysis made, and the model's predicted cycle and seams against
:meth:`Replay.run`'s own arrays.
"""

from __future__ import annotations

import threading

import numpy as np
import polars as pl
import pytest

from analyze import analyze
from analyze.compute import (
    anatomy,
    collectives,
    cycle_budget,
    findings,
    steady_tables,
    utilisation,
    view,
    whatif,
)
from analyze.compute.cycles import selection
from analyze.compute.tokens import summary
from analyze.output import data
from tests.helpers.paths import tp2


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    return tp2("tp2_straggler", tmp_path_factory.mktemp("order"))


def test_document_equals_the_old_order(path):
    old = analyze(path)
    # the order the document had: the headline tables, then the findings (the fit last)
    parts = [selection(old), summary(old), cycle_budget.budget(old), steady_tables.steady_phases(old),
             steady_tables.steady_phases_all_ranks(old), steady_tables.steady_seams(old), steady_tables.kernels(old, 10),
             anatomy.cycle_classes(old), anatomy.segments(old), steady_tables.stragglers(old)]
    assert parts[3].height and parts[9].height  # phases and stragglers: the capture has matched collectives
    found = findings.find(old)
    assert utilisation.phases(old).height == 0
    assert data.doc_json(data.document(old, found)) == data.to_json(analyze(path))


def test_matched_made_again_after_it_is_let_go_of(path):
    res = analyze(path)
    assert res.counted_matches is not None
    assert res.counted_matches.columns == ["_row", "_g", "last", "first_arrival", "end_spread_ns", "delay_ns",
                                           "is_last"]  # packed: its rows of the comm kernels, and more
    # independently: matched again as the analysis did, whole
    counted = collectives.phase_comm_split(res.phases, res.comm_kernels)[3].drop("_row")
    first = steady_tables.matched(res)
    assert res.counted_matches is None  # taken once narrowed to the steady cycles
    # independently: the counted match's rows whose (rank, range_id) is a steady key, in their order
    keys = steady_tables.keys(res)
    want = counted.join(keys, on=["rank", "range_id"], how="semi", maintain_order="left")
    assert first.equals(want)
    assert 0 < first.height <= counted.height
    assert view.known(steady_tables.matched, res) and not view.known(steady_tables.stragglers, res)
    findings.context(res)  # every table made from it made, then it is let go of
    assert view.known(steady_tables.stragglers, res) and view.known(steady_tables.matching, res)
    assert not view.known(steady_tables.matched, res) and not view.known(steady_tables.per_collective, res)
    again = steady_tables.matched(res)  # matched again from the Result's communication kernels (as a cached result is)
    assert again.select(first.columns).sort("_g", "j", "rank").equals(first.sort("_g", "j", "rank"))
    assert collectives.per_collective(again).equals(collectives.per_collective(first))


def test_reduced_replays_predict_as_the_arrays(path):
    res = analyze(path)
    m = whatif.fitted(res)
    r = m.replay
    assert r is not None and r.windows > 0
    for steps in (1, m.steps_now, 5):
        period, seams, gap = r.run(m.deltas(steps), (m.launch_cut_ns, m.launch_cut_from))
        assert m.cycle(steps) == m.period_ns + float(np.mean(period - r.period))
        assert m.seams_total(steps) == float(np.median(seams))
        tr = r.a["trans"]
        want = {lab: float(np.median(np.maximum(gap[tr == i], 0.0))) for i, lab in enumerate(r.labels)
                if (tr == i).any()}
        assert m.seams(steps) == want and want
    kept = list(m._runs.values())
    assert kept and all(isinstance(v[0], float) and isinstance(v[1], dict) for v in kept)  # no per-window arrays


def test_steady_marks_are_two_columns(path):
    res = analyze(path)
    marked = steady_tables.instances_marked_steady(res)
    marks = steady_tables.steady_marks(res)
    assert marks.columns == ["top", "steady"] and marks.height == res.instances.height
    assert marked.drop("top", "steady").equals(res.instances)
    assert marked.select(pl.col("steady").sum()).item() == steady_tables.keys(res).height + marked.filter(
        pl.col("steady") & pl.col("rank").is_null()).height


def test_findings_made_beside_the_document_raise_where_they_did(path, monkeypatch):
    """The findings (the what-if fit) are made on a second thread while the rest of the document is: the document
    is the one made on one thread (above), and what the findings raise is raised by document(), first when the
    rest fails too (the findings came first)."""
    from analyze.model import InputError

    seen: list[str] = []

    def failing(res, model=None):
        seen.append(threading.current_thread().name)
        raise InputError("no findings here", "NO_CYCLES")

    monkeypatch.setattr(findings, "find", failing)
    with pytest.raises(InputError, match="no findings here"):
        data.document(analyze(path))
    assert seen == ["spectrace findings"]
    monkeypatch.setattr(steady_tables, "kernels", lambda *a, **k: (_ for _ in ()).throw(ValueError("kernels failed")))
    with pytest.raises(InputError, match="no findings here"):
        data.document(analyze(path))
    monkeypatch.setattr(findings, "find", lambda res, model=None: [])
    with pytest.raises(ValueError, match="kernels failed"):
        data.document(analyze(path))
