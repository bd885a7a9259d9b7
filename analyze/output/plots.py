"""Figures of an analysis :class:`~analyze.model.Result` (matplotlib).

Each function returns a :class:`matplotlib.figure.Figure` (an :class:`InlineFigure`, which Jupyter shows as a
PNG by itself) and saves nothing. Figures are made without pyplot (no backend is chosen, no global figure
list): a notebook shows them inline, a script saves them. None is wider than :data:`_MAX_WIDTH_IN` inches
(1400 px at the report's 100 dpi) at any number of ranks: ranks go down the page (small multiples, one bar or
lane per rank), never across it. Headline figures use the steady-state cycles
(:mod:`analyze.compute.steady_tables`). Names from the input are shown literally (:func:`_t`: ``$`` escaped, never
mathtext). Colours come from :mod:`nvtx_hooks.phases` (phase colours,
``SEAM_COLOR``, ``IDLE_COLOR``, ``COMM_COLOR``).
"""

# ruff: noqa: E402  (matplotlib is imported through _import_matplotlib first)
from __future__ import annotations

import io
import os
import sys


def _import_matplotlib() -> None:
    """matplotlib, imported whatever ``MPLBACKEND`` says: these figures need no backend, so a value matplotlib
    refuses (a typo, a backend not installed here) is left out, with a note, not a traceback. (matplotlib reads
    the variable once, at import, into ``rcParams["backend"]``: done here the same way, checked.)"""
    if "matplotlib" in sys.modules or not os.environ.get("MPLBACKEND"):
        return
    wanted = os.environ.pop("MPLBACKEND")
    try:
        import matplotlib
    finally:
        os.environ["MPLBACKEND"] = wanted
    try:
        matplotlib.rcParams["backend"] = wanted
    except ValueError:
        print(f"spectrace: note: MPLBACKEND={wanted!r} is not a matplotlib backend here; ignored (spectrace's "
              "figures need none)", file=sys.stderr)


_import_matplotlib()

import numpy as np
import polars as pl
from matplotlib.artist import Artist
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from nvtx_hooks.phases import (
    COMM_COLOR,
    COMPUTE_COLOR,
    CYCLE_ORDER,
    IDLE_COLOR,
    SEAM_COLOR,
    base_name,
    color_of,
)

from ..compute import cycle_budget, steady_tables
from ..compute.compare import Comparison
from ..compute.cycles import cycles
from ..compute.payload import base_expr
from ..compute.scalars import to_float, to_int
from ..compute.whatif_model import Model
from ..model import Result
from . import terminal

__all__ = ["InlineFigure", "phase_bars", "rank_heatmap", "budget", "timeline", "distributions", "per_cycle",
           "cycle_periods",
           "has_comm_split", "comm_split", "whatif_curve", "utilisation_bars", "compare_delta", "DPI", "WAIT_COLOR"]

WAIT_COLOR = "#56b4e9"  # comm wait (a rank waiting for the others), a lighter blue; transfer uses COMM_COLOR


def _t(text: str) -> str:
    """Text from the input (a range or kernel name) as matplotlib shows it literally: every ``$`` escaped, so
    that no name is read as mathtext (``$\\frac{x}{`` would fail to draw, ``$5 and $6`` would be set as math), and
    no control character (no glyph for it: matplotlib warns)."""
    return terminal.clean(str(text)).replace("$", r"\$")


def _order(names: list[str]) -> list[str]:
    """Phase texts in cycle order (by base name), others after, alphabetically."""
    idx = {n: i for i, n in enumerate(CYCLE_ORDER)}
    base = pl.Series(names, dtype=pl.String).to_frame("range").with_columns(b=base_expr())["b"].to_list()
    return [n for _, n in sorted(zip(base, names), key=lambda t: (idx.get(t[0], 99), t[1]))]


def _leaf_phases(phases: pl.DataFrame) -> pl.DataFrame:
    """The rows of a per-rank phases frame that are not cycles (all of them when there is nothing else)."""
    p = phases.with_columns(base=base_expr("phase"))
    leaf = p.filter(~pl.col("base").is_in(["cycle", "prefill"]))
    return leaf if leaf.height else p


class InlineFigure(Figure):
    """A matplotlib Figure that Jupyter shows as a PNG by itself (``_repr_png_``), with no pyplot and no backend."""

    def _repr_png_(self) -> bytes:
        buf = io.BytesIO()
        self.savefig(buf, format="png", dpi=DPI)
        return buf.getvalue()


DPI = 100  # what the report saves at; every figure is at most _MAX_WIDTH_IN wide, so <= 1400 px
_MAX_WIDTH_IN = 14.0
_GAP_COLOR = "#9a9a9a"  # GPU idle between cycles


def _figure(width: float, height: float) -> InlineFigure:
    return InlineFigure(figsize=(min(width, _MAX_WIDTH_IN), height), layout="constrained")


def _small_multiples(p: pl.DataFrame, stacks: list[tuple[str, str, str | None, str]], title: str, xlabel: str,
                     marker: str | None = None) -> Figure:
    """One panel per phase (cycle order), one horizontal bar per rank, stacked from ``stacks`` = ``[(column,
    colour or "phase", hatch, label)]`` (values already in the unit shown); ``marker``: a column drawn as a tick."""
    names = _order(p["phase"].unique().to_list())
    ranks = sorted(p["rank"].unique().to_list())
    ncols = max(1, min(len(names), 4))  # (no phase: one empty panel)
    nrows = max(1, -(-len(names) // ncols))
    fig = _figure(max(3.2 * ncols + 0.8, 6.4), nrows * (1.1 + 0.3 * len(ranks)) + 1.0)  # wide enough for the title
    axes = fig.subplots(nrows, ncols, squeeze=False)
    for k, name in enumerate(names):
        ax = axes[k // ncols][k % ncols]
        q = p.filter(pl.col("phase") == name)
        for row in q.iter_rows(named=True):
            y, left = ranks.index(row["rank"]), 0.0
            for col, color, hatch, _ in stacks:
                ax.barh(y, row[col], 0.75, left=left, color=color_of(name) if color == "phase" else color,
                        hatch=hatch, edgecolor="#555555", linewidth=0.4)
                left += row[col]
            if marker:
                ax.plot([row[marker]], [y], marker="|", color="#111111", ms=12, mew=1.6)
        ax.set_yticks(range(len(ranks)), [f"rank {r}" for r in ranks], fontsize=8)
        ax.set_ylim(len(ranks) - 0.5, -0.5)
        ax.set_title(_t(name), fontsize=9, color=color_of(name, "#333333"))
        ax.set_xlabel(xlabel, fontsize=8)
        ax.grid(axis="x", alpha=0.3)
        ax.tick_params(axis="x", labelsize=8)
        ax.set_xlim(left=0)
    for k in range(len(names), nrows * ncols):
        axes[k // ncols][k % ncols].set_visible(False)
    handles: list[Artist] = [Patch(facecolor="#999999" if c == "phase" else c, hatch=h, edgecolor="#555555",
                                   label=lab) for _, c, h, lab in stacks]
    if marker:
        handles.append(Line2D([], [], marker="|", color="#111111", ls="none", ms=10, mew=1.6, label="span p50"))
    fig.suptitle(title, fontsize=10)
    fig.legend(handles=handles, loc="outside lower center", ncol=len(handles), fontsize=8, frameon=False)
    return fig


def phase_bars(res: Result) -> Figure:
    """Small multiples, one panel per phase: per rank, µs per instance (steady-state mean) stacked compute (phase
    colour), communication, idle; a tick at the median span. Legible at any number of ranks."""
    p = _leaf_phases(steady_tables.steady_phases(res)).with_columns(
        *[(pl.col(c) / pl.col("instances") / 1e3).alias(c) for c in ("compute_ns", "comm_ns", "idle_ns")],
        span_p50=pl.col("span_p50_ns") / 1e3)
    return _small_multiples(p, [("compute_ns", "phase", None, "compute (phase colour)"),
                                ("comm_ns", COMM_COLOR, None, "communication"),
                                ("idle_ns", IDLE_COLOR, "//", "idle")],
                            "Per-phase GPU span per instance, steady state: compute + comm + idle (mean)",
                            "µs per instance", marker="span_p50")


def rank_heatmap(res: Result) -> Figure | None:
    """Rank × phase: median span per instance, coloured by how far above the fastest rank (stragglers stand out).
    None with one rank."""
    p = _leaf_phases(steady_tables.steady_phases(res))
    ranks = sorted(p["rank"].unique().to_list())
    if len(ranks) < 2:
        return None
    names = _order(p["phase"].unique().to_list())
    p = p.with_columns(rel=pl.col("span_p50_ns") / pl.col("span_p50_ns").min().over("phase") - 1)
    grid = [[None] * len(names) for _ in ranks]
    vals = [[""] * len(names) for _ in ranks]
    for r in p.iter_rows(named=True):
        i, j = ranks.index(r["rank"]), names.index(r["phase"])
        grid[i][j] = r["rel"]
        vals[i][j] = f"{r['span_p50_ns'] / 1e3:,.1f}\n+{100 * r['rel']:.0f} %"
    fig = _figure(2.0 * len(names) + 2.5, 0.9 + 0.45 * len(ranks))
    ax = fig.subplots()
    data = np.array([[np.nan if v is None else v for v in row] for row in grid], dtype=float)
    im = ax.imshow(data, cmap="Oranges", vmin=0, vmax=max(0.2, float(np.nanmax(data)) if data.size else 0.2),
                   aspect="auto")
    for i in range(len(ranks)):
        for j in range(len(names)):
            ax.text(j, i, vals[i][j], ha="center", va="center", fontsize=7)
    ax.set_xticks(range(len(names)), [_t(n) for n in names], fontsize=8)
    ax.set_yticks(range(len(ranks)), [f"rank {r}" for r in ranks], fontsize=8)
    ax.set_title("Median span per instance by rank (µs) and how far above the fastest rank, steady state",
                 fontsize=10)
    fig.colorbar(im, ax=ax, label="above the fastest rank", format=lambda x, _: f"{100 * x:.0f} %")
    return fig


def budget(res: Result) -> Figure:
    """The cycle budget: one horizontal bar per rank, the mean steady cycle cut into phases, seams and the gap
    between cycles (µs; labels give % of the cycle)."""
    b = cycle_budget.budget(res)
    ranks = sorted(b["rank"].unique().to_list()) if b.height else []
    fig = _figure(12, 2.3 + 0.5 * max(len(ranks), 1))
    ax = fig.subplots()
    if not ranks:
        ax.text(0.5, 0.5, "no steady cycles with a period: no cycle budget", ha="center", transform=ax.transAxes)
        ax.set_axis_off()
        return fig
    seen: dict[str, Patch] = {}
    for y, rk in enumerate(ranks):
        left = 0.0
        r = b.filter(pl.col("rank") == rk).sort("order", "segment")
        for row in r.iter_rows(named=True):
            w = max(row["ns"], 0.0) / 1e3
            kind = row["kind"]
            color = (color_of(row["segment"]) if kind in ("phase", "prefill") else _GAP_COLOR if kind == "gap"
                     else SEAM_COLOR)
            hatch = None if kind in ("phase", "prefill") else ("//" if kind == "gap" else "..")
            ax.barh(y, w, 0.7, left=left, color=color, hatch=hatch, edgecolor="#555555", linewidth=0.4)
            if row["share"] >= 0.06:
                ax.text(left + w / 2, y, f"{_t(base_name(row['segment']) if kind == 'phase' else row['segment'])}\n"
                        f"{w:,.0f} µs · {100 * row['share']:.0f} %", ha="center", va="center", fontsize=7)
            label = (base_name(row["segment"]) if kind in ("phase", "prefill")
                     else {"gap": "between cycles"}.get(kind, "seam"))
            seen.setdefault(label, Patch(facecolor=color, hatch=hatch, edgecolor="#555555", label=_t(label)))
            left += w
        ax.text(left, y, f"  {left:,.0f} µs", va="center", fontsize=8)
    ax.set_yticks(range(len(ranks)), [f"rank {r}" for r in ranks], fontsize=8)
    ax.set_ylim(len(ranks) - 0.5, -0.5)
    ax.set_xlabel("µs of the mean steady cycle, on the GPU clock (last GPU op of the previous cycle → last of this one)")
    ax.set_title("Cycle budget per rank: the gap before the cycle, phases and the seams between them", fontsize=10)
    ax.margins(x=0.08)
    fig.legend(handles=list(seen.values()), loc="outside lower center", ncol=min(len(seen), 7), fontsize=8,
               frameon=False)
    return fig


def timeline(res: Result, cycles_shown: int = 3, first: int | None = None) -> Figure:
    """A few cycles on the GPU clock: one lane per rank; phase spans, seams, and the GPU ops below them.

    ``first``: the first cycle (0-based, rank 0's order); default: the middle of the steady state.
    """
    cyc = cycles(res)
    ranks = sorted(res.ranks["rank"].to_list())
    fig = _figure(12, 1.6 + (1.1 if len(ranks) <= 4 else 0.75) * len(ranks))
    ax = fig.subplots()
    if cyc.height == 0:
        ax.text(0.5, 0.5, "no cycle ranges", ha="center", transform=ax.transAxes)
        return fig
    steady = cyc.filter("steady")["n"] if cyc["steady"].any() else cyc["n"]
    first = max(0, to_int(steady.median()) - cycles_shown // 2) if first is None else first
    win = cyc.filter(pl.col("n").is_between(first, first + cycles_shown - 1))
    t0, t1 = to_int(win["i_first"].min()), to_int(win["i_last"].max())
    pad = (t1 - t0) // 50
    t0, t1 = t0 - pad, t1 + pad
    inst = res.instances.filter((pl.col("x_ops") > 0) & (pl.col("x_last") > t0) & (pl.col("x_first") < t1))
    inst = inst.with_columns(base=base_expr()).filter(~pl.col("base").is_in(["cycle", "decode_step"]))
    seams = res.seam_instances.filter((pl.col("b") > t0) & (pl.col("a") < t1) & (pl.col("b") > pl.col("a")))
    ops = res.ops_between(t0, t1)
    us = 1e3
    for lane, rk in enumerate(ranks):
        y = len(ranks) - 1 - lane
        for name in _order(inst["range"].unique().to_list()):
            r = inst.filter((pl.col("rank") == rk) & (pl.col("range") == name))
            bars = [((a - t0) / us, (b - a) / us) for a, b in r.select("x_first", "x_last").rows()]
            ax.broken_barh(bars, (y + 0.35, 0.5), facecolors=color_of(name), edgecolor="none", label=_t(name))
        s = seams.filter(pl.col("rank") == rk)
        ax.broken_barh([((a - t0) / us, (b - a) / us) for a, b in s.select("a", "b").rows()], (y + 0.35, 0.5),
                       facecolors=SEAM_COLOR, hatch="..", edgecolor="#888888", linewidth=0, label="seam")
        o = ops.filter(pl.col("rank") == rk)
        for is_comm, color in ((False, COMPUTE_COLOR), (True, COMM_COLOR)):
            oo = o.filter(pl.col("comm").is_not_null() == is_comm)
            ax.broken_barh([((a - t0) / us, (b - a) / us) for a, b in oo.select("start", "end").rows()],
                           (y + 0.1, 0.2), facecolors=color, edgecolor="none",
                           label="comm kernel" if is_comm else "compute op")
    for c in win.filter(pl.col("rank") == ranks[0])["i_first"].to_list():
        ax.axvline((c - t0) / us, color=color_of("cycle"), lw=0.8, ls="--")
    ax.set_yticks([len(ranks) - 1 - i + 0.5 for i in range(len(ranks))], [f"rank {r}" for r in ranks])
    ax.set_xlim(0, (t1 - t0) / us)
    ax.set_xlabel(f"µs on the GPU clock (dashed: cycle starts on rank {ranks[0]})")
    ax.set_title(f"GPU timeline, cycles {first}–{first + cycles_shown - 1}: phases (top), ops (bottom), seams dotted")
    handles, labels = ax.get_legend_handles_labels()
    uniq = dict(zip(labels, handles))
    ax.legend(uniq.values(), uniq.keys(), loc="upper center", bbox_to_anchor=(0.5, -0.35 / max(1, len(ranks) / 2)),
              ncol=min(len(uniq), 7), fontsize=8, frameon=False)
    return fig


def distributions(res: Result) -> Figure:
    """Left: idle time inside each phase instance; right: GPU idle in each seam (transition), µs, boxplots over
    the steady-state instances of all ranks (symlog axes starting at 0)."""
    fig = _figure(12, 4.4)
    a1, a2 = fig.subplots(1, 2)
    inst = steady_tables.instances_marked_steady(res).filter(pl.col("steady") & (pl.col("x_ops") > 0)).with_columns(base=base_expr())
    inst = inst.filter(~pl.col("base").is_in(["cycle", "decode_step"])) if inst.height else inst
    names = _order(inst["range"].unique().to_list())
    data = [(inst.filter(pl.col("range") == n)["x_idle_ns"] / 1e3).to_list() for n in names]
    if names:
        bp = a1.boxplot(data, patch_artist=True, showfliers=True, flierprops={"markersize": 3})
        for patch, n in zip(bp["boxes"], names):
            patch.set_facecolor(color_of(n))
        a1.set_xticks(range(1, len(names) + 1), [_t(n) for n in names], rotation=20, fontsize=8)
    a1.set_yscale("symlog", linthresh=1)
    a1.set_ylim(0, 1.8 * max([max(d, default=0) for d in data], default=1) + 1)
    a1.set_ylabel("µs idle inside one instance (symlog)")
    a1.set_title("Idle gaps inside phases (per instance, steady state, all ranks)", fontsize=10)
    a1.grid(axis="y", alpha=0.3)
    s = steady_tables.steady_seam_instances(res)
    s = s.with_columns(tr=pl.format("{} → {}", "prev_range", "range")) if s.height else s
    trs = s.group_by("tr").agg(pl.col("idle_ns").median()).sort("idle_ns", descending=True)["tr"].to_list() \
        if s.height else []
    if trs:
        bp = a2.boxplot([(s.filter(pl.col("tr") == t)["idle_ns"] / 1e3).to_list() for t in trs], orientation="horizontal",
                        patch_artist=True, flierprops={"markersize": 3})
        for patch in bp["boxes"]:
            patch.set_facecolor(SEAM_COLOR)
        a2.set_yticks(range(1, len(trs) + 1), [_t(t) for t in trs], fontsize=8)
        a2.invert_yaxis()
    a2.set_xscale("symlog", linthresh=1)
    a2.set_xlim(0, 1.8 * to_float(s["idle_ns"].max() or 0) / 1e3 + 1 if s.height else 10)
    a2.set_xlabel("µs GPU idle in the seam (symlog)")
    a2.set_title("Seams: GPU idle between consecutive ranges (steady state)", fontsize=10)
    a2.grid(axis="x", alpha=0.3)
    return fig


def per_cycle(res: Result) -> Figure:
    """Each phase's GPU span per cycle over the run (mean over ranks), and the cycle period per rank; the cycles
    left out of the steady state shaded (warm-up grey, stalls red)."""
    fig = _figure(12, 6.5)
    a1, a2 = fig.subplots(2, 1, sharex=True)
    cyc = cycles(res)
    kids = (res.instances.filter(pl.col("x_ops") > 0).join(cyc.select("rank", "n", parent="range_id"), on=["rank", "parent"])
            .group_by("n", "range").agg(pl.col("x_span_ns").mean()).sort("n"))
    for name in _order(kids["range"].unique().to_list()):
        k = kids.filter(pl.col("range") == name)
        a1.plot(k["n"], k["x_span_ns"] / 1e3, color=color_of(name), lw=1.4, marker=".", ms=3, label=_t(name))
    a1.set_ylabel("µs GPU span (mean over ranks)")
    a1.set_title("Per-cycle phase time over the run (warm-up, stalls, drift; log scale)", fontsize=10)
    a1.grid(alpha=0.3, which="both")
    a1.set_yscale("log")
    for rk in sorted(cyc["rank"].unique().to_list()):
        c = cyc.filter((pl.col("rank") == rk) & pl.col("period_ns").is_not_null())
        a2.plot(c["n"], c["period_ns"] / 1e3, lw=1.2, marker=".", ms=3, label=f"rank {rk}")
    left = cyc.filter(pl.col("why").is_not_null()).group_by("n").agg(pl.col("why").first()) if cyc.height else cyc
    shade = {"warm-up": "#cccccc", "stall": "#f2b8b5", "pause": "#f2b8b5", "skipped": "#cccccc",
             "outside window": "#cccccc"}
    for n, why in left.rows() if left.height else []:
        for ax in (a1, a2):
            ax.axvspan(n - 0.5, n + 0.5, color=shade.get(why, "#cccccc"), alpha=0.6, lw=0, zorder=0)
    a2.set_ylabel("µs cycle period")
    a2.set_xlabel("cycle (order on each rank); shaded: left out of the steady state (grey warm-up or skipped, "
                  "red rare stall or pause)")
    a2.set_title("Cycle period: last GPU op of the previous cycle → last GPU op of this one", fontsize=10)
    a2.grid(alpha=0.3, which="both")
    a2.set_yscale("log")
    for ax in (a1, a2):
        if ax.get_legend_handles_labels()[0]:  # a trace without cycles has nothing to label
            ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1), frameon=False)
    return fig


def cycle_periods(res: Result) -> Figure:
    """Every cycle on one chart (the report's interactive one, :mod:`analyze.output.cycles_chart`, as a figure):
    each cycle's period per rank (one marker per rank), coloured by its class (typical, each class of slower cycles
    that recurs, rare stalls, left out), the batch-size segments as bands."""
    from . import cycles_chart as cc
    from .timeline import class_cycles

    c = cycles(res)
    fig = _figure(12, 4.2)
    ax = fig.subplots()
    c = c.filter(pl.col("period_ns").is_not_null()) if c.height else c
    if c.height == 0:
        ax.text(0.5, 0.5, "no cycles with a period", ha="center", transform=ax.transAxes)
        return fig
    segs = res.steady.segments
    for i, sg in enumerate(segs if len(segs) > 1 else []):
        ax.axvspan(sg.first_cycle - 0.5, sg.last_cycle + 0.5, color="#e6eef5" if i % 2 == 0 else "#f2f2f2", lw=0,
                   zorder=0)
        ax.text(sg.first_cycle, 0.98, " " + _t(sg.key), transform=ax.get_xaxis_transform(), fontsize=7, va="top")
    colour = {None: cc.TYPICAL_COLOR}
    labels = {cc.TYPICAL_COLOR: "typical"}
    classes = class_cycles(res)
    of_key: dict[int, str] = {}
    for i, (cl, keys) in enumerate(classes):
        col = cc.STALL_COLOR if cl.kind == "stall" else cc.CLASS_COLORS[i % len(cc.CLASS_COLORS)]
        labels[col] = f"{cl.label} ({len(keys)})"
        of_key |= {k: col for k in keys}
    c = c.with_columns(colour=pl.when(~pl.col("steady") & (pl.col("why") != "stall")).then(pl.lit(cc.LEFT_OUT_COLOR))
                       .otherwise(pl.col("key").replace_strict(of_key, default=colour[None], return_dtype=pl.String)))
    labels[cc.LEFT_OUT_COLOR] = "left out (warm-up, outside the window)"
    markers = "os^D"
    for j, rk in enumerate(sorted(c["rank"].unique().to_list())):
        r = c.filter(pl.col("rank") == rk).sort("key")
        ax.plot(r["key"], r["period_ns"] / 1e3, color="#9db3c8", lw=0.8, zorder=1)
        ax.scatter(r["key"], r["period_ns"] / 1e3, c=r["colour"].to_list(), marker=markers[j % 4], s=14, zorder=2,
                   label=None)
    handles: list[Artist] = [Line2D([], [], marker="o", ls="none", color=col, label=_t(lab))
                             for col, lab in labels.items() if col in set(c["colour"].to_list())]
    if c["rank"].n_unique() > 1:
        handles += [Line2D([], [], marker=markers[j % 4], ls="none", color="#555555", label=f"rank {rk}")
                    for j, rk in enumerate(sorted(c["rank"].unique().to_list()))]
    ax.set_xlabel("cycle (as analyze numbers them)")
    spread = float(c["period_ns"].max()) / max(float(c["period_ns"].median()), 1.0)  # type: ignore[arg-type]
    if spread > 4:  # a few very long cycles (prefills, stalls) would flatten the rest
        ax.set_yscale("log")
    ax.set_ylabel("cycle period µs" + (" (log)" if spread > 4 else ""))
    ax.set_title("Every cycle: its period per rank, coloured by its class (last GPU op of the previous cycle → its "
                 "last)", fontsize=10)
    ax.grid(alpha=0.3)
    fig.legend(handles=handles, loc="outside lower center", ncol=min(len(handles), 5), fontsize=8, frameon=False)
    return fig


def has_comm_split(frame: pl.DataFrame) -> bool:
    """Whether a phases frame carries issue 5's wait/transfer split."""
    return {"comm_wait_ns", "comm_transfer_ns"} <= set(frame.columns)


def comm_split(phases: pl.DataFrame) -> Figure | None:
    """Small multiples, one panel per phase: per rank, communication time split into transfer vs waiting for the
    other ranks (µs per instance). ``phases``: a frame with ``rank, phase, instances, comm_wait_ns,
    comm_transfer_ns`` (e.g. :func:`analyze.compute.steady_tables.steady_phases`); None without the split or communication."""
    if not has_comm_split(phases):
        return None
    p = phases.filter((pl.col("comm_wait_ns") + pl.col("comm_transfer_ns")) > 0)
    if p.height == 0:
        return None
    n = pl.max_horizontal(pl.col("instances"), pl.lit(1))
    p = p.with_columns(transfer=pl.col("comm_transfer_ns") / n / 1e3, wait=pl.col("comm_wait_ns") / n / 1e3)
    return _small_multiples(p, [("transfer", COMM_COLOR, None, "transfer"), ("wait", WAIT_COLOR, None, "wait")],
                            "Communication per instance: transfer vs waiting for the other ranks",
                            "µs per instance (matched collectives' kernel time)")


def whatif_curve(model: Model, max_steps: int = 10) -> Figure:
    """Predicted cycle time (stacked: draft, verify, draft_extend, the seams between them, other) and tokens/s
    against the number of draft steps; the bars add up to the predicted cycle."""
    preds = pl.DataFrame([p.as_dict() for p in model.predictions(max_steps)])
    fig = _figure(9, 4.8)
    ax = fig.subplots()
    bottom = [0.0] * preds.height
    for col, name, color, hatch in (("draft_ns", "draft", color_of("draft"), None),
                                    ("verify_ns", "verify", color_of("verify"), None),
                                    ("draft_extend_ns", "draft_extend", color_of("draft_extend"), None),
                                    ("seams_ns", "seams between them", SEAM_COLOR, ".."),
                                    ("other_ns", "other (host, other seams, gap between cycles)", IDLE_COLOR, "//")):
        vals = (preds[col] / 1e3).to_list()
        ax.bar(preds["steps"], vals, bottom=bottom, color=color, hatch=hatch, label=name, edgecolor="#555555",
               linewidth=0.4)
        bottom = [b + v for b, v in zip(bottom, vals)]
    ax.axvline(model.steps_now, color="#333333", ls=":", lw=1)
    ax.set_xlabel("draft steps")
    ax.set_ylabel("predicted µs per cycle")
    ax.set_xticks(preds["steps"].to_list())
    ax.set_title(f"What-if from a trace at {model.steps_now} steps (dotted)"
                 + (f": the whole run, {len(model.segments)} batch sizes averaged (per batch size: the table)"
                    if model.segments else ""), fontsize=10)
    handles, labels = ax.get_legend_handles_labels()
    if preds["tokens_per_s"].is_not_null().any():
        a2 = ax.twinx()
        a2.plot(preds["steps"], preds["tokens_per_s"], color="#222222", marker="o", label="tokens/s (right axis)")
        a2.set_ylabel("predicted tokens/s")
        a2.set_ylim(bottom=0)
        h2, l2 = a2.get_legend_handles_labels()
        handles, labels = handles + h2, labels + l2
    fig.legend(handles, labels, loc="outside lower center", ncol=3, fontsize=8, frameon=False)
    return fig


_UTIL_METRICS = (("sm_active_pct", "SMs active", "#0072B2"), ("sm_issue_pct", "SM issue", "#56B4E9"),
                 ("tensor_active_pct", "tensor active", "#009E73"), ("dram_read_pct", "DRAM read", "#E69F00"),
                 ("dram_write_pct", "DRAM write", "#CC79A7"))  # Okabe–Ito: colour-blind safe


def _bound_label(bound: str) -> str:
    """A phase's bound in words: "memory-bound", "compute-bound", "mixed", or "SMs idle" (not a bound)."""
    return {"idle": "SMs idle", "mixed": "mixed"}.get(bound, f"{bound}-bound")


def utilisation_bars(res: Result) -> Figure | None:
    """GPU utilisation per phase (nsys GPU-metrics samples, :mod:`analyze.compute.utilisation`): per phase and
    scope (steady state, each batch size), all ranks, one bar per metric in percent of peak; phases too short for
    the sampling period are left out. None without samples."""
    from ..compute import utilisation

    u = utilisation.phases(res)
    if u.height == 0:
        return None
    u = u.filter(pl.col("rank").is_null() & (pl.col("scope") != "all") & (pl.col("instances") > 0))
    if u.height == 0:
        return None
    order = {n: i for i, n in enumerate(_order(u["phase"].unique().to_list()))}
    rows = list(u.with_columns(_p=pl.col("phase").replace_strict(order, return_dtype=pl.Int64))
                .sort(utilisation.scope_order(), "scope", "_p", maintain_order=True).iter_rows(named=True))
    fig = _figure(10, 0.45 * len(rows) * 1.6 + 1.2)
    ax = fig.add_subplot()
    h = 0.8 / len(_UTIL_METRICS)
    for j, (col, label, colour) in enumerate(_UTIL_METRICS):
        vals = [r[col] if r[col] is not None else 0.0 for r in rows]
        ax.barh(np.arange(len(rows)) + (j - 2) * h, vals, height=h, color=colour, label=label)
    ax.set_yticks(np.arange(len(rows)))
    ax.set_yticklabels([_t(f"{r['phase']} · {r['scope']}" + (f" · {_bound_label(r['bound'])}" if r["bound"] else ""))
                        for r in rows])
    ax.invert_yaxis()
    ax.set_xlim(0, 100)
    ax.set_xlabel("% of peak (time-weighted over each instance's GPU span)")
    ax.set_title("GPU utilisation per phase (nsys GPU-metrics samples), all ranks")
    ax.legend(loc="lower right", fontsize=8)
    return fig


def compare_delta(doc: Comparison, top: int = 12) -> Figure | None:
    """The comparison (``spectrace compare``'s document): Δ = B − A in µs per cycle for the phases and seams that
    moved most, one horizontal bar each, stacked into compute, comm and idle (they add up to Δ), the 95 % interval
    as a whisker; the cycle period's Δ on top. None when nothing is compared."""
    rows = [r for r in doc.rows if r.get("delta_ns") is not None][:top]
    if not rows:
        return None
    p = doc.cycle_period
    names = ["cycle period", *[_t(r["phase"]) for r in rows]]
    fig = _figure(11, 1.2 + 0.32 * len(names))
    ax = fig.subplots()
    y = np.arange(len(names))[::-1]
    ax.barh(y[0], (p["delta_ns"] or 0.0) / 1e3, color="#444444", label="cycle period")  # (None: a side without one)
    for col, label, color, hatch in (("delta_compute_ns", "compute", COMPUTE_COLOR, None),
                                     ("delta_comm_ns", "comm", COMM_COLOR, None),
                                     ("delta_idle_ns", "idle", IDLE_COLOR, "//")):
        vals = np.array([(r[col] or 0) / 1e3 for r in rows])
        pos, neg = np.clip(vals, 0, None), np.clip(vals, None, 0)
        if col == "delta_compute_ns":
            left_pos, left_neg = np.zeros(len(rows)), np.zeros(len(rows))
        ax.barh(y[1:], pos, left=left_pos, color=color, hatch=hatch, edgecolor="#555555", linewidth=0.3, label=label)
        ax.barh(y[1:], neg, left=left_neg, color=color, hatch=hatch, edgecolor="#555555", linewidth=0.3)
        left_pos, left_neg = left_pos + pos, left_neg + neg
    ci = [(i, r) for i, r in enumerate([{"ci_low_ns": p.get("ci_low_ns"), "ci_high_ns": p.get("ci_high_ns"),
                                         "delta_ns": p["delta_ns"]}, *rows]) if r.get("ci_low_ns") is not None]
    if ci:
        ax.errorbar([r["delta_ns"] / 1e3 for _, r in ci], [y[i] for i, _ in ci],
                    xerr=[[(r["delta_ns"] - r["ci_low_ns"]) / 1e3 for _, r in ci],
                          [(r["ci_high_ns"] - r["delta_ns"]) / 1e3 for _, r in ci]],
                    fmt="none", ecolor="#222222", capsize=3, lw=1, label="95 % interval")
    ax.axvline(0, color="#333333", lw=0.8)
    ax.set_yticks(y, names, fontsize=8)
    ax.set_xlabel("Δ = B − A, µs per cycle")
    ax.set_title("What changed, per cycle (largest |Δ| first)", fontsize=10)
    fig.legend(loc="outside lower center", ncol=5, fontsize=8, frameon=False)
    return fig
