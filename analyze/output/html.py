"""``DIR/index.html``: one self-contained page (tables inline, PNG figures beside it) for a browser."""

from __future__ import annotations

import html
from pathlib import Path

import polars as pl

from ..compute import compare as cmp
from ..compute import whatif
from ..compute.tokens import summary
from ..model import InputError
from . import plots
from .targets import os_error, refuse_input
from .text import compare_table, whatif_table

CSS = """body{font-family:system-ui,sans-serif;margin:2em auto;max-width:1200px;color:#222}
table{border-collapse:collapse;margin:.5em 0 1.5em;font-size:13px}th,td{padding:3px 8px;border-bottom:1px solid #ddd}
td.n{text-align:right;font-variant-numeric:tabular-nums}th{background:#f3f3f3;text-align:left}
img{max-width:100%;border:1px solid #eee;margin:.5em 0}code{background:#f5f5f5;padding:1px 4px}
.note{color:#555;font-size:13px}.warn{color:#a4441b}"""


def _table(df: pl.DataFrame, ns_cols: tuple[str, ...] = ()) -> str:
    """An HTML table; ``*_ns`` columns shown in µs."""
    heads = [c.replace("_ns", " µs") if c.endswith("_ns") or c in ns_cols else c for c in df.columns]
    rows = []
    for r in df.iter_rows():
        cells = []
        for c, v in zip(df.columns, r):
            if v is None:
                cells.append('<td class="n">-</td>')
            elif isinstance(v, int | float) and not isinstance(v, bool):
                x = v / 1e3 if c.endswith("_ns") else v
                s = f"{x:,.1f}" if c.endswith("_ns") or isinstance(v, float) else f"{x:,}"
                cells.append(f'<td class="n">{s}</td>')
            else:
                cells.append(f"<td>{html.escape(str(v))}</td>")
        rows.append("<tr>" + "".join(cells) + "</tr>")
    head = "".join(f"<th>{html.escape(h)}</th>" for h in heads)
    return f"<table><tr>{head}</tr>{''.join(rows)}</table>"


def _save(fig, out: Path, name: str) -> str:
    fig.savefig(out / name, dpi=100)
    return f'<img src="{name}" alt="{html.escape(name)}">'


PHASE_COLS = ("phase", "instances", "span_ns", "compute_ns", "comm_ns", "idle_ns", "span_mean_ns", "span_p90_ns")


def write_page(res, out: str | Path, baseline=None, steps_now: int | None = None) -> Path:
    """Write ``out/index.html`` and its figures for an analysed trace (and an analysed baseline); returns the page."""
    out = Path(out)
    inputs = [*res.reports, *(baseline.reports if baseline is not None else [])] or [res.trace.path]
    refuse_input(out, inputs, "-o")
    refuse_input(out / "index.html", inputs, "-o")
    if out.exists() and not out.is_dir():
        raise InputError(f"{out}: not a directory", "BAD_OUTPUT")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise os_error(e, out, "the report folder") from None
    t = res.trace
    name = Path(t.path).name
    parts = [f"<h1>spectrace · {html.escape(name)}</h1>",
             f'<p class="note">nsys {html.escape(str(t.nsys_version))} · {res.ranks.height} rank(s) · CUDA graph '
             f"trace: {html.escape(str(t.graph_trace_mode or 'none'))} · phases: {html.escape(res.selection)}</p>"]
    tk = summary(res, steps=steps_now)
    if tk.tokens_per_cycle is not None:
        parts.append(f"<p><b>{tk.tokens_per_cycle:.2f}</b> tokens per {tk.kind} ({tk.source}), "
                     f"<b>{tk.tokens_per_s:.1f}</b> tokens/s over the run.</p>")
    parts.append("<h2>Phases, all ranks</h2><p class=note>span = first GPU op → last GPU op per instance, summed; "
                 "span = compute + comm + idle.</p>")
    parts.append(_table(res.phases_all.select("ranks", *PHASE_COLS[:-2])))
    parts.append(_save(plots.phase_bars(res), out, "phase_bars.png"))
    parts.append("<h2>Per rank</h2>")
    parts.append(_table(res.phases.select("rank", *PHASE_COLS).sort("rank", "phase")))
    parts.append("<h2>Timeline</h2>" + _save(plots.timeline(res), out, "timeline.png"))
    parts.append("<h2>Seams and idle gaps</h2>")
    if res.seams_all.height:
        parts.append(_table(res.seams_all.select("parent", "from", "to", "instances", "idle_ns", "busy_ns",
                                                 "overlap_ns")))
    parts.append(_save(plots.distributions(res), out, "distributions.png"))
    parts.append("<h2>Over the run</h2>" + _save(plots.per_cycle(res), out, "per_cycle.png"))
    split = plots.comm_split(res.phases)
    if split is not None:
        parts.append("<h2>Communication: wait vs transfer</h2>" + _save(split, out, "comm_split.png"))
    parts.append(_whatif(res, baseline, steps_now, out))
    if baseline is not None:
        doc = cmp.compare(baseline, res)
        parts.append(f"<h2>Compared with the baseline</h2><p class=note>A = {html.escape(doc['a'])}, "
                     f"B = {html.escape(doc['b'])} (this report); Δ = B − A.</p>")
        parts.append(f"<pre>{html.escape(compare_table(doc))}</pre>")
    parts.append("<h2>Diagnostics</h2><ul>" + "".join(
        f'<li class="{"warn" if d.level != "info" else ""}">{html.escape(d.level)} <code>{html.escape(d.code)}</code>: '
        f"{html.escape(d.message)}</li>" for d in res.diagnostics) + "</ul>")
    page = out / "index.html"
    page.write_text(f"<!doctype html><html><head><meta charset=utf-8><title>spectrace · {html.escape(name)}</title>"
                    f"<style>{CSS}</style></head><body>{''.join(parts)}</body></html>\n")
    return page


def _whatif(res, baseline, steps_now, out: Path) -> str:
    head = "<h2>What if: draft steps</h2>"
    try:
        m = whatif.fit(res, steps_now, baseline=baseline)
    except InputError as e:
        return head + f"<p class=note>No what-if model: {html.escape(str(e))}</p>"
    return head + f"<pre>{html.escape(whatif_table(m))}</pre>" + _save(plots.whatif_curve(m), out, "whatif.png")
