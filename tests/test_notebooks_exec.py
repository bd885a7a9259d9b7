"""Executed notebooks hold their figures: the breakdown notebook run top to bottom has PNG outputs inline."""

from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # a Jupyter kernel runs the whole notebook: make test-all (CI)

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
NB = Path(__file__).resolve().parents[1] / "notebooks"


def pngs(nb) -> int:
    return sum("image/png" in out.get("data", {}) for c in nb.cells if c.cell_type == "code" for out in c.outputs)


def test_breakdown_notebook_shows_its_figures():
    nb = nbformat.read(NB / "breakdown.ipynb", as_version=4)
    assert pngs(nb) == 0  # stored without outputs
    nbclient.NotebookClient(nb, timeout=600, kernel_name="python3",
                            resources={"metadata": {"path": str(NB)}}).execute()
    # budget, phase bars, timeline, distributions, per cycle, what-if (one rank: no heat map, no comm split)
    assert pngs(nb) >= 3
    assert pngs(nb) == 6
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    assert errors == []
