"""Issue 23's shapes, injected vs reported: the table in the README (*Recurring slow cycles, measured*).

``python -m bench.recurring_table`` analyses the bundled one-GPU captures of
``tests/device/recurring_slow_cycles.sh`` and the two-rank shapes that ``bench/inject.py`` builds from the
bundled real TP2 captures, and prints one Markdown row per shape: what was injected (the workload's measured
record, or the injection's), how many cycles the steady state keeps after warm-up, the findings with an
``every`` (rank, phase, N, extra time per affected cycle), the straggler ``comm`` names, and for the serving
schedule the worst per-segment p50 error against the workload's own per-segment median and the prefill piece.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

from analyze import analyze, comm
from analyze.compute import anatomy, cycle_budget, findings
from analyze.compute.cycles import selection
from bench.inject import inject
from nvtx_hooks.capture import samples

BUILT = (("tp2_s3_node", ["1:draft:4:0:500"]), ("tp2_s3_graph", ["1:draft:4:0:500"]),
         ("tp2_rank0_window", ["1:draft:4:0:500"]), ("tp2_rank0_window", ["0:draft:3:0:300"]),
         ("tp2_rank0_window", ["1:draft:4:0:500", "0:draft:3:1:300"]))


def _record(name: str) -> dict:
    return json.loads((samples.data_dir(name) / f"{name}.manifest.json").read_text())["program_output"][0]


def _kept(res) -> str:
    i = selection(res)
    return f"{i['steady']} of {i['cycles'] - i['warmup']}"


def _named(res) -> str:
    return "; ".join(f"`{f.code}` rank {f.rank} {f.phase or f'{chr(8212)}'} every {f.every}, "
                     f"+{f.extra_ns / 1e3:,.0f} µs" for f in findings.find(res) if f.every) or "—"


def rows(tmp: Path) -> list[list[str]]:
    out = []
    for name in ("tp1_stall_every5", "tp1_delay_every4", "tp1_serve_graph", "tp1_serve_node"):
        res, rec = analyze(samples.path(name)), _record(name)
        what = "; ".join(f"{k} every {rec[k]['every']}: {rec[k]['measured_us_mean']:,.0f} µs (measured)"
                         for k in ("stall", "delay") if k in rec)
        extra = ""
        if "segments" in rec:
            seg = anatomy.segments(res)
            err = max(abs(s.period_p50_ns / 1e3 / t["period_median_us"] - 1) for s, t in zip(seg, rec["segments"]))
            pre = cycle_budget.budget(res).filter(kind="prefill")["ns"].sum()
            what += f"; {len(rec['segments'])} batch sizes, {sum(t['prefill'] for t in rec['segments'])} prefills"
            extra = f"; segment p50s within {100 * err:.2f} % of the workload's; `prefill` {pre / 1e3:,.0f} µs/cycle"
        out.append([f"`{name}`", what, _kept(res), _named(res) + extra, "(one rank)"])
    for src, specs in BUILT:
        dst = tmp / f"{src}_{len(out)}.sqlite"
        truth = inject(_src(src, tmp), dst, specs)
        wait: dict[int, list[int]] = {}
        for t in truth:
            wait.setdefault(t["rank"], []).append(t["wait_added_ns"])
        parts = []
        for spec in specs:
            rank, phase, every, _, us = spec.split(":")
            w = wait[int(rank)]
            parts.append(f"rank {rank} late before {phase} every {every} by {us} µs (others wait "
                         f"+{sum(w) / len(w) / 1e3:,.0f})")
        what = "; ".join(parts)
        res = analyze(dst)
        st = comm(dst).straggler.select("phase", "rank").rows()
        out.append([f"`{src}` (built)", what, _kept(res), _named(res),
                    ", ".join(f"rank {r} {p}" for p, r in st) or "— (graph level: no collectives to match)"])
    return out


def _src(name: str, tmp: Path) -> Path:
    from tests.helpers.paths import tp2

    return tp2(name, tmp)


def main() -> int:
    with tempfile.TemporaryDirectory() as d:
        print("| capture | injected | steady (kept of post-warm-up) | findings with `every` | `comm`'s straggler |")
        print("| --- | --- | --- | --- | --- |")
        for r in rows(Path(d)):
            print("| " + " | ".join(r) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
