"""The progress bar: the store's build and the analysis report to a meter (analyze.read.protocols.ProgressMeter) that
the API opens as the terminal's bar (analyze.output.progress): drawn when asked (a terminal by default), never with
``progress=False``; and a meter of one's own receives every row."""

from __future__ import annotations

from analyze import api
from analyze.compute import pipeline
from nvtx_hooks.capture import samples


def test_the_api_draws_the_bar_when_asked_and_never_when_not(capsys):
    path = samples.path("tp1_node")
    api.analyze(str(path), store=True, cache=False, progress=True)
    err = capsys.readouterr().err
    assert f"\rspectrace: reading {path.name} [" in err and "\rspectrace: analysing [" in err
    assert err.endswith("\r" + " " * 79 + "\r")  # cleared at the end
    api.analyze(str(path), store=True, cache=False, progress=False)
    api.analyze(str(path), store=True, cache=False)  # not a terminal: none by default
    assert capsys.readouterr().err == ""


def test_a_meter_of_ones_own_gets_every_row(capsys):
    steps: dict[str, list[int]] = {}

    class Meter:
        def __init__(self, total: int, label: str):
            self.label = label
            steps[label] = [total, 0, 0]

        def add(self, n: int) -> None:
            steps[self.label][1] += n

        def close(self) -> None:
            steps[self.label][2] += 1

    path = samples.path("tp1_node")
    res = pipeline.result_of(path, store=True, cache=False, progress=Meter)
    assert capsys.readouterr().err == ""
    total, done, closed = steps["spectrace: analysing"]
    assert total == done == res.ranks["gpu_ops"].sum() and closed == 1
    total, done, closed = steps[f"spectrace: reading {path.name}"]
    assert done == total and closed == 1  # (the rows its queries cover: rowids, filtered ones included)
