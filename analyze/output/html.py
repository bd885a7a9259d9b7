"""``DIR/index.html``: one self-contained page (tables and PNG figures inline, as data URIs) for a browser.

Nothing on it is wider than the page: tables scroll inside their own box, figures shrink to the page, and no
section is raw CLI text. Every table says its unit in its header, and whether a number is per instance, per
cycle or a sum.

The page is a list of :class:`Section` (id, title, body), in the order a reader needs them: the steady state
and the cycle budget, the ranked findings, then the evidence. Other analyses add sections with
``write_page(..., extra=[Section(...)])`` (placed before the whole-run tables and diagnostics); the
communication section keeps a ``<div id="comm-notes">`` for notes about collectives that could not be
matched or were refused.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import html
import importlib.metadata
import io
import json
import re
import types
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl

from nvtx_hooks.capture.files import NewFolder, utf8

from ..compute import (
    acceptance,
    anatomy,
    cycle_budget,
    findings,
    host_gaps,
    steady_tables,
    straggler,
    utilisation,
    view,
    whatif,
    whatif_model,
)
from ..compute import compare as cmp
from ..compute.cycles import selection
from ..compute.payload import cycle_order
from ..compute.scalars import real
from ..compute.tokens import DEFINITION, summary
from ..model import InputError, Result
from ..read import results
from . import cycles_chart, terminal, timeline
from .targets import FIGURES, PAGE_START, TIMELINE_FILE, as_input_error, report_folder
from .text import acceptance_text, best_steps_label, best_text, display_names, probe_lines, ranked

__all__ = ["Section", "utilisation_section", "write_page", "output_digest"]

_CSS = """body{font-family:system-ui,sans-serif;margin:2em auto;max-width:1250px;color:#222;padding:0 1em}
.tw{overflow-x:auto;max-width:100%;margin:.5em 0 1.5em}
table{border-collapse:collapse;font-size:13px}th,td{padding:3px 8px;border-bottom:1px solid #ddd;
vertical-align:top}td.n{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
th{background:#f3f3f3;text-align:left;min-width:4.5em;max-width:9em;font-weight:600}
.tw tr>:first-child{position:sticky;left:0;z-index:1;background:#fff;box-shadow:inset -1px 0 #ddd}
.tw tr>th:first-child{background:#f3f3f3}.tw tr[class^=sev]>td:first-child{background:inherit}
img{max-width:100%;height:auto;border:1px solid #eee;margin:.5em 0}
code{background:#f5f5f5;padding:1px 4px}.note{color:#555;font-size:13px}.warn{color:#a4441b}
p,li,h1,h2,h3,td,th{overflow-wrap:break-word}pre{white-space:pre-wrap;overflow-wrap:anywhere;font-size:12px}
nav{font-size:13px;margin:.5em 0 1.5em}nav a{margin-right:.9em}.head{font-size:15px}
.sev-high{background:#f8d7d3}.sev-medium{background:#fbe9c8}.sev-low{background:#eef2f5}
td.ev{min-width:260px}p.act{margin:.4em 0 0;color:#333}
td code{white-space:nowrap;overflow-wrap:normal}td code.in{white-space:normal;overflow-wrap:anywhere}.verdict{font-size:16px;padding:.6em .8em;background:#eef2f5;border-left:4px solid #5a7d9a}
""" + cycles_chart.CSS



_TICKS = re.compile(r"`([^`]+)`")


def _code(text: str) -> str:
    """``text`` escaped, its `backticked` names (flags, functions, commands) as code."""
    return _TICKS.sub(lambda m: f'<code class="in">{m.group(1)}</code>', html.escape(text))

def _plots_cycles(res: Result) -> bool:
    """Whether the run has decode cycles (the cycles chart and the timeline need them)."""
    return res.steady.cycles.height > 0


@dataclass
class Section:
    """One part of the page: an anchor ``id``, a heading and its HTML."""

    id: str
    title: str
    body: str


def _cell(c: str, v) -> str:
    if v is None:
        return '<td class="n">-</td>'
    if isinstance(v, int | float) and not isinstance(v, bool):
        if c.endswith("_ns"):
            return f'<td class="n">{v / 1e3:,.1f}</td>'
        if c in ("share", "wait_share") or c.startswith("%"):
            return f'<td class="n">{100 * v:.1f} %</td>'
        return f'<td class="n">{v:,.1f}</td>' if isinstance(v, float) else f'<td class="n">{v:,}</td>'
    return f"<td>{html.escape(str(v))}</td>"


def _table(df: pl.DataFrame, heads: dict[str, str] | None = None) -> str:
    """An HTML table in a box that scrolls sideways when wider than the page; ``*_ns`` columns shown in µs,
    ``share`` in %; ``heads`` renames columns (and says per what: instance, cycle, or a sum)."""
    heads = heads or {}
    th = "".join(f"<th>{html.escape(heads.get(c, c.replace('_ns', ' µs') if c.endswith('_ns') else c))}</th>"
                 for c in df.columns)
    rows = "".join("<tr>" + "".join(_cell(c, v) for c, v in zip(df.columns, r)) + "</tr>" for r in df.iter_rows())
    return f'<div class="tw"><table><tr>{th}</tr>{rows}</table></div>'


def _plots() -> types.ModuleType:
    """:mod:`analyze.output.plots` (and matplotlib with it): imported only when a figure is drawn, not read."""
    from . import plots

    return plots


@functools.cache
def output_digest() -> str:
    """A hash of the page's code (``analyze/output/*.py``) and matplotlib's version: part of the key a report's
    figures are kept under beside the result (any change of either draws them afresh)."""
    h = hashlib.blake2b(digest_size=16)
    for f in sorted(Path(__file__).resolve().parent.glob("*.py")):
        h.update(f.name.encode())
        h.update(f.read_bytes())
    try:
        mpl = importlib.metadata.version("matplotlib")
    except importlib.metadata.PackageNotFoundError:  # importable without its metadata (a copy on the path)
        import matplotlib

        mpl = matplotlib.__version__
    h.update(f"matplotlib {mpl}".encode())
    return h.hexdigest()


def _page_key(res: Result, vs: Result | None, steps_now: int | None) -> str | None:
    """What the page's figures are kept under, with ``res`` in its result cache (whose key already covers the
    input, the selection and the analysis code): the page's code and matplotlib's (:func:`output_digest`), the
    cycle choice, ``--steps-now``, the run compared with (``--vs``: its result's key and cycle choice) and
    whether a ``--timing`` pass is in. None (every figure drawn, none kept) when ``res`` or ``vs`` did not come
    from the cache."""
    if results.kept_key(res) is None:
        return None
    other = None
    if vs is not None:
        other = results.kept_key(vs)
        if other is None:
            return None
    key = {"output": output_digest(), "cycles": res.cycle_choice.key, "steps_now": steps_now,
           "vs": other, "vs_cycles": None if vs is None else vs.cycle_choice.key,
           "timing": res.probe_effect is not None}
    return hashlib.sha256(json.dumps(key, sort_keys=True, default=repr).encode()).hexdigest()[:32]


@dataclass
class _Figures:
    """The page's figures, each drawn or read back: with a ``key`` (:func:`_page_key`), each figure's PNG is kept
    with the result in its cache (a table: :mod:`analyze.compute.view`), and the same page of the same capture
    with the same options reads it instead of drawing it again; ``key`` None: drawn every time."""

    res: Result
    key: str | None

    def img(self, name: str, alt: str, draw: Callable[[], Any]) -> str:
        """The figure ``name`` (one of :data:`~analyze.output.targets.FIGURES`) that ``draw`` makes as an ``<img>``
        holding its PNG (a data URI): the page is one file, to be shared alone. "" when ``draw`` returns None
        (nothing to show)."""
        if name not in FIGURES:
            raise ValueError(f"{name}: not one of the report's figures")

        def png() -> bytes:
            fig = draw()
            if fig is None:
                return b""
            buf = io.BytesIO()
            fig.savefig(buf, format="png", dpi=_plots().DPI)
            return buf.getvalue()

        data = png() if self.key is None else _figure(self.res, figure=name, page=self.key, draw=png)
        if not data:
            return ""
        return (f'<img src="data:image/png;base64,{base64.b64encode(data).decode("ascii")}" '
                f'alt="{html.escape(alt)}" title="{name}">')


@view.table(params=("figure", "page"), inputs=("draw",), name="report_figure")
def _figure(res: Result, figure: str, page: str, draw: Callable[[], bytes]) -> bytes:
    """The PNG of a report's ``figure`` that ``draw`` makes, kept with the result under its page's key
    (:func:`_page_key`: what the page and the figure are drawn from)."""
    return draw()


def _p(text: str, cls: str = "note") -> str:
    return f'<p class="{cls}">{html.escape(text)}</p>'


def _summary(res: Result, steps_now) -> Section:
    t = res.trace
    tk = summary(res, steps=steps_now)
    bits = [f"nsys {t.nsys_version}", f"{res.ranks.height} rank(s)", f"CUDA graph trace: {t.graph_trace_mode or 'none'}",
            f"phases: {res.selection}"]
    body = [_p(" · ".join(bits))]
    info = selection(res)
    body.append(_p(info.text[0].upper() + info.text[1:], "head"))
    if tk.period_ns:
        line = (f"<b>{tk.period_ns / 1e3:,.1f} µs</b> cycle period, mean (p50 {real(tk.period_p50_ns) / 1e3:,.1f} µs, "
                f"p90 {real(tk.period_p90_ns) / 1e3:,.1f} µs)")
        if tk.tokens_per_cycle is not None:
            line += (f" · <b>{tk.tokens_per_cycle:.2f}</b> tokens per {tk.kind} ({html.escape(str(tk.source))}) · "
                     f"<b>{tk.tokens_per_s:,.1f}</b> tokens/s")
        body.append(f'<p class="head">{line}</p>' + _p(DEFINITION))
    if tk.accepted_per_request is not None:
        body.append(_p(f"Acceptance: {tk.accepted_per_request:.2f} accepted draft tokens per request per cycle (p50 "
                       f"{tk.accepted_p50:g}, p90 {tk.accepted_p90:g}; {tk.accepted_cycles} steady cycles, from the "
                       f"{'accept marks' if tk.acceptance_source == 'marks' else 'range payload'})."))
    pos = [r for r in acceptance.per_position(res) if r.accepted_at_position]
    if pos:
        k = max(len(r.accepted_at_position) for r in pos)
        rows = [{"segment": r.key, "cycles": r.cycles, "requests": r.requests,
                 **{f"position {j + 1}": (f"{r.accepted_at_position[j]:,} ({r.rate_at_position[j]:.2f})"
                                          if j < len(r.accepted_at_position) and r.rate_at_position[j] is not None
                                          else "–") for j in range(k)},
                 "mean accepted": r.mean_accepted} for r in pos]
        body.append("<h3>Acceptance per draft position</h3>" + _p(
            "Every cycle of each segment, from the accept_histogram marks: the requests that accepted at least j "
            "draft tokens, and in brackets the share of those that reached position j that accepted it.")
            + _table(pl.DataFrame(rows), {}))
    return Section("summary", "Steady state", "".join(body))


def _budget(res: Result, figs: _Figures) -> Section:
    b = cycle_budget.budget(res)
    if b.height == 0:
        return Section("budget", "Cycle budget", _p("No steady cycles with a period: no cycle budget."))
    ranks = sorted(b["rank"].unique().to_list())
    wide = (b.group_by("segment", "kind").agg(pl.col("order").mean(), pl.col("ns").mean().alias("mean_ns"),
                                              pl.col("share").mean(), pl.col("gpu_idle_ns").mean())
            .sort("order", "segment"))
    per = b.pivot(on="rank", index="segment", values="ns")
    per = per.rename({str(r): f"rank {r} µs" for r in ranks if str(r) in per.columns})
    tab = wide.join(per, on="segment", how="left").drop("order").rename({"mean_ns": "mean over ranks_ns"})
    if len(ranks) == 1:
        tab = tab.drop(f"rank {ranks[0]} µs", strict=False)
    tab = tab.rename({c: c.replace(" µs", "_ns") for c in tab.columns if c.startswith("rank ")})  # ns, shown in µs
    note = ("The mean steady cycle on each rank's GPU clock, cut into consecutive pieces that add up to the cycle "
            "period: each phase (first → last GPU op of what it launched), the seams between phases (negative when "
            "they overlap) and the gap between cycles. In seams and between cycles the GPU waits for the host.")
    heads = {"mean over ranks_ns": "µs per cycle (mean over ranks)", "share": "% of cycle",
             "gpu_idle_ns": "GPU idle µs per cycle", **{c: c.replace("_ns", " µs per cycle") for c in tab.columns
                                                        if c.startswith("rank ")}}
    return Section("budget", "Cycle budget",
                   _p(note) + figs.img("budget.png", "cycle budget per rank", lambda: _plots().budget(res)) + _table(tab, heads))


def _findings(found: list[findings.Finding], named: list[list[int]] | None = None,
              timeline_file: str | None = None) -> Section:
    """The ranked findings; ``named``: the cycles each names (a link marks them on the cycles chart);
    ``timeline_file``: the annotated timeline beside the page (linked)."""
    if not found:
        return Section("findings", "Findings", _p("Nothing above 1 % of the cycle."))
    rows = []
    for i, f in enumerate(found, 1):
        keys = named[i - 1] if named else []
        cyc = (f'<a class="cyc" href="#cycles" data-finding="{i}">{len(keys)} cycle{"s" if len(keys) != 1 else ""}'
               "</a>" if keys else "every steady cycle")
        if timeline_file:
            cyc += f' · <a href="{html.escape(timeline_file)}" download>timeline</a>'

        where = ", ".join(x for x in (f.phase, None if f.rank is None else
                                      ("worst rank " if f.rank_is == "worst" else "rank ") + str(f.rank))
                          if x)
        # five columns, evidence and what to try in one: the table fits a 900 px window without scrolling
        rows.append(f'<tr class="sev-{f.severity}"><td>{i}<br><span class="note">{f.severity}</span></td>'
                    f"<td><code>{f.code}</code><br>{html.escape(where or '')}</td>"
                    f'<td class="n">{f.impact_ns / 1e3:,.1f}<br>({100 * f.share:.1f} %)</td>'
                    f'<td class="ev">{_code(f.evidence)}<p class="act"><b>What to try:</b> {_code(f.action)}</p>'
                    f"</td><td>{cyc}</td></tr>")
    head = ("<tr><th>#</th><th>finding, where</th><th>µs per cycle (% of cycle)</th>"
            "<th>evidence; what to try</th><th>cycles</th></tr>")
    return Section("findings", "Findings, ranked",
                   _p("Ranked by the cycle time each explains; severity: high ≥ 10 % of the cycle, medium ≥ 3 %.")
                   + f'<div class="tw"><table>{head}{"".join(rows)}</table></div>')


_PHASE_COLS = ("phase", "instances", *(f"{k}_{s}_ns" for k in ("span", "compute", "comm", "idle")
                                       for s in ("mean", "p50", "p90")))
_PHASE_HEADS = {f"{k}_{s}_ns": f"{k} µs/inst {s}" for k in ("span", "compute", "comm", "idle")
                for s in ("mean", "p50", "p90")}


def _phases(res: Result, figs: _Figures) -> Section:
    body = [_p("Per instance over the steady state (µs per instance: mean, p50, p90); span = compute + comm + idle "
               "(means add up; percentiles do not)."),
            "<h3>All ranks</h3>", _table(steady_tables.steady_phases_all_ranks(res).with_columns(_o=cycle_order()).sort("_o", "phase")
                                         .select("phase", "ranks", *_PHASE_COLS[1:]), _PHASE_HEADS)]
    if res.ranks.height > 1:
        per = steady_tables.steady_phases(res).with_columns(_o=cycle_order()).sort("_o", "phase", "rank")
        body += ["<h3>Per rank</h3>", _table(per.select("phase", "rank", *_PHASE_COLS[1:]), _PHASE_HEADS)]
        hm = figs.img("rank_phase.png", "median span per rank and phase", lambda: _plots().rank_heatmap(res))
        if hm:
            body.append(hm)
    body.append(figs.img("phase_bars.png", "per-phase compute, comm, idle per rank", lambda: _plots().phase_bars(res)))
    return Section("phases", "Phases", "".join(body))


_UTIL_BARS = (("sm_active_pct", "SMs active", "#0072B2"), ("sm_issue_pct", "SM issue", "#56B4E9"),
              ("tensor_active_pct", "tensor active", "#009E73"), ("dram_read_pct", "DRAM read", "#E69F00"),
              ("dram_write_pct", "DRAM write", "#CC79A7"))  # Okabe–Ito: colour-blind safe


def utilisation_section(res: Result) -> Section | None:
    """GPU utilisation per phase from nsys GPU-metrics samples (docs/gpu-metrics.md): one bar per metric, percent
    of peak, over the steady state and each batch size; None without samples. Self-contained (inline bars, no
    figure file)."""
    u = utilisation.phases(res)
    if u.height == 0:
        return None
    rows = u.filter(pl.col("rank").is_null() & (pl.col("scope") != "all")).with_columns(_o=cycle_order()).sort(
        utilisation.scope_order(), "scope", "_o", "phase")

    def bar(v, colour: str) -> str:
        if v is None:
            return '<td class="n">–</td>'
        w = max(0.0, min(100.0, float(v)))
        return (f'<td class="n"><div style="display:inline-block;width:70px;background:#eee;vertical-align:middle">'
                f'<div style="width:{w:.1f}%;background:{colour};height:10px"></div></div> {float(v):.0f} %</td>')

    head = "".join(f"<th>{html.escape(t)}</th>" for t in
                   ("phase", "cycles", *[n for _, n, _ in _UTIL_BARS], "bound", "samples", "instances"))
    body = []
    for r in rows.iter_rows(named=True):
        inst = f"{r['instances']}" + (f" (+{r['short']} too short)" if r["short"] else "")
        body.append("<tr>" + f"<td>{html.escape(r['phase'])}</td><td>{html.escape(r['scope'])}</td>"
                    + "".join(bar(r[k], c) for k, _, c in _UTIL_BARS)
                    + (f"<td>{html.escape(r['bound'])}</td>" if r["bound"] else
                       f"<td title=\"{html.escape(r['note'] or '')}\">{'too short' if r['short'] else '–'}</td>")
                    + f"<td class=\"n\">{r['samples']:,}</td>"
                    + f'<td class="n">{inst}</td></tr>')
    period = utilisation.period_ns(res) or 0
    note = (f"Time-weighted means of nsys GPU-metrics samples (every {period / 1e3:.0f} µs) over each phase "
            "instance's GPU span, percent of peak; all ranks, steady state and each batch size. Bound: memory when "
            f"DRAM read ≥ {utilisation.DRAM_BOUND_PCT:.0f} % and tensor active ≤ {utilisation.TENSOR_LOW_PCT:.0f} %; "
            f"compute when tensor active ≥ {utilisation.TENSOR_BOUND_PCT:.0f} % (or SM issue ≥ "
            f"{utilisation.ISSUE_BOUND_PCT:.0f} %) with DRAM read below {utilisation.DRAM_BOUND_PCT:.0f} %; idle "
            f"when SMs are active under {utilisation.IDLE_PCT:.0f} % of the span. "
            f"Instances shorter than {utilisation.MIN_PERIODS} sampling periods get no number (bound: too short; "
            "the cell's tooltip gives their median span). "
            "Every metric: spectrace analyze REPORT --table gpu_metrics.")
    return Section("utilisation", "GPU utilisation per phase",
                   _p(note) + f"<div class=\"tw\"><table><tr>{head}</tr>{''.join(body)}</table></div>")


def _comm(res: Result, figs: _Figures) -> Section | None:
    mt = steady_tables.matching(res)
    bad = mt.filter(~pl.col("trusted"))
    refused = set(bad["phase"].to_list())
    p = steady_tables.steady_phases(res).filter(~pl.col("phase").is_in(list(refused)))
    split = figs.img("comm_split.png", "communication transfer vs wait per rank", lambda: _plots().comm_split(p))
    st = steady_tables.stragglers(res)
    st = st.filter(~pl.col("phase").is_in(list(refused))) if st.height else st
    notes = [d for d in res.diagnostics if d.code.startswith("COMM")]
    if not split and st.height == 0 and not notes and not refused:
        return None
    body: list[str] = []
    refusals = [_p(f"{r['phase']}: no wait/transfer split and no stragglers shown: its {r['collectives']:,} matched "
               f"collectives end {r['end_spread_p50_ns'] / 1e3:,.1f} µs apart across ranks (p50), so instances "
               "were probably paired wrongly (e.g. one rank's capture window starts a cycle later).", "warn")
            for r in bad.iter_rows(named=True)]
    if split:
        body.append(split)
    if st.height:
        body.append("<h3>Stragglers</h3>" + _p(
            "Per phase, over the steady cycles: the straggler is the rank that caused most of the waiting in the "
            "phase's matched collectives (the other ranks' wait at the collectives it arrived last at), "
            f"{straggler.rule_text()}; \"–\" when no rank does. Every rank that ever arrived last is listed below it."))
        body.append(_table(_stragglers(res, st), {"wait_share": "% of the waiting", "per_cycle_ns": "others' wait µs/cycle"}))
        ever = st.filter(pl.col("last_arrivals") > 0)
        if ever.height:
            body.append(_table(ever.with_columns(_o=cycle_order()).sort("_o", "phase", "caused_wait_ns", "rank",
                                                                      descending=[False, False, True, False])
                               .select("phase", "rank", "caused_wait_ns", "wait_share", "collectives", "last_arrivals",
                                       "share", "mean_delay_ns", "max_delay_ns"),
                               {"share": "% last", "wait_share": "% of the waiting", "caused_wait_ns": "caused µs"}))
    body.append('<div id="comm-notes">' + "".join(refusals) + "".join(
        f'<p class="{"warn" if d.level != "info" else "note"}"><code>{html.escape(d.code)}</code> '
        f"{html.escape(d.message)}</p>" for d in notes) + "</div>")
    return Section("communication", "Communication: transfer, waiting, stragglers", "".join(body))


def _stragglers(res: Result, st: pl.DataFrame) -> pl.DataFrame:
    """One row per phase: its straggler (:func:`steady_tables.straggler_verdict`) and the wait it costs the others."""
    v = steady_tables.straggler_verdict(res).select("phase", straggler=pl.col("rank").cast(pl.String), wait_share="wait_share",
                                               per_cycle_ns="per_cycle_ns")
    phases = st.filter(pl.col("phase").is_not_null()).group_by("phase").agg(pl.col("collectives").first())
    return (phases.join(v, on="phase", how="left")
            .with_columns(pl.col("straggler").fill_null("–"), _o=cycle_order())
            .sort("_o", "phase").select("phase", "collectives", "straggler", "wait_share", "per_cycle_ns"))


def _classes(res: Result) -> Section | None:
    """The slower cycles: the classes that recur (kept in the steady state) and the rare stalls (left out)."""
    cl = anatomy.cycle_classes(res)
    if not cl:
        return None
    rows = [{"class": c.label, "kept": "kept" if c.kept else "left out", "cycles": c.affected,
             "which": ", ".join(map(str, c.keys[:8])) + (" …" if c.affected > 8 else ""), "extra_ns": c.extra_ns,
             "per_cycle_ns": c.per_cycle_ns if c.kept else None, "where": c.text.split(" each", 1)[-1].lstrip(":, ")}
            for c in cl]
    pieces = [{"class": c.label, **p} for c in cl for p in c.pieces]
    body = _p("Slower cycles that recur (every N-th cycle, after a prefill or a batch-size change, a second mode) "
              "are part of how the run behaves: they stay in the steady state and are described here; only the warm-up "
              "and rare stalls are left out. Extra time is over the typical cycle of the same batch size; the pieces "
              "are the cycle budget's, per rank (mean over the class's cycles minus the typical cycles').")
    body += _table(pl.DataFrame(rows), {"extra_ns": "extra µs per cycle", "per_cycle_ns": "µs per steady cycle"})
    if pieces:
        body += "<h3>Where the extra time sits</h3>" + _table(
            pl.DataFrame(pieces).select("class", "rank", "segment", "class_ns", "typical_ns", "delta_ns"),
            {"segment": "piece", "class_ns": "in the class µs", "typical_ns": "typical µs", "delta_ns": "Δ µs"})
    return Section("classes", "Slower cycles", body)


def _host_gaps(res: Result) -> Section | None:
    """The host-bound gaps split by item (:mod:`analyze.compute.host_gaps`)."""
    hg = host_gaps.host_gaps(res)
    if hg.windows.height == 0:
        return None
    body = _p("The launching thread's time in each host-bound gap, from the end of the GPU work to the next launch "
              "call, by item: the innermost scheduler.* host range open, else the kind of CUDA API call, else "
              "unattributed; µs per steady cycle (a cycle whose gap was not host-bound adds 0).")
    body += _table(hg.windows, {"window_ns": "host window µs per cycle", "host_bound": "cycles host-bound"})
    body += _table(hg.items.filter(pl.col("ns") > 0), {"ns": "µs per cycle", "wait_ns": "of it waiting µs",
                                                        "share": "share of the window"})
    if hg.classes:
        body += "<h3>Slower cycles</h3>" + _table(pl.DataFrame(hg.classes).select(
            "label", "rank", "gap", "item", "class_ns", "typical_ns", "delta_ns"),
            {"class_ns": "in the class µs", "typical_ns": "typical µs", "delta_ns": "Δ µs"})
    if hg.frames.height:
        body += "<h3>CPU samples: top native frames</h3>" + _table(hg.frames)
    if hg.python_frames.height:
        body += "<h3>Python samples: innermost Python frames</h3>" + _table(hg.python_frames)
    for n in hg.notes:
        body += _p(n)
    return Section("host-gaps", "Host-bound gaps", body)


def _segments(res: Result) -> Section | None:
    """Per decode batch size: cycles, period p50/p90/mean, prefills, the biggest pieces of its mean cycle."""
    seg = anatomy.segments(res)
    if len(seg) < 2:
        return None
    rows = [{"segment": x.key, "steps": x.steps, "cycles": f"{x.first_cycle}–{x.last_cycle}", "steady": x.cycles,
             "period_p50_ns": x.period_p50_ns, "period_p90_ns": x.period_p90_ns, "period_mean_ns": x.period_mean_ns,
             "prefills": x.prefills,
             "biggest pieces": ", ".join(f"{b['segment']} {b['ns'] / 1e3:,.0f} µs"
                                         for b in sorted(x.budget, key=lambda b: -b["ns"])[:3])} for x in seg]
    return Section("segments", "Segments", _p(
        "The run cut by decode batch size and draft step count (the payload's; 0 steps: verify only): steady cycles "
        "with a period, the cycle period's p50, p90 and mean, the prefill batches that ran before its cycles, and its "
        "mean cycle's biggest pieces (its own cycles': a 0-step segment's draft piece is not averaged with a 4-step "
        "one's).")
        + _table(pl.DataFrame(rows), {"period_p50_ns": "p50 µs", "period_p90_ns": "p90 µs",
                                      "period_mean_ns": "mean µs"}))


def _seams(res: Result, figs: _Figures) -> Section:
    sa = steady_tables.steady_seams_all_ranks(res)
    body = [_p("GPU idle between consecutive ranges (last op of one → first op of the next), steady state, all ranks.")]
    if sa.height:
        causes = [c for c in ("bound", "gpu_bound_ns", "launch_bound_ns", "host_bound_ns", "launch_block_ns",
                              "host_late_ns") if c in sa.columns]
        seam = pl.format("{} → {}", "from", "to") + pl.when(pl.col("parent").is_null()).then(pl.lit(" (top level)")) \
            .otherwise(pl.format(" (in {})", "parent"))
        body.append(_table(sa.select(seam.alias("seam"), "instances", "idle_mean_ns", "idle_p50_ns",
                                     "idle_p90_ns", "idle_ns", "busy_ns", "overlap_ns", *causes), _SEAM_HEADS))
        if causes:
            body.append(_p("bound: why the GPU waited, over the instances (gpu: the next phase was queued in time; "
                           "launch: its launch call returned after the earlier work ended; host: the launch began "
                           "after it), with the idle time of each cause summed over the steady state; block and late "
                           "are means per instance of that cause."))
    body.append(figs.img("distributions.png", "idle inside phases and in seams", lambda: _plots().distributions(res)))
    return Section("seams", "Seams and idle gaps", "".join(body))


_SEAM_HEADS = {"idle_mean_ns": "idle µs/inst mean", "idle_p50_ns": "idle µs/inst p50", "idle_p90_ns": "idle µs/inst p90",
               "idle_ns": "idle µs (sum)", "busy_ns": "other work µs (sum)", "overlap_ns": "overlap µs (sum)",
               "gpu_bound_ns": "gpu-bound idle µs (sum)", "launch_bound_ns": "launch-bound idle µs (sum)",
               "host_bound_ns": "host-bound idle µs (sum)", "launch_block_ns": "launch block µs/inst mean",
               "host_late_ns": "host late µs/inst mean", "bound": "bound (instances)"}


def _parents(res: Result) -> Section:
    parents = steady_tables.steady_seams_all_ranks(res)
    names = parents["parent"].drop_nulls().unique() if parents.height else pl.Series([], dtype=pl.String)
    pr = steady_tables.ranges(res)
    body = [_p("Ranges with selected ranges inside them, inclusive (NVIDIA-style projection of everything launched "
               "inside), steady state, per rank.")]
    rows = pr.filter(pl.col("range").is_in(names.implode())) if names.len() else pr.head(0)
    if rows.height:
        body.append(_table(rows.with_columns(compute_ns=pl.col("busy_ns") - pl.col("comm_ns")).select(
            "rank", "range", "instances", "proj_span_ns", "compute_ns", "comm_ns", "idle_ns", "gpu_idle_ns")
            .sort("range", "rank"), {"proj_span_ns": "span µs (sum)", "compute_ns": "compute µs (sum)",
                                     "comm_ns": "comm µs (sum)", "idle_ns": "idle µs (sum)",
                                     "gpu_idle_ns": "GPU idle µs (sum)"}))
    cov = res.coverage
    if cov.height:
        body.append("<h3>Coverage</h3>" + _p("GPU busy time inside the phased window and how much of it phases "
                                             "received, whole run.")
                    + _table(cov.select("rank", "window_ns", "gpu_ns", "attributed_ns"),
                             {"window_ns": "phased window µs", "gpu_ns": "GPU busy µs (sum)",
                              "attributed_ns": "in phases µs (sum)"}))
    return Section("parents", "Parent ranges and coverage", "".join(body))


def _kernels(res: Result) -> Section:
    k = steady_tables.kernels(res, 5)
    if k.height == 0:
        return Section("kernels", "Top GPU operations", _p("No GPU operations in phases."))
    k = k.with_columns(name=pl.Series(display_names(k["name"].to_list())))
    return Section("kernels", "Top GPU operations per phase",
                   _p("Per phase, the 5 GPU operations with the most time, steady state, all ranks (per cycle = per "
                      "rank per steady cycle).")
                   + _table(k.select("phase", "name", "count_per_cycle", "per_cycle_ns", "share", "ranks"),
                            {"name": "operation", "count_per_cycle": "count/cycle", "per_cycle_ns": "µs/cycle",
                             "share": "% of phase"}))


def _whatif(res: Result, figs: _Figures, model: whatif_model.Model | InputError, max_steps: int = whatif_model.MAX_STEPS) -> Section:
    """The what-if model as prose and tables (what ``spectrace whatif`` prints), and its figure."""
    if isinstance(model, InputError):
        return Section("whatif", "What if: draft steps", _p(f"No what-if model: {model}"))
    m = model
    now = m.predict(m.steps_now)
    body = [_p(f"From {m.steps_now} draft steps ({m.steps_source}): measured cycle {m.period_ns / 1e3:,.1f} µs (mean "
               f"over the steady cycles); the model's {now.cycle_ns / 1e3:,.1f} µs = draft "
               f"{now.draft_ns / 1e3:,.1f} + verify {now.verify_ns / 1e3:,.1f} + draft_extend "
               f"{now.draft_extend_ns / 1e3:,.1f} + seams {now.seams_ns / 1e3:,.1f} + other "
               f"{now.other_ns / 1e3:,.1f} µs.", "head")]
    if m.alpha is not None:
        body.append(_p(acceptance_text(m)))
    body += [_p(f"Note: {n}") for n in m.notes]
    preds = pl.DataFrame([p.as_dict() for p in m.predictions(max_steps)])
    marks = [("measured now" if p["measured"] else "extrapolated" if p["extrapolated"] else "")
             for p in preds.iter_rows(named=True)]
    body.append(_table(preds.select("steps", "cycle_ns", "draft_ns", "verify_ns", "draft_extend_ns", "seams_ns",
                                    "other_ns", "tokens_per_cycle", "tokens_per_s").with_columns(pl.Series("", marks)),
                       {"cycle_ns": "cycle µs", "draft_ns": "draft µs/cycle", "verify_ns": "verify µs/cycle",
                        "draft_extend_ns": "draft_extend µs/cycle", "seams_ns": "seams µs/cycle",
                        "other_ns": "other µs/cycle", "tokens_per_cycle": "tokens/cycle", "tokens_per_s": "tokens/s"}))
    body.append(_p(best_text(m, max_steps), "head"))
    body.append(_p(f"Verify: {m.verify_text()}"))
    if m.segments:
        rows = []
        for sm in m.segments:
            d = sm.as_dict(max_steps)
            rows.append({"segment": sm.key, "measured steps": ", ".join(map(str, sm.measured_steps)),
                         "cycles": sm.cycles, "period_p50_ns": sm.period_ns,
                         **{f"{p['steps']} steps": (None if p["tokens_per_s"] is None else
                                                    f"{p['tokens_per_s']:,.0f}" + ("*" if p["extrapolated"] else ""))
                            for p in d["predictions"]},
                         "best": best_steps_label(d),
                         "gain": None if d["gain"] is None else f"{100 * d['gain']:+.1f} %"})
        body.append("<h3>Per segment</h3>" + _p("One model per batch size, from its own cycles at the step counts it "
                                                 "ran (measured steps; 0: verify only): predicted tokens/s at "
                                                 "each step count (* extrapolated); best among the others, ≈ another "
                                                 f"within {100 * whatif_model.NEAR_BEST:.0f} % of its tokens/s.")
                    + _table(pl.DataFrame(rows), {"period_p50_ns": "cycle µs p50"}))
    if m.probe is not None:
        body.append(_p("Fitted on the graph-level pass (--timing)."))
    body.append(figs.img("whatif.png", "what-if over draft steps", lambda: _plots().whatif_curve(m, max_steps)))
    return Section("whatif", "What if: draft steps", "".join(body))


def _period_us(ns: float | None) -> str:
    return f"{ns / 1e3:,.1f} µs" if ns is not None else "unknown (fewer than two cycles)"


def _comparison(doc: cmp.Comparison, figs: _Figures) -> Section:
    """``--vs``: the verdict and a chart of Δ per phase and seam first, then the ranking, per rank, kernels."""
    p = doc.cycle_period
    tok = doc.per_token
    body = [f'<p class="verdict">{html.escape(doc.verdict["text"])}</p>',
            _p(f"A = {doc.a} ({doc.a_cycles} steady cycles over ranks), B = {doc.b} (this report, "
               f"{doc.b_cycles}); Δ = B − A, per cycle (the mean over the steady cycles of the mean over ranks). "
               f"Cycle period A {_period_us(p['a_ns'])}, B {_period_us(p['b_ns'])}.")]
    body += [_p(f"Warning: {w}", "warn") for w in doc.warnings]
    for k in ("a", "b"):
        for v in doc.stragglers.get(k) or []:
            body.append(_p(f"Straggler in {k.upper()}: rank {v['rank']} in {v['phase']}: the other ranks wait "
                           f"{v['per_cycle_ns'] / 1e3:,.1f} µs per cycle for it ({100 * v['wait_share']:.0f} % of the "
                           "waiting in its collectives)."))
    fig = figs.img("compare.png", "Δ per phase and seam, split into compute, comm and idle",
                   lambda: _plots().compare_delta(doc))
    if fig:
        body.append(fig)
    rows = [{"phase or seam": r["phase"], "a_ns": r["a_ns_per_cycle"] if r["in_a"] else None,
             "b_ns": r["b_ns_per_cycle"] if r["in_b"] else None, "delta_ns": r["delta_ns"],
             "d_compute_ns": r["delta_compute_ns"], "d_comm_ns": r["delta_comm_ns"], "d_idle_ns": r["delta_idle_ns"],
             "ci_low_ns": r.get("ci_low_ns"), "ci_high_ns": r.get("ci_high_ns"),
             "outside noise": "yes" if r.get("significant") else "",
             **({"d_token_ns": r["delta_ns_per_token"]} if tok else {})} for r in doc.rows]
    rows.append({"phase or seam": "cycle period", "a_ns": p["a_ns"], "b_ns": p["b_ns"], "delta_ns": p["delta_ns"],
                 "d_compute_ns": None, "d_comm_ns": None, "d_idle_ns": None, "ci_low_ns": p.get("ci_low_ns"),
                 "ci_high_ns": p.get("ci_high_ns"), "outside noise": "",
                 **({"d_token_ns": p["b_ns_per_token"] - p["a_ns_per_token"]} if tok else {})})
    body.append(_table(pl.DataFrame(rows, infer_schema_length=None),
                       {"a_ns": "A µs/cycle", "b_ns": "B µs/cycle", "delta_ns": "Δ µs/cycle",
                        "d_compute_ns": "= compute", "d_comm_ns": "+ comm", "d_idle_ns": "+ idle",
                        "ci_low_ns": "95 % low", "ci_high_ns": "95 % high", "d_token_ns": "Δ µs/token"}))
    ranks = sorted({r["rank"] for r in doc.per_rank if r["rank"] is not None})
    if len(ranks) > 1:
        by = {(r["phase"], r["rank"]): r["delta_ns"] for r in doc.per_rank}
        top = [r["phase"] for r in doc.rows[:8]]
        body.append("<h3>Δ per rank</h3>" + _table(pl.DataFrame(
            [{"phase or seam": ph, **{f"rank {k}_ns": by.get((ph, k)) for k in ranks}} for ph in top],
            infer_schema_length=None), {f"rank {k}_ns": f"rank {k} Δ µs/cycle" for k in ranks}))
    if doc.kernels:
        moved = [k for k in doc.kernels if k["phase"] in {r["phase"] for r in doc.rows[:6]}]
        if moved:
            body.append("<h3>GPU operations that moved most</h3>" + _table(pl.DataFrame(
                [{"phase": k["phase"], "operation": name, "a_ns": k["a_ns_per_cycle"], "b_ns": k["b_ns_per_cycle"],
                  "delta_ns": k["delta_ns"], "count/cycle": f"{k['a_count_per_cycle']:,.1f} → "
                                                          f"{k['b_count_per_cycle']:,.1f}"}
                 for k, name in zip(moved, display_names([k["name"] for k in moved]))]),
                {"a_ns": "A µs/cycle", "b_ns": "B µs/cycle", "delta_ns": "Δ µs/cycle"}))
    return Section("compare", "Compared with " + Path(str(doc.a).split(",")[0]).name, "".join(body))


def _whole_run(res: Result) -> Section:
    body = [_p("Every captured instance, warm-up and stalls included: these sums equal nsys stats' projections."),
            _table(res.phases_all.select("phase", "ranks", "instances", "span_ns", "compute_ns", "comm_ns", "idle_ns",
                                         (pl.col("span_ns") / pl.col("instances")).alias("span_mean_ns")),
                   {"span_ns": "span µs (sum)", "compute_ns": "compute µs (sum)", "comm_ns": "comm µs (sum)",
                    "idle_ns": "idle µs (sum)", "span_mean_ns": "span µs/inst mean"})]
    if res.ranks.height > 1:
        body.append(_table(res.phases.with_columns(_o=cycle_order()).sort("_o", "phase", "rank").select(
            "phase", "rank", "instances", "span_ns", "compute_ns", "comm_ns", "idle_ns", "span_p50_ns"),
                           {"span_ns": "span µs (sum)", "compute_ns": "compute µs (sum)", "comm_ns": "comm µs (sum)",
                            "idle_ns": "idle µs (sum)", "span_p50_ns": "span µs/inst p50"}))
    return Section("whole-run", "Whole run", "".join(body))


def write_page(res: Result, out: str | Path, vs: Result | None = None, steps_now: int | None = None,
               extra: list[Section] | tuple = (), force: bool = False, inputs=None, baseline=None,
               timeline_events: int = timeline.REPORT_MAX_EVENTS) -> Path:
    """Write ``out/index.html`` for an analysed trace (and an analysed run ``vs`` to compare with: A = ``vs``,
    B = ``res``; ``baseline`` is its old name); returns the page.
    ``extra``: more sections, placed before the whole-run tables. The folder is built beside ``out`` and put in
    its place whole when complete (:func:`analyze.output.targets.report_folder`): ``out`` may be new, empty or
    a report folder spectrace wrote; another folder is refused unless ``force``. ``inputs``: what must not be
    written (default: the reports of ``res`` and ``vs``). The page is UTF-8 whatever the locale. ``timeline_events``:
    the bound of the annotated timeline written beside the page (``timeline.trace.json``,
    :mod:`analyze.output.timeline`; 0: none written)."""
    vs = vs if vs is not None else baseline
    if inputs is None:
        inputs = [*res.reports, *(vs.reports if vs is not None else [])] or [res.trace.path]
    with as_input_error(), report_folder(out, inputs, force) as folder:
        _write_page(res, folder, vs, steps_now, extra, timeline_events)
    return Path(out) / "index.html"


def _write_page(res: Result, out: NewFolder, vs: Result | None, steps_now: int | None, extra,
                timeline_events: int = timeline.REPORT_MAX_EVENTS) -> None:
    name = ", ".join(Path(p).name for p in res.reports) or Path(res.trace.path).name
    model: whatif_model.Model | InputError  # the error is shown in the what-if section
    try:  # vs is a run to compare with, not whatif's no-speculation baseline: one model per batch size
        model = whatif.fitted(res, steps_now)  # with its per-batch-size models; kept with the result
    except InputError as e:
        model = e
    if isinstance(model, InputError):
        found = findings.find(res)
    else:  # the findings with the model at these steps: kept with the result, as the model is
        found = findings.findings_at(res, steps_now=steps_now)
    figs = _Figures(res, _page_key(res, vs, steps_now))
    tl_file = None
    if timeline_events and _plots_cycles(res):
        out.write(TIMELINE_FILE, timeline.build(res, None, timeline_events).data())
        tl_file = TIMELINE_FILE
    classes = timeline.class_cycles(res) if _plots_cycles(res) else []
    named = [timeline.finding_cycles(res, f, classes) for f in found]
    top = [_comparison(cmp.compare_results(vs, res), figs)] if vs is not None else []
    cyc = ([Section("cycles", "Every cycle", cycles_chart.section_html(res, found, tl_file))]
           if _plots_cycles(res) else [])
    secs = [*top, _summary(res, steps_now), _budget(res, figs), _findings(found, named, tl_file), *cyc,
            *[x for x in (_classes(res), _host_gaps(res), _segments(res)) if x is not None], _phases(res, figs)]
    secs += [s for s in (utilisation_section(res),) if s is not None]
    if res.probe_effect is not None:  # a two-pass capture (--timing): what node-level tracing cost
        secs.insert(len(top) + 1, Section("probe", "Probe effect", '<div class="tw"><pre>'
                                          + html.escape(chr(10).join(probe_lines(res.probe_effect))) + "</pre></div>"))
    secs += [s for s in (_comm(res, figs),) if s is not None]
    secs += [Section("timeline", "Timeline", figs.img("timeline.png", "a few cycles on the GPU",
                                                      lambda: _plots().timeline(res))),
             _seams(res, figs),
             Section("run", "Over the run", figs.img("per_cycle.png", "per-cycle times", lambda: _plots().per_cycle(res))),
             _parents(res), _kernels(res), _whatif(res, figs, model)]
    secs += list(extra)
    secs.append(_whole_run(res))
    secs.append(Section("diagnostics", "Diagnostics", "<ul>" + "".join(
        f'<li class="{"warn" if d.level != "info" else ""}">{html.escape(d.level)} <code>{html.escape(d.code)}</code>: '
        f"{html.escape(d.message)}</li>" for d in ranked(res.diagnostics)) + "</ul>"))
    nav = "<nav>" + "".join(f'<a href="#{s.id}">{html.escape(s.title)}</a>' for s in secs) + "</nav>"
    body = "".join(f'<section id="{s.id}"><h2>{html.escape(s.title)}</h2>{s.body}</section>' for s in secs)
    page = f"{html.escape(name)}</title><style>{_CSS}</style></head><body><h1>spectrace · {html.escape(name)}</h1>" \
           f"{nav}{body}</body></html>\n"
    out.write("index.html", PAGE_START + utf8(terminal.clean(page)))  # names are data: no control characters
