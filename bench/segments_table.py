"""Issue 24: the what-if per batch size from a 3-step capture against runs without a profiler (docs/whatif-per-batch.md).

``python -m bench.segments_table [sweep|dense|dense_r1|dense_r2|dense_r3]``: for each segment of the 3-step capture
(``sweep``: ``tp1_sweep_s3_graph``, batch 1, 8, 32, 128, truth ``tp1_sweep_plain.jsonl``; ``dense``:
``tp1_dense_s3_graph``, batch 1, 4, 8, 16, 24, 32, 48, 64, 96, 128, 160, truth ``tp1_dense_plain.jsonl``;
``dense_rN``: ``tp1_dense_s3_graph_rN``, the same schedule captured again on a second machine, truth the three
``tp1_dense_plain_r*.jsonl`` made beside those captures; ``dense_dlN``, N = 4, 5, 6: a third machine, truth the
``tp1_dense_plain_dl*.jsonl``, and with ``--calibrate`` the predictions calibrated on the 3-step run's decode log of
the same round, ``whatif --unprofiled-log``), the predicted cycle period at 1, 2 and 4 draft steps
against the median of the runs without a profiler at that step count (spread = (max − min) / median over the runs),
and then ``model``: the error of the predicted *change* from 3 steps, (predicted / predicted at 3) / (measured /
measured at 3) − 1, which leaves out the capture's own offset at 3 steps (``capture``: its period under nsys against
the runs without); and the best step count within one step of the measured 3 against the sweep's (tokens/s from the
runs' periods and the workload's acceptance α = 0.7). ``*``: extrapolated.
"""

from __future__ import annotations

import json
import statistics
import sys
from collections import defaultdict

from analyze import whatif
from nvtx_hooks.capture import samples

ALPHA = 0.7
SETS = {"sweep": ("tp1_sweep_s3_graph", ["tp1_sweep_plain.jsonl"]),
        "dense": ("tp1_dense_s3_graph", ["tp1_dense_plain.jsonl"]),
        **{f"dense_r{i}": (f"tp1_dense_s3_graph_r{i}", [f"tp1_dense_plain_r{j}.jsonl" for j in (1, 2, 3)])
           for i in (1, 2, 3)},
        **{f"dense_dl{i}": (f"tp1_dense_s3_graph_dl{i}", [f"tp1_dense_plain_dl{j}.jsonl" for j in (4, 5, 6)])
           for i in (4, 5, 6)}}


def plain_runs(files: list[str]) -> dict[tuple[int, int], list[float]]:
    """(batch size, steps) → each run's host-measured median period of that segment (µs)."""
    runs = defaultdict(list)
    for f in files:
        for line in (samples.DATA / f).read_text().splitlines():
            r = json.loads(line)
            for s in r["segments"]:
                runs[(s["batch"], r["steps"])].append(s["period_median_us"])
    return runs


def main(argv: list[str] | None = None) -> int:
    args = argv if argv is not None else sys.argv[1:] or ["sweep"]
    name, files = SETS[args[0]]
    runs = plain_runs(files)
    log = None
    if "--calibrate" in args:  # the 3-step run's decode log of the same round (dense_dlN: tp1_dense_plain_dlN_s3_rep1.log)
        log = samples.DATA / f"tp1_dense_plain_{args[0].removeprefix('dense_')}_s3_rep1.log"
    m = whatif(samples.path(name), unprofiled_log=log)
    print(f"{name} against {', '.join(files)}" + (f", calibrated on {log.name}" if log else ""))
    print("| batch | capture at 3 | " + " | ".join(f"{s} steps: predicted / measured µs (error; model; spread)"
                                                for s in (1, 2, 4))
          + " | best (model, within one step of 3) | best (sweep, 2–4 / 1–4) |")
    print("|---:|---:|" + "---|" * 3 + "---:|---:|")
    for sm in m.segments:
        med = {s: statistics.median(runs[(sm.batch_size, s)]) for s in (1, 2, 3, 4)}
        p3 = sm.model.predict(3)["cycle_ns"] / 1e3
        cells = []
        for s in (1, 2, 4):
            v = runs[(sm.batch_size, s)]
            pred = sm.model.predict(s)["cycle_ns"] / 1e3
            star = "*" if sm.model.extrapolated(s) else ""
            cells.append(f"{pred:,.0f}{star} / {med[s]:,.0f} ({100 * (pred / med[s] - 1):+.1f} %; "
                         f"{100 * ((pred / p3) / (med[s] / med[3]) - 1):+.1f} %; "
                         f"{100 * (max(v) - min(v)) / med[s]:.1f} %)")

        def tps(s, bs=sm.batch_size, med=med):
            return bs * (1 + sum(ALPHA ** i for i in range(1, s + 1))) / med[s]

        best = f"{max((2, 3, 4), key=tps)} / {max((1, 2, 3, 4), key=tps)}"
        print(f"| {sm.batch_size} | {100 * (p3 / med[3] - 1):+.1f} % | " + " | ".join(cells)
              + f" | {sm.as_dict(4)['best_steps']} | {best} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
