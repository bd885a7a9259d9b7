"""Warnings and notes about a trace and its attribution, each with a stable code (README: Diagnostics).

They are computed once, globally, from the small per-process results and the counts each process
body reports (:data:`FACTS`), never from all GPU operations at once.
"""

from __future__ import annotations

import polars as pl

from ..model import Diagnostic, Trace

# Counts each process body returns, summed over processes.
FACTS = ("graph_ops", "node_ops", "graph_launches", "orphan_launches", "unmatched_ops", "duplicate_ops")

# Oddities met while reading (:attr:`analyze.model.Trace.read_warnings`): code and message per count.
READ_WARNINGS = {
    "lossy_strings": ("NON_UTF8_STRINGS", "{n} strings in the export are not valid UTF-8; they were decoded with "
                                          "U+FFFD replacement characters"),
    "missing_strings": ("MISSING_STRINGS", "{n} NVTX ranges name a string id that StringIds lacks; their name is "
                                           "empty"),
    "reversed_ranges": ("RANGE_END_BEFORE_START", "{n} NVTX ranges end before they start; they are left out"),
    "long_ranges": ("RANGE_LONGER_THAN_SESSION", "{n} NVTX ranges last longer than the whole session (an absurd "
                                                 "end time); their end is taken as the session end"),
    "api_without_pid": ("API_WITHOUT_PROCESS", "{n} CUDA API calls have no thread id (NULL globalTid); they are "
                                               "left out"),
}


def label(domain: str, text: str) -> str:
    return f"{domain}:{text}" if domain else text


def diagnose(t: Trace, nested: pl.DataFrame, facts: dict[str, int], ranks: pl.DataFrame, inst: pl.DataFrame,
             cov: pl.DataFrame, phases: pl.DataFrame) -> list[Diagnostic]:
    """Warnings and notes about the trace and the attribution."""
    out = []
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
                              f"{t.dropped_ops} GPU operations with invalid timestamps (start <= 0 or end < start, "
                              "or longer than the whole session) or no process id (NULL globalPid) dropped"))
    for key, (code, msg) in READ_WARNINGS.items():
        if t.read_warnings.get(key):
            out.append(Diagnostic("warning", code, msg.format(n=t.read_warnings[key])))
    if facts.get("duplicate_ops"):
        out.append(Diagnostic("warning", "DUPLICATE_OPS",
                              f"{facts['duplicate_ops']} GPU operations repeat another row exactly (process, "
                              "correlation id, start and end); their kernel time and op counts are counted twice"))
    unclosed = t.ranges.filter("unclosed")
    if unclosed.height:
        sel_ids = nested["range_id"].implode()
        per = (unclosed.with_columns(_sel=pl.col("range_id").is_in(sel_ids))
               .group_by("domain", "range").agg(pl.len(), pl.col("_sel").any()).sort("range", "domain"))
        for row in per.iter_rows(named=True):
            out.append(Diagnostic(
                "warning" if row["_sel"] else "info", "UNCLOSED_RANGE",
                f"{row['len']} {label(row['domain'], row['range'])} range(s) never closed; their end is the session end",
            ))
    cross = t.ranges.filter("cross_thread")
    if cross.height:
        out.append(Diagnostic("info", "CROSS_THREAD_RANGE",
                              f"{cross.height} start/end ranges ended on another thread are not used for attribution"))
    bad_nest = nested.join(nested.select(parent="range_id", _pend="end"), on="parent").filter(pl.col("end") > pl.col("_pend"))
    if bad_nest.height:
        out.append(Diagnostic("warning", "NONNESTED_RANGES",
                              f"{bad_nest.height} selected ranges end after their enclosing range; innermost-range attribution is approximate"))
    if facts["graph_ops"]:
        out.append(Diagnostic(
            "warning", "GRAPH_LEVEL_TRACE",
            f"CUDA graphs were traced as a whole (--cuda-graph-trace=graph): {facts['graph_ops']} graph executions are "
            "attributed as single operations, without per-kernel detail; communication inside them counts as "
            "compute. Capture with --cuda-graph-trace=node for the split.",
        ))
    if facts["orphan_launches"]:
        out.append(Diagnostic(
            "warning", "GRAPH_LAUNCH_NO_GPU",
            f"{facts['orphan_launches']} of {facts['graph_launches']} cudaGraphLaunch calls have no GPU rows (events lost, "
            "or launched outside the captured GPU window)",
        ))
    if facts["unmatched_ops"]:
        out.append(Diagnostic("info", "UNMATCHED_OPS",
                              f"{facts['unmatched_ops']} GPU operations have no matching CUDA API call (pid, correlationId); "
                              "they count as GPU time but belong to no phase"))
    multi = ranks.filter(pl.col("devices").list.len() > 1)
    for row in multi.iter_rows(named=True):
        out.append(Diagnostic("warning", "MULTI_DEVICE_PROCESS",
                              f"pid {row['pid']} ran work on devices {row['devices']}; its rank uses device {row['device']}"))
    per_name = inst.group_by("domain", "range").agg(n=pl.len(), empty=(pl.col("i_ops") == 0).sum())
    nowork = per_name.filter(pl.col("empty") > 0).sort("empty", "domain", "range", descending=[True, False, False])
    if nowork.height:
        dead = nowork.filter(pl.col("empty") == pl.col("n"))
        names = [label(d, t) for d, t in dead.select("domain", "range").rows()]
        shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
        msg = f"{int(nowork['empty'].sum())} of {int(per_name['n'].sum())} selected range instances launched no GPU work"
        out.append(Diagnostic("warning" if names else "info", "RANGE_NO_GPU",
                              msg + (f"; never any: {shown}" if names else "")))
    gpu = int(cov["gpu_ns"].sum()) if cov.height else 0
    att = int(cov["attributed_ns"].sum()) if cov.height else 0
    if gpu:
        share = 1 - att / gpu
        out.append(Diagnostic(
            "warning" if share > 0.1 else "info", "COVERAGE",
            f"{share:.1%} of GPU busy time inside the phased window ({(gpu - att) / 1e6:.3f} of {gpu / 1e6:.3f} ms) "
            "belongs to no phase",
        ))
    if not phases.height:
        out.append(Diagnostic("warning", "NO_PHASE_WORK", "no GPU work was launched inside any selected range"))
    return out
