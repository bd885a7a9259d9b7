"""The derived tables (:mod:`analyze.compute.view`): any order of requests gives the same tables, on a bundled real
TP=2 capture with a straggler, recurring slower cycles and matched collectives (every table non-trivial).

Each order starts from a fresh analysis of the capture (the counted match handed over as the analysis made it) and
asks for every registered table; the values are compared with those made in the registry's own order, field by
field and frame by frame. Then what the view declares: the tables let go of are gone once the tables that release
them are made, made again when asked for; a failed table is not kept; a second thread waits for the first's.
"""

from __future__ import annotations

import dataclasses
import random
import threading
import time

import numpy as np
import polars as pl
import pytest

from analyze import analyze
from analyze.compute import cycle_budget, steady_state, steady_tables, view, whatif_fit
from analyze.model import CycleChoice, Result
from analyze.output import html  # noqa: F401  (declares the report's figure table)
from tests.helpers.paths import tp2

assert steady_state.SteadyState  # (importing it declares every table of the steady state)


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    return tp2("tp2_straggler", tmp_path_factory.mktemp("view"))


def _ask(t: view.Table, res: Result):
    """``t``'s value for ``res`` with the arguments the verbs give it."""
    if t.name == "comm_document":
        return t(res, reports=[res])
    if t.name == "report_figure":
        return t(res, figure="budget.png", page="k", draw=lambda: b"png")
    if t.name == "whatif_fit":
        return t(res, steps_now=None, alpha=None, as_traced=False)
    if t.name == "findings_at":
        return t(res, steps_now=3)
    if t.name == "straggler_verdict":
        return t(res, min_collectives=0)
    return t(res)


def _same(a, b, where: str = "") -> None:
    """``a`` equals ``b``: frames exactly (dtypes too), arrays with NaN equal to NaN, dataclasses field by field."""
    if isinstance(a, pl.DataFrame):
        assert isinstance(b, pl.DataFrame) and a.schema == b.schema and a.equals(b), where
    elif isinstance(a, np.ndarray):
        assert np.array_equal(a, b, equal_nan=a.dtype.kind == "f"), where
    elif dataclasses.is_dataclass(a) and not isinstance(a, type):
        assert type(a) is type(b), where
        for f in dataclasses.fields(a):
            if f.compare:
                _same(getattr(a, f.name), getattr(b, f.name), f"{where}.{f.name}")
    elif isinstance(a, dict):
        assert isinstance(b, dict) and list(a) == list(b), where
        for k in a:
            _same(a[k], b[k], f"{where}[{k!r}]")
    elif isinstance(a, list | tuple):
        assert type(a) is type(b) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _same(x, y, f"{where}[{i}]")
    elif isinstance(a, float) and np.isnan(a):
        assert isinstance(b, float) and np.isnan(b), where
    else:
        assert a == b, where


def _canonical(t: view.Table, value):
    """A released table is made again from the result's communication kernels when asked for after its release:
    the same rows, in another order (a table of rows, not kept): compared as such."""
    if t.name in ("matched", "per_collective"):
        return value.select(sorted(value.columns)).sort(sorted(value.columns), nulls_last=True)
    return value


def test_any_order_of_requests_gives_the_same_tables(path):
    tables = list(view.TABLES.values())
    assert len(tables) >= 30 and {"flagged_cycles", "steady_phases", "matched", "findings", "whatif_fit", "replay",
                                  "cycle_classes", "comm_document", "compare_long"} <= set(view.TABLES)
    released = {r.name for t in tables for r in t.releases}
    assert released == {"matched", "per_collective"}
    ref = analyze(path, cache=False)
    want = {t.name: _canonical(t, _ask(t, ref)) for t in tables}
    orders = [list(reversed(tables))] + [random.Random(seed).sample(tables, len(tables)) for seed in (1, 2)]
    for order in orders:
        res = analyze(path, cache=False)
        got = {t.name: _canonical(t, _ask(t, res)) for t in order}
        for t in tables:
            _same(want[t.name], got[t.name], t.name)


def test_tables_let_go_of_once_released_and_made_again(path):
    res = analyze(path, cache=False)
    first = steady_tables.matched(res)
    assert first.height and view.known(steady_tables.matched, res)
    steady_tables.comm_inputs(res)  # releases the steady matched collectives (and their per-collective rows)
    assert not view.known(steady_tables.matched, res) and not view.known(steady_tables.per_collective, res)
    assert view.known(steady_tables.stragglers, res) and view.known(steady_tables.keys, res)  # kept: what they were made for
    again = steady_tables.matched(res)  # matched anew from the result's communication kernels
    assert again is not first
    _same(again.select(first.columns).sort("_g", "j", "rank"), first.sort("_g", "j", "rank"))


def test_a_view_under_another_choice_shares_only_the_tables_of_any_choice(path):
    res = analyze(path, cache=False)
    other = view.with_choice(res, CycleChoice(skip_cycles=3))
    assert whatif_fit.phase_spans(other) is whatif_fit.phase_spans(res)  # any choice: made once for both
    assert cycle_budget.budget(other) is not cycle_budget.budget(res)
    assert not cycle_budget.budget(other).equals(cycle_budget.budget(res))  # three cycles fewer per rank


def test_a_failed_table_is_not_kept_and_a_second_thread_waits(path, monkeypatch):
    res = analyze(path, cache=False)
    calls: list[int] = []
    started, go = threading.Event(), threading.Event()
    real = steady_tables.keys.make

    def slow(r):
        calls.append(1)
        started.set()
        go.wait(10)
        if len(calls) == 1:
            raise RuntimeError("broken once")
        return real(r)

    monkeypatch.setattr(steady_tables.keys, "make", slow)
    errors: list[BaseException] = []

    def ask():
        try:
            steady_tables.keys(res)
        except RuntimeError as e:
            errors.append(e)

    a = threading.Thread(target=ask)
    a.start()
    started.wait(10)
    b = threading.Thread(target=ask)
    b.start()  # asks while the first makes it: waits, and gets its exception
    time.sleep(0.3)  # (time for it to ask)
    go.set()
    a.join()
    b.join()
    assert len(calls) == 1 and len(errors) == 2 and not view.known(steady_tables.keys, res)
    assert steady_tables.keys(res).equals(real(res)) and len(calls) == 2  # not kept: made again
