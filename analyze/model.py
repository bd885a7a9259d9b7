"""What the layers pass to each other: the parsed export (:class:`Trace`), the analysis (:class:`Result`),
its notes (:class:`Diagnostic`), and the one error that means "bad input" (:class:`InputError`).

No computation lives here; every other module of :mod:`analyze` may import this one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import polars as pl

from . import __version__

# Sums over ranks: the columns of each per-rank table that add up (the first one orders the rows).
PHASE_SUMS = ("span_ns", "busy_ns", "compute_ns", "comm_ns", "idle_ns", "kernel_ns", "ops", "launches",
              "gpu_idle_ns", "instances", "comm_wait_ns", "comm_transfer_ns")
RANGE_SUMS = ("proj_span_ns", "instances", "range_instances", "ops", "launches", "busy_ns", "comm_ns", "idle_ns",
              "range_ns")
SEAM_SUMS = ("idle_ns", "gap_ns", "busy_ns", "overlap_ns", "instances")
MARKS_SCHEMA = {"pid": pl.Int64, "gtid": pl.Int64, "time": pl.Int64, "domain": pl.String, "mark": pl.String,
                "uint64": pl.Int64, "int64": pl.Int64}


class InputError(Exception):
    """The input cannot be analysed; ``str(e)`` says what is wrong and what to do (the CLI: one line, exit 2)."""

    def __init__(self, message: str, code: str = "BAD_INPUT"):
        super().__init__(message)
        self.code = code

    def __reduce__(self):  # keeps the code when raised in a worker process
        return (type(self), (str(self), self.code))


@dataclass
class Diagnostic:
    level: str  # "info", "warning" or "error"
    code: str
    message: str

    def as_dict(self) -> dict[str, str]:
        return {"level": self.level, "code": self.code, "message": self.message}


@dataclass
class Trace:
    """The parts of an nsys export that spectrace analyses (times in ns on the session clock).

    - ``ranges``: NVTX push/pop and start/end ranges: ``range_id, pid, gtid, start, end, event_type,
      domain, range, color, uint64, int64, unclosed, cross_thread``
    - ``api``: CUDA runtime and driver calls: ``pid, gtid, corr, start, end, name_id``
    - ``ops``: GPU operations: ``pid, device, stream, corr, start, end, kind, name_id, label, graph_node``
      (kind: kernel, memcpy, memset, graph)
    - ``names``: ``name_id, name`` for kernels and API calls
    - ``devices``: ``device, device_name``; ``nsys_diagnostics``: DIAGNOSTIC_EVENT rows
    - ``marks``: NVTX marks (instantaneous events): ``pid, gtid, time, domain, mark, uint64, int64``
    - ``read_warnings``: counts of oddities met while reading (``lossy_strings``, ``missing_strings``,
      ``reversed_ranges``, ``long_ranges``, ``api_without_pid``); each non-zero one becomes a warning

    A Trace inside a :class:`Result` is the export's *head*: everything but ``ops`` and ``api``, which
    stay where they were read from (empty frames here) unless the analysis was asked to keep them.
    """

    path: str
    nsys_version: str
    schema_version: str
    export_meta: dict[str, str]
    capture_meta: dict[str, str]
    duration_ns: int | None
    ranges: pl.DataFrame
    api: pl.DataFrame
    ops: pl.DataFrame
    names: pl.DataFrame
    devices: pl.DataFrame
    nsys_diagnostics: pl.DataFrame
    marks: pl.DataFrame = field(default_factory=lambda: pl.DataFrame(schema=MARKS_SCHEMA))
    tables: set[str] = field(default_factory=set)
    dropped_ops: int = 0
    utc_epoch_ns: int | None = None
    read_warnings: dict[str, int] = field(default_factory=dict)
    graph_rows: str | None = None  # "Graph"/"Node" as seen in the GPU rows of every process (set by the analysis)

    @property
    def graph_trace_mode(self) -> str | None:
        """``Node`` or ``Graph`` as recorded by nsys, else inferred from the rows, else None."""
        for k, v in self.capture_meta.items():
            if k.endswith("CUDA_GRAPH_TRACE_OPTIONS:MODE"):
                return v
        if self.graph_rows is not None:
            return self.graph_rows
        if (self.ops["kind"] == "graph").any():
            return "Graph"
        if self.ops["graph_node"].is_not_null().any():
            return "Node"
        return None


def sum_over_ranks(per_rank: pl.DataFrame, keys: list[str], sums: tuple[str, ...]) -> pl.DataFrame:
    """Sum a per-rank table over ranks (``ranks`` = how many ranks had the row)."""
    have = [c for c in sums if c in per_rank.columns]
    return (
        per_rank.group_by(keys)
        .agg(pl.col("rank").n_unique().alias("ranks"), *[pl.col(c).sum() for c in have])
        .sort(have[0], *keys, descending=[True] + [False] * len(keys))
    )


@dataclass
class Result:
    """Everything ``spectrace analyze`` reports, as frames; the same shape whatever the path or size.

    ``comm_kernels``: every communication kernel with its matching key (:mod:`analyze.compute.collectives`).
    ``ops``: all GPU operations (with rank, range_id, name, comm) only when the analysis was asked to keep them
    (``keep_ops=True``); otherwise None, and :meth:`ops_between` reads a time window from the source.
    ``marks``: the NVTX marks of the ranks' processes (``rank`` added), e.g. the hooks' ``accept`` marks.
    ``reports``: the input files, in rank order (several when reports were merged); ``clock``: how they
    were put on one clock. ``kernels``: GPU operations summed per (rank, range instance, name): ``rank,
    range_id, name, count, kernel_ns`` (the top-kernels tables). ``cycle_choice``: which cycles are the
    steady state (``skip_cycles``/``window``; empty = detected, :mod:`analyze.compute.tokens`).
    ``memo``: results derived from this one, kept by the functions that computed them.
    """

    trace: Trace
    selection: str
    ranks: pl.DataFrame
    instances: pl.DataFrame  # one row per selected range instance, exclusive x_* and inclusive i_* metrics
    phases: pl.DataFrame
    ranges: pl.DataFrame
    seam_instances: pl.DataFrame
    seams: pl.DataFrame
    coverage: pl.DataFrame
    comm_kernels: pl.DataFrame
    ops: pl.DataFrame | None = None
    marks: pl.DataFrame = field(default_factory=lambda: pl.DataFrame(schema={"rank": pl.Int64, **MARKS_SCHEMA}))
    diagnostics: list[Diagnostic] = field(default_factory=list)
    reports: list[str] = field(default_factory=list)
    clock: dict[str, Any] = field(default_factory=dict)
    window: Any = field(default=None, repr=False)  # reads ops by time window: analyze.read.source.OpsWindow
    kernels: pl.DataFrame | None = None
    cycle_choice: dict[str, Any] = field(default_factory=dict)
    memo: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def phases_all(self) -> pl.DataFrame:
        return sum_over_ranks(self.phases, ["domain", "phase"], PHASE_SUMS)

    @property
    def ranges_all(self) -> pl.DataFrame:
        return sum_over_ranks(self.ranges, ["domain", "range"], RANGE_SUMS)

    @property
    def seams_all(self) -> pl.DataFrame:
        return sum_over_ranks(self.seams, ["parent", "from", "to"], SEAM_SUMS)

    def ops_between(self, t0: int, t1: int) -> pl.DataFrame:
        """GPU operations overlapping ``[t0, t1)`` on the result's clock: ``rank, start, end, kind, comm``."""
        if self.ops is not None:
            return self.ops.filter((pl.col("end") > t0) & (pl.col("start") < t1)).select(
                "rank", "start", "end", "kind", "comm").sort("start", "rank", "end")
        if self.window is None:
            return pl.DataFrame(schema={"rank": pl.Int64, "start": pl.Int64, "end": pl.Int64, "kind": pl.String,
                                        "comm": pl.String})
        return self.window(t0, t1)

    def to_dict(self) -> dict[str, Any]:
        """The JSON document (keys documented in the README)."""
        cov = self.coverage
        d = {
            "spectrace_version": __version__,
            "report": self.trace.path,
            "nsys_version": self.trace.nsys_version,
            "schema_version": self.trace.schema_version,
            "graph_trace_mode": self.trace.graph_trace_mode,
            "selection": self.selection,
            "ranks": self.ranks.drop("devices").to_dicts(),
            "phases": self.phases.to_dicts(),
            "phases_all_ranks": self.phases_all.to_dicts(),
            "ranges": self.ranges.to_dicts(),
            "ranges_all_ranks": self.ranges_all.to_dicts(),
            "seams": self.seams.to_dicts(),
            "seams_all_ranks": self.seams_all.to_dicts(),
            "diagnostics": [d.as_dict() for d in self.diagnostics],
            "coverage": {
                "gpu_ns": int(cov["gpu_ns"].sum()) if cov.height else 0,
                "attributed_ns": int(cov["attributed_ns"].sum()) if cov.height else 0,
                "per_rank": cov.to_dicts(),
            },
        }
        if len(self.reports) > 1:
            d["reports"] = self.reports
            d["clock"] = self.clock
        return d


@dataclass
class CommResult:
    """What ``spectrace comm`` reports, as frames (times on the aligned clock, ns)."""

    reports: list[str]
    selection: str
    ranks: pl.DataFrame  # rank, report, path, pid, device
    kernels: pl.DataFrame  # every communication kernel with its key
    matched: pl.DataFrame  # per (matched collective, rank)
    collectives: pl.DataFrame  # per rank, phase, name
    stragglers: pl.DataFrame
    mismatches: pl.DataFrame
    clock: dict[str, Any]
    diagnostics: list[Diagnostic] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """The JSON document: ``collectives`` and ``stragglers`` keys as in the README."""
        n_coll = self.matched.select(pl.struct("_g", "j").n_unique()).item() if self.matched.height else 0
        return {
            "spectrace_version": __version__,
            "reports": self.reports,
            "selection": self.selection,
            "clock": self.clock,
            "ranks": self.ranks.to_dicts(),
            "matching": {
                "comm_kernels": self.kernels.height,
                "matched_kernels": self.matched.height,
                "matched_collectives": n_coll,
                "unmatched_kernels": self.kernels.height - self.matched.height,
            },
            "collectives": self.collectives.to_dicts(),
            "stragglers": self.stragglers.to_dicts(),
            "mismatches": self.mismatches.with_columns(
                pl.col("counts").list.eval(pl.element().struct.field("n")).alias("per_rank")
            ).drop("counts").to_dicts(),
            "diagnostics": [d.as_dict() for d in self.diagnostics],
        }
