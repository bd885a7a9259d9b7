"""Issue 24: the what-if per batch size from a 3-step capture against runs without a profiler (docs/whatif-per-batch.md).

``python -m bench.segments_table [sweep|dense|dense_r1|dense_r2|dense_r3]``: for each segment of the 3-step capture
(``sweep``: ``tp1_sweep_s3_graph``, batch 1, 8, 32, 128, truth ``tp1_sweep_plain.jsonl``; ``dense``:
``tp1_dense_s3_graph``, batch 1, 4, 8, 16, 24, 32, 48, 64, 96, 128, 160, truth ``tp1_dense_plain.jsonl``;
``dense_rN``: ``tp1_dense_s3_graph_rN``, the same schedule captured again on a second machine, truth the three
``tp1_dense_plain_r*.jsonl`` made beside those captures; ``dense_dlN``, N = 4, 5, 6: a third machine, truth the
``tp1_dense_plain_dl*.jsonl``, and with ``--calibrate`` the predictions calibrated on the 3-step run's decode log of
the same round, ``whatif --unprofiled-log``; ``cover_cvN`` / ``cover_cwN``, N = 1, 2, 3: the ``cover`` schedule
of 25 batch sizes, 30 / 60 cycles each, truth the ``tp1_cover_plain_cv*`` / ``_cw*`` runs; ``serve_svN``: the
same batch sizes visited three times for 10 cycles each, shuffled, truth per batch size over its visits), the predicted cycle
period at 1, 2 and 4 draft steps against the median of the runs without a profiler at that step count (spread = (max − min) / median over the runs),
and then ``model``: the error of the predicted *change* from 3 steps, (predicted / predicted at 3) / (measured /
measured at 3) − 1, which leaves out the capture's own offset at 3 steps (``capture``: its period under nsys against
the runs without); and the best step count within one step of the measured 3 against the sweep's (tokens/s from the
runs' periods and the workload's acceptance α = 0.7). ``*``: extrapolated. ``summary KEY...``: one row over the
captures as captured and one calibrated (within 4 %, p50 / p90 / max error, per step count, best steps).
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
           for i in (4, 5, 6)},
        **{f"cover_cv{i}": (f"tp1_cover_s3_graph_cv{i}", [f"tp1_cover_plain_cv{j}.jsonl" for j in (1, 2, 3)])
           for i in (1, 2, 3)},
        **{f"cover_cw{i}": (f"tp1_cover_s3_graph_cw{i}", [f"tp1_cover_plain_cw{j}.jsonl" for j in (1, 2, 3)])
           for i in (1, 2, 3)},
        **{f"serve_sv{i}": (f"tp1_serve_s3_graph_sv{i}", [f"tp1_serve_plain_sv{j}.jsonl" for j in (1, 2, 3)])
           for i in (1, 2, 3)}}


def plain_runs(files: list[str]) -> dict[tuple[int, int], list[float]]:
    """(batch size, steps) → each run's host-measured median period of that segment (µs)."""
    runs = defaultdict(list)
    for f in files:
        for line in (samples.DATA / f).read_text().splitlines():
            r = json.loads(line)
            for s in r["segments"]:
                runs[(s["batch"], r["steps"])].append(s["period_median_us"])
    return runs


def plain_medians(files: list[str]) -> dict[tuple[int, int], float]:
    """(batch size, steps) → the median over the runs of :func:`plain_runs` (µs): the truth of a sweep."""
    return {k: statistics.median(v) for k, v in plain_runs(files).items()}


def _log(key: str, calibrate: bool):
    """The 3-step run's decode log of the same round (dense_dlN: tp1_dense_plain_dlN_s3_rep1.log), or None."""
    if not calibrate:
        return None
    kind, tag = key.split("_", 1)
    return samples.DATA / f"tp1_{kind}_plain_{tag}_s3_rep1.log"


def _sweep_best(runs, bs: int, steps: tuple[int, ...]) -> int:
    """The sweep's best step count among ``steps``: the most tokens/s from the runs' median periods."""
    return max(steps, key=lambda s: bs * (1 + sum(ALPHA ** i for i in range(1, s + 1)))
               / statistics.median(runs[(bs, s)]))


def summary(keys: list[str], calibrate: bool) -> str:
    """One row over the captures ``keys``: predictions at 1, 2 and 4 steps within 4 % of the runs' median, the
    error's p50 / p90 / max, per step count, and the best step count (within one step of 3) against the sweep's."""
    errs: dict[int, list[float]] = defaultdict(list)
    best = near = n = 0
    for key in keys:
        name, files = SETS[key]
        runs = plain_runs(files)
        m = whatif(samples.path(name), unprofiled_log=_log(key, calibrate))
        for sm in m.segments:
            for s in (1, 2, 4):
                pred = sm.model.predict(s)["cycle_ns"] / 1e3
                errs[s].append(abs(pred / statistics.median(runs[(sm.batch_size, s)]) - 1))
            sweep = _sweep_best(runs, sm.batch_size, (2, 3, 4))
            best += sm.as_dict(4)["best_steps"] == sweep
            near += sweep in sm.near_best(4)
            n += 1
    every = sorted(e for v in errs.values() for e in v)

    def q(p: float) -> float:
        return 100 * every[min(len(every) - 1, int(p * len(every)))]

    within = {s: sum(e <= 0.04 for e in v) for s, v in errs.items()}
    return (f"| {'calibrated' if calibrate else 'as captured'} | {sum(within.values())} of {len(every)} | "
            f"{q(0.5):.1f} % | {q(0.9):.1f} % | {100 * every[-1]:.1f} % | "
            + " | ".join(f"{within[s]} of {len(errs[s])}" for s in (1, 2, 4))
            + f" | {best} of {n} | {near} of {n} |")


def main(argv: list[str] | None = None) -> int:
    args = argv if argv is not None else sys.argv[1:] or ["sweep"]
    if args[0] == "summary":  # summary KEY... [--calibrate]: both rows, as captured and calibrated
        keys = [a for a in args[1:] if not a.startswith("--")]
        print("| predictions | within 4 % | p50 | p90 | max | at 1 step | at 2 | at 4 | best steps (2–4) match the "
              "sweep's | the sweep's best among near_best_steps |")
        print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        print(summary(keys, False))
        print(summary(keys, True))
        return 0
    name, files = SETS[args[0]]
    runs = plain_runs(files)
    log = _log(args[0], "--calibrate" in args)
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
