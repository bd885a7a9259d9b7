"""The ``spectrace`` command: every verb is registered here, each a thin layer over one public function.

Analysis verbs (:mod:`analyze.api`): ``analyze``, ``comm``, ``report``, ``timeline``, ``compare``, ``whatif``.
Capture verbs (:mod:`nvtx_hooks.capture`, no analysis stack needed): ``trace``, ``demo-workload``, ``scrub``.
Hooks: ``hooks check`` (:mod:`nvtx_hooks.check`). Expected failures (:class:`analyze.model.InputError`,
:class:`nvtx_hooks.capture.CaptureError`, and any ``OSError``: permissions, a full disk) print one line
and exit 2; Ctrl-C, at any moment, prints one line and exits 130. Standard output is written (and
flushed) before any output file, so a failing ``--db`` never loses it.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Any, NoReturn

if TYPE_CHECKING:  # annotations only: the modules load inside main() (below)
    import argparse
    from collections.abc import Callable, Iterable
    from pathlib import Path

    from nvtx_hooks.capture.bounds import Number

    from .model import Diagnostic

__all__ = ["build_parser", "main", "run"]

# Only os and sys (loaded with the interpreter) at import: everything else loads inside main(), where a
# Ctrl-C is caught, so that the window in which Ctrl-C means a Python traceback is the interpreter's start.

# Set by main() before polars loads (only in spectrace's own process; a user's setting wins): keep freed
# pages 1 s rather than polars' 0.5 s, so that the next step reuses them instead of faulting fresh
# ones in. At 20 M kernels 2 s cut system time 14 -> 10 s and the analysis 29 -> 25 s (BENCHMARKS.md, session 4);
# session 11 took it to 1 s: at 10 M kernels cold, the peak 1.41-1.50 -> 1.32-1.39 GB (SQLite) and 1.40-1.42 ->
# 1.29-1.35 GB (parquetdir) for +0.4 s wall (parquetdir, 3 %) and +0.2 s (SQLite, 1 %), four same-minute pairs. One
# arena (not one per thread): memory freed by one polars thread is reused by the next, so fewer fresh pages
# (10 M kernels cold, measured alone: 1.34 -> 1.08 M page faults). No separate arena for allocations over 8 MiB
# (``oversize_threshold:0``): jemalloc's default gives those back to the kernel at once, and the columns of a
# million-row frame are that size, so each step faulted its pages in afresh (10 M cold, medians of 5 same-minute
# rounds: 0.86 -> 0.61 M page faults, system time 2.4 -> 2.1 s, wall 10.7 -> 10.4 s; peak 1.73-1.94 -> 1.65-1.73 GiB).
_MALLOC_VAR = "_RJEM_MALLOC_CONF"
_MALLOC_CONF = "narenas:1,dirty_decay_ms:1000,muzzy_decay_ms:0,oversize_threshold:0"
# What importing polars writes into the variable (polars/__init__.py): a process started by one that imported
# polars (a notebook, a script, make bench) inherits it. Not the user's choice, so it does not stop ours.
_POLARS_OWN = frozenset({"dirty_decay_ms:500", "muzzy_decay_ms:1000"})
# Verbs that start the user's programs (an SGLang server under nsys): they get the variable as it was
# (importing polars rewrites it too).
_LAUNCHERS = {"trace", "demo-workload"}
_ANALYSES = {"analyze", "comm", "report", "timeline", "compare", "whatif"}


# ---- shared options -----------------------------------------------------------------------------------


def _num(kind: type, lo: float, hi: float, lo_open: bool = False) -> Number:
    """The ``type=`` of a numeric option (:func:`nvtx_hooks.capture.bounds.number`): NaN, infinities and values
    out of ``[lo, hi]`` are one line."""
    from nvtx_hooks.capture.bounds import number

    return number(kind, lo, hi, lo_open)


def _bounds() -> Any:  # the module of the physical bounds (STEPS_MAX, CYCLES_MAX, ...): standard library only
    from nvtx_hooks.capture import bounds

    return bounds


def _add_selection_args(p: argparse.ArgumentParser) -> None:
    """Options of every verb that selects phases and classifies communication."""
    p.add_argument("--ranges", metavar="REGEX",
                   help="NVTX ranges that are phases (searched in 'text' and 'domain:text'); "
                        "default: the spectrace domain, else ranges named after spectrace phases")
    p.add_argument("--comm-pattern", metavar="FAMILY=REGEX", action="append", default=[],
                   help="extra communication kernel pattern (repeatable)")
    p.add_argument("--comm-patterns-file", metavar="FILE", action="append", default=[],
                   help="file of FAMILY=REGEX lines to add to the communication table")


def _add_common_args(p: argparse.ArgumentParser, formats: tuple[str, ...], format_help: str) -> None:
    """The options of every verb that reads captures, with one meaning each: ``-q``, ``--format``, ``--ranges``,
    ``--comm-pattern(s-file)``, ``--skip-cycles``/``--window`` (and, via :func:`_add_source_args`, where the rows
    live)."""
    p.add_argument("--format", choices=formats, default=formats[0], help=format_help)
    p.add_argument("-q", "--quiet", action="store_true", help="no diagnostics, notes or progress bar on stderr")
    _add_selection_args(p)
    _add_steady_args(p)


def _add_source_args(p: argparse.ArgumentParser) -> None:
    """Where the rows live and how several reports run: the same for every analysis verb."""
    import argparse

    p.add_argument("--store", action=argparse.BooleanOptionalAction, default=None,
                   help="read the export once into a per-process parquet store and analyse one process at a "
                        "time from it, in bounded memory (default: for exports of 4 M GPU-op + API rows or more)")
    p.add_argument("--cache", action=argparse.BooleanOptionalAction, default=None,
                   help="keep that store as a cache beside the report (or in ~/.cache/spectrace) and reuse it "
                        "(default: reuse a valid cache; keep the store when one is built)")
    p.add_argument("-j", "--jobs", type=_num(int, 1, 1024), default=None, metavar="N",
                   help="parallel processes for several reports (default: one per CPU)")


def _add_steady_args(p: argparse.ArgumentParser) -> None:
    """Which decode cycles the headline numbers use (README: *Steady state*)."""
    g = p.add_mutually_exclusive_group()
    g.add_argument("--skip-cycles", type=_num(int, 0, _bounds().CYCLES_MAX), metavar="N",
                   help="leave out exactly the first N cycles of each rank (0: the whole run); default: warm-up "
                        "and rare stalls are detected and left out (slower cycles that recur are kept and "
                        "described), and the output says how many and why")
    g.add_argument("--window", metavar="START:END",
                   help="use only cycles START <= n < END (e.g. 5:50, open ends allowed), or the cycles whose "
                        "first GPU op lies in a time range on the capture's clock (e.g. 1.5s:3s; ns, us, ms, s)")


def _add_timing_args(p: argparse.ArgumentParser) -> None:
    """Options of the verbs that take a two-pass capture (``spectrace trace --passes graph,node``)."""
    p.add_argument("--timing", metavar="GRAPH", nargs="+",
                   help="a graph-level pass of the same workload (REPORT being the node-level pass): phase spans, "
                        "seams and cycle period from it, the compute/comm/idle split inside graphs from REPORT, "
                        "and a probe-effect section")
    p.add_argument("--unprofiled-cycles-per-s", type=_num(float, 0, 1e9, lo_open=True), metavar="X",
                   help="with --timing: the workload's throughput without a profiler, to say how far each pass is "
                        "from it (default: the plain pass recorded beside a --passes capture)")


def _options(a: argparse.Namespace) -> dict[str, Any]:
    """Keyword arguments of the analysis functions from the shared options."""
    from .compute.comm_patterns import load_patterns

    out = {"ranges": a.ranges, "comm_patterns": load_patterns(a.comm_pattern, a.comm_patterns_file),
           "store": a.store, "cache": a.cache, "jobs": a.jobs, "skip_cycles": a.skip_cycles, "window": a.window}
    if a.quiet:
        out["progress"] = False
    if getattr(a, "timing", None):
        out |= {"timing": a.timing, "unprofiled_cycles_per_s": a.unprofiled_cycles_per_s}
    elif getattr(a, "unprofiled_cycles_per_s", None) is not None:
        from .model import InputError

        raise InputError("--unprofiled-cycles-per-s needs --timing GRAPH (a two-pass capture)")
    return out


def _inputs(a: argparse.Namespace) -> list[str]:
    """Every report a verb reads (``--baseline`` and ``--timing`` ones too): outputs must be none of them."""
    base = getattr(a, "baseline", None) or getattr(a, "vs", None) or getattr(a, "b", None) or []
    return [*a.report, *([base] if isinstance(base, str) else base), *(getattr(a, "timing", None) or []),
            *(getattr(a, "other_steps", None) or []),
            *([a.unprofiled_log] if getattr(a, "unprofiled_log", None) else []),
            *(getattr(a, "comm_patterns_file", None) or []),
            *([a.current_sglang_config] if getattr(a, "current_sglang_config", None) else [])]


def _out(text: str) -> None:
    """Write to standard output now (a full disk is a one-line error here, not a traceback at exit)."""
    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    except BrokenPipeError:
        raise
    except OSError as e:
        from .model import InputError

        raise InputError(f"cannot write to standard output ({e.strerror or e})", "BAD_OUTPUT") from None


def _warn(diagnostics: Iterable[Diagnostic], quiet: bool) -> None:
    if not quiet:
        for d in diagnostics:
            if d.level != "info":
                print(f"spectrace: {d.level}: {d.code}: {d.message}", file=sys.stderr)


_REPORTS_HELP = ("nsys SQLite export(s) (`nsys export --type sqlite`, opened read-only) or parquetdir/arrowdir "
                "exports; several (one per node or rank) are analysed in parallel and merged, ranks numbered "
                "across them")


# ---- analysis verbs -----------------------------------------------------------------------------------


def _run_analyze(a: argparse.Namespace) -> int:
    from .api import analyze, keep_derived
    from .compute.findings import find
    from .output import data, text
    from .output.targets import check_db

    if a.table is not None and a.table not in data.CSV_TABLES:
        from .model import InputError

        raise InputError(f"unknown table {a.table!r}; one of {', '.join(data.CSV_TABLES)}", "BAD_TABLE")
    if a.db is not None:  # before the analysis: a --db that may not be written is refused at once
        check_db(a.db, _inputs(a))
    res = analyze(a.report, **_options(a))
    if a.table is not None:  # one table, in the chosen format
        if a.format == "csv":
            out = data.to_csv(res, a.table)
        elif a.format == "json":
            out = data.doc_json({a.table: data.frame(res, a.table).to_dicts()})
        elif a.table == "kernels":
            out = text.kernels_text(res, a.top)
        elif a.table == "findings":
            out = "\n".join(text.findings_text(find(res))) + "\n"
        else:
            out = text.table_text(data.frame(res, a.table).drop("order", strict=False))
    elif a.format == "json":
        out = data.to_json(res)
    elif a.format == "csv":
        out = data.to_csv(res, "phases")
    else:
        out = text.analyze_table(res, find(res))
    _out(out)
    if a.format != "table" or a.table is not None:
        _warn(res.diagnostics, a.quiet)
    if a.db is not None:
        data.to_db(res, a.db, _inputs(a))
    keep_derived(res)
    return 0


def _run_comm(a: argparse.Namespace) -> int:
    from .api import comm
    from .output import data, text

    res = comm(a.report, **_options(a))
    if a.format == "json":
        _out(data.doc_json(res.to_dict()))
        _warn(res.diagnostics, a.quiet)
    else:
        _out(text.comm_table(res))
    return 0


def _run_report(a: argparse.Namespace) -> int:
    from .api import report
    from .output.targets import check_report_folder

    if a.baseline:  # the old name of --vs (one release): a run to compare with, never whatif's no-speculation run
        a.vs = a.vs or a.baseline
        if not a.quiet:
            print("spectrace: note: report --baseline is now --vs (a run to compare with); --baseline will be "
                  "removed in the next release", file=sys.stderr)
    a.baseline = None
    if a.output is None:
        a.output = _default_report_folder(a.report[0])
    check_report_folder(a.output, _inputs(a), a.force)  # before the analysis
    page = report(a.report, a.output, vs=a.vs, steps_now=a.steps_now, force=a.force,
                  timeline_events=a.timeline_events, **_options(a))
    print(f"spectrace: wrote {page}", file=sys.stderr)
    return 0


def _run_timeline(a: argparse.Namespace) -> int:
    from .api import default_timeline_path, timeline
    from .output.targets import check_file

    out = a.output or default_timeline_path(a.report[0])
    check_file(out, _inputs(a), "-o", replace=a.force)  # before the analysis
    tl = timeline(a.report, out, cycles=a.cycles, max_events=a.max_events, force=a.force, **_options(a))
    if tl.cut and not a.quiet:
        print(f"spectrace: note: {tl.cut}", file=sys.stderr)
    print(f"spectrace: wrote {tl.path} ({tl.events:,} events, {tl.meta['cycles_shown']} cycles): open it in "
          "ui.perfetto.dev or chrome://tracing", file=sys.stderr)
    return 0


def _default_report_folder(report: str | os.PathLike) -> str:
    """``report``'s default ``-o``: ``NAME_report`` beside ``NAME.sqlite`` (or the parquetdir/arrowdir)."""
    from pathlib import Path

    p = Path(report)
    stem = p.name[:-len(p.suffix)] if p.suffix in (".sqlite", ".nsys-rep", ".qdrep", ".parquetdir", ".arrowdir") \
        else p.name
    return str(p.with_name(f"{stem}_report"))


def _run_compare(a: argparse.Namespace) -> int:
    from .api import compare
    from .model import InputError
    from .output import data, text

    if a.vs and a.b:
        raise InputError("give --vs (the run to compare with: A) or --b (B's reports, the old meaning), not both",
                         "BAD_OPTION")
    if a.vs:  # --vs names the run compared with, side A, in every verb (report's meaning)
        side_a, side_b = a.vs, a.a
    elif a.b:  # compare's old --vs (one release): the positional reports are A, these B
        side_a, side_b = a.a, a.b
        if not a.quiet:
            print("spectrace: note: --b is compare's old --vs (B's reports) and goes in the next release: write "
                  "`compare B… --vs A…` (--vs names the run compared with, side A, in every verb)", file=sys.stderr)
    elif len(a.a) == 2:
        side_a, side_b = a.a[:1], a.a[1:]
    else:
        raise InputError("give two reports (A B), or this run's reports then --vs and the other run's (several "
                         "per side for multi-node runs)", "BAD_OPTION")
    if a.vs and not a.quiet:
        print("spectrace: note: compare X --vs Y now compares X (B) with Y (A), as report X --vs Y does; before, Y "
              "was B: for that, write `compare Y --vs X` (or --b, until the next release)", file=sys.stderr)
    doc = compare(side_a, side_b, **_options(a))
    _out(data.doc_json(doc.to_dict()) if a.format == "json" else text.compare_table(doc))
    for w in doc.warnings:
        if a.format == "json" and not a.quiet:
            print(f"spectrace: warning: {w}", file=sys.stderr)
    if a.fail_if_slower is not None and doc.verdict.get("result") == "unknown":  # the gate never passes blind
        print(f"spectrace: cannot judge whether B is slower than A by more than {a.fail_if_slower} %: "
              f"{doc.verdict.get('text', 'no verdict')}: exit 1", file=sys.stderr)
        return 1
    if a.fail_if_slower is not None and doc.slower_than(a.fail_if_slower):
        unlike = f" (but the runs differ: {'; '.join(doc.warnings)})" if doc.warnings else ""
        print(f"spectrace: B is slower than A by {doc.verdict['change_pct']:.1f} % (more than "
              f"{a.fail_if_slower} %, outside the noise){unlike}: exit 1", file=sys.stderr)
        return 1
    return 0


def _run_whatif(a: argparse.Namespace) -> int:
    from .api import whatif
    from .compute.whatif import to_dict
    from .output import data, text

    if a.sglang_config:  # before the analysis: a target that is an input is refused at once
        from .output.targets import check_file

        check_file(a.sglang_config, _inputs(a), "--sglang-config", replace=a.force)
    current = None
    if a.current_sglang_config:  # read first: a config SGLang would refuse is refused before the analysis
        from .output import sglang_config

        current = sglang_config.read(a.current_sglang_config)
    m = whatif(a.report, a.steps_now, baseline=a.baseline, acceptance=a.acceptance, as_traced=a.as_traced,
               other_steps=a.other_steps, unprofiled_log=a.unprofiled_log, **_options(a))
    doc = to_dict(m, a.max_steps)
    if current is not None:
        from .output import sglang_config

        doc["sglang_config_comparison"] = sglang_config.compare(doc["segments"], current)
    table = text.whatif_table(m, a.max_steps, explain=a.explain) if a.format != "json" else ""
    if current is not None and a.format != "json":
        table += ("\nYour SGLang tiers (--current-sglang-config, routed as SGLang 0.5.23 routes a batch size: the "
                  "largest tier key not above it)\n" + "\n".join("  " + x for x in doc["sglang_config_comparison"])
                  + ("" if doc["segments"] else "\n  (no per-batch-size models: the run has one segment)") + "\n")
    _out(data.doc_json(doc) if a.format == "json" else table)
    if not a.quiet:  # notes with a code of their own (DECODE_LOG_LINES, ...) are warnings about an input
        for n in m.notes:
            if n.split(":", 1)[0].isupper() and "_" in n.split(":", 1)[0]:
                print(f"spectrace: warning: {n}", file=sys.stderr)
    if a.sglang_config:
        from .output import sglang_config

        path = sglang_config.write(a.sglang_config, doc["segments"], m.steps_now, ", ".join(map(str, a.report)),
                                   inputs=_inputs(a), force=a.force)
        print(f"spectrace: wrote {path} (SGLang --speculative-adaptive --speculative-adaptive-config)",
              file=sys.stderr)
    return 0


# ---- hooks and capture verbs --------------------------------------------------------------------------


def _installed_sglang() -> Path | None:
    """Directory holding the installed sglang package, found without importing it."""
    import importlib.util
    from pathlib import Path

    try:
        spec = importlib.util.find_spec("sglang")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0]).parent


def _run_hooks_check(a: argparse.Namespace) -> int:
    """0 if every hook target is present and unchanged in the SGLang tree, 1 otherwise."""
    from nvtx_hooks.check import FetchError, check_tree, fetch_sglang

    from .model import InputError

    root = a.sglang_root
    if root is None:
        root = _installed_sglang()
        if root is None:
            if not a.version:
                raise InputError("SGLang is not installed here; pass --sglang-root DIR or --version V")
            try:
                root = fetch_sglang(a.version)
            except FetchError as e:
                raise InputError(str(e)) from e
    elif not root.exists():
        raise InputError(f"{root}: no such directory")
    try:
        rep = check_tree(root, a.version)
    except (FileNotFoundError, ValueError) as e:
        raise InputError(str(e)) from e
    print("\n".join(rep.lines()))
    return 0 if rep.ok else 1


# ---- the parser -----------------------------------------------------------------------------------------


def _did_you_mean(parser: argparse.ArgumentParser, message: str, argv: list[str] | None) -> str:
    """``"; did you mean X?"`` for a usage error naming a mistyped verb or option (the closest of the verb's own
    options), else ``""``."""
    import difflib
    import re

    verbs = _subparsers(parser)
    m = re.search(r"argument (COMMAND|ACTION): invalid choice: '([^']*)' \(choose from (.*)\)", message)
    if m:  # a verb, or a hooks action
        near = difflib.get_close_matches(m.group(2), re.findall(r"'([^']*)'", m.group(3)), n=1, cutoff=0.6)
        return f"; did you mean {near[0]!r}?" if near else ""
    m = re.search(r"unrecognized arguments: (.*)", message)
    if not m:
        return ""
    words = argv if argv is not None else sys.argv[1:]
    verb = next((w for w in words if w in verbs), None)
    opts = [o for a in (verbs[verb] if verb else parser)._actions for o in a.option_strings if a.help != "==SUPPRESS=="]
    out, bad = [], [w for w in m.group(1).split() if w.startswith("-")]
    for b in bad:
        near = difflib.get_close_matches(b.split("=", 1)[0], opts, n=1, cutoff=0.75)
        if near:
            out.append(f"{near[0]} (for {b})" if len(bad) > 1 else near[0])
    return f"; did you mean {', '.join(out)}?" if out else ""


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    import argparse

    for a in parser._actions:
        if isinstance(a, argparse._SubParsersAction):
            return a.choices
    return {}


def _usage(p: argparse.ArgumentParser) -> Callable[[argparse.Namespace], int]:
    """The ``func`` of a verb given without its action: its help, exit 2."""
    def show(a: argparse.Namespace) -> int:
        p.print_help()
        return 2

    return show


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    import argparse
    from pathlib import Path

    from nvtx_hooks.capture import nsys, scrub, workload

    from . import __version__

    parser: argparse.ArgumentParser  # (the top-level parser, made below: its errors name its verbs)

    class Parser(argparse.ArgumentParser):
        def error(self, message: str) -> NoReturn:  # one line (not the usage), exit 2, as for every other bad input
            print(f"spectrace: error: {' '.join(message.split())}{_did_you_mean(parser, message, argv)}",
                  file=sys.stderr)
            raise SystemExit(2)

    parser = Parser(
        prog="spectrace",
        description="Where the time goes in SGLang EAGLE-3 speculative decoding on tensor-parallel GPUs.",
    )
    parser.add_argument("--version", action="version", version=f"spectrace {__version__}")
    sub = parser.add_subparsers(dest="subcommand", metavar="COMMAND")

    p = sub.add_parser("analyze", help="per-rank, per-phase compute / comm / idle of an nsys SQLite export",
                       description="Attribute GPU time to NVTX phases: span = compute + comm + idle, "
                                   "plus seams between phases and NVIDIA-style projections.")
    p.add_argument("report", nargs="+", help=_REPORTS_HELP)
    _add_common_args(p, ("table", "json", "csv"), "table: text for people (default); json: every table and the "
                                                 "findings; csv: one table (--table, default phases)")
    p.add_argument("--table", metavar="NAME",
                   help="print only this table, in the chosen format: phases, ranges, seams, ranks, coverage, "
                        "instances, host_calls (whole run); phases_steady, seams_steady, budget, kernels (top GPU "
                        "operations per phase), cycles, cycle_classes (slower cycles that recur, rare stalls), "
                        "segments (per batch size), findings (steady state); utilisation, utilisation_seams, gpu_metrics "
                        "(GPU-metrics samples per phase; see docs/gpu-metrics.md)")
    p.add_argument("--top", type=_num(int, 1, 10_000), default=5, metavar="N", help="with --table kernels as text: operations per "
                                                                   "phase (default 5)")
    p.add_argument("--db", metavar="RESULTS.db", help="also write every result table into this SQLite file")
    _add_timing_args(p)
    _add_source_args(p)
    p.set_defaults(func=_run_analyze)

    p = sub.add_parser("comm", help="cross-rank communication: wait vs transfer per phase and rank, stragglers",
                       description="Match each collective kernel across ranks (the k-th kernel of a name in the "
                                   "k-th instance of a phase), split its time into waiting for the last rank and "
                                   "transfer, and name the rank that arrives last. Several reports (one per node "
                                   "or rank) are aligned by utcEpochNs, then by collective end times.")
    p.add_argument("report", nargs="+", help=_REPORTS_HELP)
    _add_common_args(p, ("table", "json"), "table: text for people (default); json: the collectives, stragglers, "
                                          "clock and matching")
    _add_source_args(p)
    p.set_defaults(func=_run_comm)

    p = sub.add_parser("report", help="HTML report (tables and figures) of an nsys SQLite export",
                       description="Write DIR/index.html, one self-contained page (figures inline): the comparison's "
                                   "verdict first with --vs, the cycle budget and ranked findings, then the "
                                   "per-phase tables, figures, stragglers and the what-if model.")
    p.add_argument("report", nargs="+", help=_REPORTS_HELP)
    p.add_argument("--vs", metavar="OTHER", nargs="+",
                   help="another run to compare with (A = OTHER, B = this report); several exports for a "
                        "multi-node run")
    p.add_argument("--baseline", metavar="OTHER", nargs="+", help=argparse.SUPPRESS)  # deprecated: --vs
    p.add_argument("-o", "--output", metavar="DIR",
                   help="output folder (default: NAME_report beside the first report NAME.sqlite): built beside "
                        "DIR and put in its place whole when complete; DIR may be new, empty or a report "
                        "spectrace wrote (replaced)")
    p.add_argument("-f", "--force", action="store_true",
                   help="write into a folder spectrace did not make (files of the same names are replaced, its "
                        "other files kept)")
    p.add_argument("--steps-now", type=_num(int, 1, _bounds().STEPS_MAX), metavar="N",
                   help="draft steps of this trace (default: its manifest, else inferred from the trace)")
    p.add_argument("--timeline-events", type=_num(int, 0, 1_000_000_000), metavar="N",
                   help="bound of DIR/timeline.trace.json, the annotated timeline for Perfetto the page links to "
                        "(default 150,000 events; 0: not written; `spectrace timeline` for more)")
    _add_common_args(p, ("html",), "html: DIR/index.html, the only format of a report (JSON: analyze --format json)")
    _add_timing_args(p)
    _add_source_args(p)
    p.set_defaults(func=_run_report)

    p = sub.add_parser("timeline", help="an annotated timeline of the cycles for Perfetto / chrome://tracing",
                       description="Write the cycles as a trace-event JSON file (ui.perfetto.dev, chrome://tracing): "
                                   "per rank its host threads (phase and scheduler ranges, CUDA API waits) and its "
                                   "GPU (cycles, phases split into compute / comm / idle, seams named by their "
                                   "cause), counters (cycle period, GPU metrics), and a track per finding, "
                                   "straggler and class of slower cycles over the cycles it names.")
    p.add_argument("report", nargs="+", help=_REPORTS_HELP)
    p.add_argument("-o", "--output", metavar="FILE",
                   help="the trace file (default: NAME.trace.json beside the first report NAME.sqlite; FILE.gz: "
                        "gzip-compressed); written whole and renamed into place, never over an input")
    p.add_argument("-f", "--force", action="store_true", help="replace FILE when it exists")
    p.add_argument("--cycles", metavar="SPEC",
                   help="which cycles: A:B (cycles A <= cycle < B, as analyze numbers them; open ends allowed), "
                        "class:N (the N-th class of slower cycles of `analyze --table cycle_classes`, each of its "
                        "cycles with the one before it), stalls, or segment:N (a batch-size segment, from 0); "
                        "default: every cycle")
    p.add_argument("--max-events", type=_num(int, 0, 1_000_000_000), metavar="N",
                   help="at most N events (default 500,000, about 60 MB): whole cycles past it are left out, and "
                        "the note on stderr and the file's otherData.cut say which; 0: no bound")
    p.add_argument("-q", "--quiet", action="store_true", help="no notes or progress bar on stderr")
    _add_selection_args(p)
    _add_steady_args(p)
    _add_source_args(p)
    p.set_defaults(func=_run_timeline)

    p = sub.add_parser("compare", help="phase-by-phase time per cycle (and per token) of two runs, B − A, "
                                       "split into compute / comm / idle, with a noise-aware verdict",
                       description="Match phases and seams by name (any prefix); GPU time per steady cycle in A "
                                   "and B and the difference split into compute, communication and idle, one "
                                   "ranking by |Δ| (per generated token when both know tokens), per rank, the "
                                   "GPU operations that moved, and a verdict on the cycle period from a bootstrap "
                                   "over cycles. `compare A B`, or `compare B1 B2 --vs A1 A2` for multi-node runs (--vs names the "
                                   "run compared with, A, as in `report --vs`).")
    p.add_argument("a", nargs="+", metavar="RUN",
                   help="`A B`: run A (e.g. the baseline) then run B; with --vs, all of this run's exports (B)")
    p.add_argument("--vs", nargs="+", metavar="OTHER",
                   help="the run to compare with (A = OTHER, B = the reports before --vs), as in `report --vs`; "
                        "several exports for a multi-node run")
    p.add_argument("--b", nargs="+", metavar="B",
                   help="deprecated, for one release: compare's old --vs (B's reports, the positional ones A); "
                        "write `compare B… --vs A…`")
    _add_common_args(p, ("table", "json"), "table: text for people (default); json: every row, per rank, "
                                          "kernels, verdict")
    p.add_argument("--fail-if-slower", type=_num(float, 0, 1e6), metavar="PCT",
                   help="exit 1 when B is slower than A by more than PCT %% (the cycle period over every steady "
                        "cycle; per token when the runs make different numbers of tokens per cycle) and the 95 %% "
                        "bootstrap interval excludes no change: a CI gate; also exit 1 when there is no verdict "
                        "(too few cycles for an interval, no cycle period): a gate never passes what it cannot "
                        "judge")
    _add_source_args(p)
    p.set_defaults(func=_run_compare)

    p = sub.add_parser("whatif", help="predict cycle time and tokens/s for 1..10 draft steps from one trace",
                       description="Fit per-phase costs on one EAGLE trace and predict other step counts by "
                                   "replaying each cycle on the trace's CPU and GPU timelines (assumptions: "
                                   "--explain, analyze/compute/whatif.py and the README).")
    p.add_argument("report", nargs="+", help=_REPORTS_HELP)
    p.add_argument("--steps-now", type=_num(int, 1, _bounds().STEPS_MAX), metavar="N",
                   help="draft steps of this trace (default: its manifest, else inferred from the trace)")
    p.add_argument("--baseline", metavar="OTHER", help="a decode_step (no speculation) export: calibrates how "
                                                       "verify cost grows with verified tokens")
    p.add_argument("--acceptance", type=_num(float, 0, 1), metavar="ALPHA",
                   help="per-token acceptance probability (default: fitted on the accept-length payload)")
    p.add_argument("--max-steps", type=_num(int, 1, _bounds().STEPS_MAX), default=10, metavar="N",
                   help="predict 1..N draft steps (default %(default)s)")
    _add_common_args(p, ("table", "json"), "table: text for people (default); json: predictions, best step count "
                                          "and the model")
    p.add_argument("--explain", action="store_true",
                   help="also print the model's assumptions, with this trace's numbers (JSON: model.assumptions)")
    p.add_argument("--as-traced", action="store_true",
                   help="predict the traced program: keep node-level graph tracing's launch cost (default: removed)")
    p.add_argument("--other-steps", action="append", metavar="OTHER",
                   help="a run of the same workload at another draft-step count (its manifest says which; repeat "
                        "for more): per batch size, each step count is predicted from the run measured nearest to "
                        "it, and a measured step count is the measurement")
    p.add_argument("--unprofiled-log", metavar="LOG",
                   help="a decode log of the same workload at this run's step count without a profiler (SGLang's "
                        "'Decode batch' lines): per batch size, the capture's excess over it is taken off every "
                        "predicted period")
    p.add_argument("--sglang-config", metavar="FILE",
                   help="write the best draft steps per batch size (the what-if per segment) as the JSON that "
                        "SGLang's --speculative-adaptive-config reads: tiers of batch sizes, candidate steps the "
                        "best and each batch size's current one (0: verify only)")
    p.add_argument("-f", "--force", action="store_true", help="with --sglang-config: replace an existing FILE")
    p.add_argument("--current-sglang-config", metavar="FILE",
                   help="the --speculative-adaptive-config the run used (SGLang 0.5.23's format): per tier, its "
                        "candidate steps against the measured best of the batch sizes routed to it, and the "
                        "tokens/s predicted")
    _add_timing_args(p)
    _add_source_args(p)
    p.set_defaults(func=_run_whatif)

    p = sub.add_parser("hooks", help="NVTX hooks for SGLang: verify targets")
    hs = p.add_subparsers(dest="hooks_command", metavar="ACTION")
    c = hs.add_parser("check", help="check that every hook target exists, unchanged, in an SGLang source tree "
                                    "(AST, no import)",
                      description="Static check of the hook targets. Without --sglang-root, the installed SGLang is "
                                  "read; with only --version, that wheel is fetched from PyPI into the cache.")
    c.add_argument("--sglang-root", type=Path, help="directory containing sglang/ (or the sglang package dir)")
    c.add_argument("--version", help="SGLang version of the tree (default: read from the tree)")
    c.set_defaults(func=_run_hooks_check)
    p.set_defaults(func=_usage(p))

    p = sub.add_parser("trace", help="profile a command under nsys and export SQLite + manifest",
                       description=nsys.__doc__.split("\n\n")[1])
    nsys.add_trace_arguments(p)
    p.set_defaults(func=nsys.trace)
    p = sub.add_parser("demo-workload", help="run the embedded EAGLE-shaped GPU workload (needs torch)",
                       description="An EAGLE-shaped PyTorch program emitting spectrace's phase ranges.")
    workload.build_parser(p)
    p.set_defaults(func=nsys.demo_workload)
    p = sub.add_parser("scrub", help="copy an nsys export without its launch environment and process list")
    scrub.add_arguments(p)
    p.set_defaults(func=scrub.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run one verb; its exit status (0, 1 for a failed check, 2 for an expected failure, 130 on Ctrl-C).
    Standard output and error are :func:`analyze.output.terminal.streams` meanwhile (closed descriptors,
    encoding, control characters)."""
    try:
        from .output import terminal

        with terminal.streams():
            try:
                return _main(argv)
            except KeyboardInterrupt:
                print("spectrace: interrupted", file=sys.stderr)
                return 130
    except KeyboardInterrupt:  # at any moment, imports included
        if sys.stderr is not None:
            print("spectrace: interrupted", file=sys.stderr)
        return 130


def _detach_stdout() -> None:
    """Point standard output at /dev/null, so that the interpreter's last flush at exit cannot fail again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        pass


def _main(argv: list[str] | None) -> int:
    from nvtx_hooks.capture.bounds import environment_problem

    bad = environment_problem()  # before polars loads: it reads them
    if bad:
        print(f"spectrace: error: {bad}", file=sys.stderr)
        return 2
    user_malloc = os.environ.get(_MALLOC_VAR)
    if user_malloc is None or set(user_malloc.split(",")) <= _POLARS_OWN:
        os.environ[_MALLOC_VAR] = _MALLOC_CONF
    from nvtx_hooks.capture import CaptureError

    from .model import InputError

    parser = build_parser(argv)
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # --help, --version, or a usage error (one line said so)
        return e.code if isinstance(e.code, int) else 2
    if getattr(args, "subcommand", None) in _LAUNCHERS:  # polars, already loaded, keeps its own setting
        if user_malloc is None:
            os.environ.pop(_MALLOC_VAR, None)
        else:
            os.environ[_MALLOC_VAR] = user_malloc
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        if args.subcommand in _ANALYSES:  # the result cache written while the outputs are made (read.results)
            from .read.results import writing_behind

            with writing_behind():
                rc = int(args.func(args) or 0)
        else:
            rc = int(args.func(args) or 0)
        _out("")
        return rc
    except (InputError, CaptureError) as e:
        _detach_stdout_if_broken()
        print(f"spectrace: error: {_one_line(e)}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # the reader went away (| head): not an error
        _detach_stdout()
        return 0
    except OSError as e:  # permissions, a full disk, ... anywhere: the path and the reason
        where = f"{e.filename}: " if e.filename else ""
        print(f"spectrace: error: {where}{e.strerror or _one_line(e)}", file=sys.stderr)
        return 2


def _detach_stdout_if_broken() -> None:
    """After a failed write to standard output, drop what is still buffered (it cannot be written)."""
    try:
        sys.stdout.flush()
    except (OSError, ValueError):
        _detach_stdout()


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split())


def run() -> None:
    """The ``spectrace`` command: :func:`main`, then exit with its status. After Ctrl-C (130, everything
    cleaned up by then) the process ends at once: CPython would otherwise kill itself with SIGINT at exit
    (status -2, not 130) when the interrupt landed in code that an import ran through ``PyRun_*``, even though
    :func:`main` handled it."""
    rc = main()
    if rc == 130:
        for f in (sys.stdout, sys.stderr):
            try:
                f.flush()
            except (OSError, ValueError, AttributeError):  # AttributeError: a closed one (None)
                pass
        os._exit(130)
    sys.exit(rc)


if __name__ == "__main__":
    run()
