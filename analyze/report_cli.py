"""``spectrace report``, ``compare`` and ``whatif``: HTML report, run comparison, speculative what-if."""

from __future__ import annotations

import json
import sys

from .commands import add_selection_args


def _analyze(path: str, args):
    from .analysis import analyze
    from .comm import load_patterns

    return analyze(path, ranges=args.ranges, comm_patterns=load_patterns(args.comm_pattern, args.comm_patterns_file))


def register(sub) -> None:
    p = sub.add_parser("report", help="HTML report (tables and figures) of an nsys SQLite export",
                       description="Write DIR/index.html with the per-phase tables, figures (PNG beside it), "
                                   "the what-if model and, with --baseline, the comparison.")
    p.add_argument("report", help="the .sqlite export")
    p.add_argument("--baseline", metavar="OTHER", help="another export to compare with (e.g. a no-speculation run)")
    p.add_argument("-o", "--output", metavar="DIR", required=True, help="output directory (created)")
    p.add_argument("--steps-now", type=int, metavar="N", help="draft steps of this trace (default: its manifest)")
    add_selection_args(p)
    p.set_defaults(func=run_report)

    p = sub.add_parser("compare", help="phase-by-phase time per cycle (and per token) of two exports, B − A",
                       description="Match phases by name (any prefix), GPU time per cycle in A and B and the "
                                   "difference, biggest movers first; per generated token when both know tokens.")
    p.add_argument("a", help="export A (e.g. the baseline)")
    p.add_argument("b", help="export B")
    p.add_argument("--format", choices=("table", "json"), default="table")
    add_selection_args(p)
    p.set_defaults(func=run_compare)

    p = sub.add_parser("whatif", help="predict cycle time and tokens/s for 1..10 draft steps from one trace",
                       description="Fit per-phase costs on one EAGLE trace and predict other step counts "
                                   "(assumptions: see analyze/whatif.py and the README).")
    p.add_argument("report", help="the .sqlite export of a speculative run")
    p.add_argument("--steps-now", type=int, metavar="N", help="draft steps of this trace (default: its manifest)")
    p.add_argument("--baseline", metavar="OTHER", help="a decode_step (no speculation) export: calibrates how "
                                                       "verify cost grows with verified tokens")
    p.add_argument("--acceptance", type=float, metavar="ALPHA",
                   help="per-token acceptance probability (default: fitted on the accept-length payload)")
    p.add_argument("--max-steps", type=int, default=10, metavar="N")
    p.add_argument("--format", choices=("table", "json"), default="table")
    add_selection_args(p)
    p.set_defaults(func=run_whatif)


def run_report(args) -> int:
    from .report import build

    res = _analyze(args.report, args)
    base = _analyze(args.baseline, args) if args.baseline else None
    page = build(res, args.output, baseline=base, steps_now=args.steps_now)
    print(f"spectrace: wrote {page}", file=sys.stderr)
    return 0


def run_compare(args) -> int:
    from . import compare

    doc = compare.compare(_analyze(args.a, args), _analyze(args.b, args))
    sys.stdout.write(compare.to_json(doc) if args.format == "json" else compare.table(doc))
    return 0


def run_whatif(args) -> int:
    from . import whatif
    from .errors import InputError

    if args.acceptance is not None and not 0 <= args.acceptance <= 1:
        raise InputError(f"--acceptance must be in [0, 1], not {args.acceptance}")
    if args.max_steps < 1:
        raise InputError(f"--max-steps must be >= 1, not {args.max_steps}")
    res = _analyze(args.report, args)
    base = _analyze(args.baseline, args) if args.baseline else None
    m = whatif.fit(res, args.steps_now, baseline=base, alpha=args.acceptance)
    if args.format == "json":
        sys.stdout.write(json.dumps(whatif.to_dict(m, args.max_steps), indent=2) + "\n")
    else:
        sys.stdout.write(whatif.table(m, args.max_steps))
    return 0
