"""``spectrace comm``: collectives matched across ranks, wait vs transfer per phase, stragglers."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import polars as pl

from .commands import add_selection_args
from .errors import InputError


def register(sub) -> None:
    p = sub.add_parser("comm", help="cross-rank communication: wait vs transfer per phase and rank, stragglers",
                       description="Match each collective kernel across ranks (the k-th kernel of a name in the "
                                   "k-th instance of a phase), split its time into waiting for the last rank and "
                                   "transfer, and name the rank that arrives last. Several reports (one per node "
                                   "or rank) are aligned by utcEpochNs, then by collective end times.")
    p.add_argument("report", nargs="+", help="nsys SQLite export(s); one report of all ranks, or one per node/rank")
    add_selection_args(p)
    p.add_argument("--format", choices=("table", "json"), default="table")
    p.add_argument("-q", "--quiet", action="store_true", help="no diagnostics on stderr")
    p.set_defaults(func=run)


def run(args) -> int:
    from .analysis import analyze
    from .collectives import cross_rank
    from .comm import load_patterns

    paths = [str(Path(p).resolve()) for p in args.report]
    if len(set(paths)) != len(paths):
        raise InputError("the same report is given twice; pass each report once", "DUPLICATE_REPORT")
    patterns = load_patterns(args.comm_pattern, args.comm_patterns_file)
    res = cross_rank([analyze(p, ranges=args.ranges, comm_patterns=patterns) for p in args.report])
    if args.format == "json":
        sys.stdout.write(json.dumps(res.to_dict(), indent=2, default=str) + "\n")
        if not args.quiet:
            for d in res.diagnostics:
                if d.level != "info":
                    print(f"spectrace: {d.level}: {d.code}: {d.message}", file=sys.stderr)
    else:
        sys.stdout.write(table(res))
    return 0


def _us(ns) -> str:
    return "-" if ns is None else f"{ns / 1e3:,.1f}"


def _ms(ns) -> str:
    return f"{(ns or 0) / 1e6:,.3f}"


def _pct(a, b) -> str:
    return f"{100 * a / b:.1f}" if b else "-"


def table(res) -> str:
    """The human-readable report."""
    from .collectives import NONE_PHASE, short_name
    from .render import _grid

    c = res.clock
    out = [f"spectrace comm · {', '.join(Path(p).name for p in res.reports)} · {res.ranks.height} rank(s)",
           f"phases: {res.selection}",
           f"clock: {c['alignment']}; collective end spread p50 {_us(c.get('end_spread_p50_ns'))} µs, "
           f"p99 {_us(c.get('end_spread_p99_ns'))} µs (residual)"]
    for r in c.get("per_report", []):
        out.append(f"  report {r['report']} {Path(r['path']).name}: utcEpochNs {r['utc_epoch_ns']}, "
                   f"session offset {_us(r['session_offset_ns'])} µs, refined by {_us(r.get('refine_ns'))} µs")
    d = res.to_dict()["matching"]
    out.append(f"matched {d['matched_collectives']} collectives ({d['matched_kernels']} of {d['comm_kernels']} "
               f"communication kernels; {d['unmatched_kernels']} unmatched)")
    out.append("wait = kernel time before the last rank arrived (latest start); transfer = the rest; "
               "skew = last arrival - own start")
    out.append("")
    s = res.collectives.with_columns(short_name(pl.col("name")).alias("name"), pl.col("phase").fill_null(NONE_PHASE))
    rows = [[r["phase"], str(r["rank"]), r["name"], str(r["count"]), _ms(r["duration_ns"]), _ms(r["wait_ns"]),
             _pct(r["wait_ns"], r["duration_ns"]), _ms(r["transfer_ns"]), _us(r["skew_p50_ns"]),
             _us(r["skew_p99_ns"]), str(r["last_arrivals"])] for r in s.iter_rows(named=True)]
    out.append("Per phase, rank and kernel")
    out += _grid(["phase", "rank", "kernel", "count", "dur ms", "wait ms", "%wait", "transfer ms", "skew p50 µs",
                  "skew p99 µs", "last"], rows, 3)
    st = res.stragglers.with_columns(pl.col("phase").fill_null(NONE_PHASE))
    rows = [[r["phase"], str(r["rank"]), f"{r['last_arrivals']}/{r['collectives']}", _pct(r["last_arrivals"],
             r["collectives"]), _us(r["mean_delay_ns"]), _us(r["max_delay_ns"]), _ms(r["total_delay_ns"])]
            for r in st.iter_rows(named=True)]
    out.append("")
    out.append("Stragglers: who arrived last (strictly), and how much later than the next-latest rank")
    out += _grid(["phase", "rank", "last", "%", "mean delay µs", "max delay µs", "total delay ms"], rows, 2)
    if res.diagnostics:
        out.append("")
        out.append("Diagnostics")
        out += [f"  {x.level:<7} {x.code}: {x.message}" for x in res.diagnostics]
    return "\n".join(out) + "\n"
