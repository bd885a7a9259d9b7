"""Which path analyses a report (in memory, or streamed from the parquet cache), and many reports at once.

:func:`analyze_path` picks the path: in memory for small reports; streamed, one process at a
time from the cache (:mod:`analyze.cache`, :mod:`analyze.stream`), for reports of
``STREAM_BYTES`` or more, or when asked. Both give the same numbers.

:func:`analyze_many` maps :func:`analyze_path` over reports in parallel worker processes (spawned:
polars' thread pool does not survive fork), then merges: ranks are numbered across reports in the
order given, each report's ranks after the previous report's; communication is matched across all
ranks with the clock alignment of :func:`analyze.collectives.cross_rank` (session start, then
collective end times), which replaces the per-report ``comm_wait_ns``/``comm_transfer_ns``. The
map is one picklable call per report (:func:`analyze_for_merge`): the unit a Ray or Dask task
would run (see the README, Scale).
"""

from __future__ import annotations

import multiprocessing
import os
import shutil
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import polars as pl

from . import breakdown, collectives
from .analysis import Diagnostic, Result, analyze
from .comm import CommPattern
from .errors import InputError

STREAM_BYTES = 1 << 30  # reports this large (file, or directory total) are streamed by default


def report_bytes(path: str | os.PathLike) -> int:
    p = Path(path)
    if p.is_dir():
        return sum(f.stat().st_size for f in p.iterdir() if f.is_file())
    return p.stat().st_size if p.exists() else 0


def analyze_path(
    path: str | os.PathLike,
    ranges: str | None = None,
    comm_patterns: list[CommPattern] | None = None,
    stream: bool | None = None,
    cache: bool | None = None,
    progress: bool | None = None,
) -> Result:
    """Analyse one report. ``stream``: None = by size; ``cache``: None = keep the cache when streaming.

    ``cache=True`` always goes through the cache (built on first use; later calls skip parsing);
    ``cache=False`` never leaves one behind (a streamed run then uses a temporary directory).
    """
    from .cache import open_store, temporary_store
    from .stream import analyze_store

    big = report_bytes(path) >= STREAM_BYTES
    if cache is True or (stream is None and big and cache is None) or (stream is True and cache is not False):
        return analyze_store(open_store(path, progress=progress), ranges, comm_patterns, progress)
    if stream or (stream is None and big):
        store, tmp = temporary_store(path, progress)
        try:
            return analyze_store(store, ranges, comm_patterns, progress)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return analyze(path, ranges=ranges, comm_patterns=comm_patterns)


def analyze_for_merge(path: str, ranges: str | None, comm_patterns: list[CommPattern] | None,
                      stream: bool | None, cache: bool | None) -> Result:
    """:func:`analyze_path`, with ``ops`` cut to what merging needs (communication kernels), for shipping."""
    res = analyze_path(path, ranges, comm_patterns, stream, cache, progress=False)
    keep = res.ops.filter((pl.col("kind") == "kernel") & pl.col("comm").is_not_null())
    res.ops = keep
    res.trace.ops = res.trace.ops.head(0)
    res.trace.api = res.trace.api.head(0)
    return res


@dataclass
class MultiResult(Result):
    """Several reports as one: ranks numbered across reports; ``report`` columns say which."""

    reports: list[str] = field(default_factory=list)
    clock: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        d = super().to_dict()
        d["report"] = self.reports[0] if self.reports else None
        d["reports"] = self.reports
        d["clock"] = self.clock
        return d


def _offset(df: pl.DataFrame, base: int, i: int) -> pl.DataFrame:
    if "rank" not in df.columns:
        return df
    return df.with_columns(pl.col("rank") + base, report=pl.lit(i, pl.Int32))


def merge(results: list[Result]) -> MultiResult:
    """One result from several reports' (see the module docstring)."""
    if len(results) == 1:
        r = results[0]
        return MultiResult(**{f: getattr(r, f) for f in r.__dataclass_fields__}, reports=[r.trace.path])
    comm = collectives.cross_rank(results)
    parts: dict[str, list[pl.DataFrame]] = {k: [] for k in ("ranks", "instances", "seam_instances", "coverage",
                                                             "ops", "phases")}
    diags: list[Diagnostic] = []
    base = 0
    for i, r in enumerate(results):
        for k in parts:
            parts[k].append(_offset(getattr(r, k), base, i))
        diags += [Diagnostic(d.level, d.code, f"report {i} ({Path(r.trace.path).name}): {d.message}")
                  for d in r.diagnostics if not d.code.startswith("COMM_")]
        base += r.ranks.height
    cat = {k: pl.concat(v, how="diagonal_relaxed") for k, v in parts.items()}
    inst = cat["instances"]
    # Instance ids are per report: seams find their parent range within their own report.
    seams = pl.concat([_offset(breakdown.seams(s, r.instances), b, i) for i, (s, r, b) in enumerate(
        zip(parts["seam_instances"], results, _bases(results)))], how="diagonal_relaxed")
    split = collectives.phase_split(comm.matched)
    phases = cat["phases"].drop(*collectives.SPLIT).join(split, on=["rank", "domain", "phase"], how="left",
                                                          maintain_order="left")
    phases = phases.with_columns(pl.col(*collectives.SPLIT).fill_null(0).cast(pl.Int64))
    diags += comm.diagnostics
    first = results[0]
    return MultiResult(
        trace=first.trace,
        selection=first.selection,
        ranks=cat["ranks"],
        instances=inst,
        phases=phases,
        ranges=pl.concat([_offset(r.ranges, b, i) for i, (r, b) in enumerate(zip(results, _bases(results)))],
                         how="diagonal_relaxed"),
        seam_instances=cat["seam_instances"],
        seams=seams,
        coverage=cat["coverage"],
        ops=cat["ops"],
        diagnostics=diags,
        reports=[r.trace.path for r in results],
        clock=comm.clock,
    )


def _bases(results: list[Result]) -> list[int]:
    out, b = [], 0
    for r in results:
        out.append(b)
        b += r.ranks.height
    return out


def analyze_many(
    paths: list[str],
    ranges: str | None = None,
    comm_patterns: list[CommPattern] | None = None,
    stream: bool | None = None,
    cache: bool | None = None,
    jobs: int | None = None,
    executor=None,
) -> MultiResult:
    """Analyse reports in parallel processes (``jobs``, default: CPUs, at most one per report) and merge.

    ``executor``: any ``concurrent.futures.Executor``-like object (``submit(fn, *args)`` returning
    futures with ``result()``) to run the per-report map elsewhere, e.g. a Dask cluster's
    ``Client.get_executor()``; the reports must be readable where the tasks run.
    """
    resolved = [str(Path(p).resolve()) for p in paths]
    if len(set(resolved)) != len(resolved):
        raise InputError("the same report is given twice; pass each report once", "DUPLICATE_REPORT")
    for p in paths:
        if not Path(p).exists():
            raise InputError(f"{p}: no such file", "NO_FILE")
    n = max(1, min(jobs or os.cpu_count() or 1, len(paths)))
    if executor is not None:
        futs = [executor.submit(analyze_for_merge, p, ranges, comm_patterns, stream, cache) for p in paths]
        results = [f.result() for f in futs]
    elif n == 1:
        results = [analyze_for_merge(p, ranges, comm_patterns, stream, cache) for p in paths]
    else:
        with ProcessPoolExecutor(n, mp_context=multiprocessing.get_context("spawn")) as ex:
            futs = [ex.submit(analyze_for_merge, p, ranges, comm_patterns, stream, cache) for p in paths]
            results = [f.result() for f in futs]
    return merge(results)
