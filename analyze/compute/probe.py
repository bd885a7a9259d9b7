"""Two passes of one workload, and what tracing costs: the probe effect.

Node-level CUDA-graph tracing (``--cuda-graph-trace node``) records every kernel inside a graph replay,
which the compute / communication / idle split needs, but it slows the host's graph launches and the
cycle. Graph-level tracing records one row per replay and costs much less. ``spectrace trace --passes
graph,node`` runs the workload once under each; :func:`combine` makes one result of the pair:

- from the **graph** pass (the timing): phase instances and spans, seams and their causes, the cycle
  period, the host calls (so the what-if replays the less disturbed run);
- from the **node** pass (the split): each phase's compute / communication / idle (and GPU-idle,
  collective wait / transfer) as fractions of its span, applied to the graph pass's span of the same rank
  and phase (so span = compute + comm + idle still holds) — in the per-phase sums and in every range
  instance (the steady-state tables are built from those), exclusive and inclusive views alike; its kernels,
  op counts and matched collectives.

:func:`probe_effect` measures the probe: the median cycle period over the steady cycles under each pass and their ratio
(``inflation``, percent), per phase the median GPU span and host launch time per instance under each, per
seam the median idle and the dominant cause under each, and, given the workload's throughput without any
profiler (cycles/s), how far each pass is from it.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import polars as pl

from nvtx_hooks.phases import CYCLE_ORDER

from ..model import Diagnostic, InputError, Result
from ..read.manifest import read_manifest
from .payload import base_expr
from .tokens import summary

__all__ = ["combine", "own_rate", "unprofiled_rate", "probe_effect"]

_SPLIT = ("compute_ns", "comm_ns", "gpu_idle_ns", "comm_wait_ns", "comm_transfer_ns")
_FROM_NODE = ("kernel_ns", "ops")


def combine(node: Result, graph: Result) -> Result:
    """One result of a node-level and a graph-level pass of the same workload (see the module docstring)."""
    if node.ranks.height != graph.ranks.height:
        raise InputError(f"--timing: {Path(graph.trace.path).name} has {graph.ranks.height} rank(s), "
                         f"{Path(node.trace.path).name} {node.ranks.height}: not two passes of one workload",
                         "TIMING_MISMATCH")
    keys = ["rank", "domain", "phase"]
    have = [c for c in _SPLIT if c in node.phases.columns and c in graph.phases.columns]
    n = node.phases.select(*keys, pl.col("span_ns").alias("_nspan"),
                           *[pl.col(c).alias(f"_n_{c}") for c in (*have, *_FROM_NODE)])
    g = graph.phases.join(n, on=keys, how="left", maintain_order="left")
    share = {c: pl.when(pl.col("_nspan") > 0).then(
        (pl.col("span_ns") * pl.col(f"_n_{c}") / pl.col("_nspan")).round().cast(pl.Int64)).otherwise(pl.col(c))
        for c in have}
    g = g.with_columns(**share).with_columns(
        pl.coalesce(f"_n_{c}", c).cast(graph.phases.schema[c]).alias(c) for c in _FROM_NODE)
    g = g.with_columns(idle_ns=pl.col("span_ns") - pl.col("compute_ns") - pl.col("comm_ns"),
                       busy_ns=pl.col("compute_ns") + pl.col("comm_ns"))
    phases = g.select(graph.phases.columns)
    missing = graph.phases.join(node.phases, on=keys, how="anti")
    diags = [Diagnostic("info", "TIMING", f"spans, seams and cycle period from the graph-level pass "
                        f"{Path(graph.trace.path).name}; compute/comm/idle split inside them from the node-level "
                        f"pass {Path(node.trace.path).name}")]
    if node.trace.graph_trace_mode != "Node" or graph.trace.graph_trace_mode != "Graph":
        diags.append(Diagnostic("warning", "TIMING_MODES", f"--timing expects a graph-level pass and a node-level "
                                f"one; got {graph.trace.graph_trace_mode} and {node.trace.graph_trace_mode}"))
    if missing.height:
        diags.append(Diagnostic("warning", "TIMING_PHASES", f"{missing.height} rank/phase rows of the graph pass "
                                "have no node-pass counterpart: their split is the graph pass's own"))
    diags += [dataclasses.replace(d, message=f"graph pass: {d.message}") for d in graph.diagnostics]
    diags += [dataclasses.replace(d, message=f"node pass: {d.message}") for d in node.diagnostics
              if d.code != "RANGE_SELECTION"]
    return dataclasses.replace(graph, phases=phases, instances=_split_instances(node.instances, graph.instances),
                               comm_kernels=node.comm_kernels, diagnostics=diags,
                               reports=[*node.reports, *graph.reports])


def _split_instances(node: pl.DataFrame, graph: pl.DataFrame) -> pl.DataFrame:
    """The graph pass's range instances with compute / comm / GPU-idle (``x_`` and ``i_``) split as in the node
    pass: per rank, domain and range name, the node pass's share of each in the summed span, times each
    instance's own span (idle and busy follow). Ranges the node pass has no GPU work in keep their own."""
    keys = ["rank", "domain", "range"]
    out = graph
    for v in ("x_", "i_"):
        cols = [f"{v}compute_ns", f"{v}comm_ns", f"{v}gpu_idle_ns"]
        share = (node.filter(pl.col(f"{v}span_ns") > 0).group_by(keys)
                 .agg(*[(pl.col(c).sum() / pl.col(f"{v}span_ns").sum()).alias(f"_f{c}") for c in cols]))
        out = out.join(share, on=keys, how="left", maintain_order="left")
        scaled = {c: pl.when(pl.col(f"_f{c}").is_not_null() & (pl.col(f"{v}span_ns") > 0))
                  .then((pl.col(f"{v}span_ns") * pl.col(f"_f{c}")).round().cast(graph.schema[c])).otherwise(c)
                  for c in cols}
        out = out.with_columns(**scaled).with_columns(
            (pl.col(f"{v}span_ns") - pl.col(f"{v}compute_ns") - pl.col(f"{v}comm_ns")).alias(f"{v}idle_ns"),
            (pl.col(f"{v}compute_ns") + pl.col(f"{v}comm_ns")).alias(f"{v}busy_ns"),
        ).drop(*[f"_f{c}" for c in cols])
    return out.select(graph.columns).cast(graph.schema)


def _per_phase(res: Result) -> pl.DataFrame:
    return (res.instances.filter(pl.col("x_ops") > 0).with_columns(phase=base_expr())
            .group_by("phase").agg(span=pl.col("x_span_ns").median(), launch=pl.col("x_launch_api_ns").median(),
                                   n=pl.len()))


def _per_seam(res: Result) -> pl.DataFrame:
    s = res.seam_instances
    if s.height == 0 or "cause" not in s.columns:
        return pl.DataFrame(schema={"transition": pl.String, "idle": pl.Float64, "bound": pl.String})
    s = s.with_columns(transition=pl.format("{}→{}", base_expr("prev_range"), base_expr("range")))
    bound = (s.filter(pl.col("cause").is_not_null()).group_by("transition", "cause").len()
             .sort("len", "cause", descending=[True, False]).group_by("transition", maintain_order=True)
             .agg(bound=pl.col("cause").first()))
    return s.group_by("transition").agg(idle=pl.col("idle_ns").median()).join(bound, on="transition", how="left")


def _pct(a: float | None, b: float | None) -> float | None:
    return 100 * (a / b - 1) if a is not None and b else None


def own_rate(report: str | Path) -> float | None:
    """The workload's own throughput in the run that made ``report``: mean ``cycles_per_s`` of the JSON lines
    it printed (one per rank), as recorded in its manifest by ``spectrace trace``; None if not recorded."""
    m = read_manifest(report) or {}
    rates = [r["cycles_per_s"] for r in m.get("program_output") or []
             if isinstance(r, dict) and isinstance(r.get("cycles_per_s"), int | float)]
    return sum(rates) / len(rates) if rates else None


def unprofiled_rate(report: str | Path) -> float | None:
    """Cycles/s of the run without a profiler recorded beside a ``--passes`` capture (its ``plain`` pass)."""
    plain = ((read_manifest(report) or {}).get("passes") or {}).get("plain")
    return own_rate(Path(report).with_name(f"{plain}.sqlite")) if isinstance(plain, str) else None


def probe_effect(node: Result, graph: Result, unprofiled_cycles_per_s: float | None = None) -> dict:
    """The probe-effect document of a node-level and a graph-level pass (JSON-ready; see the module docstring).

    ``unprofiled_cycles_per_s``: the workload's throughput without a profiler (default: the ``plain`` pass
    recorded beside the node pass, if any).
    """
    # Typical cycles: the median over the steady cycles (a stall one pass happened to have does not move it; on
    # the device sweep the ratio of means was 0.8 points off the ratio of medians); the mean (tokens.DEFINITION,
    # what the other sections print) beside it.
    sg, sn = summary(graph), summary(node)
    pg, pn = sg.period_p50_ns, sn.period_p50_ns
    a, b = _per_phase(graph), _per_phase(node)
    phases = []
    order = pl.col("phase").replace_strict({p: i for i, p in enumerate(CYCLE_ORDER)}, default=len(CYCLE_ORDER),
                                           return_dtype=pl.Int64)
    both = a.join(b, on="phase", how="full", coalesce=True, suffix="_node").sort(order, "phase")
    for r in both.iter_rows(named=True):
        phases.append({"phase": r["phase"], "instances": {"graph": r["n"], "node": r["n_node"]},
                       "span_ns": {"graph": r["span"], "node": r["span_node"]},
                       "span_inflation": _pct(r["span_node"], r["span"]),
                       "launch_ns": {"graph": r["launch"], "node": r["launch_node"]}})
    seams = [{"transition": r["transition"], "idle_ns": {"graph": r["idle"], "node": r["idle_node"]},
              "bound": {"graph": r["bound"], "node": r["bound_node"]}}
             for r in _per_seam(graph).join(_per_seam(node), on="transition", how="full", coalesce=True,
                                            suffix="_node").sort("transition").iter_rows(named=True)]
    source = "given"
    if unprofiled_cycles_per_s is None:
        unprofiled_cycles_per_s, source = unprofiled_rate(node.trace.path), "plain pass"
    unprof = None
    if unprofiled_cycles_per_s:
        p0 = 1e9 / unprofiled_cycles_per_s
        own = {"graph": own_rate(graph.trace.path), "node": own_rate(node.trace.path)}
        unprof = {"cycles_per_s": unprofiled_cycles_per_s, "source": source, "period_ns": p0,
                  "period_vs_unprofiled": {"graph": _pct(pg, p0), "node": _pct(pn, p0)},
                  "own_cycles_per_s": own,
                  "own_vs_unprofiled": {k: _pct(unprofiled_cycles_per_s, v) if v else None for k, v in own.items()}}
    return {"node": node.trace.path, "graph": graph.trace.path, "period_ns": {"graph": pg, "node": pn},
            "period_mean_ns": {"graph": sg.period_ns, "node": sn.period_ns},
            "inflation": _pct(pn, pg), "phases": phases, "seams": seams, "unprofiled": unprof}
