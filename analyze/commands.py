"""``spectrace analyze``: the per-phase breakdown of one nsys export."""

from __future__ import annotations

import argparse
import sys

from .comm import load_patterns


def add_selection_args(p: argparse.ArgumentParser) -> None:
    """Options shared by every command that selects phases and classifies communication."""
    p.add_argument("--ranges", metavar="REGEX",
                   help="NVTX ranges that are phases (searched in 'text' and 'domain:text'); "
                        "default: the spectrace domain, else ranges named after spectrace phases")
    p.add_argument("--comm-pattern", metavar="FAMILY=REGEX", action="append", default=[],
                   help="extra communication kernel pattern (repeatable)")
    p.add_argument("--comm-patterns-file", metavar="FILE", action="append", default=[],
                   help="file of FAMILY=REGEX lines to add to the communication table")


def register(sub) -> None:
    p = sub.add_parser("analyze", help="per-rank, per-phase compute / comm / idle of an nsys SQLite export",
                       description="Attribute GPU time to NVTX phases: span = compute + comm + idle, "
                                   "plus seams between phases and NVIDIA-style projections.")
    p.add_argument("report", help="the .sqlite exported by `nsys export --type sqlite` (opened read-only)")
    add_selection_args(p)
    p.add_argument("--format", choices=("table", "json", "csv"), default="table")
    p.add_argument("--table", default="phases", help="with --format csv: phases, ranges, seams, ranks, coverage, "
                                                     "instances")
    p.add_argument("--db", metavar="RESULTS.db", help="also write every result table into this SQLite file")
    p.add_argument("-q", "--quiet", action="store_true", help="no diagnostics on stderr")
    p.set_defaults(func=run)


def run(args) -> int:
    from . import render
    from .analysis import analyze

    patterns = load_patterns(args.comm_pattern, args.comm_patterns_file)
    res = analyze(args.report, ranges=args.ranges, comm_patterns=patterns)
    if args.format == "json":
        out = render.to_json(res)
    elif args.format == "csv":
        out = render.to_csv(res, args.table)
    else:
        out = render.table(res)
    if args.db:
        render.to_db(res, args.db)
    sys.stdout.write(out)
    if not args.quiet and args.format != "table":
        for d in res.diagnostics:
            if d.level != "info":
                print(f"spectrace: {d.level}: {d.code}: {d.message}", file=sys.stderr)
    return 0
