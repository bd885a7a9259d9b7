"""Each notebooks/*.ipynb is the jupytext pairing of its notebooks/*.py (same cells, same sources)."""

from __future__ import annotations

from pathlib import Path

import pytest

jupytext = pytest.importorskip("jupytext")
NB = Path(__file__).resolve().parents[1] / "notebooks"
PAIRS = sorted(NB.glob("*.py"))


def cells(nb):
    return [(c.cell_type, c.source.strip()) for c in nb.cells]


def test_every_notebook_is_paired():
    assert {p.stem for p in PAIRS} == {p.stem for p in NB.glob("*.ipynb")} >= {"breakdown", "compare"}


@pytest.mark.parametrize("py", PAIRS, ids=lambda p: p.name)
def test_pair_in_sync(py):
    a = jupytext.read(py)
    b = jupytext.read(py.with_suffix(".ipynb"))
    assert cells(a) == cells(b), f"{py.name} and its .ipynb differ: run `jupytext --sync {py}`"
