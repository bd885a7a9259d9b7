"""The public functions, one per ``spectrace`` verb; the CLI (:mod:`analyze.cli`) is a thin layer over them.

Every function takes one report or several (one per node or per rank: merged, ranks numbered across
them) and goes through the same :func:`analyze`, which picks where the rows live by size, reuses a
valid cache, and analyses several reports in parallel processes.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .model import CommResult, Diagnostic, InputError, Result, Trace

if TYPE_CHECKING:
    from concurrent.futures import Executor

    import polars as pl

    from .compute.comm_patterns import CommPattern
    from .compute.compare import Comparison
    from .compute.whatif import Model
    from .output.timeline import Timeline

__all__ = ["analyze", "comm", "compare", "whatif", "whatif_validation", "report", "timeline", "default_timeline_path",
           "probe_effect", "keep_derived", "Report", "Reports"]

Report = str | os.PathLike | Trace | Result
Reports = Report | Sequence[Report]


_REP_SUFFIXES = (".nsys-rep", ".qdrep")


def _many(reports: Reports) -> list:
    if isinstance(reports, bytes):  # a path as bytes (os.fsencode): the path, not a sequence of integers
        reports = os.fsdecode(reports)
    if isinstance(reports, str | os.PathLike | Trace | Result):
        return [reports]
    if not isinstance(reports, Sequence):
        raise InputError(f"reports must be a path, a Trace, a Result or a list of them, not {type(reports).__name__}",
                         "BAD_OPTION")
    out = [os.fsdecode(r) if isinstance(r, bytes) else r for r in reports]
    bad = [r for r in out if not isinstance(r, str | os.PathLike | Trace | Result)]
    if bad:
        raise InputError(f"a report must be a path, a Trace or a Result, not {type(bad[0]).__name__} "
                         f"{str(bad[0])[:60]!r}", "BAD_OPTION")
    if not out:
        raise InputError("no report given", "NO_FILE")
    if len(out) > 1 and any(isinstance(r, Result) for r in out):
        raise InputError("an analysed Result stands alone: give it, or the reports to analyse together", "BAD_OPTION")
    return out


def _paths(reports: Reports) -> list:
    """The files behind ``reports`` (an analysed Result: the reports it was analysed from)."""
    return [p for r in _many(reports)
            for p in ((r.reports or [r.trace.path]) if isinstance(r, Result) else [r])]


def _exported(reports: list) -> tuple[list, list[Diagnostic]]:
    """``NAME.nsys-rep`` → ``NAME.sqlite`` when that export sits beside it (a note says so; a warning when it is
    older than the .nsys-rep). Anything else is passed on unchanged."""
    out, notes = [], []
    for r in reports:
        p = Path(r) if isinstance(r, str | os.PathLike) else None
        sib = p.with_suffix(".sqlite") if p is not None and p.suffix in _REP_SUFFIXES else None
        if p is not None and not p.exists() and not (sib is not None and sib.is_file()):
            _no_such_report(p)
        if p is not None and sib is not None and sib.is_file():
            stale = p.exists() and sib.stat().st_mtime < p.stat().st_mtime
            notes.append(Diagnostic("warning" if stale else "info", "REPORT_EXPORT",
                                    f"{p.name} is nsys's own format: analysed the export {sib.name} beside it"
                                    + (" (older than the .nsys-rep: export it again if the capture changed)"
                                       if stale else "")))
            r = sib
        out.append(r)
    return out, notes


def _no_such_report(p: Path) -> None:
    """A report that does not exist: one line, with the file the user probably meant (``run`` → ``run.sqlite``)."""
    near = [p.with_name(p.name + s) for s in (".sqlite", ".nsys-rep", ".parquetdir", ".arrowdir")]
    near = [q for q in near if q.exists()]
    if near:
        raise InputError(f"{p}: no such file; did you mean {near[0]}?", "NO_FILE")
    if p.suffix not in (".sqlite", ".nsys-rep", ".qdrep", ".parquetdir", ".arrowdir"):
        raise InputError(f"{p}: no such file (spectrace reads NAME.sqlite, the export of nsys's NAME.nsys-rep: "
                         "`nsys export --type sqlite NAME.nsys-rep`)", "NO_FILE")
    raise InputError(f"{p}: no such file", "NO_FILE")


def analyze(
    reports: Reports,
    ranges: str | None = None,
    comm_patterns: list[CommPattern] | None = None,
    *,
    store: bool | None = None,
    cache: bool | None = None,
    keep_ops: bool = False,
    jobs: int | None = None,
    executor: Executor | None = None,
    progress: bool | None = None,
    skip_cycles: int | None = None,
    window: str | tuple | None = None,
    timing: Reports | None = None,
    unprofiled_cycles_per_s: float | None = None,
) -> Result:
    """Per rank and phase: GPU compute, communication and idle time, seams, projections, coverage.

    ``reports``: an nsys SQLite export (or parquetdir/arrowdir, or a loaded Trace), or several; an analysed
    Result is returned as it is (so that every verb also takes one), with no option that would change it.
    ``ranges``: the NVTX ranges that are phases (regex; default: the spectrace domain). ``comm_patterns``:
    the communication kernel table (default: :data:`analyze.compute.comm_patterns.PATTERNS`).
    ``store``/``cache``: where the rows live (default: by size; a valid cache is reused).
    ``keep_ops``: keep every GPU operation in ``Result.ops`` (one report). ``jobs``/``executor``: how
    several reports are analysed in parallel (worker processes, or e.g. a Dask ``Client.get_executor()``).
    ``progress``: the progress bar on standard error (default: when it is a terminal; False: never).
    ``skip_cycles``/``window``: which cycles are the steady state of the headline numbers (default: warm-up
    and stalls detected and left out; :mod:`analyze.compute.steady_cycles`); ``Result.phases`` etc. always count
    every captured instance, :mod:`analyze.compute.steady_tables` has the steady-state tables.
    ``timing``: a graph-level pass of the same workload (``reports`` then being the node-level pass): spans,
    seams and cycle period from it, the split inside graphs from ``reports``, and ``Result.probe_effect``
    (:mod:`analyze.compute.probe`; ``unprofiled_cycles_per_s``: the workload's throughput without a profiler).
    ``Result.steady``: the steady state, what ``spectrace analyze`` prints first
    (:class:`~analyze.compute.steady_state.SteadyState`: ``res.steady.budget``, ``.phases``, ``.findings``, ...).
    """
    from .compute import pipeline, steady_cycles
    from .compute.comm_patterns import checked_patterns
    from .compute.steady_state import SteadyState
    from .output.progress import terminal_bar

    comm_patterns = checked_patterns(comm_patterns)
    if isinstance(reports, bytes):
        reports = os.fsdecode(reports)
    if isinstance(reports, Result):
        return _analysed(reports, ranges=ranges, comm_patterns=comm_patterns, keep_ops=keep_ops or None,
                         skip_cycles=skip_cycles, window=window, timing=timing,
                         unprofiled_cycles_per_s=unprofiled_cycles_per_s)
    choice = steady_cycles.check_choice(skip_cycles, window)
    if timing is not None:
        def one(r: Reports) -> Result:  # each pass with the same options
            return analyze(r, ranges, comm_patterns, store=store, cache=cache, jobs=jobs, executor=executor,
                           progress=progress, skip_cycles=skip_cycles, window=window)

        node, graph = one(reports), one(timing)
        out = _combined(node, graph, unprofiled_cycles_per_s)
        out.steady_class = SteadyState
        return out
    many, notes = _exported(_many(reports))
    if len(many) == 1 and executor is None:
        res = pipeline.result_of(many[0], ranges, comm_patterns, store=store, cache=cache, keep_ops=keep_ops,
                               progress=terminal_bar(progress))
    elif keep_ops:
        raise InputError("keep_ops needs a single report", "BAD_OPTION")
    else:
        res = pipeline.merge_results(pipeline.results_of(many, ranges, comm_patterns, store=store, cache=cache,
                                                   jobs=jobs, executor=executor))
    res.cycle_choice = choice
    res.diagnostics[:0] = notes
    res.steady_class = SteadyState
    if choice.chosen:
        from .compute.cycles import selection

        selection(res)  # a choice that leaves no cycle fails here, not later
    return res


def _analysed(res: Result, **options: object) -> Result:
    """An analysed Result given where a report is expected: itself, refused with an option that would need it
    analysed again (a silently ignored ``skip_cycles`` would print numbers of other cycles than asked)."""
    given = sorted(k for k, v in options.items() if v is not None)
    if given:
        raise InputError(f"an analysed Result is used as it is: analyse the report again for {', '.join(given)}",
                         "BAD_OPTION")
    if res.steady_class is None:
        from .compute.steady_state import SteadyState

        res.steady_class = SteadyState
    return res


def _combined(node: Result, graph: Result, unprofiled_cycles_per_s: float | None) -> Result:
    from .compute import probe

    if unprofiled_cycles_per_s is not None and unprofiled_cycles_per_s <= 0:
        raise InputError(f"--unprofiled-cycles-per-s must be > 0, not {unprofiled_cycles_per_s}")
    res = probe.combine(node, graph)
    res.probe_effect = probe.probe_effect(node, graph, unprofiled_cycles_per_s)
    return res


def probe_effect(node: Reports, graph: Reports, unprofiled_cycles_per_s: float | None = None, ranges: str | None = None,
                 comm_patterns: list[CommPattern] | None = None, **kw: Any) -> dict[str, Any]:
    """What node-level graph tracing costs: a node-level and a graph-level pass of one workload compared
    (cycle period under each and their ratio, per-phase span and launch time, seams; how far each is from
    the unprofiled throughput when known). The ``probe_effect`` JSON document."""
    res = analyze(node, ranges, comm_patterns, timing=graph, unprofiled_cycles_per_s=unprofiled_cycles_per_s, **kw)
    assert res.probe_effect is not None  # (set by every analysis with a timing pass)
    return res.probe_effect


def comm(reports: Reports, ranges: str | None = None, comm_patterns: list[CommPattern] | None = None, *,
         skip_cycles: int | None = None, window: str | tuple | None = None, **kw: Any) -> CommResult:
    """Collectives matched across ranks: wait vs transfer per phase and rank, stragglers, clock alignment.

    Several reports (one per node or rank) are put on one clock (utcEpochNs, then collective end times). The
    phases' collectives are those of the steady-state cycles, as in :func:`analyze` (``skip_cycles``/``window``
    choose them; ``skip_cycles=0``: the whole run), so that both name the same straggler; collectives outside
    any phase are kept. ``kw``: as for :func:`analyze` (store, cache, jobs, executor).
    """
    from .compute import pipeline, steady_cycles, steady_tables
    from .compute.comm_patterns import checked_patterns
    from .compute.cycles import selection
    from .output.progress import terminal_bar

    comm_patterns = checked_patterns(comm_patterns)
    if isinstance(reports, Result):
        raise InputError("comm matches collectives across the reports themselves: give the reports, not an "
                         "analysed Result", "BAD_OPTION")
    choice = steady_cycles.check_choice(skip_cycles, window)
    many, _ = _exported(_many(reports))
    kw["progress"] = terminal_bar(kw.get("progress"))  # (the bar of a single report)
    results = pipeline.results_of(many, ranges, comm_patterns, **kw)  # kw: store, cache, jobs, executor, progress
    res = pipeline.merge_results(results) if len(results) > 1 else results[0]
    res.cycle_choice = choice
    selection(res)  # a choice that leaves no cycle fails here
    # One report's document depends on its result and the cycle choice only: kept with the result (a merge's is
    # made each time).
    out = steady_tables.comm_document(res, reports=results)
    keep_derived(res)
    return out


def compare(a: Reports, b: Reports, ranges: str | None = None, comm_patterns: list[CommPattern] | None = None,
            **kw: Any) -> Comparison:
    """Phase by phase and seam by seam, GPU time per cycle (and per token) of runs A and B over their steady
    cycles, the difference B − A split into compute / comm / idle, and a noise-aware verdict: a
    :class:`~analyze.compute.compare.Comparison` (``to_dict()``: the JSON document). ``a``/``b``: one report or
    several each (multi-node runs), or an analysed :class:`Result`."""
    from .compute import compare as cmp

    # One side at a time: what the comparison reads of A is made and A's Result let go before B's is read.
    ra = analyze(a, ranges, comm_patterns, **kw)
    sa = cmp.Side.of(ra)
    keep_derived(ra)
    del ra
    rb = analyze(b, ranges, comm_patterns, **kw)
    sb = cmp.Side.of(rb)
    keep_derived(rb)
    return cmp.compare_sides(sa, sb)


def whatif(reports: Reports, steps_now: int | None = None, baseline: Reports | None = None,
           acceptance: float | None = None, ranges: str | None = None,
           comm_patterns: list[CommPattern] | None = None, *, as_traced: bool = False, timing: Reports | None = None,
           unprofiled_cycles_per_s: float | None = None, other_steps: list[Reports] | None = None,
           unprofiled_log: str | os.PathLike | None = None, **kw: Any) -> Model:
    """The cost model fitted on one speculative run (:class:`analyze.compute.whatif_model.Model`): predictions
    for other draft-step counts. ``baseline``: a run without speculation (calibrates verify's slope).
    ``as_traced``: keep node-level graph tracing's launch cost in the prediction (default: removed).
    ``timing``: a graph-level pass of the same run: the model is fitted on it (``Model.probe``: the probe effect).
    ``Model.segments``: without a baseline, one model per batch size when the run has several
    (:func:`analyze.compute.whatif_segments.fit_segments`). ``other_steps``: runs of the same workload at other draft-step
    counts (their manifests say which): each batch size's prediction at a step count comes from the run measured
    nearest to it, with this run's acceptance (:class:`analyze.compute.whatif_model.SegmentModel`). ``unprofiled_log``:
    a decode log of the same workload at this run's step count without a profiler (SGLang's "Decode batch" lines):
    each batch size's predictions are calibrated on it (:func:`analyze.compute.whatif_segments.calibrate`)."""
    from .compute import whatif, whatif_fit, whatif_segments

    if acceptance is not None and not 0 <= acceptance <= 1:
        raise InputError(f"--acceptance must be in [0, 1], not {acceptance}")
    periods, log_name = None, ""
    if unprofiled_log is not None:  # read first: a bad log is refused before the analysis
        from .read.server_log import decode_periods, left_out_note

        counts: dict[str, int] = {}
        periods, log_name = decode_periods(unprofiled_log, counts), Path(unprofiled_log).name
    res = analyze(reports, ranges, comm_patterns, timing=timing, unprofiled_cycles_per_s=unprofiled_cycles_per_s,
                  **kw)
    base = analyze(baseline, ranges, comm_patterns, **kw) if baseline is not None else None
    # kept with the result, when nothing below changes it (join_runs and calibrate do)
    if base is None and not other_steps and periods is None and res.probe_effect is None:
        m = whatif.fitted(res, steps_now, alpha=acceptance, as_traced=as_traced)
    else:
        m = whatif_fit.fit(res, steps_now, baseline=base, alpha=acceptance, as_traced=as_traced)
        m.probe = res.probe_effect
        if base is None:  # one model per batch size, verify's curve measured across them
            whatif.with_segments(m, res, steps_now, acceptance, as_traced)
    if other_steps:
        if not m.segments:
            raise InputError("--other-steps joins runs per batch size: this run has fewer than two batch sizes "
                             "(no segments to join)", "NO_SEGMENTS")
        kept: list[Result] = []

        def runs() -> Iterator[tuple[str, Result]]:
            # analysed one at a time, as join_runs reaches them (its refusal comes before the next run)
            for o in other_steps:
                kept.append(analyze(o, ranges, comm_patterns, **kw))
                yield ", ".join(Path(p).name for p in _paths(o)), kept[-1]

        alpha = acceptance if acceptance is not None else whatif_segments.run_alpha(res, m.steps_now)
        m.notes += whatif_segments.join_runs(m.segments, runs(), alpha, as_traced)
        keep_derived(*kept)
    if periods is not None:
        m.notes += whatif_segments.calibrate(m, periods, log_name)
        if counts.get("left_out"):
            m.notes.append(left_out_note(counts["left_out"], log_name))
    keep_derived(res, base)
    return m


def whatif_validation(runs: dict[int, Reports | list[Reports]], baseline: Reports | None = None,
                      as_traced: bool = True, ranges: str | None = None,
                      comm_patterns: list[CommPattern] | None = None, **kw: Any) -> pl.DataFrame:
    """The what-if checked against a sweep of draft steps: ``runs`` maps a step count to its run (or a list of
    repeated runs); a model fitted on each run predicts every step count, one row each (``from_steps, steps,
    predicted_ns, measured_ns, error_pct``, ...: :func:`analyze.compute.whatif.validate`). ``baseline``: a run
    without speculation, as for :func:`whatif`; ``as_traced`` (default): the models keep the traces' own probe
    effect, so that like is compared with like. ``kw``: as for :func:`analyze`."""
    from .compute import whatif

    def one(r: Reports) -> Result:
        return analyze(r, ranges, comm_patterns, **kw)

    analysed: dict[int, Result | Sequence[Result]] = {
        s: [one(x) for x in r] if isinstance(r, list) else one(r) for s, r in runs.items()}
    base = one(baseline) if baseline is not None else None
    out = whatif.validate(analysed, baseline=base, as_traced=as_traced)
    for r in analysed.values():
        keep_derived(*([r] if isinstance(r, Result) else r))
    return out


def report(reports: Reports, output: str | os.PathLike, vs: Reports | None = None,
           steps_now: int | None = None, ranges: str | None = None, comm_patterns: list[CommPattern] | None = None, *,
           timing: Reports | None = None, unprofiled_cycles_per_s: float | None = None, force: bool = False,
           baseline: Reports | None = None, timeline_events: int | None = None, **kw: Any) -> Path:
    """Write ``output/index.html``, one self-contained page (tables, inline figures, what-if; the comparison with
    the run ``vs`` first; the probe effect with a graph-level ``timing`` pass); its path. The folder is built beside
    ``output`` and put in its place whole; a folder spectrace did not make is refused unless ``force``
    (:func:`analyze.output.html.write_page`). ``baseline``: the old name of ``vs`` (deprecated). Beside the page,
    ``timeline.trace.json``: the annotated timeline (:func:`timeline`) of at most ``timeline_events`` events
    (default :data:`analyze.output.timeline.REPORT_MAX_EVENTS`; 0: none)."""
    from .output import html
    from .output.timeline import REPORT_MAX_EVENTS

    vs = vs if vs is not None else baseline
    res = analyze(reports, ranges, comm_patterns, timing=timing, unprofiled_cycles_per_s=unprofiled_cycles_per_s,
                  **kw)
    other = analyze(vs, ranges, comm_patterns, **kw) if vs is not None else None
    page = html.write_page(res, os.fspath(output), vs=other, steps_now=steps_now, force=force,
                           inputs=[*_paths(reports), *(_paths(vs) if vs is not None else []),
                                   *(_paths(timing) if timing is not None else [])],
                           timeline_events=REPORT_MAX_EVENTS if timeline_events is None else timeline_events)
    keep_derived(res, other)
    return page


def timeline(reports: Reports, output: str | os.PathLike | None = None, cycles: str | None = None,
             max_events: int | None = None, ranges: str | None = None,
             comm_patterns: list[CommPattern] | None = None, *, force: bool = False, **kw: Any) -> Timeline:
    """Write the annotated timeline of the cycles, in the Chrome / Perfetto trace-event format (JSON; gzip when
    ``output`` ends in ``.gz``), for ui.perfetto.dev and chrome://tracing: per rank its host threads and its GPU
    (phases split into compute, comm and idle, seams named by cause), counters, and the findings, stragglers and
    slower cycles on the cycles they name (:mod:`analyze.output.timeline`). ``output``: default ``NAME.trace.json``
    beside the first report; new, or replaced with ``force``, never an input. ``cycles``: ``A:B``, ``class:N``,
    ``stalls`` or ``segment:N`` (default every cycle); ``max_events``: the bound
    (:data:`~analyze.output.timeline.DEFAULT_MAX_EVENTS`; 0: none): whole cycles past it are left out, and the
    returned :class:`~analyze.output.timeline.Timeline` says so (``cut``; ``path``, ``events``, ``keys``, ``meta``).
    ``kw``: as for :func:`analyze`."""
    from .output import timeline as tl

    paths = _paths(reports)
    out = Path(output) if output is not None else default_timeline_path(paths[0])
    res = analyze(reports, ranges, comm_patterns, **kw)
    path, doc = tl.write(res, out, cycles, tl.DEFAULT_MAX_EVENTS if max_events is None else max_events,
                         inputs=paths, force=force)
    doc.path = path
    keep_derived(res)
    return doc


def default_timeline_path(report: str | os.PathLike | Trace) -> Path:
    """``NAME.trace.json`` beside ``NAME.sqlite`` (or the parquetdir/arrowdir)."""
    p = Path(report.path if isinstance(report, Trace) else report)
    stem = p.name[:-len(p.suffix)] if p.suffix in (".sqlite", ".nsys-rep", ".qdrep", ".parquetdir", ".arrowdir") \
        else p.name
    return p.with_name(f"{stem}.trace.json")


def keep_derived(*results: Result | None) -> None:
    """Keep the tables derived from each result since the analysis (the headline tables of its cycle choice,
    ...) in its report's result cache, so that the next command on the same capture reads them instead of
    computing them (:mod:`analyze.read.results`). A no-op for a result that did not come from the cache (a small
    export analysed in memory, ``cache=False``, a merge of several reports). The verbs call it once they are done."""
    from .read import results as kept

    for r in results:
        if r is not None:
            kept.keep_derived(r)
