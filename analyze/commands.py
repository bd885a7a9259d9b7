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
    p.add_argument("report", nargs="+",
                   help="the .sqlite exported by `nsys export --type sqlite` (opened read-only), or a "
                        "parquetdir/arrowdir export; several reports (one per node or rank) are analysed in "
                        "parallel and merged, ranks numbered across them")
    add_selection_args(p)
    p.add_argument("--format", choices=("table", "json", "csv"), default="table")
    p.add_argument("--table", default="phases", help="with --format csv: phases, ranges, seams, ranks, coverage, "
                                                     "instances")
    p.add_argument("--db", metavar="RESULTS.db", help="also write every result table into this SQLite file")
    p.add_argument("-q", "--quiet", action="store_true", help="no diagnostics or progress bar on stderr")
    p.add_argument("--stream", action=argparse.BooleanOptionalAction, default=None,
                   help="analyse one process at a time from a parquet cache, in bounded memory "
                        "(default: for reports of 1 GiB or more)")
    p.add_argument("--cache", action=argparse.BooleanOptionalAction, default=None,
                   help="keep parsed frames as parquet beside the report (or in ~/.cache/spectrace) and reuse "
                        "them (default: when streaming)")
    p.add_argument("-j", "--jobs", type=int, default=None, help="parallel processes for several reports")
    p.set_defaults(func=run)


def run(args) -> int:
    from . import render
    from .multi import analyze_many, analyze_path

    patterns = load_patterns(args.comm_pattern, args.comm_patterns_file)
    if len(args.report) > 1:
        res = analyze_many(args.report, args.ranges, patterns, args.stream, args.cache, args.jobs)
    else:
        res = analyze_path(args.report[0], args.ranges, patterns, args.stream, args.cache,
                           progress=False if args.quiet else None)
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
