"""The analysis facade: one call from an nsys export to the per-phase breakdown."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import polars as pl

from . import attribute, breakdown, collectives
from .comm import PATTERNS, CommPattern, family_expr
from .errors import InputError
from .load import Trace, load

GRAPH_LAUNCH = r"^(cudaGraphLaunch|cuGraphLaunch)"


@dataclass
class Diagnostic:
    level: str  # "info", "warning" or "error"
    code: str
    message: str

    def as_dict(self) -> dict[str, str]:
        return {"level": self.level, "code": self.code, "message": self.message}


@dataclass
class Result:
    """Everything ``spectrace analyze`` reports, as frames."""

    trace: Trace
    selection: str
    ranks: pl.DataFrame
    instances: pl.DataFrame  # one row per selected range instance, exclusive x_* and inclusive i_* metrics
    phases: pl.DataFrame
    ranges: pl.DataFrame
    seam_instances: pl.DataFrame
    seams: pl.DataFrame
    coverage: pl.DataFrame
    ops: pl.DataFrame  # GPU ops with rank, rid, comm family and name
    diagnostics: list[Diagnostic] = field(default_factory=list)

    @property
    def phases_all(self) -> pl.DataFrame:
        return breakdown.all_ranks(self.phases, ["domain", "phase"],
                                   ["span_ns", *breakdown.METRICS[1:], "gpu_idle_ns", "instances", *collectives.SPLIT])

    @property
    def ranges_all(self) -> pl.DataFrame:
        sums = ["proj_span_ns", "instances", "range_instances", "ops", "launches", "busy_ns", "comm_ns",
                "idle_ns", "range_ns"]
        return breakdown.all_ranks(self.ranges, ["domain", "range"], sums)

    @property
    def seams_all(self) -> pl.DataFrame:
        return breakdown.all_ranks(self.seams, ["parent", "from", "to"],
                                   ["idle_ns", "gap_ns", "busy_ns", "overlap_ns", "instances"])

    def to_dict(self) -> dict[str, Any]:
        """The JSON document (keys documented in the README)."""
        cov = self.coverage
        return {
            "spectrace_version": _version(),
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
                "gpu_ns": int(cov["gpu_ns"].sum()),
                "attributed_ns": int(cov["attributed_ns"].sum()),
                "per_rank": cov.to_dicts(),
            },
        }


def _version() -> str:
    from . import __version__

    return __version__


def select_phases(path: str, ranges_df: pl.DataFrame, has_ops: bool, regex: str | None) -> tuple[pl.DataFrame, str]:
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
        top = (ranges_df.group_by("domain", "text").len().sort("len", descending=True).head(8)
               .select(pl.format("{}:{}", "domain", "text")).to_series().to_list())
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


def add_kinds(ops: pl.DataFrame, kinds: pl.DataFrame, cols: list[str]) -> pl.DataFrame:
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


def analyze(
    report: str | os.PathLike | Trace,
    ranges: str | None = None,
    comm_patterns: list[CommPattern] | None = None,
) -> Result:
    """Attribute the GPU work of an nsys export to phases (see the README for the definitions)."""
    trace = report if isinstance(report, Trace) else load(report)
    patterns = comm_patterns if comm_patterns is not None else list(PATTERNS)
    diags: list[Diagnostic] = []

    sel, how = select_phases(trace.path, trace.ranges, trace.ops.height > 0, ranges)
    diags.append(Diagnostic("info", "RANGE_SELECTION", f"phases are {how}: {sel.height} range instances"))

    nested = attribute.nest(sel)
    kinds = op_kinds(trace.ops.select("name_id", "label").unique(), trace.names, patterns)
    ops = add_kinds(trace.ops, kinds, ["name", "comm"])
    ops = attribute.attribute_ops(ops, trace.api, nested)
    rk = breakdown.ranks(ops, trace.devices)
    rank_of = rk.select("pid", "rank")
    ops = ops.join(rank_of, on="pid", how="left").sort("start")  # every interval step relies on this order
    nested = nested.join(rank_of, on="pid", how="left")
    anc = attribute.ancestors(nested)
    inst = breakdown.instances(nested, ops, anc)
    blocks = breakdown.gpu_blocks(ops)
    inst = breakdown.add_gpu_idle(inst, blocks)
    seam_inst = breakdown.seam_instances(inst, blocks)
    cov = breakdown.coverage(inst, ops, blocks)
    return assemble(trace, how, rk, inst, seam_inst, cov, ops, diags, nested, collectives.comm_kernels(ops, inst))


def assemble(trace: Trace, selection: str, ranks: pl.DataFrame, inst: pl.DataFrame, seam_inst: pl.DataFrame,
             cov: pl.DataFrame, ops: pl.DataFrame, diags: list[Diagnostic], nested: pl.DataFrame,
             comm_kernels: pl.DataFrame) -> Result:
    """The Result from the per-instance frames: sums, diagnostics, and the cross-rank comm split.

    ``comm_kernels``: :func:`analyze.collectives.comm_kernels` of every process, ranks numbered.
    """
    res = Result(
        trace=trace,
        selection=selection,
        ranks=ranks,
        instances=inst,
        phases=breakdown.phases(inst),
        ranges=breakdown.projections(inst),
        seam_instances=seam_inst,
        seams=breakdown.seams(seam_inst, inst),
        coverage=cov,
        ops=ops,
        diagnostics=diags,
    )
    diags.extend(diagnose(res, nested))
    res.phases, comm_diags = collectives.phase_comm_split(res.phases, comm_kernels)
    diags.extend(comm_diags)
    return res


def diagnose(res: Result, nested: pl.DataFrame) -> list[Diagnostic]:
    """Warnings and notes about the trace and the attribution, each with a stable code."""
    t, ops, out = res.trace, res.ops, []
    nd = t.nsys_diagnostics
    lost = nd.filter(pl.col("text").str.contains(r"(?i)not all .* events might have been collected"))
    for row in lost.group_by("pid").agg(pl.col("text").unique().sort()).sort("pid").iter_rows(named=True):
        out.append(Diagnostic(
            "warning", "INCOMPLETE_COLLECTION",
            f"pid {row['pid']}: nsys says " + " ".join(row["text"])
            + " Ranges at the end of the run may lack their GPU work; it is not counted as idle.",
        ))
    if t.dropped_ops:
        out.append(Diagnostic("warning", "DROPPED_OPS",
                              f"{t.dropped_ops} GPU operations with invalid timestamps (start <= 0 or end < start) dropped"))
    unclosed = t.ranges.filter("unclosed")
    if unclosed.height:
        sel_ids = set(nested["row_id"].to_list())
        for row in unclosed.group_by("domain", "text").agg(pl.len(), pl.col("row_id")).sort("text").iter_rows(named=True):
            is_sel = any(r in sel_ids for r in row["row_id"])
            out.append(Diagnostic(
                "warning" if is_sel else "info", "UNCLOSED_RANGE",
                f"{row['len']} {_label(row['domain'], row['text'])} range(s) never closed; their end is the session end",
            ))
    cross = t.ranges.filter("cross_thread")
    if cross.height:
        out.append(Diagnostic("info", "CROSS_THREAD_RANGE",
                              f"{cross.height} start/end ranges ended on another thread are not used for attribution"))
    bad_nest = nested.join(nested.select(parent="row_id", _pend="end"), on="parent").filter(pl.col("end") > pl.col("_pend"))
    if bad_nest.height:
        out.append(Diagnostic("warning", "NONNESTED_RANGES",
                              f"{bad_nest.height} selected ranges end after their enclosing range; innermost-range attribution is approximate"))
    graphs = ops.filter(pl.col("kind") == "graph")
    if graphs.height:
        out.append(Diagnostic(
            "warning", "GRAPH_LEVEL_TRACE",
            f"CUDA graphs were traced as a whole (--cuda-graph-trace=graph): {graphs.height} graph executions are "
            "attributed as single operations, without per-kernel detail; communication inside them counts as "
            "compute. Capture with --cuda-graph-trace=node for the split.",
        ))
    launches = t.api.join(t.names, on="name_id").filter(pl.col("name").str.contains(GRAPH_LAUNCH))
    if launches.height:
        orphan = launches.join(ops.select("pid", "corr").unique(), on=["pid", "corr"], how="anti")
        if orphan.height:
            out.append(Diagnostic(
                "warning", "GRAPH_LAUNCH_NO_GPU",
                f"{orphan.height} of {launches.height} cudaGraphLaunch calls have no GPU rows (events lost, "
                "or launched outside the captured GPU window)",
            ))
    unmatched = ops.filter(pl.col("gtid").is_null()).height
    if unmatched:
        out.append(Diagnostic("info", "UNMATCHED_OPS",
                              f"{unmatched} GPU operations have no matching CUDA API call (pid, correlationId); "
                              "they count as GPU time but belong to no phase"))
    multi = res.ranks.filter(pl.col("devices").list.len() > 1)
    for row in multi.iter_rows(named=True):
        out.append(Diagnostic("warning", "MULTI_DEVICE_PROCESS",
                              f"pid {row['pid']} ran work on devices {row['devices']}; its rank uses device {row['device']}"))
    inst = res.instances
    per_name = inst.group_by("domain", "text").agg(n=pl.len(), empty=(pl.col("i_ops") == 0).sum())
    nowork = per_name.filter(pl.col("empty") > 0).sort("empty", descending=True)
    if nowork.height:
        dead = nowork.filter(pl.col("empty") == pl.col("n"))
        names = [_label(d, t) for d, t in dead.select("domain", "text").rows()]
        shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
        msg = f"{int(nowork['empty'].sum())} of {int(per_name['n'].sum())} selected range instances launched no GPU work"
        out.append(Diagnostic("warning" if names else "info", "RANGE_NO_GPU",
                              msg + (f"; never any: {shown}" if names else "")))
    cov = res.coverage
    gpu, att = int(cov["gpu_ns"].sum()), int(cov["attributed_ns"].sum())
    if gpu:
        share = 1 - att / gpu
        out.append(Diagnostic(
            "warning" if share > 0.1 else "info", "COVERAGE",
            f"{share:.1%} of GPU busy time inside the phased window ({(gpu - att) / 1e6:.3f} of {gpu / 1e6:.3f} ms) "
            "belongs to no phase",
        ))
    if not res.phases.height:
        out.append(Diagnostic("warning", "NO_PHASE_WORK", "no GPU work was launched inside any selected range"))
    return out


def _label(domain: str, text: str) -> str:
    return f"{domain}:{text}" if domain else text
