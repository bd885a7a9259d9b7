"""Text for people: the tables of ``spectrace analyze``, ``comm``, ``compare`` and ``whatif`` (all text rendering is here)."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import polars as pl

from nvtx_hooks.phases import base_name

from ..compute import acceptance, anatomy, host_gaps, steady_tables
from ..compute.collectives import short_name
from ..compute.compare import Comparison
from ..compute.cycle_budget import budget
from ..compute.cycles import selection
from ..compute.findings import Finding
from ..compute.payload import cycle_order
from ..compute.scalars import real, to_float
from ..compute.tokens import DEFINITION, summary
from ..compute.whatif_model import MAX_STEPS, NEAR_BEST, Model
from ..model import SEAM_CAUSES, CommResult, Result

__all__ = ["kernel_label", "ranked", "text_width", "wrap_lines", "display_names", "selection_lines", "class_lines",
           "host_gap_lines",
           "segment_lines", "budget_text", "steady_phase_text", "findings_text", "table_text", "kernels_text",
           "analyze_table", "probe_lines", "comm_table", "compare_table", "whatif_segment_lines", "acceptance_text",
           "best_text", "best_steps_label", "whatif_table", "TABLE_GAP", "acceptance_lines"]

_NO_PHASE = "(none)"  # how a null phase (GPU work outside every selected range) is shown


def _ms(ns) -> str:
    return f"{(ns or 0) / 1e6:,.3f}"


def _us(ns) -> str:
    return f"{(ns or 0) / 1e3:,.1f}"


def _pct(a, b) -> str:
    return f"{100 * a / b:5.1f}" if b else "    -"


def _grid(header: list[str], rows: list[list[str]], left: int = 1) -> list[str]:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(header)]

    def line(cells):
        return "  ".join(c.ljust(w) if i < left else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))

    return [line(header), line(["-" * w for w in widths]), *[line(r) for r in rows]]


def _phase_rows(df: pl.DataFrame, total_span: int) -> list[list[str]]:
    rows = []
    for r in df.iter_rows(named=True):
        span = r["span_ns"]
        rows.append([
            r["phase"], str(r["instances"]), _ms(span), _pct(span, total_span), _us(span / max(r["instances"], 1)),
            _ms(r["compute_ns"]), _pct(r["compute_ns"], span), _ms(r["comm_ns"]), _pct(r["comm_ns"], span),
            _ms(r["idle_ns"]), _pct(r["idle_ns"], span), _ms(r.get("gpu_idle_ns")), _ms(r["kernel_ns"]), str(r["ops"]),
        ])
    return rows


_PHASE_HEADER = ["phase", "inst", "span ms", "%all", "µs/inst", "compute ms", "%", "comm ms", "%", "idle ms", "%",
                 "GPU-idle ms", "kernel ms", "ops"]


def _order(df: pl.DataFrame, col: str) -> pl.DataFrame:
    """Phases in cycle order when they are cycle phases, else by time."""
    return df.with_columns(_o=cycle_order(col)).sort("_o", "span_ns" if "span_ns" in df.columns else col,
                                                     descending=[False, True]).drop("_o")


def _refusals(refused: pl.DataFrame) -> list[str]:
    """One line per phase whose matched collectives do not end together (no wait/straggler numbers for it)."""
    return [f"  {r['phase'] if r['phase'] is not None else _NO_PHASE}: {r['collectives']} matched collectives end "
            f"{_us(r['end_spread_p50_ns'])} µs apart (p50) > {_us(r['bound_ns'])} µs: they are not the same "
            "collectives on every rank, or the clocks disagree" for r in refused.iter_rows(named=True)]


def _comm_split(res: Result) -> list[str]:
    """Matched collectives per rank and phase: waiting for the last rank vs transfer (more in ``spectrace comm``)."""
    p, refused = res.phases, res.comm_refused
    if "comm_wait_ns" not in p.columns:
        return []
    p = _order(p.filter((pl.col("comm_wait_ns") + pl.col("comm_transfer_ns")) > 0), "phase").sort("rank",
                                                                                                  maintain_order=True)
    if not p.height and not refused.height:
        return []
    rows = [[r["phase"], str(r["rank"]), _ms(r["comm_wait_ns"] + r["comm_transfer_ns"]), _ms(r["comm_wait_ns"]),
             _pct(r["comm_wait_ns"], r["comm_wait_ns"] + r["comm_transfer_ns"]), _ms(r["comm_transfer_ns"])]
            for r in p.iter_rows(named=True)]
    out = ["", "Collectives matched across ranks: kernel time spent waiting for the last rank vs transferring "
               "(spectrace comm for stragglers)",
           *_grid(["phase", "rank", "collective ms", "wait ms", "%", "transfer ms"], rows, 2)]
    if refused.height:
        out += ["No wait/transfer split (refused) for:", *_refusals(refused)]
    return out


def kernel_label(name: str, width: int = 60) -> str:
    """A kernel name for tables: no ``void``, template and argument lists shortened, at most ``width`` chars."""
    n = re.sub(r"^void\s+", "", name or "")
    n = re.sub(r"\(.*$", "", re.sub(r"<.*", "<…>", n)) or n
    return n if len(n) <= width else n[: width - 1] + "…"


TABLE_GAP = re.compile(r"\S  +\S")  # two spaces or more between words: a table row (or a bar), never wrapped
_DIAG = re.compile(r"^(  (?:info|warning|error) +)")


def ranked(diagnostics: list) -> list:
    """Errors, then warnings (a number the user reads is affected), then notes; each in its own order."""
    order = {"error": 0, "warning": 1}
    return sorted(diagnostics, key=lambda d: order.get(d.level, 2))


def text_width() -> int:
    """Where prose lines wrap: the terminal's width when standard output is one, else 120."""
    import os
    import sys

    try:
        if sys.stdout is not None and sys.stdout.isatty():
            return max(60, os.get_terminal_size(sys.stdout.fileno()).columns)
    except (OSError, ValueError, AttributeError):
        pass
    return 120


def wrap_lines(lines: list[str], width: int | None = None) -> list[str]:
    """Prose lines wrapped at ``width`` (default :func:`text_width`), continued under their own indent
    (a diagnostic under its message); table rows (words two spaces apart) are kept whole."""
    width = width or text_width()
    out = []
    for line in lines:
        m = _DIAG.match(line)
        if len(line) <= width or (not m and TABLE_GAP.search(line.strip())):
            out.append(line)
            continue
        lead = m.group(1) if m else line[: len(line) - len(line.lstrip())]
        out += textwrap.wrap(line[len(lead):], width, initial_indent=lead, subsequent_indent=" " * len(lead),
                             break_on_hyphens=False, break_long_words=False) or [line]
    return out


_IDENT = re.compile(r"[A-Za-z_]\w*")


def display_names(names: list[str], width: int = 60) -> list[str]:
    """:func:`kernel_label` of each name, except that distinct names whose labels would be the same keep the part
    that differs: the first identifiers of their template and argument lists that the others lack, e.g.
    ``vectorized_elementwise_kernel<…GeluCUDAKernelImpl…>`` and ``vectorized_elementwise_kernel<…CUDAFunctor_add…>``
    (at most ``width`` chars, cut inside the common part). Equal names get equal labels; distinct names that
    still look the same are numbered (``#2``)."""
    full = [str(n or "") for n in names]
    labels = [kernel_label(n, 10**6) for n in full]
    groups: dict[str, set[str]] = {}
    for n, lab in zip(full, labels):
        groups.setdefault(lab, set()).add(n)
    named: dict[str, str] = {}
    for lab, members in groups.items():
        if len(members) == 1:
            n = next(iter(members))
            named[n] = lab if len(lab) <= width else lab[: width - 1] + "…"
            continue
        base = lab[:-3] if lab.endswith("<…>") else lab
        toks = {n: list(dict.fromkeys(_IDENT.findall(re.sub(r"^void\s+", "", n)[len(base):]))) for n in members}
        common = set.intersection(*(set(t) for t in toks.values()))
        seen: dict[str, int] = {}
        for n in sorted(members):
            diff = [t for t in toks[n] if t not in common][:2]
            if len(diff) > 1 and len(base) + len(diff[0]) + len(diff[1]) + 5 > width:
                diff = diff[:1]
            tail = "<…" + "…".join(diff) + "…>" if diff else ""
            head = base if len(base) + len(tail) <= width else base[: max(8, width - len(tail) - 1)] + "…"
            lab_n = head + tail
            seen[lab_n] = seen.get(lab_n, 0) + 1
            named[n] = lab_n if seen[lab_n] == 1 else f"{lab_n} #{seen[lab_n]}"
    return [named[n] for n in full]


def selection_lines(res: Result) -> list[str]:
    """The steady-state statement and the cycle period / tokens headline (one definition, stated once)."""
    info = selection(res)
    out = [info.text[0].upper() + info.text[1:]]
    tk = summary(res)
    if tk.period_ns:
        line = (f"Cycle period {_us(tk.period_ns)} µs (p50 {_us(tk.period_p50_ns)}, p90 {_us(tk.period_p90_ns)})")
        if tk.tokens_per_cycle is not None:
            line += (f" · {tk.tokens_per_cycle:.2f} tokens per {tk.kind} ({tk.source}) · "
                     f"{tk.tokens_per_s:,.1f} tokens/s")
        out += [line, f"  ({DEFINITION})"]
    if tk.accepted_per_request is not None:
        out.append(f"Acceptance: {tk.accepted_per_request:.2f} accepted draft tokens per request per cycle (p50 "
                   f"{tk.accepted_p50:g}, p90 {tk.accepted_p90:g}; measured on {tk.accepted_cycles} steady cycles "
                   f"from the {'accept marks' if tk.acceptance_source == 'marks' else 'range payload'})")
    return out + acceptance_lines(res)


def acceptance_lines(res: Result) -> list[str]:
    """Acceptance per draft position (the hooks' ``accept_histogram`` marks): per segment and the run, the requests
    that accepted at least j drafts and the conditional rate at each position j."""
    rows = acceptance.per_position(res)
    if not rows:
        return []
    k = max((len(r.accepted_at_position) for r in rows), default=0)
    if k == 0:
        return []
    cells = []
    for r in rows:
        cells.append([r.key, str(r.cycles), f"{r.requests:,}", *[
            f"{r.accepted_at_position[j]:,} ({r.rate_at_position[j]:.2f})"
            if j < len(r.accepted_at_position) and r.rate_at_position[j] is not None else "-" for j in range(k)],
            f"{r.mean_accepted:.2f}" if r.mean_accepted is not None else "-"])
    return ["Acceptance per draft position (every cycle of each segment, from the accept_histogram marks): requests "
            "that accepted at least j drafts (of those that reached position j, the share that accepted it)",
            *_grid(["segment", "cycles", "requests", *[f"position {j + 1}" for j in range(k)], "mean"], cells)]


def class_lines(res: Result) -> list[str]:
    """The classes of slower cycles: the recurring ones (kept in the numbers) and the rare stalls (left out)."""
    cl = anatomy.cycle_classes(res)
    if not cl:
        return []
    out = ["", "Slower cycles: what recurs is kept in the steady state, rare stalls are left out (µs over the "
               "typical cycle of the same batch size; where the extra time sits, per rank)"]
    for c in cl:
        out.append(f"  {'kept' if c.kept else 'left out'} · {c.text}")
    return out


def host_gap_lines(res: Result) -> list[str]:
    """The host-bound gaps: what the launching thread did from the end of the GPU work to the next launch call, per
    item (host range, CUDA API call, unattributed), µs per steady cycle; the classes' items; the samples' frames."""
    hg = host_gaps.host_gaps(res)
    if hg.windows.height == 0:
        return []
    out = ["", "Host-bound gaps: the launching thread from the end of the GPU work to the next launch call "
               "(µs per steady cycle; a cycle whose gap was not host-bound adds 0)"]
    st = hg.windows.filter(pl.col("scope") == "steady")
    for w in st.iter_rows(named=True):
        out.append(f"  rank {w['rank']} · {w['gap']}: {_us(w['window_ns'])} per cycle "
                   f"(host-bound in {w['host_bound']} of {w['cycles']} cycles)")
        it = hg.items.filter((pl.col("scope") == "steady") & (pl.col("rank") == w["rank"]) & (pl.col("gap") == w["gap"])
                             & (pl.col("ns") > 0))
        for r in it.iter_rows(named=True):
            extra = f", {_us(r['wait_ns'])} µs waiting for the GPU" if r["wait_ns"] and r["kind"] == "range" else ""
            smp = f", {r['samples']} CPU samples" if hg.sampled else ""
            out.append(f"    {r['item']:<40} {_us(r['ns']):>12}  {100 * r['share']:5.1f} %{extra}{smp}")
            fr = hg.frames.filter((pl.col("rank") == w["rank"]) & (pl.col("gap") == w["gap"])
                                  & (pl.col("item") == r["item"]))
            if fr.height:
                out.append("      top frames: " + ", ".join(f"{f['frame']} ({f['samples']})" for f in fr.iter_rows(named=True)))
            py = hg.python_frames.filter((pl.col("rank") == w["rank"]) & (pl.col("gap") == w["gap"])
                                         & (pl.col("item") == r["item"]))
            if py.height:
                out.append("      top Python frames: " + ", ".join(f"{f['frame']} ({f['samples']})"
                                                                  for f in py.iter_rows(named=True)))
    seg = hg.items.filter(pl.col("scope") != "steady")
    if seg.height:
        out.append("  per segment (µs per cycle): " + "; ".join(
            f"{sc} rank {rk} {gap}: " + ", ".join(f"{i} {_us(n)}" for i, n in zip(g["item"], g["ns"]) if n > 0)
            for (sc, rk, gap), g in seg.group_by("scope", "rank", "gap", maintain_order=True)))
    for c in hg.classes:
        out.append(f"  {c['text']}")
    out += [f"  note: {n}" for n in hg.notes]
    return out


def segment_lines(res: Result) -> list[str]:
    """Per decode batch size and step count (the payload's): cycles, period p50/p90/mean, prefills, the biggest
    pieces."""
    seg = anatomy.segments(res)
    if len(seg) < 2:  # one batch size all along: the headline above is its segment
        return []
    rows = []
    for s in seg:
        top = sorted(s.budget, key=lambda b: -b["ns"])[:3]
        rows.append([s.key, f"{s.first_cycle}–{s.last_cycle}", str(s.cycles), _us_or_dash(s.period_p50_ns),
                     _us_or_dash(s.period_p90_ns), _us_or_dash(s.period_mean_ns), str(s.prefills),
                     ", ".join(f"{b['segment']} {_us(b['ns'])}" for b in top)])
    steps = sorted({x.steps for x in seg if x.steps is not None})
    note = ([f"(the draft steps differ between segments: {', '.join(map(str, steps))}; each segment's pieces are its "
             "own cycles'; the cycle budget averages them all)"] if len(steps) > 1 else [])
    return ["", "Segments: cycles of one decode batch size and draft step count (steady cycles; period µs; prefill "
            "batches before them)",
            *_grid(["segment", "cycles", "steady", "p50", "p90", "mean", "prefills", "biggest pieces (µs per cycle)"],
                   rows), *note]


def _symbols(names: list[str]) -> dict[str, str]:
    """One letter per phase for the text bars: the first free letter of its base name."""
    out: dict[str, str] = {}
    for n in names:
        b = base_name(n)
        letters = [c.upper() for c in b if c.isalpha()] + list("XYZQWK")
        if base_name(n).endswith("_extend"):
            letters.insert(0, "E")
        used = set(out.values())
        out[n] = next((c for c in [*letters, *_MORE_SYMBOLS] if c not in used), "·")  # (hundreds of phases: "·")
    return out


_MORE_SYMBOLS = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"


def budget_text(res: Result, width: int = 64) -> list[str]:
    """The cycle budget: one text bar per rank and a table of the pieces (µs per cycle, % of the cycle)."""
    b = budget(res)
    if b.height == 0:
        return []
    ranks = sorted(b["rank"].unique().to_list())
    order = (b.group_by("segment", "kind").agg(pl.col("order").mean(), pl.col("ns").mean())
             .sort("order", "segment"))
    sym = _symbols(order.filter(pl.col("kind") == "phase")["segment"].to_list())
    mark = {"seam": "·", "head": "·", "tail": "·", "gap": "-", "prefill": "p"}
    periods = b.group_by("rank").agg(pl.col("ns").sum())
    scale = width / to_float(periods["ns"].max())
    out = ["Cycle budget: the mean steady cycle on each rank's GPU clock, piece by piece (they add up to the period)"]
    for rk in ranks:
        r = b.filter(pl.col("rank") == rk).sort("order", "segment")
        cells, acc, drawn = [], 0.0, 0
        for row in r.iter_rows(named=True):
            acc += max(row["ns"], 0.0) * scale
            k = round(acc) - drawn
            drawn += k
            cells.append((sym.get(row["segment"]) or mark.get(row["kind"], "?")) * k)
        total = float(r["ns"].sum())
        out.append(f"  rank {rk:<3} |{''.join(cells).ljust(width)}| {_us(total)} µs")
    out.append("           " + "  ".join(f"{v} {k}" for k, v in sym.items()) + "  · seam  - between cycles"
               + ("  p prefill" if (b["kind"] == "prefill").any() else ""))
    head = ["piece", *[f"rank {r} µs" for r in ranks], "% of cycle", "GPU idle µs"]
    rows = []
    mean_period = to_float(periods["ns"].mean())
    for seg in order.iter_rows(named=True):
        per = b.filter(pl.col("segment") == seg["segment"])
        vals = dict(zip(per["rank"].to_list(), per["ns"].to_list()))
        gi = per["gpu_idle_ns"].drop_nulls()
        rows.append([seg["segment"], *[_us(vals[r]) if r in vals else "-" for r in ranks],
                     f"{100 * float(per['ns'].sum()) / len(ranks) / mean_period:5.1f} %",
                     _us(to_float(gi.mean())) if gi.len() else "-"])
    out += _grid(head, rows)
    idle = real(b.filter(pl.col("kind").is_in(["seam", "gap"]))["gpu_idle_ns"].fill_null(0).sum()) / len(ranks)
    inside = real(b.filter(pl.col("kind") == "phase")["gpu_idle_ns"].fill_null(0).sum()) / len(ranks)
    gap = real(b.filter(pl.col("kind") == "gap")["gpu_idle_ns"].fill_null(0).sum()) / len(ranks)
    out.append(f"GPU idle per cycle (mean over ranks): {_us(idle + inside)} µs = "
               f"{100 * (idle + inside) / mean_period:.1f} % of the cycle: {_us(gap)} between cycles and "
               f"{_us(idle - gap)} in seams (waiting for the host to launch), {_us(inside)} inside phases.")
    return out


_STEADY_HEADER = ["phase", "rank", "inst", "span µs", "p50", "p90", "compute µs", "comm µs", "idle µs", "p50",
                  "p90", "%comm", "%idle"]


def steady_phase_text(res: Result) -> list[str]:
    """Per phase (all ranks, then each rank when there are several): per-instance mean / p50 / p90, steady state."""
    pa = _order(steady_tables.steady_phases_all_ranks(res).with_columns(rank=pl.lit(None, pl.Int64)), "phase")
    pr = steady_tables.steady_phases(res)
    multi = res.ranks.height > 1
    rows = []
    for a in pa.iter_rows(named=True):
        group = [a] + (pr.filter(pl.col("phase") == a["phase"]).sort("rank").to_dicts() if multi else [])
        for r in group:
            rows.append([r["phase"] if r is a else "", "all" if r["rank"] is None else str(r["rank"]),
                         str(r["instances"]), _us(r["span_mean_ns"]), _us(r["span_p50_ns"]), _us(r["span_p90_ns"]),
                         _us(r["compute_mean_ns"]), _us(r["comm_mean_ns"]), _us(r["idle_mean_ns"]),
                         _us(r["idle_p50_ns"]), _us(r["idle_p90_ns"]), _pct(r["comm_ns"], r["span_ns"]),
                         _pct(r["idle_ns"], r["span_ns"])])
    which = "steady state" if selection(res).how != "none" else "whole run (no cycle ranges)"
    return [f"Phases per instance, {which} (µs; mean unless p50/p90; span = compute + comm + idle)",
            *_grid(_STEADY_HEADER, rows, 2)]


def findings_text(found: list[Finding], width: int = 110) -> list[str]:
    """Ranked findings with their evidence and what to try (the lines ``spectrace analyze`` prints)."""
    out = ["Findings, ranked by the cycle time they explain (what to change first)"]
    if not found:
        return [*out, "  none above 1 % of the cycle."]
    for i, f in enumerate(found, 1):
        rk = None if f.rank is None else ("worst rank " if f.rank_is == "worst" else "rank ") + str(f.rank)
        where = " · ".join(x for x in (f.phase, rk) if x)
        out.append(f"{i:>2}. [{f.severity}] {f.code}" + (f" · {where}" if where else "")
                   + f" · {_us(f.impact_ns)} µs per cycle ({100 * f.share:.1f} %)")
        out += textwrap.wrap(f.evidence, width, initial_indent="    ", subsequent_indent="    ")
        out += textwrap.wrap("try: " + f.action, width, initial_indent="    ", subsequent_indent="         ")
    return out


def table_text(df: pl.DataFrame) -> str:
    """Any result table as aligned text (``*_ns`` columns in µs)."""
    if df.height == 0:
        return "(no rows)\n"
    head = [c[:-3] + " µs" if c.endswith("_ns") else c for c in df.columns]
    if "name" in df.columns:
        df = df.with_columns(name=pl.Series(display_names(df["name"].cast(pl.String).to_list())))
    rows = []
    for r in df.iter_rows():
        cells = []
        for c, v in zip(df.columns, r):
            if v is None:
                cells.append("-")
            elif c.endswith("_ns") and isinstance(v, int | float):
                cells.append(_us(v))
            elif isinstance(v, float):
                cells.append(f"{v:,.3f}")
            else:
                cells.append(str(v))
        rows.append(cells)
    left = sum(1 for c in df.columns if df[c].dtype == pl.String)
    return "\n".join(_grid(head, rows, max(left, 1))) + "\n"


def kernels_text(res: Result, top: int = 5) -> str:
    """``analyze --table kernels``: the top GPU operations of each phase, steady state."""
    k = _order(steady_tables.kernels(res, top), "phase")
    out = [f"Top {top} GPU operations per phase, steady state, all ranks (per cycle = per rank per steady cycle)"]
    rows = [[r["phase"], label, f"{r['count_per_cycle']:,.1f}", _us(r["per_cycle_ns"]),
             f"{100 * r['share']:.1f}", str(r["ranks"])]
            for r, label in zip(k.iter_rows(named=True), display_names(k["name"].to_list()))]
    out += _grid(["phase", "operation", "count/cycle", "µs/cycle", "% of phase", "ranks"], rows, 2)
    return "\n".join(out) + "\n"


def analyze_table(res: Result, found: list[Finding] | None = None) -> str:
    """``spectrace analyze``: steady state and cycle budget first, per-instance phases, the whole run's totals,
    comm split, seams, parent ranges, coverage, diagnostics, then the ranked findings."""
    t, out = res.trace, []
    pe = res.probe_effect
    name = (f"{Path(pe['node']).name} (split) + {Path(pe['graph']).name} (timing)" if pe is not None
            else ", ".join(Path(p).name for p in res.reports) or Path(t.path).name)
    out.append(f"spectrace · {name} · nsys {t.nsys_version} (schema {t.schema_version}) · "
               f"{res.ranks.height} rank(s) · CUDA graph trace: {t.graph_trace_mode or 'none'}")
    out.append(f"phases: {res.selection}")
    for rk in res.ranks.iter_rows(named=True):
        dev = f"GPU {rk['device']}" + (f" {rk['device_name']}" if rk["device_name"] else "")
        out.append(f"Rank {rk['rank']} (pid {rk['pid']}, {dev})")
    out.append("")
    out += selection_lines(res)
    out += class_lines(res)
    out += host_gap_lines(res)
    out += segment_lines(res)
    bt = budget_text(res)
    if bt:
        out += ["", *bt]
    out += ["", *steady_phase_text(res)]
    out.append("")
    out.append("Whole run: every captured instance, warm-up included (these sums equal nsys stats' projections).")
    out.append("Each phase: span (first op start → last op end, per instance, summed) = compute + comm + idle;")
    out.append("GPU-idle is the part of idle in which the GPU ran nothing at all (no other phase's work either).")
    pa = res.phases_all
    total = int(pa["span_ns"].sum()) if pa.height else 0
    out.append(f"All ranks ({res.ranks.height}), times summed over ranks")
    out += _grid(_PHASE_HEADER, _phase_rows(_order(pa, "phase"), total))
    out += _comm_split(res)
    sa = steady_tables.steady_seams_all_ranks(res)
    if sa.height:
        out.append("")
        out.append("Seams, steady state: GPU idle between consecutive ranges (last op of one → first op of the next), "
                   "all ranks")
        out += _seam_rows(sa)
    out += _host_waits(pa)
    parents = res.ranges_all.join(res.seams_all.select(pl.col("parent").alias("range")).unique(), on="range",
                                  how="semi")
    if parents.height:
        out.append("")
        out.append("Parent ranges, inclusive (NVIDIA-style projection of everything launched inside), all ranks, whole run")
        rows = [[r["range"], str(r["instances"]), _ms(r["proj_span_ns"]), _us(r["proj_span_ns"] / max(r["instances"], 1)),
                 _ms(r["busy_ns"] - r["comm_ns"]), _ms(r["comm_ns"]), _ms(r["idle_ns"]), _pct(r["idle_ns"], r["proj_span_ns"])]
                for r in parents.iter_rows(named=True)]
        out += _grid(["range", "inst", "span ms", "µs/inst", "compute ms", "comm ms", "idle ms", "%idle"], rows)
    if res.probe_effect is not None:
        out += ["", *probe_lines(res.probe_effect)]
    cov = res.coverage
    gpu, att = (int(cov["gpu_ns"].sum()), int(cov["attributed_ns"].sum())) if cov.height else (0, 0)
    out.append("")
    out.append(f"Coverage: phases received {_ms(att)} of {_ms(gpu)} ms of GPU busy time inside the phased window "
               f"({_pct(att, gpu).strip()}%).")
    if res.diagnostics:
        out.append("")
        out.append("Diagnostics")
        out += [f"  {d.level:<7} {d.code}: {d.message}" for d in ranked(res.diagnostics)]
    if found is not None:
        out += ["", *findings_text(found)]
    return "\n".join(wrap_lines(out)) + "\n"


def _seam_rows(sa: pl.DataFrame) -> list[str]:
    """The seams table; with causes (analyze.compute.host): the dominant one and the idle time of each."""
    causes = "bound" in sa.columns
    rows = []
    spread = "idle_p50_ns" in sa.columns
    for r in sa.iter_rows(named=True):
        n = max(r["instances"], 1)
        row = [r["parent"] or "(top level)", f"{r['from']} → {r['to']}", str(r["instances"]), _ms(r["idle_ns"]),
               _us(r["idle_ns"] / n)]
        row += [_us(r["idle_p50_ns"]), _us(r["idle_p90_ns"])] if spread else []
        row += [_ms(r["busy_ns"]), _ms(r["overlap_ns"])]
        if causes:
            b = r["bound"]
            row += [f"{b} {r[f'{b}_bound_inst']}/{r['instances']}" if b else "-",
                    *(_ms(r[f"{c}_bound_ns"]) for c in SEAM_CAUSES),
                    _us_or_dash(r["launch_block_ns"] / r["launch_bound_inst"] if r["launch_bound_inst"] else None),
                    _us_or_dash(r["host_late_ns"] / r["host_bound_inst"] if r["host_bound_inst"] else None)]
        rows.append(row)
    head = ["within", "transition", "inst", "idle ms", "µs/inst", *(["p50", "p90"] if spread else []),
            "other work ms", "overlap ms"]
    if causes:
        head += ["bound", "gpu ms", "launch ms", "host ms", "block µs", "late µs"]
    out = _grid(head, rows, 2)
    if causes:
        out.append("bound: why the GPU waited, per instance: gpu = the next phase's first op was queued before the "
                   "earlier work ended; launch = its launch call returned after that (block µs: how long after, "
                   "mean); host = the launch began after it (late µs: how late, mean). gpu/launch/host ms: idle "
                   "time of the instances of each cause.")
    return out


def _host_waits(pa: pl.DataFrame) -> list[str]:
    """Per phase: the host's time in launching calls and waiting in sync-like calls (all ranks)."""
    if "host_wait_ns" not in pa.columns or not int(real(pa["launch_api_ns"].sum()) + real(pa["host_wait_ns"].sum())):
        return []
    rows = [[r["phase"], str(r["instances"]), _ms(r["launch_api_ns"]), _us(r["launch_api_ns"] / max(r["instances"], 1)),
             str(r["syncs"]), _ms(r["host_wait_ns"]), _us(r["host_wait_ns"] / max(r["instances"], 1))]
            for r in _order(pa, "phase").iter_rows(named=True)]
    return ["", "Host side per phase, all ranks: time in the API calls that launched its GPU work, and time waiting "
                "for the GPU in sync-like calls (synchronize, .item()/DtoH copies)",
            *_grid(["phase", "inst", "launch API ms", "µs/inst", "syncs", "host wait ms", "µs/inst"], rows)]


def probe_lines(pe: dict) -> list[str]:
    """The probe-effect section: cycle period under the graph- and node-level passes, per phase and seam."""
    def pct(x) -> str:
        return "-" if x is None else f"{x:+.1f}%"

    p = pe["period_ns"]
    out = [f"Probe effect: graph-level pass {Path(pe['graph']).name} vs node-level pass {Path(pe['node']).name}",
           f"median cycle period: graph {_us_or_dash(p['graph'])} µs, node {_us_or_dash(p['node'])} µs: node-level "
           f"tracing {pct(pe['inflation'])}"]
    u = pe.get("unprofiled")
    if u:
        own = u["own_cycles_per_s"]
        out.append(f"without a profiler ({u['source']}): {u['cycles_per_s']:,.1f} cycles/s = {_us_or_dash(u['period_ns'])} "
                   f"µs per cycle; trace median period vs that: graph {pct(u['period_vs_unprofiled']['graph'])}, node "
                   f"{pct(u['period_vs_unprofiled']['node'])}")
        if any(v is not None for v in own.values()):
            out.append("the workload's own cycles/s under each pass: " + ", ".join(
                f"{k} {v:,.1f} ({pct(u['own_vs_unprofiled'][k])} slower)" for k, v in own.items() if v is not None))
    rows = [[r["phase"], _us_or_dash(r["span_ns"]["graph"]), _us_or_dash(r["span_ns"]["node"]), pct(r["span_inflation"]),
             _us_or_dash(r["launch_ns"]["graph"]), _us_or_dash(r["launch_ns"]["node"])] for r in pe["phases"]]
    rows += [[f"seam {r['transition']}", _us_or_dash(r["idle_ns"]["graph"]), _us_or_dash(r["idle_ns"]["node"]), "",
              r["bound"]["graph"] or "-", r["bound"]["node"] or "-"] for r in pe["seams"]]
    out += _grid(["phase / seam", "span/idle µs: graph", "node", "Δ", "launch µs/bound: graph", "node"], rows)
    out.append("per instance, medians: a phase's GPU span and the time in the API calls that launched its work; a "
               "seam's GPU idle and dominant cause")
    return out


def _us_or_dash(ns) -> str:
    return "-" if ns is None else f"{ns / 1e3:,.1f}"


def _ms_or_dash(ns) -> str:
    return "-" if ns is None else _ms(ns)


def _pct1(a, b) -> str:
    return f"{100 * a / b:.1f}" if b and a is not None else "-"


def comm_table(res: CommResult) -> str:
    """``spectrace comm``: collectives per phase, rank and kernel; stragglers; diagnostics."""
    c = res.clock
    out = [f"spectrace comm · {', '.join(Path(p).name for p in res.reports)} · {res.ranks.height} rank(s)",
           f"phases: {res.selection}",
           f"clock: {c['alignment']}; collective end spread p50 {_us_or_dash(c.get('end_spread_p50_ns'))} µs, "
           f"p99 {_us_or_dash(c.get('end_spread_p99_ns'))} µs (residual)"]
    for r in c.get("per_report", []):
        out.append(f"  report {r['report']} {Path(r['path']).name}: utcEpochNs {r['utc_epoch_ns']}, "
                   f"session offset {_us_or_dash(r['session_offset_ns'])} µs, refined by {_us_or_dash(r.get('refine_ns'))} µs")
    d = res.to_dict()["matching"]
    out.append(f"matched {d['matched_collectives']} collectives ({d['matched_kernels']} of {d['comm_kernels']} "
               f"communication kernels; {d['unmatched_kernels']} unmatched"
               + (f"; {d['left_out_kernels']} in instances left out: cut, lost or unpaired" if d["left_out_kernels"]
                  else "") + ")")
    if res.cycles:
        out.append(f"cycles: {res.cycles}" + (f" ({res.outside_cycles} matched kernels of phase instances outside "
                                              "them not counted)" if res.outside_cycles else ""))
    out.append("wait = kernel time before the last rank arrived (latest start); transfer = the rest; "
               "skew = last arrival - own start")
    out.append("")
    s = res.collectives.with_columns(short_name(pl.col("name")).alias("name"), pl.col("phase").fill_null(_NO_PHASE))
    rows = [[r["phase"], str(r["rank"]), r["name"], str(r["count"]), _ms(r["duration_ns"]), _ms_or_dash(r["wait_ns"]),
             _pct1(r["wait_ns"], r["duration_ns"]), _ms_or_dash(r["transfer_ns"]), _us_or_dash(r["skew_p50_ns"]),
             _us_or_dash(r["skew_p99_ns"]), "-" if r["last_arrivals"] is None else str(r["last_arrivals"])]
            for r in s.iter_rows(named=True)]
    out.append("Per phase, rank and kernel")
    out += _grid(["phase", "rank", "kernel", "count", "dur ms", "wait ms", "%wait", "transfer ms", "skew p50 µs",
                  "skew p99 µs", "last"], rows, 3)
    st = res.stragglers.with_columns(pl.col("phase").fill_null(_NO_PHASE))
    rows = [[r["phase"], str(r["rank"]), _ms(r["caused_wait_ns"]), f"{100 * r['wait_share']:.1f}",
             f"{r['last_arrivals']}/{r['collectives']}", _us_or_dash(r["mean_delay_ns"]), _us_or_dash(r["max_delay_ns"])]
            for r in st.iter_rows(named=True)]
    out.append("")
    out.append("Stragglers: the waiting each rank caused (the other ranks' wait at the collectives it arrived last at), "
               "how often it was last and by how much")
    out += _grid(["phase", "rank", "caused ms", "% of wait", "last", "mean delay µs", "max delay µs"], rows, 2)
    for v in res.straggler.iter_rows(named=True) if res.straggler.height else []:
        per = f", {v['per_cycle_ns'] / 1e3:,.1f} µs per cycle" if v.get("per_cycle_ns") is not None else ""
        out.append(f"Straggler of {v['phase']}: rank {v['rank']} (it caused {100 * v['wait_share']:.0f} % of the waiting "
                   f"in its collectives{per}; the same rule as analyze's findings)")
    if res.refused.height:
        out.append("")
        out.append("Refused: no wait, skew or straggler numbers for these phases")
        out += _refusals(res.refused)
    if res.diagnostics:
        out.append("")
        out.append("Diagnostics")
        out += [f"  {x.level:<7} {x.code}: {x.message}" for x in res.diagnostics]
    return "\n".join(wrap_lines(out)) + "\n"


def _f(v, scale=1e3, fmt="{:,.1f}") -> str:
    return "-" if v is None else fmt.format(v / scale)


def _d(v, fmt="{:+,.1f}") -> str:
    return "-" if v is None else fmt.format(v / 1e3)


def compare_table(doc: Comparison) -> str:
    """``spectrace compare``: the verdict, then phases and seams in one ranking (µs per cycle, B − A split into
    compute / comm / idle, 95 % interval), per rank, and the kernels that moved."""
    tok = doc.per_token
    out = [f"A: {doc.a}", f"   {doc.steady['a']}", f"B: {doc.b}", f"   {doc.steady['b']}"]
    p = doc.cycle_period
    for k in ("a", "b"):
        t = doc.tokens[k]
        line = f"{k.upper()}: cycle period {_f(p[f'{k}_ns'])} µs"
        if t.tokens_per_cycle is not None:
            line += f", {t.tokens_per_cycle:.2f} tokens per {t.kind} ({t.source})"
            line += f", {t.tokens_per_s:,.1f} tokens/s" if t.tokens_per_s is not None else ""
        out.append(line)
    out.append(f"   ({doc.definition})")
    out += ["", f"Verdict: {doc.verdict['text']}"]
    out += [f"Warning: {w}" for w in doc.warnings]
    st = doc.stragglers
    for k in ("a", "b"):
        for v in st.get(k) or []:
            out.append(f"Straggler in {k.upper()}: rank {v['rank']} in {v['phase']}: the other ranks wait "
                       f"{_f(v['per_cycle_ns'])} µs per cycle for it ({100 * v['wait_share']:.0f} % of the waiting in "
                       f"{v['phase']}'s collectives)")
    out.append("")
    head = ["phase or seam", "A µs/cycle", "B µs/cycle", "Δ µs", "= compute", "+ comm", "+ idle", "95 % interval"]
    if tok:
        head.append("Δ µs/token")
    rows = []
    for r in doc.rows:
        ci = (f"{_d(r.get('ci_low_ns'))} … {_d(r.get('ci_high_ns'))}" + (" *" if r.get("significant") else "  ")
              if r.get("ci_low_ns") is not None else "-")
        cells = [r["phase"], _f(r["a_ns_per_cycle"]) if r["in_a"] else "–", _f(r["b_ns_per_cycle"]) if r["in_b"] else "–",
                 _d(r["delta_ns"]), _d(r["delta_compute_ns"]), _d(r["delta_comm_ns"]), _d(r["delta_idle_ns"]), ci]
        if tok:
            cells.append(_d(r["delta_ns_per_token"]))
        rows.append(cells)
    cells = ["cycle period", _f(p["a_ns"]), _f(p["b_ns"]), _d(p["delta_ns"]), "", "", "",
             f"{_d(p.get('ci_low_ns'))} … {_d(p.get('ci_high_ns'))}" if p.get("ci_low_ns") is not None else "-"]
    if tok:
        cells.append(_d(p["b_ns_per_token"] - p["a_ns_per_token"]))
    rows.append(cells)
    out += _grid(head, rows)
    ranks = sorted({r["rank"] for r in doc.per_rank if r["rank"] is not None})
    if len(ranks) > 1:
        top = [r["phase"] for r in doc.rows[:8]]
        by = {(r["phase"], r["rank"]): r for r in doc.per_rank}
        out += ["", "Δ per rank, µs per cycle (compute / comm / idle of the change in the JSON's per_rank)"]
        out += _grid(["phase or seam", *[f"rank {k}" for k in ranks]],
                     [[ph, *[_d(by[(ph, k)]["delta_ns"]) if (ph, k) in by else "–" for k in ranks]] for ph in top])
    if doc.kernels:
        out += ["", "GPU operations that moved most, per phase (µs per cycle; count per cycle)"]
        moved = [k for k in doc.kernels if k["phase"] in {r["phase"] for r in doc.rows[:6]}]
        rows = [[k["phase"], label, _f(k["a_ns_per_cycle"]), _f(k["b_ns_per_cycle"]),
                 _d(k["delta_ns"]), f"{k['a_count_per_cycle']:,.1f} → {k['b_count_per_cycle']:,.1f}"]
                for k, label in zip(moved, display_names([k["name"] for k in moved], 56))]
        out += _grid(["phase", "operation", "A µs", "B µs", "Δ µs", "count"], rows, 2)
    out.append("")
    out.append("Δ = B − A over the steady cycles; per cycle = the mean over the cycles of the mean over their ranks, "
               "the cycle budget's pieces (they add up to the cycle period); one ranking by |Δ|"
               + (" per token" if tok else "") + "; – = not in that trace; * = the 95 % interval (bootstrap over "
               "cycles) excludes 0")
    return "\n".join(wrap_lines(out)) + "\n"


def best_steps_label(d: dict) -> str | None:
    """A segment's best step count and its ties (:meth:`SegmentModel.as_dict`): ``2 ≈3``; None without a best."""
    if d["best_steps"] is None:
        return None
    return str(d["best_steps"]) + "".join(f" ≈{t}" for t in d["near_best_steps"][1:])


def whatif_segment_lines(m: Model, max_steps: int = MAX_STEPS) -> list[str]:
    """Per segment (batch size): predicted tokens/s at each step count, the best one and its gain."""
    if not m.segments:
        return []
    rows = []
    steps: list[int] = []
    for sm in m.segments:
        d = sm.as_dict(max_steps)
        steps = [p["steps"] for p in d["predictions"]]
        cells = [f"{p['tokens_per_s']:,.0f}" + ("*" if p["extrapolated"] else "") if p["tokens_per_s"] else "-"
                 for p in d["predictions"]]
        gain = f"{100 * d['gain']:+.1f} %" if d["gain"] is not None else "-"
        rows.append([sm.key, ",".join(map(str, sm.measured_steps)), str(sm.cycles), _us(sm.period_ns), *cells,
                     best_steps_label(d) or "-", gain])
    several = any(len(sm.measured_steps) > 1 for sm in m.segments)
    joined = ("; a batch size measured at several step counts (an adaptive run's segments, or runs joined with "
              "--other-steps): each step count from the one measured nearest to it" if several else "")
    return ["", "Per segment (one model per batch size, from its own cycles at the step counts it ran: 'measured', "
                "the first the p50 and gain are of; tokens/s at each step count, "
                f"* extrapolated; best among the others, ≈ another within {100 * NEAR_BEST:.0f} % of its tokens/s{joined})",
            *_grid(["segment", "measured", "cycles", "p50 µs", *[f"{s} steps" for s in steps], "best", "gain"], rows)]


def acceptance_text(m: Model) -> str:
    """How the model's acceptance α is known: measured (accepted draft tokens per request per cycle) or given."""
    if m.alpha_given or m.accepted_now is None:
        return f"acceptance: α = {m.alpha:.3f}, given (--acceptance), not measured"
    return f"acceptance: {m.accepted_now:.2f} accepted draft tokens/request/cycle (measured) → α = {m.alpha:.3f}"


def best_text(m: Model, max_steps: int = MAX_STEPS) -> str:
    """The best step count, or why it is not known (with segments: said to be the whole run's average)."""
    best, near = m.best(max_steps), m.best(max_steps, measured_only=True)
    whole = (f"for the whole run ({len(m.segments)} batch sizes averaged, right for none of them: the best per batch "
             "size is in the per-segment table) " if m.segments else "")
    if best is None:
        return "best: unknown without acceptance (shortest cycle is always 1 step)"
    if near is not None and near.steps != best.steps:
        return (f"best {whole}within one step of the measured {m.steps_now}: {near.steps} steps, "
                f"{near.tokens_per_s:.1f} tok/s predicted; {best.steps} steps predicts "
                f"{best.tokens_per_s:.1f} tok/s but is extrapolated (*)")
    return (f"best {whole}".rstrip() + f": {best.steps} steps, {best.tokens_per_s:.1f} tok/s predicted"
            + (" (extrapolated *)" if best.extrapolated else ""))


def whatif_table(m: Model, max_steps: int = MAX_STEPS, explain: bool = False) -> str:
    """``spectrace whatif``: the fitted costs and the predictions per step count (``explain``: the assumptions)."""
    now = m.predict(m.steps_now)
    out = [f"what-if from {m.steps_now} draft steps: measured cycle {m.period_ns / 1e3:.1f} µs (mean over the "
           f"steady cycles); model {now.cycle_ns / 1e3:.1f} µs = draft {now.draft_ns / 1e3:.1f} + verify "
           f"{now.verify_ns / 1e3:.1f} + draft_extend {now.draft_extend_ns / 1e3:.1f} + seams {now.seams_ns / 1e3:.1f} "
           f"+ other {now.other_ns / 1e3:.1f} µs"]
    seams = m.seams(m.steps_now)
    if seams:
        out.append("seams inside a cycle (median µs): " + ", ".join(f"{k} {v / 1e3:.1f}" for k, v in seams.items()))
    if m.steps_source != "given":
        out.append(f"draft steps: {m.steps_now}, {m.steps_source}")
    if m.alpha is not None:
        out.append(acceptance_text(m))
    out += [f"note: {n}" for n in m.notes]
    out.append("")
    out.append(f"{'steps':>5}  {'cycle µs':>9}  {'draft':>8}  {'verify':>8}  {'extend':>8}  {'seams':>8}  {'other':>8}  "
               f"{'tok/cycle':>9}  {'tok/s':>9}")
    for p in m.predictions(max_steps):
        tok = f"{p.tokens_per_cycle:9.2f}" if p.tokens_per_cycle is not None else f"{'-':>9}"
        tps = f"{p.tokens_per_s:9.1f}" if p.tokens_per_s is not None else f"{'-':>9}"
        mark = " ← now" if p.measured else " *" if p.extrapolated else ""
        out.append(f"{p.steps:5d}  {p.cycle_ns / 1e3:9.1f}  {p.draft_ns / 1e3:8.1f}  {p.verify_ns / 1e3:8.1f}  "
                   f"{p.draft_extend_ns / 1e3:8.1f}  {p.seams_ns / 1e3:8.1f}  {p.other_ns / 1e3:8.1f}  {tok}  {tps}{mark}")
    out += ["", best_text(m, max_steps)]
    out.append(f"verify: {m.verify_text()}")
    out += whatif_segment_lines(m, max_steps)
    if m.probe is not None:
        out += ["", "Fitted on the graph-level pass (--timing).", *probe_lines(m.probe)]
    if explain:
        out += ["", "Assumptions"] + [f"  - {a}" for a in m.assumptions()]
    return "\n".join(wrap_lines(out)) + "\n"
