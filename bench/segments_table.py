"""Issue 24: the what-if per batch size from the 3-step capture against the sweep run without a profiler (the
table in the README, *What-if per batch size*).

``python -m bench.segments_table``: for each segment of ``tp1_sweep_s3_graph`` (batch 1, 8, 32, 128), the
predicted cycle period at 1, 2 and 4 draft steps against the median of 3 runs without a profiler at that step
count (``tp1_sweep_plain.jsonl``; spread = (max − min) / median over the runs), and the best step count
within one step of the measured 3 against the sweep's (tokens/s from the runs' periods and the workload's
acceptance α = 0.7).
"""

from __future__ import annotations

import json
import statistics
import sys
from collections import defaultdict

from analyze import whatif
from nvtx_hooks.capture import samples

ALPHA = 0.7


def main() -> int:
    runs = defaultdict(list)
    for line in (samples.data_dir("tp1_sweep_s3_graph") / "tp1_sweep_plain.jsonl").read_text().splitlines():
        r = json.loads(line)
        for s in r["segments"]:
            runs[(s["batch"], r["steps"])].append(s["period_median_us"])
    m = whatif(samples.path("tp1_sweep_s3_graph"))
    print("| batch | " + " | ".join(f"{s} steps: predicted / measured µs (error; spread)" for s in (1, 2, 4))
          + " | best (model, within one step of 3) | best (sweep, 2–4 / 1–4) |")
    print("|---:|" + "---|" * 3 + "---:|---:|")
    for sm in m.segments:
        cells = []
        for s in (1, 2, 4):
            v = runs[(sm.batch_size, s)]
            meas = statistics.median(v)
            pred = sm.model.predict(s)["cycle_ns"] / 1e3
            star = "*" if sm.model.extrapolated(s) else ""
            cells.append(f"{pred:,.0f}{star} / {meas:,.0f} ({100 * (pred / meas - 1):+.1f} %; "
                         f"{100 * (max(v) - min(v)) / meas:.1f} %)")

        def tps(s, bs=sm.batch_size):
            return bs * (1 + sum(ALPHA ** i for i in range(1, s + 1))) / statistics.median(runs[(bs, s)])

        sweep = f"{max((2, 3, 4), key=tps)} / {max((1, 2, 3, 4), key=tps)}"
        print(f"| {sm.batch_size} | " + " | ".join(cells) + f" | {sm.as_dict(4)['best_steps']} | {sweep} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
