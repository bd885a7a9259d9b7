"""The streamed analysis: one process (rank) at a time from the cache, in bounded memory.

Attribution and every per-instance metric are per process: an op joins its own process's API
calls, ranges and GPU. So :func:`analyze_store` reads one process's ops and API calls from the
parquet cache (:mod:`analyze.cache`), runs the same steps as :func:`analyze.analysis.analyze`
(the same functions of :mod:`analyze.attribute` and :mod:`analyze.breakdown`), keeps the small
per-instance, per-seam and coverage rows, and drops the ops. What is global is done once at the
end on those small frames: rank numbering, per-phase sums, cross-rank collective matching (which
needs only the communication kernels, numbered per process by instance and ordinal) and the
diagnostics.

The result equals the in-memory one (tests compare both on the same inputs), except that
``Result.ops`` and ``Result.trace.ops``/``api`` hold only what the global steps need:
communication kernels, graph executions, ops without an API call, one op per graph launch and
per process with a graph node id; and the graph-launch API calls.
"""

from __future__ import annotations

import dataclasses
from concurrent.futures import ThreadPoolExecutor

import polars as pl

from . import attribute, breakdown, collectives
from .analysis import GRAPH_LAUNCH, Diagnostic, Result, add_kinds, assemble, op_kinds, select_phases
from .cache import Progress, Store
from .comm import PATTERNS, CommPattern

WORKER_ROWS = 3_000_000  # two processes at once up to this size: 20 M kernels (2.6 M per process) peak 3.4 GB either way


def _keep(ops: pl.DataFrame, launches: pl.DataFrame) -> pl.DataFrame:
    """The ops of one process the global steps need (see the module docstring), in their order."""
    is_launch = pl.col("corr").is_in(launches["corr"].implode())
    node = pl.col("graph_node").is_not_null()
    return ops.filter(
        ((pl.col("kind") == "kernel") & pl.col("comm").is_not_null())
        | (pl.col("kind") == "graph")
        | pl.col("gtid").is_null()
        | (is_launch & pl.when(is_launch).then(pl.col("corr")).is_first_distinct())  # one op per graph launch
        | (node & (node.cum_sum() == 1))  # the first graph node op: the trace is in node mode
    )


def analyze_store(
    store: Store,
    ranges: str | None = None,
    comm_patterns: list[CommPattern] | None = None,
    progress: bool | None = None,
    workers: int = 2,
) -> Result:
    """:func:`analyze.analysis.analyze` over a cache, one process at a time."""
    head = store.head()
    patterns = comm_patterns if comm_patterns is not None else list(PATTERNS)
    diags: list[Diagnostic] = []
    sel, how = select_phases(head.path, head.ranges, any(store.meta["ops_rows"].values()), ranges)
    diags.append(Diagnostic("info", "RANGE_SELECTION", f"phases are {how}: {sel.height} range instances"))
    nested_all = attribute.nest(sel)
    kinds = op_kinds(store.scan("ops").select("name_id", "label").unique().collect(), head.names, patterns)
    # Kernel names are long and repeat millions of times: Categorical until the Result is handed out.
    kinds = kinds.with_columns(pl.col("name").cast(pl.Categorical))
    launch_ids = head.names.filter(pl.col("name").str.contains(GRAPH_LAUNCH))["name_id"]

    parts: dict[str, list[pl.DataFrame]] = {k: [] for k in ("ranks", "inst", "seam", "cov", "ops", "api", "kern")}
    pids = store.pids
    bar = Progress(sum(store.meta["ops_rows"].values()), "spectrace: analysing", progress)
    def one(pid: int) -> dict[str, pl.DataFrame]:
        out: dict[str, pl.DataFrame] = {}
        ops = store.scan("ops", [pid]).collect()
        api = store.scan("api", [pid]).collect()
        nested = nested_all.filter(pl.col("pid") == pid)
        # Kernel names (long strings) are joined only onto the ops kept at the end: nothing per process reads them.
        ops = add_kinds(ops, kinds, ["comm"])
        ops = attribute.attribute_ops(ops, api, nested)
        rk = breakdown.ranks(ops, head.devices)  # one row: its rank is fixed once all processes are in
        rank_of = rk.select("pid", "rank")
        ops = ops.join(rank_of, on="pid", how="left")
        nested = nested.join(rank_of, on="pid", how="left")
        launches = api.filter(pl.col("name_id").is_in(launch_ids.implode()))
        del api
        kept = add_kinds(_keep(ops, launches), kinds, ["name"])
        cols = ops.columns
        out["ops"] = kept.select(*cols[: cols.index("comm")], "name", *cols[cols.index("comm"):])
        out["api"] = launches
        out["ranks"] = rk
        n_ops = ops.height
        # The interval steps read only these columns: a narrow copy halves the memory of the inclusive view.
        ops = ops.select("pid", "rank", "rid", "corr", "start", "end", "comm").sort("start")
        if ops.height:
            anc = attribute.ancestors(nested)
            inst = breakdown.instances(nested, ops, anc)
            blocks = breakdown.gpu_blocks(ops)
            inst = breakdown.add_gpu_idle(inst, blocks)
            out["seam"] = breakdown.seam_instances(inst, blocks)
            out["cov"] = breakdown.coverage(inst, ops, blocks)
            out["inst"] = inst
            # Collective matching is global, but each kernel's group (instance k, ordinal j) is per rank.
            out["kern"] = collectives.comm_kernels(out["ops"], inst).with_columns(pid=pl.lit(pid, pl.Int64))
        elif nested.height:  # API calls but no GPU work: its ranges still count as instances
            out["inst"] = breakdown.instances(nested, ops, attribute.ancestors(nested)).with_columns(
                x_gpu_idle_ns=pl.lit(0, pl.Int64), i_gpu_idle_ns=pl.lit(0, pl.Int64))
        bar.add(n_ops)
        return out

    # Processes in parallel threads (polars releases the GIL): ``workers`` processes' ops in memory at once,
    # one at a time when a process has more than WORKER_ROWS ops (memory stays bounded by the largest one).
    biggest = max([*store.meta["ops_rows"].values(), 0])
    n = max(1, workers if biggest <= WORKER_ROWS else 1)
    with ThreadPoolExecutor(max_workers=n) as ex:
        for out in (ex.map(one, pids) if n > 1 else map(one, pids)):
            for k, v in out.items():
                parts[k].append(v)
    bar.close()
    # Ranges of processes without any GPU op or API call still count as (empty) instances.
    done = set(pids)
    rest = nested_all.filter(~pl.col("pid").is_in(list(done)))
    if rest.height:
        empty = store.scan("ops", []).collect().with_columns(
            pl.lit(None, pl.Int64).alias(c) for c in ("gtid", "rid", "api_start", "api_name_id", "rank")
        ).with_columns(comm=pl.lit(None, pl.String), name=pl.lit(None, pl.String))
        rest = rest.with_columns(rank=pl.lit(None, pl.Int64))
        parts["inst"].append(breakdown.instances(rest, empty, attribute.ancestors(rest)).with_columns(
            x_gpu_idle_ns=pl.lit(0, pl.Int64), i_gpu_idle_ns=pl.lit(0, pl.Int64)))

    # Global: rank numbers (device order, as breakdown.ranks does over all processes at once).
    rk = pl.concat(parts["ranks"]).filter(pl.col("gpu_ops") > 0)
    rk = rk.sort("device", "pid").with_columns(rank=pl.int_range(pl.len()).cast(pl.Int64))
    rank_of = rk.select("pid", _r="rank")

    def renumber(df: pl.DataFrame) -> pl.DataFrame:
        return df.join(rank_of, on="pid", how="left", maintain_order="left").with_columns(rank=pl.col("_r")).drop("_r")

    inst = renumber(pl.concat(parts["inst"], how="diagonal_relaxed")).sort("row_id")
    nested = renumber(nested_all.with_columns(rank=pl.lit(None, pl.Int64)))
    seam_inst = renumber(pl.concat(parts["seam"])) if parts["seam"] else pl.DataFrame()
    cov = renumber(pl.concat(parts["cov"])).sort("rank") if parts["cov"] else pl.DataFrame()
    ops = renumber(pl.concat(parts.pop("ops"))).sort("start")
    trace = dataclasses.replace(head, ops=ops.select(head.ops.columns), api=pl.concat(parts["api"]))
    kern = (renumber(pl.concat(parts["kern"])).drop("pid") if parts["kern"]
            else collectives.comm_kernels(ops, inst))
    parts.clear()  # the per-process pieces are concatenated: let them go before matching collectives
    res = assemble(trace, how, rk, inst, seam_inst, cov, ops, diags, nested, kern)
    del kern, ops
    res.ops = res.ops.with_columns(pl.col("name").cast(pl.String))  # as the in-memory Result has them
    return res
