"""What the layers pass to each other: the parsed export (:class:`Trace`), the analysis (:class:`Result`),
its notes (:class:`Diagnostic`), and the one error that means "bad input" (:class:`InputError`).

No computation lives here; every other module of :mod:`analyze` may import this one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import polars as pl

from . import __version__

__all__ = ["OP_KIND", "MARKS_SCHEMA", "SEAM_CAUSES", "SYNC_API", "GRAPH_LAUNCH", "KEPT_API", "InputError",
           "Diagnostic", "Trace", "bound_expr", "WindowReader", "Window", "CycleChoice", "Result", "CommResult"]

# Sums over ranks: the columns of each per-rank table that add up (the first one orders the rows).
_PHASE_SUMS = ("span_ns", "busy_ns", "compute_ns", "comm_ns", "idle_ns", "kernel_ns", "ops", "launches",
              "gpu_idle_ns", "instances", "comm_wait_ns", "comm_transfer_ns", "launch_api_ns", "host_wait_ns", "syncs")
_RANGE_SUMS = ("proj_span_ns", "instances", "range_instances", "ops", "launches", "busy_ns", "comm_ns", "idle_ns",
              "range_ns")
# The kinds of GPU operation (``Trace.ops.kind``): an Enum, one byte a row instead of a string.
OP_KIND = pl.Enum(["kernel", "memcpy", "memset", "graph"])
MARKS_SCHEMA = pl.Schema({"pid": pl.Int64, "gtid": pl.Int64, "time": pl.Int64, "domain": pl.String,
                          "mark": pl.String, "uint64": pl.Int64, "int64": pl.Int64})
# Why the GPU waited at a seam (analyze.compute.host): the next phase's first op was queued in time (gpu), its
# launch call returned after the earlier work ended (launch), or the launch began after it (host).
SEAM_CAUSES = ("gpu", "launch", "host")
# CUDA API calls the analysis finds by name (analyze.compute.host and .pipeline): calls that return only when
# earlier GPU work is done, and graph launches.
SYNC_API = (r"^(cuda(Stream|Device|Event|Thread)Synchronize|cu(Stream|Ctx|Event)Synchronize"
            r"|cudaMemcpy(2D|3D|FromSymbol|ToSymbol|Peer)?|cudaMemset(2D|3D)?"
            r"|cuMemcpy(DtoH|HtoD|DtoD|Peer)?|cuMemsetD(8|16|32))(_v\d+|_v\d+_ptds|_ptds|_ptsz)?$")
GRAPH_LAUNCH = r"^(cudaGraphLaunch|cuGraphLaunch)"
# The calls the parquet store keeps (analyze.read.store): the two above, and the ones that usually launch GPU work.
# The rest are read only for what the analysis needs of them: each process's first call (its capture window), and
# any call that launched a GPU operation after all (a launcher this pattern misses).
KEPT_API = rf"{SYNC_API}|{GRAPH_LAUNCH}|^(cuda|cu)(Launch|GraphLaunch|Memcpy|Memset)"
_SEAM_SUMS = ("idle_ns", "gap_ns", "busy_ns", "overlap_ns", "instances",
             *(f"{c}_bound_{k}" for c in SEAM_CAUSES for k in ("ns", "inst")), "launch_block_ns", "host_late_ns")


class InputError(Exception):
    """The input cannot be analysed; ``str(e)`` says what is wrong and what to do (the CLI: one line, exit 2)."""

    def __init__(self, message: str, code: str = "BAD_INPUT"):
        super().__init__(message)
        self.code = code

    def __reduce__(self) -> tuple[type[InputError], tuple[str, str]]:  # keeps the code when raised in a worker
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
    - ``api``: CUDA runtime and driver calls: ``pid, gtid, corr, start, end, name_id``; from the parquet store
      only the calls the analysis needs (:data:`KEPT_API`, and every call that launched a GPU operation), with
      ``api_first``: each process's first call of all
    - ``ops``: GPU operations: ``pid, device, stream, corr, start, end, kind, name_id, label, in_graph``
      (kind: kernel, memcpy, memset, graph; ``in_graph``: a node of a CUDA graph, traced node by node)
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
    api_first: dict[int, int] | None = None  # pid -> start of its first API call, when ``api`` is not every call
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
        if self.ops["in_graph"].any():
            return "Node"
        return None


def bound_expr() -> pl.Expr:
    """A seam row's dominant cause from its ``<cause>_bound_inst``/``_ns`` columns: the cause with the most
    instances (ties: the most idle time, then the order of :data:`SEAM_CAUSES`); null when none is known."""
    n = {c: pl.col(f"{c}_bound_inst") for c in SEAM_CAUSES}
    t = {c: pl.col(f"{c}_bound_ns") for c in SEAM_CAUSES}

    def beats(x: str, y: str) -> pl.Expr:
        return (n[x] > n[y]) | ((n[x] == n[y]) & (t[x] >= t[y]))

    g, la, h = SEAM_CAUSES
    pick = pl.when(beats(g, la) & beats(g, h)).then(pl.lit(g)).when(beats(la, h)).then(pl.lit(la)).otherwise(pl.lit(h))
    return pl.when(pl.max_horizontal(*n.values()) > 0).then(pick).alias("bound")


def _sum_over_ranks(per_rank: pl.DataFrame, keys: list[str], sums: tuple[str, ...]) -> pl.DataFrame:
    """Sum a per-rank table over ranks (``ranks`` = how many ranks had the row)."""
    have = [c for c in sums if c in per_rank.columns]
    # a column null on every rank (a refused split) stays null rather than summing to 0
    return (
        per_rank.group_by(keys)
        .agg(pl.col("rank").n_unique().alias("ranks"),
             *[pl.when(pl.col(c).is_not_null().any()).then(pl.col(c).sum()).alias(c) for c in have])
        .sort(have[0], *keys, descending=[True] + [False] * len(keys))
    )


@runtime_checkable
class WindowReader(Protocol):
    """Reads the GPU operations of a time window again, when asked (``Result.window``): ``rank, start, end, kind,
    comm``, sorted by start. :class:`analyze.read.source.OpsWindow` (one report, from its store or the export)
    and :class:`analyze.read.source.ManyWindows` (merged reports) implement it."""

    def __call__(self, t0: int, t1: int) -> pl.DataFrame:
        """The operations overlapping ``[t0, t1)`` (ns, on the result's clock)."""
        ...


@dataclass(frozen=True)
class Window:
    """``--window START:END``: cycles ``START <= n < END`` (``unit`` ``cycle``) or cycles whose first GPU op lies
    in that time range on the session clock (``unit`` ``ns``); an open end is None; ``text`` as the user wrote it."""

    unit: str
    start: int | None
    end: int | None
    text: str


@dataclass(frozen=True)
class CycleChoice:
    """Which cycles are the steady state: the user's ``skip_cycles`` (the first N of each rank left out) or
    ``window``, else detected (:mod:`analyze.compute.steady_cycles`). ``segment`` (internal: the what-if per batch
    size) keeps one decode-batch segment's steady cycles only, or several segments' (a tuple)."""

    skip_cycles: int | None = None
    window: Window | None = None
    segment: int | tuple[int, ...] | None = None

    @property
    def chosen(self) -> bool:
        """Whether the cycles are chosen (by the user, or one segment's), not only detected."""
        return self.skip_cycles is not None or self.window is not None or self.segment is not None

    def described(self) -> dict[str, Any]:
        """What was chosen, as the JSON's ``steady.choice`` has it (the window as its text; only what was set)."""
        out: dict[str, Any] = {}
        if self.skip_cycles is not None:
            out["skip_cycles"] = self.skip_cycles
        if self.window is not None:
            out["window"] = self.window.text
        if self.segment is not None:
            out["segment"] = list(self.segment) if isinstance(self.segment, tuple) else self.segment
        return out

    @property
    def key(self) -> str:
        """What the tables derived under this choice are kept under (:mod:`analyze.compute.view`)."""
        return repr(sorted(self.described().items()))


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
    steady state (:class:`CycleChoice`: ``skip_cycles``/``window``; neither = detected).
    ``memo``: the tables derived from this one (:mod:`analyze.compute.view` alone reads and writes it; a copy made
    with :func:`dataclasses.replace` starts with none); ``cached``: where the result cache keeps it
    (:mod:`analyze.read.results`; None for a copy). ``counted_matches``: the collectives matched across ranks
    over the counted instances, packed (:func:`analyze.compute.collectives.packed`), until the steady view takes
    them (None after, and for a merge of several reports: matched again from ``comm_kernels``). :attr:`steady`: the
    steady state (what ``spectrace analyze`` prints first). ``comm_refused``: phases whose matched collectives
    do not end together
    (``domain, phase, collectives, end_spread_p50_ns, bound_ns``): their ``comm_wait_ns``/``comm_transfer_ns``
    are null. ``instances`` rows with ``left_out`` set (cut by a capture window, GPU tail lost, or without
    a counterpart on every rank) are not in ``phases`` or ``seams``.
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
    window: WindowReader | None = field(default=None, repr=False)  # reads ops by time window, when asked
    kernels: pl.DataFrame | None = None
    cycle_choice: CycleChoice = field(default_factory=CycleChoice)
    counted_matches: pl.DataFrame | None = field(default=None, repr=False)
    # Not fields a copy, a pickle or the result cache carries (init=False): the derived tables' storage
    # (analyze.compute.view), and where the result cache keeps this very object (analyze.read.results; a copy may
    # hold other frames or another cycle choice: it is not the cache's).
    memo: dict[tuple[str, ...], Any] = field(default_factory=dict, init=False, repr=False, compare=False)
    cached: Any = field(default=None, init=False, repr=False, compare=False)
    # The key CUDA API calls of each rank (analyze.compute.host.CALL_SCHEMA): what the what-if replays.
    host_calls: pl.DataFrame | None = field(default=None, repr=False)
    # The launching thread's windows in host-bound seams and the kept API calls in them, per rank
    # (analyze.compute.host_windows.WINDOWS and rank): what the host-gap anatomy splits.
    host_windows: pl.DataFrame | None = field(default=None, repr=False)
    # With a graph-level timing pass (analyze.compute.probe): what node-level tracing cost.
    probe_effect: dict[str, Any] | None = None
    comm_refused: pl.DataFrame = field(default_factory=pl.DataFrame)
    # What :attr:`steady` builds (analyze.compute.steady_state.SteadyState), set by analyze.api.analyze: this
    # layer does not import the computations.
    steady_class: Any = field(default=None, repr=False, compare=False)

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k not in ("memo", "cached")}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state, memo={}, cached=None)

    @property
    def steady(self) -> Any:
        """The steady state (:class:`analyze.compute.steady_state.SteadyState`): ``res.steady.phases``,
        ``.seams``, ``.budget``, ``.findings``, ``.tokens``, ``.segments``, ``.cycle_classes``, ... — the
        numbers ``spectrace analyze`` prints, over the steady cycles of :attr:`cycle_choice`. Set on every
        Result :func:`analyze.analyze` returns; ``SteadyState(res)`` for one built otherwise."""
        if self.steady_class is None:
            raise AttributeError("this Result did not come from analyze.analyze: use "
                                 "analyze.SteadyState(res) for its steady state")
        return self.steady_class(self)

    @property
    def phases_all(self) -> pl.DataFrame:
        return _sum_over_ranks(self.phases, ["domain", "phase"], _PHASE_SUMS)

    @property
    def ranges_all(self) -> pl.DataFrame:
        return _sum_over_ranks(self.ranges, ["domain", "range"], _RANGE_SUMS)

    @property
    def seams_all(self) -> pl.DataFrame:
        out = _sum_over_ranks(self.seams, ["parent", "from", "to"], _SEAM_SUMS)
        return out.with_columns(bound_expr()) if "gpu_bound_inst" in out.columns else out

    def ops_between(self, t0: int, t1: int) -> pl.DataFrame:
        """GPU operations overlapping ``[t0, t1)`` on the result's clock: ``rank, start, end, kind, comm``."""
        if self.ops is not None:
            return self.ops.filter((pl.col("end") > t0) & (pl.col("start") < t1)).select(
                "rank", "start", "end", "kind", "comm").sort("start", "rank", "end")
        if self.window is None:
            return pl.DataFrame(schema={"rank": pl.Int64, "start": pl.Int64, "end": pl.Int64, "kind": OP_KIND,
                                        "comm": pl.String})
        return self.window(t0, t1)

    def to_dict(self) -> dict[str, Any]:
        """The JSON document (keys documented in the README)."""
        cov = self.coverage
        d: dict[str, Any] = {
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
            "comm_refused": self.comm_refused.to_dicts(),
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
        if self.probe_effect is not None:
            d["probe_effect"] = self.probe_effect
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
    refused: pl.DataFrame = field(default_factory=pl.DataFrame)  # phases without wait/straggler numbers, and why
    left_out_kernels: int = 0  # kernels of instances left out by the cross-rank pairing (not matched)
    cycles: str | None = None  # which cycles the phases' collectives come from (the steady state's sentence)
    outside_cycles: int = 0  # matched kernels of phase instances outside those cycles (warm-up, rare stalls)
    straggler: pl.DataFrame = field(default_factory=pl.DataFrame)  # the one verdict per phase (compute.straggler)
    matched_collectives: int = 0  # collectives matched (the rows of ``matched`` are per collective and rank)

    def to_dict(self) -> dict[str, Any]:
        """The JSON document: ``collectives`` and ``stragglers`` keys as in the README."""
        return {
            "spectrace_version": __version__,
            "reports": self.reports,
            "selection": self.selection,
            "clock": self.clock,
            "ranks": self.ranks.to_dicts(),
            "matching": {
                "comm_kernels": self.kernels.height + self.left_out_kernels,
                "matched_kernels": self.matched.height,
                "matched_collectives": self.matched_collectives,
                "unmatched_kernels": self.kernels.height - self.matched.height,
                "left_out_kernels": self.left_out_kernels,
            },
            "refused": self.refused.to_dicts(),
            "cycles": self.cycles,
            "outside_cycles_kernels": self.outside_cycles,
            "collectives": self.collectives.to_dicts(),
            "stragglers": self.stragglers.to_dicts(),
            "straggler": self.straggler.to_dicts(),
            "mismatches": self.mismatches.with_columns(
                pl.col("counts").list.eval(pl.element().struct.field("n")).alias("per_rank")
            ).drop("counts").to_dicts(),
            "diagnostics": [d.as_dict() for d in self.diagnostics],
        }
