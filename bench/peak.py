"""Where the JSON document's memory goes: each of its parts' own peak RSS, one process.

    .venv/bin/python -m bench.peak [--cold] REPORT [--parts]

Analyses REPORT (``--cold``: its cache removed first) and then builds ``analyze --format json``'s document part by
part in the order :func:`analyze.output.data.document` builds it, resetting the kernel's peak-RSS counter
(``/proc/self/clear_refs``, Linux) before each part: each row's peak is that part's own high-water mark, the
memory the parts before it left behind included (tracemalloc does not see polars' allocations). Then the whole
document once more from the same Result (what the parts kept) and its bytes' md5. A dev tool, not shipped in the
wheel.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import sys
import time
from pathlib import Path


def _status() -> tuple[float, float]:
    """``VmRSS, VmHWM`` of this process in MB."""
    got = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        k, _, v = line.partition(":")
        if k in ("VmRSS", "VmHWM"):
            got[k] = int(v.split()[0]) / 1024
    return got["VmRSS"], got["VmHWM"]


def _reset_peak() -> None:
    Path("/proc/self/clear_refs").write_text("5")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.peak")
    ap.add_argument("report")
    ap.add_argument("--cold", action="store_true", help="remove the report's cache first")
    ap.add_argument("--settle", type=float, default=0.0, metavar="S",
                    help="wait S seconds before each part (the CLI's jemalloc gives freed pages back after 2 s: "
                         "then RSS before a part is what is live)")
    a = ap.parse_args(sys.argv[1:] if argv is None else argv)
    from analyze import cli

    os.environ.setdefault(cli._MALLOC_VAR, cli._MALLOC_CONF)  # as the CLI runs (before polars loads)
    from analyze import api
    from analyze.compute import anatomy, cycle_budget, findings, steady_tables, straggler, utilisation, view
    from analyze.compute.cycles import selection
    from analyze.compute.tokens import summary
    from analyze.output import data

    if a.cold:
        from analyze.read.store import cache_dir_for

        shutil.rmtree(cache_dir_for(a.report), ignore_errors=True)
    rows: list[tuple[str, float, float, float, float]] = []

    def part(label: str, fn):
        time.sleep(a.settle)
        _reset_peak()
        r0, _ = _status()
        t0 = time.perf_counter()
        out = fn()
        t1 = time.perf_counter()
        r1, hwm = _status()
        rows.append((label, t1 - t0, r0, hwm, r1))
        return out

    res = part("analysis (read, per process, global, result kept)", lambda: api.analyze(a.report))
    sizes = {n: getattr(res, n) for n in ("instances", "seam_instances", "comm_kernels", "kernels", "host_calls",
                                          "ops", "marks", "phases", "seams", "coverage")}
    d: dict = {}
    part("findings (the what-if fit, the tables they ask for)", lambda: findings.find(res))
    part("to_dict", lambda: d.update(res.to_dict()))
    part("steady selection", lambda: selection(res))
    part("tokens summary", lambda: summary(res))
    part("budget", lambda: cycle_budget.budget(res))
    part("steady_phases", lambda: steady_tables.steady_phases(res))
    part("steady_phases_all_ranks", lambda: steady_tables.steady_phases_all_ranks(res))
    part("steady_seams", lambda: steady_tables.steady_seams(res))
    part("kernels", lambda: steady_tables.kernels(res, data.TOP_KERNELS))
    part("cycle_classes", lambda: anatomy.cycle_classes(res))
    part("segments", lambda: anatomy.segments(res))
    st = part("stragglers", lambda: steady_tables.stragglers(res))
    part("straggler verdict", lambda: straggler.verdict(st))
    part("utilisation", lambda: utilisation.phases(res))
    doc = part("whole document again (from what the parts kept)", lambda: data.to_json(res))
    print(f"{Path(a.report).name}: md5 of the JSON document {hashlib.md5(doc.encode()).hexdigest()}")
    print("| part | wall s | RSS before MB | its peak MB | RSS after MB |\n|---|---:|---:|---:|---:|")
    for label, w, r0, hwm, r1 in rows:
        print(f"| {label} | {w:.2f} | {r0:,.0f} | {hwm:,.0f} | {r1:,.0f} |")
    print("\n| Result frame | rows | MB |\n|---|---:|---:|")
    for n, f in sizes.items():
        if f is not None:
            print(f"| {n} | {f.height:,} | {f.estimated_size() / 2**20:,.1f} |")
    held = view.held(res)
    for k, v in held.items():
        if hasattr(v, "estimated_size"):
            print(f"| table {k} | {v.height:,} | {v.estimated_size() / 2**20:,.1f} |")
    print(f"| tables ({len(held)} held) | | {sum(v.estimated_size() for v in held.values() if hasattr(v, 'estimated_size')) / 2**20:,.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
