"""The analysis pipeline, the only copy: per process, then global; one report or many.

Attribution and every per-instance number are per process (an op joins its own process's API calls,
ranges and GPU), so :func:`process` runs the whole per-process body over one process of a *source*
(:mod:`analyze.read.source`: frames in memory, or the parquet store) and returns small frames:
instances, seams, coverage, its communication kernels numbered for matching, one rank row, and
counts for the diagnostics. :func:`result_of` maps it over the processes (two at a time in threads
when they are small enough) and then runs the global steps once, on those small frames: rank
numbering, per-phase sums, cross-rank collective matching, diagnostics.

:func:`results_of` maps :func:`result_of` over several reports (worker processes, or any executor
such as a Dask cluster's) and :func:`merge_results` makes one result of them: ranks numbered across reports in the
order given; communication matched across all ranks with the clock alignment of
:func:`analyze.compute.collectives.cross_rank`.
"""

from __future__ import annotations

import dataclasses
import filecmp
import multiprocessing
import os
import signal
import stat
from collections.abc import Sequence
from concurrent.futures import Executor, ProcessPoolExecutor, ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import polars as pl

from ..model import GRAPH_LAUNCH, SYNC_API, Diagnostic, InputError, Result, Trace
from ..read import packed_keys, results
from ..read.export import RUNTIME
from ..read.protocols import ProcessSource, ShowProgress, no_progress
from ..read.source import ManyWindows, OpsWindow, StoreSource, open_source
from ..read.store.install import discard, existing_store, open_store
from ..read.store.reader import CacheError
from . import attribute, breakdown, collectives, host, host_windows, repeated_rows, windows, workers
from .comm_patterns import PATTERNS, CommPattern, family_expr
from .diagnostics import FACTS, diagnose, duplicate_rows
from .scalars import to_int

if TYPE_CHECKING:
    from ..read.store.reader import Store

__all__ = ["ProcessContext", "ProcessResult", "op_kinds", "process", "result_of", "result_for_merge", "merge_results",
           "results_of"]

_T = TypeVar("_T")
_WORK_COLS = ("pid", "device", "corr", "start", "end", "kind", "name_id", "label", "in_graph")  # of OPS_SCHEMA
_WORKER_ROWS = 3_000_000  # two processes at once up to this size: 20 M kernels (2.6 M per process) peak 3.4 GB either way


def _select_phases(path: str, ranges_df: pl.DataFrame, has_ops: bool, regex: str | None) -> tuple[pl.DataFrame, str]:
    """The phase ranges of an export and how they were chosen, or a one-line InputError saying what is missing."""
    if ranges_df.height == 0:
        raise InputError(
            f"{path}: no NVTX ranges in this export; profile with -t cuda,nvtx and SPECTRACE_HOOKS=1 "
            "(or annotate the workload with nvtx_hooks.ranges)",
            "NO_NVTX",
        )
    if not has_ops:
        raise InputError(
            f"{path}: no CUDA trace in this export (no kernel, memcpy, memset or graph rows); "
            "profile with nsys profile -t cuda,nvtx",
            "NO_CUDA",
        )
    sel, how = attribute.select_ranges(ranges_df, regex)
    if sel.height == 0:
        top = (ranges_df.group_by("domain", "range").len().sort("len", "domain", "range", descending=[True, False, False])
               .head(8).select(pl.format("{}:{}", "domain", "range")).to_series().to_list())
        raise InputError(
            f"{path}: no NVTX ranges selected ({how}); pass --ranges REGEX, e.g. one of: {', '.join(top)}",
            "NO_PHASES",
        )
    return sel, how


def op_kinds(keys: pl.DataFrame, names: pl.DataFrame, patterns: list[CommPattern]) -> pl.DataFrame:
    """Each distinct (``name_id``, ``label``) of the ops with its ``name`` and ``comm`` family.

    Names are classified once each here: regexes never run per operation.
    """
    kinds = keys.join(names, on="name_id", how="left").with_columns(name=pl.coalesce("name", "label"))
    return kinds.with_columns(comm=family_expr(pl.col("name"), patterns))


def _add_kinds(ops: pl.DataFrame, kinds: pl.DataFrame, cols: list[str]) -> pl.DataFrame:
    """``ops`` with columns ``cols`` of their row in :func:`op_kinds`: a lookup by ``name_id`` (kernels)
    or ``label`` (copies, memsets, graphs), cheaper than a join on both. Columns keep their type in ``kinds``.
    """
    by_id, by_label = kinds.filter(pl.col("name_id").is_not_null()), kinds.filter(pl.col("name_id").is_null())
    if by_id["name_id"].is_duplicated().any():  # one name id under several labels: join on both
        return ops.join(kinds.select("name_id", "label", *cols), on=["name_id", "label"], how="left", nulls_equal=True)
    return ops.with_columns(
        pl.when(pl.col("name_id").is_not_null())
        .then(pl.col("name_id").replace_strict(by_id["name_id"], by_id[c], default=None))
        .otherwise(pl.col("label").replace_strict(by_label["label"], by_label[c], default=None))
        .alias(c)
        for c in cols
    )


_DENSE_IDS = 1 << 20  # name ids below this are looked up in an array (8 MB at most), not hashed


def _kind_codes(ops: pl.DataFrame, kinds: pl.DataFrame) -> pl.Series:
    """Each op's row number in :func:`op_kinds` (``_kind``, Int64; null for a key not there): the one lookup per
    op, every column of ``kinds`` is then a gather by it.

    Name ids (string ids: small integers) index an array of codes, one gather; only the few ops without a name id
    (copies, memsets) look their label up. The lookup of :func:`_add_kinds` when ids repeat or do not fit."""
    codes = kinds.select("name_id", "label").with_row_index("_kind").with_columns(pl.col("_kind").cast(pl.Int64))
    by_id, by_label = codes.filter(pl.col("name_id").is_not_null()), codes.filter(pl.col("name_id").is_null())
    lo, hi = by_id["name_id"].min(), by_id["name_id"].max()
    if (not isinstance(lo, int) or not isinstance(hi, int) or lo < 0 or hi >= _DENSE_IDS
            or by_id["name_id"].is_duplicated().any()):
        return _add_kinds(ops.select("name_id", "label"), codes, ["_kind"])["_kind"]
    table = pl.Series([None] * (hi + 1), dtype=pl.Int64).scatter(by_id["name_id"], by_id["_kind"])
    nid = pl.col("name_id")
    out = ops.select(pl.when(nid.is_between(0, hi)).then(pl.lit(table).gather(nid.clip(0, hi))).alias("_kind"))
    code = out["_kind"]
    bare = ops.select(pl.arg_where(nid.is_null()).alias("_i"))["_i"]  # ops keyed by their label
    if bare.len():
        code = code.scatter(bare, ops["label"].gather(bare).replace_strict(by_label["label"], by_label["_kind"],
                                                                            default=None))
    return code


def _gather_kinds(kinds: pl.DataFrame, cols: list[str]) -> list[pl.Expr]:
    """Columns ``cols`` of :func:`op_kinds` for ops with ``_kind`` (:func:`_kind_codes`)."""
    return [pl.lit(kinds[c]).gather(pl.col("_kind")).alias(c) for c in cols]


@dataclasses.dataclass
class ProcessContext:
    """What every process body shares: the selected ranges, op kinds, devices, graph-launch API names."""

    nested: pl.DataFrame
    kinds: pl.DataFrame
    devices: pl.DataFrame
    launch_ids: pl.Series
    keep_ops: bool
    sync_ids: pl.Series = dataclasses.field(default_factory=lambda: pl.Series("name_id", [], pl.Int64))
    graphs: bool = True  # which CUDA graphs each range launched (segments without a payload batch size)
    cycle_index: bool = True  # the payload's cycle index identifies cycles (windows.cycle_index_problem)
    api_kinds: pl.DataFrame | None = None  # name_id, what of the kept API names (host_windows.api_kinds)


@dataclasses.dataclass
class ProcessResult:
    """What :func:`process` measured of one process: small frames and counts, merged by :func:`result_of`.

    Ranks are provisional (one process cannot know its rank among the others: renumbered globally). A frame is
    None when the process has none of it: no GPU operation (then only ``instances``, when it opened ranges) or,
    for ``ops``, when the operations are not kept.
    """

    facts: dict[str, int]
    """The counts of :data:`analyze.compute.diagnostics.FACTS` (graph rows, orphan launches, duplicates, ...)."""
    ranks: pl.DataFrame
    """One row (its device, GPU operations and window) or none: :func:`analyze.compute.breakdown.ranks`."""
    kernel_stats: pl.DataFrame
    """GPU operations inside selected ranges summed per range instance and name (:func:`_kernel_stats`)."""
    instances: pl.DataFrame | None = None
    """Every instance of its selected ranges, measured (becomes ``Result.instances``)."""
    seams: pl.DataFrame | None = None
    """The gaps between consecutive instances, with their causes (becomes ``Result.seam_instances``)."""
    coverage: pl.DataFrame | None = None
    """How much of its GPU time the selected ranges cover (:func:`analyze.compute.breakdown.coverage`)."""
    comm_kernels: pl.DataFrame | None = None
    """Its communication kernels numbered within their instance, for matching across ranks."""
    host_calls: pl.DataFrame | None = None
    """The key host calls of :mod:`analyze.compute.host` (synchronisations, graph launches)."""
    host_windows: pl.DataFrame | None = None
    """The launching thread's windows in host-bound seams and the API calls in them (:mod:`.host_windows`)."""
    ops: pl.DataFrame | None = None
    """Every GPU operation with its range and name (only with ``keep_ops``)."""


def process(source: ProcessSource, pid: int, ctx: ProcessContext) -> ProcessResult:
    """The per-process body: attribute one process's GPU ops to its ranges and measure every instance."""
    # Only the columns the analysis reads (the stream is not one), unless every op is kept.
    cols = None if ctx.keep_ops else (*_WORK_COLS, "graph") if ctx.graphs else _WORK_COLS
    ops, (api, dup_api, api_twins) = source.ops(pid, cols), repeated_rows.api_calls_once(source.api(pid))
    nested = ctx.nested.filter(pl.col("pid") == pid)
    rk = breakdown.ranks(ops, ctx.devices)  # one row (or none): its rank is fixed once all processes are in
    rk = rk.with_columns(pl.lit(v, pl.Int64).alias(k)
                         for k, v in windows.rank_window(ops, source.api_first(pid), nested).items())
    node_ops, graph_ops = int(ops["in_graph"].sum()), int((ops["kind"] == "graph").sum())
    if not ctx.keep_ops:  # the device and graph node flag are done with: narrower copies below
        ops = ops.drop("device", "in_graph")
    # One lookup of each op's kind (name, communication family), a gather per column after.
    ops = ops.with_columns(_kind=_kind_codes(ops, ctx.kinds))
    tl = attribute.timeline(nested)  # who launched what, and the range open around a call: one timeline
    if ctx.keep_ops:
        ops = ops.with_columns(_gather_kinds(ctx.kinds, ["comm"]))
        calls = attribute.launching_calls(ops, api, nested, tl)
        ops = attribute.join_calls(ops, calls)
        per_call = None
        unmatched = int(ops["gtid"].null_count())
    else:
        # The columns the rest reads, sorted by start once (the kind code stands for the name id and label, a flag
        # for the communication family); each launching call looked up once for all the ops it launched.
        is_comm = pl.lit(ctx.kinds["comm"].is_not_null()).gather(pl.col("_kind")).fill_null(False)
        launch_graphs = _launch_graphs(ops, ctx.graphs)  # (the few rows before the sort: it keeps no graph column)
        ops = (ops.select("corr", "start", "end", "_kind", _c=is_comm, _kernel=pl.col("kind") == "kernel")
               .sort("start").with_columns(pid=pl.lit(pid, pl.Int64)))
        per_call, range_id = attribute.per_call(ops, api, nested, tl)
        ops = ops.with_columns(range_id=range_id)
        calls = per_call  # (its rows without a call have no name id: not launches)
        unmatched = int(per_call.filter(pl.col("gtid").is_null())["ops"].sum())
    # The CUDA graphs each range launched (a few pairs): a cycle's graphs name its batch shape without a payload.
    if per_call is None:
        graphs = _launch_graphs(ops.with_columns(_r=pl.col("range_id")), ctx.graphs)
    else:
        ranges = per_call.select("corr", _r="range_id").filter(pl.col("corr").is_in(launch_graphs["corr"].implode()))
        graphs = launch_graphs.join(ranges, on="corr", how="left")  # (a join of the few launches' rows only)
    graphs = graphs.select(range_id="_r", graph="graph").filter(pl.col("range_id").is_not_null()).unique()
    rank = rk["rank"][0] if rk.height else None
    nested = nested.with_columns(rank=pl.lit(rank, pl.Int64))
    is_launch = pl.col("name_id").is_in(ctx.launch_ids.implode())
    launches = int(api.select(is_launch.sum()).item())
    launched = calls.filter(pl.col("api_name_id").is_in(ctx.launch_ids.implode())).height
    del calls
    # Graph launches without GPU rows inside the process's GPU window (lost mid-run: a number is short of them);
    # those before its first or after its last GPU op were only outside the captured window.
    orphans_inside = 0
    if launches > launched and ops.height:
        lo, hi = ops["start"].min(), ops["end"].max()
        launchers = ops.select("corr").unique() if per_call is None else per_call.select("corr")
        orphans_inside = (api.filter(is_launch & pl.col("start").is_between(lo, hi))
                          .join(launchers, on="corr", how="anti").height)
    # The key host calls, the first call of each instance and per-instance counts (none without GPU work).
    host_parts = host.calls(ops, api, nested, ctx.sync_ids, ctx.launch_ids, tl, per_call) if ops.height else None
    api_cols = api.select("corr", "gtid", "start", "end", "name_id") if host_parts is not None else None
    del api
    facts = {
        "graph_ops": graph_ops,
        "node_ops": node_ops,
        "graph_launches": launches,
        "orphan_launches": launches - launched,
        "orphan_launches_inside": orphans_inside,
        "unmatched_ops": unmatched,
        "api_twins": api_twins,
        "duplicate_api": dup_api,
    }
    # The rank goes on the few rows that keep it (communication kernels, kernel statistics), not on every op.
    is_comm = ((pl.col("kind") == "kernel") & pl.col("comm").is_not_null() if ctx.keep_ops
               else pl.col("_kernel") & pl.col("_c"))
    comm = (ops.lazy().filter(is_comm)
            .select(pl.lit("kernel").alias("kind"), "range_id", "corr", "start", "end", "_kind")  # what comm_kernels reads
            .with_columns(*_gather_kinds(ctx.kinds, ["comm", "name"]), rank=pl.lit(rank, pl.Int64)).collect())
    out = ProcessResult(facts, rk, _kernel_stats(ops, ctx.kinds, rank, nested))
    if ctx.keep_ops:
        kept = [c for c in ops.columns if c != "_kind"]
        out.ops = ops.with_columns(*_gather_kinds(ctx.kinds, ["name"]), rank=pl.lit(rank, pl.Int64)).select(
            *kept[: kept.index("comm")], pl.col("name").cast(pl.String), *kept[kept.index("comm"):], "rank")
        # The interval steps read only these columns: a narrow copy halves the memory of the inclusive view.
        ops = ops.select("pid", "range_id", "corr", "start", "end", "comm", "api_start").sort("start")
    else:
        ops = ops.select("pid", "range_id", "corr", "start", "end", "_c")
    facts["duplicate_ops"] = repeated_rows.duplicate_ops(ops)
    if host_parts is not None:  # (the same rows: ops has GPU work)
        key_calls, firsts, per_inst = host_parts
        anc = attribute.ancestors(nested)
        inst = breakdown.measure_instances(nested, ops, anc, per_call)
        blocks = breakdown.gpu_blocks(ops)
        inst = windows.with_cycle(breakdown.add_gpu_idle(inst, blocks), anc, ctx.cycle_index)
        out.seams = host.seam_causes(breakdown.measure_seams(inst, blocks), firsts)
        if api_cols is not None and ctx.api_kinds is not None:
            out.host_windows = host_windows.host_windows(out.seams, firsts, api_cols, ctx.api_kinds, pid)
        del api_cols
        out.coverage = breakdown.coverage(inst, ops, blocks)
        out.instances = _with_graphs(host.add_instance_cols(inst, per_inst), graphs, anc)
        out.host_calls = key_calls
        # Collective matching is global, but each kernel's ordinal j in its instance is per rank.
        out.comm_kernels = collectives.comm_kernels(comm, inst).with_columns(pid=pl.lit(pid, pl.Int64))
    elif nested.height:  # API calls but no GPU work: its ranges still count as instances
        out.instances = _without_gpu(nested, ops)
    return out


def _with_graphs(inst: pl.DataFrame, graphs: pl.DataFrame, anc: pl.DataFrame) -> pl.DataFrame:
    """``inst`` with ``i_graphs``: the CUDA graphs launched inside each instance (itself and its descendants), as
    sorted ids joined by ``+`` (``"2+5"``); null when none."""
    if graphs.height == 0:
        return inst.with_columns(i_graphs=pl.lit(None, pl.String))
    pairs = graphs.join(anc, on="range_id").select(range_id="anc", graph="graph").unique()
    pairs = pairs.join(pairs.group_by("range_id").agg(_n=pl.len()), on="range_id")
    # Most instances launched one graph: its id as it is; only the others' ids are sorted and joined, per instance.
    sig = pl.concat([pairs.filter(pl.col("_n") == 1).select("range_id", i_graphs=pl.col("graph").cast(pl.String)),
                     pairs.filter(pl.col("_n") > 1).group_by("range_id")
                     .agg(i_graphs=pl.col("graph").sort().cast(pl.String).str.join("+"))])
    return inst.join(sig, on="range_id", how="left", maintain_order="left")


def _launch_graphs(ops: pl.DataFrame, graphs: bool) -> pl.DataFrame:
    """The CUDA graph of each launch that has one (``corr, graph``, and ``_r`` where ``ops`` have it), when graphs
    are wanted. One op per launch is enough (a launch's ops share its correlation id, range and graph): dropping
    each op whose correlation id repeats the previous row's leaves a few rows to make unique, whatever the row
    order."""
    cols = ["corr", "graph", *(["_r"] if "_r" in ops.columns else [])]
    if "graph" not in ops.columns or not graphs:
        return pl.DataFrame(schema={"corr": pl.Int64, "graph": pl.Int32, "_r": pl.Int64}).select(cols)
    new_launch = (pl.col("corr") != pl.col("corr").shift(1)).fill_null(True)
    return ops.lazy().select(cols).filter(pl.col("graph").is_not_null() & new_launch).unique().collect()


def _payload_batches(sel: pl.DataFrame) -> bool:
    """Whether the selected ranges carry the hooks' payload with a batch size (then segments need no graph ids)."""
    from .payload import decode_exprs

    cols = [c for c in ("uint64", "int64") if c in sel.columns]
    if not cols or sel.height == 0:
        return False
    v = sel.select(cols).with_columns(pl.lit(None, pl.Int64).alias(c) for c in ("uint64", "int64")
                                      if c not in cols)
    return bool(v.select(decode_exprs()[0].is_not_null().any()).item())


def _kernel_stats(ops: pl.DataFrame, kinds: pl.DataFrame, rank: int | None, nested: pl.DataFrame) -> pl.DataFrame:
    """GPU operations inside selected ranges summed per (process, range instance, name): ``count, kernel_ns``.

    One process (rank ``rank``; ``nested``: its ranges, which the ops' range ids are of): grouped on one integer key
    (range instance × kind of op: ``_kind``, see :func:`_kind_codes`; :func:`analyze.read.packed_keys.bounded`, the
    two columns if they do not pack), the names, process and rank added after; nothing per operation but that key."""
    # (range ids from 0 to the process's highest, kinds from 0 to n - 1: no pass over the ops to measure them; a null
    # in either: a null key)
    lo, hi = nested["range_id"].min(), nested["range_id"].max()
    instance_kind = packed_keys.bounded(["range_id", "_kind"], [(min(to_int(lo or 0), 0), to_int(hi or 0)),
                                                                (0, max(kinds.height - 1, 0))])
    if instance_kind is None:
        by, known = [pl.col("range_id", "_kind")], pl.col("_kind").is_not_null()
    else:
        by, known = [instance_kind.key("key")], pl.col("key").is_not_null()
    # Lazy: the four columns it reads projected first (an eager group-by of the wide frame takes twice as long).
    per = (ops.lazy().filter(pl.col("range_id").is_not_null())
           .group_by(*by)
           .agg(count=pl.len(), kernel_ns=(pl.col("end") - pl.col("start")).sum())
           .filter(known).collect())
    names = kinds.select("name").with_row_index("_kind").with_columns(pl.col("_kind").cast(pl.Int64))
    if instance_kind is not None:
        per = per.with_columns(instance_kind.unpacked("key"))
    per = per.join(names, on="_kind", how="left")
    if kinds["name"].null_count() == 0 and kinds["name"].n_unique() == kinds.height:
        # each name is one kind: a (range, name) is one (range, kind), already summed (no second group-by)
        per = per.with_columns(pl.col("count").cast(pl.Int64))
    else:
        per = per.group_by("range_id", "name").agg(pl.col("count").sum().cast(pl.Int64), pl.col("kernel_ns").sum())
    return (per.with_columns(pid=pl.lit(ops["pid"][0] if ops.height else None, pl.Int64),
                             rank=pl.lit(rank if ops.height else None, pl.Int64))
            .select("pid", "rank", "range_id", "name", "count", "kernel_ns"))


def _without_gpu(nested: pl.DataFrame, ops: pl.DataFrame) -> pl.DataFrame:
    """Instances of ranges whose process ran no GPU work (every metric zero)."""
    return host.add_instance_cols(breakdown.measure_instances(nested, ops, attribute.ancestors(nested)).with_columns(
        x_gpu_idle_ns=pl.lit(0, pl.Int64), i_gpu_idle_ns=pl.lit(0, pl.Int64)), None)


def result_of(
    report: str | os.PathLike | Trace | Store,
    ranges: str | None = None,
    comm_patterns: list[CommPattern] | None = None,
    *,
    store: bool | None = None,
    cache: bool | None = None,
    keep_ops: bool = False,
    progress: ShowProgress | None = None,
    workers: int = 2,
) -> Result:
    """Attribute the GPU work of one nsys export to phases (see the README for the definitions).

    ``report``: a SQLite export, a parquetdir/arrowdir directory, a loaded :class:`~analyze.model.Trace`
    or an opened store. ``ranges``: the phase regex (default: the spectrace domain). ``store``/``cache``:
    where the rows live (:func:`analyze.read.source.open_source`; by default: in memory for small exports,
    the parquet store beside the report for large ones, any valid cache reused). ``keep_ops``: keep every
    GPU operation in ``Result.ops`` (memory grows with the trace). ``workers``: processes analysed at once.
    ``progress``: meters of the store's build and of the analysis (None: none; :func:`analyze.api.analyze` passes
    the terminal's bar, :func:`analyze.output.progress.terminal_bar`).
    """
    try:
        return _cached_or_run(report, store, cache, progress, ranges, comm_patterns, keep_ops, workers)
    except CacheError as e:
        if e.store is None:  # a temporary store, or a cache just built: nothing to rebuild
            raise
        broken = e.store
    # A kept cache that could not be read: rebuilt once (from the report the caller gave; unless another process
    # has replaced that build meanwhile), and analysed again from scratch.
    root = broken.root
    path = report if isinstance(report, str | os.PathLike) else broken.meta["report"]
    try:
        fresh = open_store(path, progress=progress, cache_dir=root, broken=broken.meta.get("build"))
        return _cached_or_run(fresh, store, cache, progress, ranges, comm_patterns, keep_ops, workers)
    except CacheError as e:
        if e.store is not None:  # not kept: it could not be read twice (only that build: never another's)
            discard(e.store.root, e.store.meta.get("build"))
        why = str(e).removeprefix(f"{root}: ")
        raise CacheError(f"{root}: the cache cannot be read even after a rebuild ({why}); check the disk, or set "
                         "SPECTRACE_CACHE_DIR to another place", "CACHE_BROKEN") from None


def _cached_or_run(report, store, cache, progress, ranges, comm_patterns, keep_ops, workers) -> Result:
    if isinstance(report, str | os.PathLike) and not keep_ops and cache is not False and store is not False:
        found = existing_store(report)  # a kept result is read before the source is opened (its head, checks)
        if found is not None:
            from ..read.manifest import read_manifest

            key = results.result_key(str(Path(report)), found.meta.get("build"), ranges, comm_patterns,
                                     read_manifest(str(Path(report))))
            res = results.load(found.root, key)
            if res is not None:
                return res
    source = open_source(report, store=store, cache=cache, progress=progress)
    try:
        kept = getattr(source, "store", None)
        if keep_ops or kept is None or not kept.kept:  # the result cache lives in a kept store only
            return _run(source, ranges, comm_patterns, keep_ops, progress, workers)
        from ..read.manifest import read_manifest  # the cycles' tokens may come from it: part of the key

        key = results.result_key(source.path, kept.meta.get("build"), ranges, comm_patterns,
                                 read_manifest(source.path))
        res = results.load(kept.root, key)
        if res is None:
            res = _run(source, ranges, comm_patterns, keep_ops, progress, workers)
            results.save(kept.root, key, res)
        return res
    finally:
        source.close()


def _run(source: ProcessSource, ranges: str | None, comm_patterns: list[CommPattern] | None, keep_ops: bool,
         progress: ShowProgress | None, workers: int) -> Result:
    head = source.head
    patterns = comm_patterns if comm_patterns is not None else list(PATTERNS)
    diags: list[Diagnostic] = list(source.notes)
    key = [c for c in head.ranges.columns if c != "range_id"]
    unique_ranges = head.ranges.unique(key, keep="first", maintain_order=True)
    if unique_ranges.height < head.ranges.height:  # an export appended to: each range once (DUPLICATE_ROWS)
        diags.append(duplicate_rows("NVTX ranges", head.ranges.height - unique_ranges.height))
        head = dataclasses.replace(head, ranges=unique_ranges)
    sel, how = _select_phases(head.path, head.ranges, any(source.ops_rows.values()), ranges)
    if not any(source.api_first(p) is not None for p in source.pids):
        raise InputError(f"{head.path}: no CUDA API calls in this export (CUPTI_ACTIVITY_KIND_RUNTIME "
                         f"{'empty' if RUNTIME in head.tables else 'missing'}): no GPU work can be attributed to the "
                         "ranges that launched it; profile with nsys profile -t cuda,nvtx and export every table",
                         "NO_CUDA_API")
    diags.append(Diagnostic("info", "RANGE_SELECTION", f"phases are {how}: {sel.height} range instances"))
    nested_all = attribute.nest(sel)
    kinds = op_kinds(source.op_keys(), head.names, patterns)
    # Kernel names are long and repeat millions of times: Categorical until the Result is handed out.
    kinds = kinds.with_columns(pl.col("name").cast(pl.Categorical))
    launch_ids = head.names.filter(pl.col("name").str.contains(GRAPH_LAUNCH))["name_id"]
    sync_ids = head.names.filter(pl.col("name").str.contains(SYNC_API))["name_id"]
    bad_index = windows.cycle_index_problem(sel)
    if bad_index:
        diags.append(Diagnostic("warning", "PAYLOAD_CYCLE_INDEX", bad_index))
    ctx = ProcessContext(nested_all, kinds, head.devices, launch_ids, keep_ops, sync_ids,
                         graphs=not _payload_batches(sel), cycle_index=bad_index is None,
                         api_kinds=host_windows.api_kinds(head.names))

    pids = source.pids
    bar = (progress or no_progress)(sum(source.ops_rows.values()), "spectrace: analysing")

    def one(pid: int) -> ProcessResult:
        out = process(source, pid, ctx)
        bar.add(source.ops_rows.get(pid, 0))
        return out

    # Processes in parallel threads (polars releases the GIL): ``workers`` processes' ops in memory at once,
    # one at a time when a process has more than WORKER_ROWS ops (memory stays bounded by the largest one).
    biggest = max([*source.ops_rows.values(), 0])
    n = max(1, workers if biggest <= _WORKER_ROWS else 1)
    store_source = source if isinstance(source, StoreSource) else None
    if store_source is not None:  # what it reads together (a columnar export: fewer scans of its files)
        store_source.read_in_order(pids, n)
    try:
        with ThreadPoolExecutor(max_workers=n) as ex:
            outs = list(ex.map(one, pids) if n > 1 else map(one, pids))
    finally:
        if store_source is not None:
            store_source.read_in_order([], 0)
    bar.close()
    parts = _Parts.of(outs)
    del outs
    # Ranges of processes without any GPU op or API call still count as (empty) instances.
    rest = nested_all.filter(~pl.col("pid").is_in(pids))
    if rest.height:
        parts.instances.append(_without_gpu(rest.with_columns(rank=pl.lit(None, pl.Int64)),
                                            _empty_ops(source.head.ops)))
    facts = {k: sum(f[k] for f in parts.facts) for k in FACTS}

    # Global: rank numbers in device order.
    rk = pl.concat(parts.ranks).filter(pl.col("gpu_ops") > 0)
    rk = rk.sort("device", "pid").with_columns(rank=pl.int_range(pl.len()).cast(pl.Int64))
    pid_rank = dict(zip(rk["pid"].to_list(), rk["rank"].to_list()))

    def renumber(df: pl.DataFrame) -> pl.DataFrame:
        return df.with_columns(rank=pl.col("pid").replace_strict(pid_rank, default=None, return_dtype=pl.Int64))

    inst = renumber(pl.concat(parts.instances, how="diagonal_relaxed")).sort("range_id")
    nested = renumber(nested_all.with_columns(rank=pl.lit(None, pl.Int64)))
    seam_inst = renumber(pl.concat(parts.seams)) if parts.seams else pl.DataFrame()
    cov = renumber(pl.concat(parts.coverage)).sort("rank") if parts.coverage else pl.DataFrame()
    kern = renumber(pl.concat(parts.comm_kernels)).drop("pid") if parts.comm_kernels else _no_kernels()
    ops = renumber(pl.concat(parts.ops)).sort("start") if keep_ops and parts.ops else None
    kstat = renumber(pl.concat(parts.kernel_stats)).drop("pid") if parts.kernel_stats else None  # names Categorical
    calls = renumber(pl.concat(parts.host_calls)) if parts.host_calls else pl.DataFrame(schema=host.CALL_SCHEMA)
    hw = (renumber(pl.concat(parts.host_windows)) if parts.host_windows
          else pl.DataFrame(schema=host_windows.WINDOWS).with_columns(rank=pl.lit(None, pl.Int64)))
    del parts
    graph_rows = "Graph" if facts["graph_ops"] else ("Node" if facts["node_ops"] else None)
    head = dataclasses.replace(head, graph_rows=graph_rows)
    # Cycles paired across ranks; instances cut by a capture window or unpaired are left out of the sums.
    paired = windows.pair(inst, kern, rk)
    inst, kern = paired.instances, paired.kernels
    counted = inst.filter(pl.col("left_out").is_null())
    seam_inst = _counted_seams(seam_inst, inst)
    phases = breakdown.sum_phases(counted).join(host.phase_host(counted), on=["rank", "domain", "phase"], how="left",
                                            maintain_order="left")
    diags.extend(diagnose(head, nested, facts, rk, inst, cov, phases))
    diags.extend(paired.diagnostics)
    phases, comm_diags, refused, matched = collectives.phase_comm_split(phases, kern)
    diags.extend(comm_diags)
    marks = head.marks.with_columns(rank=pl.col("pid").replace_strict(pid_rank, default=None, return_dtype=pl.Int64))
    window = OpsWindow(head.path, str(source.store_root) if source.store_root else None,
                       rk.select("pid", "rank"), kinds.select("name_id", "label", "comm"))
    return Result(
        trace=head,
        selection=how,
        ranks=rk,
        instances=inst,
        phases=phases,
        ranges=breakdown.projections(counted),
        seam_instances=seam_inst,
        seams=breakdown.sum_seams(seam_inst, inst),
        coverage=cov,
        comm_kernels=kern,  # names Categorical: they repeat millions of times (every table casts them back)
        ops=ops,
        marks=marks.select("rank", *head.marks.columns),
        diagnostics=diags,
        reports=[head.path],
        window=window,
        kernels=kstat,
        host_calls=calls,
        host_windows=hw,
        comm_refused=refused.filter(pl.col("phase").is_not_null()),
        counted_matches=collectives.packed(matched),  # the steady view narrows it to the steady cycles
    )


@dataclasses.dataclass
class _Parts:
    """The :class:`ProcessResult` of every process, field by field, in process order (those it has)."""

    facts: list[dict[str, int]]
    ranks: list[pl.DataFrame]
    kernel_stats: list[pl.DataFrame]
    instances: list[pl.DataFrame]
    seams: list[pl.DataFrame]
    coverage: list[pl.DataFrame]
    comm_kernels: list[pl.DataFrame]
    host_calls: list[pl.DataFrame]
    host_windows: list[pl.DataFrame]
    ops: list[pl.DataFrame]

    @classmethod
    def of(cls, outs: list[ProcessResult]) -> _Parts:
        return cls(**{f.name: [v for o in outs if (v := getattr(o, f.name)) is not None]
                      for f in dataclasses.fields(ProcessResult)})


def _counted_seams(seam_inst: pl.DataFrame, inst: pl.DataFrame) -> pl.DataFrame:
    """The seams between two counted instances (neither left out by :func:`windows.pair`)."""
    if seam_inst.height == 0:
        return seam_inst
    out = inst.filter(pl.col("left_out").is_not_null())["range_id"].implode()
    return seam_inst.filter(~pl.col("range_id").is_in(out) & ~pl.col("prev_range_id").is_in(out))


def _empty_ops(schema_of: pl.DataFrame) -> pl.DataFrame:
    return schema_of.head(0).with_columns(
        pl.lit(None, pl.Int64).alias(c) for c in ("gtid", "range_id", "api_start", "api_name_id", "rank")
    ).with_columns(comm=pl.lit(None, pl.String), name=pl.lit(None, pl.String))


def _no_kernels() -> pl.DataFrame:
    return pl.DataFrame(schema={"rank": pl.Int64, "domain": pl.String, "phase": pl.String, "k": pl.Int64,
                                "name": pl.Categorical, "j": pl.Int64, "range_id": pl.Int64, "corr": pl.Int64,
                                "comm": pl.String, "start": pl.Int64, "end": pl.Int64})


# ---- several reports ------------------------------------------------------------------------------------


def result_for_merge(path: str, ranges: str | None, comm_patterns: list[CommPattern] | None,
                      store: bool | None, cache: bool | None) -> Result:
    """:func:`result_of` of one report for :func:`merge_results`: the unit a worker process, Ray or Dask task runs."""
    return result_of(path, ranges, comm_patterns, store=store, cache=cache)


def _offset(df: pl.DataFrame, base: int, i: int) -> pl.DataFrame:
    if "rank" not in df.columns:
        return df
    return df.with_columns(pl.col("rank") + base, report=pl.lit(i, pl.Int32))


def merge_results(results: list[Result]) -> Result:
    """One result from several reports' (see the module docstring)."""
    if len(results) == 1:
        return results[0]
    # Instances paired across the ranks of every report again; phases and seams summed over the counted ones.
    paired = windows.pair_reports(results)
    comm = collectives.cross_rank(results, paired)
    every = ("ranks", "seam_instances", "coverage", "marks")  # frames every Result has
    maybe = ("kernels", "host_calls", "host_windows")  # frames a Result may lack
    parts: dict[str, list[pl.DataFrame]] = {k: [] for k in (*every, *maybe)}
    diags: list[Diagnostic] = []
    windows_, base = [], 0
    mine = ("INSTANCE_PAIRING", *windows.CODES, "COMM_")
    for i, r in enumerate(results):
        for k in parts:
            if getattr(r, k) is not None:
                parts[k].append(_offset(getattr(r, k), base, i))
        if isinstance(r.window, OpsWindow):  # one report's (merged results are not merged again)
            windows_.append(dataclasses.replace(r.window, rank_offset=base))
        diags += [Diagnostic(d.level, d.code, f"report {i} ({Path(r.trace.path).name}): {d.message}")
                  for d in r.diagnostics if not d.code.startswith(mine)]
        base += r.ranks.height
    cat = {k: pl.concat(parts[k], how="diagonal_relaxed") for k in every}
    some = {k: pl.concat(parts[k], how="diagonal_relaxed") if parts[k] else None for k in maybe}
    inst = paired.instances
    gone = inst.filter(pl.col("left_out").is_not_null()).select("report", "range_id")
    seam_inst = cat["seam_instances"]
    if seam_inst.height:  # instance ids are per report: seams find their instances within their own report
        seam_inst = (seam_inst.join(gone, on=["report", "range_id"], how="anti")
                     .join(gone.rename({"range_id": "prev_range_id"}), on=["report", "prev_range_id"], how="anti"))
    seams = [breakdown.sum_seams(seam_inst.filter(pl.col("report") == i).drop("report"),
                             inst.filter(pl.col("report") == i)).with_columns(report=pl.lit(i, pl.Int32))
             for i in range(len(results))]
    report_of = cat["ranks"].select("rank", "report")
    counted = inst.filter(pl.col("left_out").is_null())
    phases = (breakdown.sum_phases(counted).join(host.phase_host(counted), on=["rank", "domain", "phase"], how="left",
                                             maintain_order="left").join(report_of, on="rank", how="left"))
    phases = collectives.with_split(phases, comm.matched, comm.refused)
    diags += comm.diagnostics  # the pairing diagnostics of every rank, then matching
    versions = sorted({str(r.trace.nsys_version) for r in results})
    if len(versions) > 1:
        diags.append(Diagnostic("warning", "MIXED_NSYS_VERSIONS",
                                f"the reports were exported by different nsys versions ({', '.join(versions)}); "
                                "their tables may differ in what they record"))
    first = results[0]
    return Result(
        trace=first.trace,
        selection=first.selection,
        ranks=cat["ranks"],
        instances=inst,
        phases=phases,
        ranges=breakdown.projections(counted).join(report_of, on="rank", how="left"),
        seam_instances=seam_inst,
        seams=pl.concat(seams, how="diagonal_relaxed"),
        coverage=cat["coverage"],
        comm_kernels=comm.kernels.drop("_g", "report", strict=False),
        ops=None,
        marks=cat["marks"],
        diagnostics=diags,
        reports=[r.trace.path for r in results],
        clock=comm.clock,
        window=ManyWindows(windows_) if windows_ else None,
        kernels=some["kernels"],
        host_calls=some["host_calls"],
        host_windows=some["host_windows"],
        comm_refused=comm.refused.filter(pl.col("phase").is_not_null()),
    )


def results_of(
    paths: Sequence[str | os.PathLike | Trace | Store],
    ranges: str | None = None,
    comm_patterns: list[CommPattern] | None = None,
    *,
    store: bool | None = None,
    cache: bool | None = None,
    jobs: int | None = None,
    executor: Executor | None = None,
    progress: ShowProgress | None = None,
) -> list[Result]:
    """:func:`result_of` of each report, in parallel processes (``jobs``, default: CPUs, at most one per report).

    ``executor``: any ``concurrent.futures.Executor``-like object (``submit(fn, *args)`` returning
    futures with ``result()``) to run the per-report map elsewhere, e.g. a Dask cluster's
    ``Client.get_executor()``; the reports must be readable where the tasks run. Only the small
    per-report results travel back. ``progress``: the bar of a single report (as :func:`result_of`).
    """
    if len(paths) == 1 and executor is None:
        return [result_of(paths[0], ranges, comm_patterns, store=store, cache=cache, progress=progress)]
    files = [str(p) for p in paths]
    _refuse_twice(files)
    for f in files:
        if not Path(f).exists():
            raise InputError(f"{f}: no such file", "NO_FILE")
    n = max(1, min(jobs or os.cpu_count() or 1, len(files)))
    if executor is not None:
        return [t.result() for t in [executor.submit(result_for_merge, f, ranges, comm_patterns, store, cache)
                                     for f in files]]
    if n == 1:
        return [result_for_merge(f, ranges, comm_patterns, store, cache) for f in files]
    ex = ProcessPoolExecutor(n, mp_context=multiprocessing.get_context("spawn"), initializer=workers.start)
    futures = None
    try:
        with workers.start_deaf():
            futures = [ex.submit(workers.run, result_for_merge, f, ranges, comm_patterns, store, cache) for f in files]
        return [f.result() for f in futures]
    except (BrokenProcessPool, OSError) as e:
        if isinstance(e, OSError) and futures is not None:  # an I/O error of a report, raised in its worker
            raise
        # A worker died (or one broke the pool while it was being filled: "handle is closed"). End the other
        # workers too: one started while the pool broke is not always ended by the pool (3.11).
        workers.signal_all(ex, signal.SIGTERM)
        raise InputError("a worker process analysing the reports ended abruptly (killed, or out of memory?) or "
                         "could not start; try -j 1 to analyse one report at a time", "WORKER_DIED") from None
    except KeyboardInterrupt:  # pass it on, so that each worker cleans up (its cache build) before the pool ends
        workers.signal_all(ex, signal.SIGINT)
        raise
    finally:
        ex.shutdown(wait=True, cancel_futures=True)


def _refuse_twice(paths: list[str]) -> None:
    """InputError when two reports are one capture: the same file by any name (a symlink, a hard link, another
    path: same device and inode) or byte-identical copies (equal sizes, then compared byte for byte; different
    exports differ within their first pages). Counted twice, its ranks would be four out of two."""
    seen: dict[tuple[int, int], str] = {}
    by_size: dict[int, list[str]] = {}
    for p in paths:
        try:
            st = os.stat(p)
        except OSError:  # a missing or unreadable report is said where it is opened
            continue
        other = seen.get((st.st_dev, st.st_ino))
        seen[(st.st_dev, st.st_ino)] = p
        if other is not None:
            raise InputError(f"{other} and {p} are the same file: one capture given twice; give each report once",
                             "DUPLICATE_REPORT")
        if stat.S_ISREG(st.st_mode):
            for q in by_size.get(st.st_size, []):
                if filecmp.cmp(q, p, shallow=False):
                    raise InputError(f"{q} and {p} are byte-identical copies of one capture; give each report "
                                     "once", "DUPLICATE_REPORT")
            by_size.setdefault(st.st_size, []).append(p)
