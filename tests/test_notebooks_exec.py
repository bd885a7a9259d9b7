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
    # budget, every cycle, phase bars, timeline, distributions, per cycle, what-if (one rank: no heat map, no comm
    # split)
    assert pngs(nb) >= 3
    assert pngs(nb) == 7
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    assert errors == []
    # every cycle on one chart (the report's cycles chart as a figure)
    (cell,) = [c for c in nb.cells if c.cell_type == "code" and "plots.cycle_periods(res)" in c.source]
    assert [o for o in cell.outputs if "image/png" in o.get("data", {})]


def test_make_notebooks_runs_from_the_development_install():
    """`make notebooks` starts `jupyter lab` from .venv: the dev extra (what `make install` / `make demo` install)
    declares jupyterlab, and it is importable here (this suite runs from that install)."""
    import importlib.util
    import re

    root = NB.parent
    dev = re.search(r"^dev = \[(.*?)^\]", (root / "pyproject.toml").read_text(), re.S | re.M).group(1)
    assert re.search(r'"jupyterlab[>=<~ ]', dev)
    make = (root / "Makefile").read_text()
    assert "'.[dev,cluster]'" in make and "jupyter lab notebooks" in make
    assert importlib.util.find_spec("jupyterlab") is not None
