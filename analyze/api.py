"""The public functions, one per ``spectrace`` verb; the CLI (:mod:`analyze.cli`) is a thin layer over them.

Every function takes one report or several (one per node or per rank: merged, ranks numbered across
them) and goes through the same :func:`analyze`, which picks where the rows live by size, reuses a
valid cache, and analyses several reports in parallel processes.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from .model import CommResult, InputError, Result, Trace

Report = str | os.PathLike | Trace
Reports = Report | Sequence[Report]


def _many(reports: Reports) -> list:
    if isinstance(reports, str | os.PathLike | Trace):
        return [reports]
    out = list(reports)
    if not out:
        raise InputError("no report given", "NO_FILE")
    return out


def analyze(
    reports: Reports,
    ranges: str | None = None,
    comm_patterns=None,
    *,
    store: bool | None = None,
    cache: bool | None = None,
    keep_ops: bool = False,
    jobs: int | None = None,
    executor=None,
    progress: bool | None = None,
) -> Result:
    """Per rank and phase: GPU compute, communication and idle time, seams, projections, coverage.

    ``reports``: an nsys SQLite export (or parquetdir/arrowdir, or a loaded Trace), or several.
    ``ranges``: the NVTX ranges that are phases (regex; default: the spectrace domain). ``comm_patterns``:
    the communication kernel table (default: :data:`analyze.compute.comm_patterns.PATTERNS`).
    ``store``/``cache``: where the rows live (default: by size; a valid cache is reused).
    ``keep_ops``: keep every GPU operation in ``Result.ops`` (one report). ``jobs``/``executor``: how
    several reports are analysed in parallel (worker processes, or e.g. a Dask ``Client.get_executor()``).
    """
    from .compute import pipeline

    many = _many(reports)
    if len(many) == 1 and executor is None:
        return pipeline.analyze(many[0], ranges, comm_patterns, store=store, cache=cache, keep_ops=keep_ops,
                                progress=progress)
    if keep_ops:
        raise InputError("keep_ops needs a single report", "BAD_OPTION")
    return pipeline.merge(pipeline.analyze_each(many, ranges, comm_patterns, store=store, cache=cache, jobs=jobs,
                                                executor=executor))


def comm(reports: Reports, ranges: str | None = None, comm_patterns=None, **kw) -> CommResult:
    """Collectives matched across ranks: wait vs transfer per phase and rank, stragglers, clock alignment.

    Several reports (one per node or rank) are put on one clock (utcEpochNs, then collective end times).
    ``kw``: as for :func:`analyze` (store, cache, jobs, executor).
    """
    from .compute import collectives, pipeline

    many = _many(reports)
    return collectives.cross_rank(pipeline.analyze_each(many, ranges, comm_patterns, **kw))


def compare(a: Reports, b: Reports, ranges: str | None = None, comm_patterns=None, **kw) -> dict:
    """Phase by phase, GPU time per cycle (and per token) of runs A and B and the difference B − A."""
    from .compute import compare as cmp

    return cmp.compare(analyze(a, ranges, comm_patterns, **kw), analyze(b, ranges, comm_patterns, **kw))


def whatif(reports: Reports, steps_now: int | None = None, baseline: Reports | None = None,
           acceptance: float | None = None, ranges: str | None = None, comm_patterns=None, *,
           as_traced: bool = False, **kw):
    """The cost model fitted on one speculative run (:class:`analyze.compute.whatif.Model`): predictions
    for other draft-step counts. ``baseline``: a run without speculation (calibrates verify's slope).
    ``as_traced``: keep node-level graph tracing's launch cost in the prediction (default: removed)."""
    from .compute import whatif as wi

    if acceptance is not None and not 0 <= acceptance <= 1:
        raise InputError(f"--acceptance must be in [0, 1], not {acceptance}")
    res = analyze(reports, ranges, comm_patterns, **kw)
    base = analyze(baseline, ranges, comm_patterns, **kw) if baseline is not None else None
    return wi.fit(res, steps_now, baseline=base, alpha=acceptance, as_traced=as_traced)


def report(reports: Reports, output: str | os.PathLike, baseline: Reports | None = None,
           steps_now: int | None = None, ranges: str | None = None, comm_patterns=None, **kw) -> Path:
    """Write ``output/index.html`` (tables, figures, what-if; the comparison with ``baseline``); its path."""
    from .output import html

    res = analyze(reports, ranges, comm_patterns, **kw)
    base = analyze(baseline, ranges, comm_patterns, **kw) if baseline is not None else None
    return html.write_page(res, output, baseline=base, steps_now=steps_now)
