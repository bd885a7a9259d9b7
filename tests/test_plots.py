"""Figures: the drawn numbers are the hand-computed ones of tests/helpers/eagle_synth.py; colours from
nvtx_hooks.phases."""

from __future__ import annotations

import matplotlib.colors as mc
import polars as pl
import pytest
from matplotlib.figure import Figure

from analyze import analyze
from analyze.compute.whatif_fit import fit
from analyze.output import plots
from nvtx_hooks.phases import COMM_COLOR, IDLE_COLOR, color_of
from tests.helpers import eagle_synth as es


@pytest.fixture(scope="module")
def res(tmp_path_factory):
    return analyze(es.eagle(tmp_path_factory.mktemp("pl") / "e.sqlite", prefix="eagle3."))


def hbars(ax):
    """Horizontal bars of a small-multiples panel: (rank row, length, colour)."""
    return [(round(p.get_y() + p.get_height() / 2, 3), p.get_width(), mc.to_hex(p.get_facecolor()))
            for p in ax.patches if p.get_width() > 0]


def test_phase_bars_heights_and_colours(res):
    fig = plots.phase_bars(res)
    panels = {ax.get_title(): hbars(ax) for ax in fig.axes if ax.get_visible()}
    assert list(panels) == ["eagle3.draft", "eagle3.verify", "eagle3.draft_extend", "eagle3.host_overhead"]
    got = panels["eagle3.draft"]
    # draft: rank 0 (row 0) compute 0.6 µs, comm 0.5 µs; rank 1 (row 1) 0.6, 0.1
    assert (0, pytest.approx(0.6), color_of("draft")) in got and (1, pytest.approx(0.6), color_of("draft")) in got
    assert (0, pytest.approx(0.5), COMM_COLOR) in got and (1, pytest.approx(0.1), COMM_COLOR) in got
    # verify: compute 3.0 µs, no idle; draft_extend: mean (150..300) = 0.225 µs
    assert (0, pytest.approx(3.0), color_of("verify")) in panels["eagle3.verify"]
    assert (1, pytest.approx(0.225), color_of("draft_extend")) in panels["eagle3.draft_extend"]
    assert not any(c == IDLE_COLOR for g in panels.values() for *_, c in g)  # no idle inside any synthetic phase


def test_timeline_draws_phase_spans(res):
    fig = plots.timeline(res, cycles_shown=2, first=1)
    ax = fig.axes[0]
    spans = {}
    for coll in ax.collections:
        lab = coll.get_label()
        for path in coll.get_paths():
            x = path.vertices[:, 0]
            spans.setdefault(lab, []).append(round(float(x.max() - x.min()), 4))
    assert sorted(spans["eagle3.verify"]) == [3.0] * 4  # 2 cycles × 2 ranks, 3 µs each
    assert sorted(spans["eagle3.draft"]) == [0.7, 0.7, 1.1, 1.1]
    assert mc.to_hex(next(c for c in ax.collections if c.get_label() == "eagle3.verify").get_facecolor()[0]) \
        == color_of("verify")


def test_other_figures(res):
    for fig in (plots.distributions(res), plots.per_cycle(res), plots.whatif_curve(fit(res))):
        assert isinstance(fig, Figure) and fig.axes
    line = next(ln for ln in plots.per_cycle(res).axes[1].lines if ln.get_label() == "rank 0")
    assert list(line.get_ydata()) == [10.0, 10.0, 10.0]  # µs period between the 4 cycles


def test_comm_split():
    df = pl.DataFrame({"rank": [0, 1], "phase": ["draft", "draft"], "instances": [2, 2],
                       "comm_wait_ns": [4000, 0], "comm_transfer_ns": [2000, 2000]})
    got = hbars(plots.comm_split(df).axes[0])
    assert (0, pytest.approx(1.0), COMM_COLOR) in got and (0, pytest.approx(2.0), plots.WAIT_COLOR) in got
    assert (1, pytest.approx(1.0), COMM_COLOR) in got and not any(r == 1 and c == plots.WAIT_COLOR for r, _, c in got)
    assert plots.comm_split(df.drop("comm_wait_ns")) is None
