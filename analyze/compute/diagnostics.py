"""Warnings and notes about a trace and its attribution, each with a stable code (README: Diagnostics).

Ranked by consequence: a *warning* only when a number the user reads is affected (the message says which);
everything else is *info*. One diagnostic per cause, not one per process (the processes are listed in it).

They are computed once, globally, from the small per-process results and the counts each process
body reports (:data:`FACTS`), never from all GPU operations at once.
"""

from __future__ import annotations

import polars as pl

from ..model import Diagnostic, Trace
from ..read.manifest import speculative
from .payload import accept_beyond_bound, accept_bound_text, decode_frame

__all__ = ["FACTS", "diagnose", "duplicate_rows"]

# Counts each process body returns, summed over processes.
FACTS = ("graph_ops", "node_ops", "graph_launches", "orphan_launches", "orphan_launches_inside", "unmatched_ops",
         "duplicate_ops", "api_twins", "duplicate_api")

# Oddities met while reading (:attr:`analyze.model.Trace.read_warnings`): code and message per count.
_READ_WARNINGS = {
    "lossy_strings": ("NON_UTF8_STRINGS", "{n} strings in the export are not valid UTF-8; they were decoded with "
                                          "U+FFFD replacement characters"),
    "missing_strings": ("MISSING_STRINGS", "{n} NVTX ranges name a string id that StringIds lacks; their name is "
                                           "empty"),
    "reversed_ranges": ("RANGE_END_BEFORE_START", "{n} NVTX ranges end before they start; they are left out"),
    "long_ranges": ("RANGE_LONGER_THAN_SESSION", "{n} NVTX ranges last longer than the whole session (an absurd "
                                                 "end time); their end is taken as the session end"),
    "kernels_not_exported": ("KERNELS_NOT_EXPORTED", "{n} kernel launch calls, but the export has no kernel table "
                             "(CUPTI_ACTIVITY_KIND_KERNEL): those kernels are in no number (GPU time, spans, idle); "
                             "capture with nsys --trace cuda and export again"),
    "api_without_pid": ("API_WITHOUT_PROCESS", "{n} CUDA API calls have no thread id (NULL globalTid); they are "
                                               "left out"),
}


def duplicate_rows(what: str, n: int) -> Diagnostic:
    """DUPLICATE_ROWS: ``n`` rows of ``what`` that repeat another row exactly (an export appended to), kept once."""
    return Diagnostic("warning", "DUPLICATE_ROWS", f"{n} {what} repeat another row exactly (an export appended to, or "
                                                   "written twice?): each is counted once")


def _label(domain: str, text: str) -> str:
    return f"{domain}:{text}" if domain else text


def diagnose(t: Trace, nested: pl.DataFrame, facts: dict[str, int], ranks: pl.DataFrame, inst: pl.DataFrame,
             cov: pl.DataFrame, phases: pl.DataFrame) -> list[Diagnostic]:
    """Warnings and notes about the trace and the attribution."""
    out = []
    rank_pids = set(ranks["pid"].to_list()) if ranks.height else set()
    nd = t.nsys_diagnostics
    lost = nd.filter(pl.col("text").str.contains(r"(?i)not all .* events might have been collected"))
    if lost.height:  # one note for every process (nsys says it of each, the launcher too)
        pids = sorted(lost["pid"].drop_nulls().unique().to_list())
        said = " ".join(sorted(lost["text"].unique().to_list()))
        out.append(Diagnostic(
            "info", "INCOMPLETE_COLLECTION",
            f"nsys says {said} (process{'es' if len(pids) > 1 else ''} {', '.join(map(str, pids))}). Ranges at the "
            "end of the run may lack their GPU work; when that changes a number, GPU_TAIL_LOST or WINDOW_CUT says "
            "which instances were left out.",
        ))
    others = sorted(set(nd["pid"].drop_nulls().to_list()) | set(t.ranges["pid"].drop_nulls().to_list())) \
        if rank_pids else []
    others = [p for p in others if p not in rank_pids and p > 0]  # pid 0: nsys's own events
    if others:
        out.append(Diagnostic("info", "NOT_A_RANK", f"process{'es' if len(others) > 1 else ''} "
                              f"{', '.join(map(str, others))} ran no GPU work: not a rank (e.g. the launcher)"))
    if t.dropped_ops:
        out.append(Diagnostic("warning", "DROPPED_OPS",
                              f"{t.dropped_ops} GPU operations with invalid timestamps (no end, start <= 0 or end < "
                              "start, or longer than the whole session) or no process id (NULL globalPid) "
                              "dropped: they are in no number"))
    if t.export_meta.get("SPECTRACE_SOURCE") == "torch-profiler":  # what such a trace cannot give, said once
        out.append(Diagnostic("info", "TORCH_PROFILER_TRACE", t.export_meta.get("SPECTRACE_INPUT_NOTE", "")))
    for key, (code, msg) in _READ_WARNINGS.items():
        if t.read_warnings.get(key):
            out.append(Diagnostic("warning", code, msg.format(n=t.read_warnings[key])))
    if facts.get("duplicate_api"):
        out.append(duplicate_rows("CUDA API calls", facts["duplicate_api"]))
    if facts.get("duplicate_ops"):
        out.append(Diagnostic("warning", "DUPLICATE_OPS",
                              f"{facts['duplicate_ops']} GPU operations repeat another row exactly (process, "
                              "correlation id, start and end); their kernel time and op counts are counted twice"))
    if facts.get("api_twins"):
        out.append(Diagnostic("info", "API_TWINS",
                              f"{facts['api_twins']} CUDA API calls are recorded twice (an outer row and an inner "
                              "versioned one, e.g. cudaGraphLaunch around cudaGraphLaunch_v10000, one thread and "
                              "correlation id: nsys with CPU backtraces); each is counted once, as its inner row"))
    unclosed = t.ranges.filter("unclosed")
    if unclosed.height:
        counted = inst.filter(pl.col("i_ops") > 0)  # a selected instance with GPU work that no rule left out
        if "left_out" in counted.columns:
            counted = counted.filter(pl.col("left_out").is_null())
        per = (unclosed.with_columns(_counted=pl.col("range_id").is_in(counted["range_id"].implode()))
               .group_by("domain", "range").agg(pl.len(), pl.col("_counted").any()).sort("range", "domain"))
        for row in per.iter_rows(named=True):
            name = _label(row["domain"], row["range"])
            out.append(Diagnostic(
                "warning" if row["_counted"] else "info", "UNCLOSED_RANGE",
                f"{row['len']} {name} range(s) never closed; their end is the session end"
                + (f": {name}'s span and idle include the time to the session end" if row["_counted"]
                   else " (not counted in any number)"),
            ))
    cross = t.ranges.filter("cross_thread")
    if cross.height:
        names = sorted(cross["range"].unique().to_list())
        shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
        out.append(Diagnostic("warning", "CROSS_THREAD_RANGE",
                              f"{cross.height} start/end ranges ({shown}) ended on another thread than the one that "
                              "started them (legal NVTX): each is attributed on the thread that started it, from its "
                              "start to its end; GPU work launched by the ending thread is not in it"))
    if "uint64" in inst.columns or "int64" in inst.columns:
        steps = speculative(t.path).get("steps")
        steps = steps if isinstance(steps, int) and steps >= 1 else None
        beyond = int(decode_frame(inst.select(*(c for c in ("uint64", "int64") if c in inst.columns)))
                     .select(accept_beyond_bound(steps).sum()).item() or 0)
        if beyond:
            out.append(Diagnostic("warning", "PAYLOAD_ACCEPT_LENGTH",
                                  f"{beyond} range payloads claim more accepted draft tokens than "
                                  f"{accept_bound_text(steps)} (every request accepting every draft token): those "
                                  "accept lengths are left out (their cycles' tokens unknown)"))
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
        inside = facts.get("orphan_launches_inside", facts["orphan_launches"])
        out.append(Diagnostic(
            "warning" if inside else "info", "GRAPH_LAUNCH_NO_GPU",
            f"{facts['orphan_launches']} of {facts['graph_launches']} cudaGraphLaunch calls have no GPU rows"
            + (f"; {inside} of them inside the captured GPU window (events lost): the spans of the ranges that "
               "launched them lack that work" if inside else
               ": launched outside the captured GPU window (no number is affected)"),
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
        names = [_label(d, t) for d, t in dead.select("domain", "range").rows()]
        shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
        msg = f"{int(nowork['empty'].sum())} of {int(per_name['n'].sum())} selected range instances launched no GPU work"
        out.append(Diagnostic("warning" if names else "info", "RANGE_NO_GPU",
                              msg + (f"; never any: {shown}" if names else "")))
    gpu = int(cov["gpu_ns"].sum()) if cov.height else 0
    att = int(cov["attributed_ns"].sum()) if cov.height else 0
    if gpu and att < gpu:  # nothing to say when phases received all of it
        share = 1 - att / gpu
        out.append(Diagnostic(
            "warning" if share > 0.1 else "info", "COVERAGE",
            f"{share:.1%} of GPU busy time inside the phased window ({(gpu - att) / 1e6:.3f} of {gpu / 1e6:.3f} ms) "
            "belongs to no phase" + (": the per-phase tables miss it (the whole-run totals include it)"
                                     if share > 0.1 else ""),
        ))
    if not phases.height:
        out.append(Diagnostic("warning", "NO_PHASE_WORK", "no GPU work was launched inside any selected range"))
    return out
