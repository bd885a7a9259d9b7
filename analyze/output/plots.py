"""Figures of an analysis :class:`~analyze.model.Result` (matplotlib).

Each function returns a :class:`matplotlib.figure.Figure` and saves nothing. Figures are made without
pyplot (no backend is chosen, no global figure list): a notebook shows them inline, a script saves them. Colours come from
:mod:`nvtx_hooks.phases` (phase colours, ``SEAM_COLOR``, ``IDLE_COLOR``, ``COMM_COLOR``).
"""

from __future__ import annotations

import polars as pl
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from nvtx_hooks.phases import COMM_COLOR, CYCLE_ORDER, IDLE_COLOR, SEAM_COLOR, color_of

from ..compute.tokens import base_expr, cycles

WAIT_COLOR = "#f4a259"  # comm wait (a rank waiting for the others); transfer uses COMM_COLOR


def _order(names: list[str]) -> list[str]:
    """Phase texts in cycle order (by base name), others after, alphabetically."""
    idx = {n: i for i, n in enumerate(CYCLE_ORDER)}
    base = pl.Series(names, dtype=pl.String).to_frame("range").with_columns(b=base_expr())["b"].to_list()
    return [n for _, n in sorted(zip(base, names), key=lambda t: (idx.get(t[0], 99), t[1]))]


def _leaf_phases(res) -> pl.DataFrame:
    """Per rank and phase: totals of the phases that are not cycles (exclusive view)."""
    p = res.phases.with_columns(base=base_expr("phase"))
    leaf = p.filter(~pl.col("base").is_in(["cycle", "prefill"]))
    return leaf if leaf.height else p


def _rank_bars(p: pl.DataFrame):
    """A figure with one slot per (phase, rank) of ``p``: ``fig, ax, width, names, [(x, phase, rank, row)]``."""
    names = _order(p["phase"].unique().to_list())
    ranks = sorted(p["rank"].unique().to_list())
    fig = Figure(figsize=(max(6.0, 1.1 * len(names) * max(len(ranks), 1) + 2), 4.2), layout="constrained")
    ax = fig.subplots()
    width = 0.8 / max(len(ranks), 1)
    slots = []
    for i, name in enumerate(names):
        for j, rk in enumerate(ranks):
            r = p.filter((pl.col("phase") == name) & (pl.col("rank") == rk))
            if r.height:
                slots.append((i + (j - (len(ranks) - 1) / 2) * width, name, rk, r.row(0, named=True)))
    return fig, ax, width, names, slots


def phase_bars(res) -> Figure:
    """Per phase, one stacked bar per rank: compute (phase colour), comm and idle, µs per instance."""
    p = _leaf_phases(res).with_columns(
        (pl.col(c) / pl.col("instances") / 1e3).alias(c) for c in ("compute_ns", "comm_ns", "idle_ns"))
    fig, ax, width, names, slots = _rank_bars(p)
    for x, name, rk, row in slots:
        bottom = 0.0
        for col, color, hatch in (("compute_ns", color_of(name), None), ("comm_ns", COMM_COLOR, None),
                                  ("idle_ns", IDLE_COLOR, "//")):
            ax.bar(x, row[col], width * 0.92, bottom=bottom, color=color, edgecolor="#555555", linewidth=0.4,
                   hatch=hatch)
            bottom += row[col]
        ax.text(x, bottom, f"r{rk}", ha="center", va="bottom", fontsize=7)
    ax.set_xticks(range(len(names)), names, rotation=0 if len(names) < 6 else 30)
    ax.set_ylabel("µs per instance (mean)")
    ax.set_title("Per-phase GPU span per rank: compute + comm + idle")
    ax.legend(handles=[Patch(facecolor="#999999", label="compute (phase colour)"),
                       Patch(facecolor=COMM_COLOR, label="communication"),
                       Patch(facecolor=IDLE_COLOR, hatch="//", edgecolor="#555555", label="idle")],
              loc="upper right", fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    return fig


def timeline(res, cycles_shown: int = 3, first: int | None = None) -> Figure:
    """A few cycles on the GPU clock: one lane per rank; phase spans, seams, and the GPU ops below them.

    ``first``: the first cycle (0-based, rank 0's order); default: the middle of the run (past warm-up).
    """
    cyc = cycles(res)
    ranks = sorted(res.ranks["rank"].to_list())
    fig = Figure(figsize=(12, 1.4 + 1.1 * len(ranks)), layout="constrained")
    ax = fig.subplots()
    if cyc.height == 0:
        ax.text(0.5, 0.5, "no cycle ranges", ha="center", transform=ax.transAxes)
        return fig
    n_max = int(cyc["n"].max())
    first = max(0, (n_max + 1) // 2 - cycles_shown // 2) if first is None else first
    win = cyc.filter(pl.col("n").is_between(first, first + cycles_shown - 1))
    t0, t1 = int(win["i_first"].min()), int(win["i_last"].max())
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
            ax.broken_barh(bars, (y + 0.35, 0.5), facecolors=color_of(name), edgecolor="none", label=name)
        s = seams.filter(pl.col("rank") == rk)
        ax.broken_barh([((a - t0) / us, (b - a) / us) for a, b in s.select("a", "b").rows()], (y + 0.35, 0.5),
                       facecolors=SEAM_COLOR, hatch="..", edgecolor="#888888", linewidth=0, label="seam")
        o = ops.filter(pl.col("rank") == rk)
        for is_comm, color in ((False, "#333333"), (True, COMM_COLOR)):
            oo = o.filter(pl.col("comm").is_not_null() == is_comm)
            ax.broken_barh([((a - t0) / us, (b - a) / us) for a, b in oo.select("start", "end").rows()],
                           (y + 0.1, 0.2), facecolors=color, edgecolor="none",
                           label="comm kernel" if is_comm else "other GPU op")
    for c in win.filter(pl.col("rank") == ranks[0])["i_first"].to_list():
        ax.axvline((c - t0) / us, color="#4c72b0", lw=0.8, ls="--")
    ax.set_yticks([len(ranks) - 1 - i + 0.5 for i in range(len(ranks))], [f"rank {r}" for r in ranks])
    ax.set_xlim(0, (t1 - t0) / us)
    ax.set_xlabel(f"µs on the GPU clock (dashed: cycle starts on rank {ranks[0]})")
    ax.set_title(f"GPU timeline, cycles {first}–{first + cycles_shown - 1}: phases (top), ops (bottom), seams dotted")
    handles, labels = ax.get_legend_handles_labels()
    uniq = dict(zip(labels, handles))
    ax.legend(uniq.values(), uniq.keys(), loc="upper center", bbox_to_anchor=(0.5, -0.35 / max(1, len(ranks) / 2)),
              ncol=min(len(uniq), 7), fontsize=8, frameon=False)
    return fig


def distributions(res) -> Figure:
    """Left: idle time inside each phase instance; right: GPU idle in each seam (transition), µs, boxplots."""
    fig = Figure(figsize=(12, 4.2), layout="constrained")
    a1, a2 = fig.subplots(1, 2)
    inst = res.instances.filter(pl.col("x_ops") > 0).with_columns(base=base_expr())
    inst = inst.filter(~pl.col("base").is_in(["cycle", "decode_step"])) if inst.height else inst
    names = _order(inst["range"].unique().to_list())
    data = [(inst.filter(pl.col("range") == n)["x_idle_ns"] / 1e3).to_list() for n in names]
    if names:
        bp = a1.boxplot(data, patch_artist=True, showfliers=True, flierprops={"markersize": 3})
        for patch, n in zip(bp["boxes"], names):
            patch.set_facecolor(color_of(n))
        a1.set_xticks(range(1, len(names) + 1), names, rotation=20, fontsize=8)
    a1.set_yscale("symlog", linthresh=1)
    a1.set_ylabel("µs idle inside one instance (symlog)")
    a1.set_title("Idle gaps inside phases (per instance, all ranks)")
    a1.grid(axis="y", alpha=0.3)
    s = res.seam_instances.with_columns(tr=pl.format("{} → {}", "prev_range", "range"))
    trs = s.group_by("tr").agg(pl.col("idle_ns").median()).sort("idle_ns", descending=True)["tr"].to_list()
    if trs:
        bp = a2.boxplot([(s.filter(pl.col("tr") == t)["idle_ns"] / 1e3).to_list() for t in trs], orientation="horizontal",
                        patch_artist=True, flierprops={"markersize": 3})
        for patch in bp["boxes"]:
            patch.set_facecolor(SEAM_COLOR)
        a2.set_yticks(range(1, len(trs) + 1), trs, fontsize=8)
        a2.invert_yaxis()
    a2.set_xscale("symlog", linthresh=1)
    a2.set_xlabel("µs GPU idle in the seam (symlog)")
    a2.set_title("Seams: GPU idle between consecutive phases")
    a2.grid(axis="x", alpha=0.3)
    return fig


def per_cycle(res) -> Figure:
    """Each phase's GPU span per cycle over the run (mean over ranks), and the cycle period per rank."""
    fig = Figure(figsize=(12, 6.5), layout="constrained")
    a1, a2 = fig.subplots(2, 1, sharex=True)
    cyc = cycles(res)
    kids = (res.instances.filter(pl.col("x_ops") > 0).join(cyc.select("rank", "n", parent="range_id"), on=["rank", "parent"])
            .group_by("n", "range").agg(pl.col("x_span_ns").mean()).sort("n"))
    for name in _order(kids["range"].unique().to_list()):
        k = kids.filter(pl.col("range") == name)
        a1.plot(k["n"], k["x_span_ns"] / 1e3, color=color_of(name), lw=1.4, marker=".", ms=3, label=name)
    a1.set_ylabel("µs GPU span (mean over ranks)")
    a1.set_title("Per-cycle phase time over the run (warm-up, drift; log scale)")
    a1.legend(fontsize=8, ncol=4, loc="upper right")
    a1.grid(alpha=0.3, which="both")
    a1.set_yscale("log")
    for rk in sorted(cyc["rank"].unique().to_list()):
        c = cyc.filter((pl.col("rank") == rk) & pl.col("period_ns").is_not_null())
        a2.plot(c["n"], c["period_ns"] / 1e3, lw=1.2, marker=".", ms=3, label=f"rank {rk}")
    a2.set_ylabel("µs cycle period")
    a2.set_xlabel("cycle (order on each rank)")
    a2.set_title("Cycle period: first GPU op of a cycle → first GPU op of the next")
    a2.legend(fontsize=8)
    a2.grid(alpha=0.3, which="both")
    a2.set_yscale("log")
    return fig


def has_comm_split(frame: pl.DataFrame) -> bool:
    """Whether a phases frame carries issue 5's wait/transfer split."""
    return {"comm_wait_ns", "comm_transfer_ns"} <= set(frame.columns)


def comm_split(phases: pl.DataFrame) -> Figure | None:
    """Per phase and rank: communication time split into waiting for other ranks vs transfer (µs per instance).

    ``phases``: a frame with ``rank, phase, instances, comm_wait_ns, comm_transfer_ns``; None without the split
    or without communication.
    """
    if not has_comm_split(phases):
        return None
    p = phases.filter((pl.col("comm_wait_ns") + pl.col("comm_transfer_ns")) > 0)
    if p.height == 0:
        return None
    fig, ax, width, names, slots = _rank_bars(p)
    for x, _name, rk, row in slots:
        n = max(row["instances"], 1)
        w, t = row["comm_wait_ns"] / n / 1e3, row["comm_transfer_ns"] / n / 1e3
        ax.bar(x, t, width * 0.92, color=COMM_COLOR, edgecolor="#555555", linewidth=0.4)
        ax.bar(x, w, width * 0.92, bottom=t, color=WAIT_COLOR, edgecolor="#555555", linewidth=0.4)
        ax.text(x, t + w, f"r{rk}", ha="center", va="bottom", fontsize=7)
    ax.set_xticks(range(len(names)), names)
    ax.set_ylabel("µs per instance (mean)")
    ax.set_title("Communication: transfer vs waiting for the other ranks")
    ax.legend(handles=[Patch(facecolor=COMM_COLOR, label="transfer"), Patch(facecolor=WAIT_COLOR, label="wait")],
              fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    return fig


def whatif_curve(model, max_steps: int = 10) -> Figure:
    """Predicted cycle time (stacked by phase) and tokens/s against the number of draft steps."""
    preds = pl.DataFrame(model.predictions(max_steps))
    fig = Figure(figsize=(8, 4.2), layout="constrained")
    ax = fig.subplots()
    bottom = [0.0] * preds.height
    for col, name in (("draft_ns", "draft"), ("verify_ns", "verify"), ("draft_extend_ns", "draft_extend"),
                      ("other_ns", "other (host, seams, gaps)")):
        vals = (preds[col] / 1e3).to_list()
        ax.bar(preds["steps"], vals, bottom=bottom, color=color_of(name.split()[0], SEAM_COLOR), label=name,
               edgecolor="#555555", linewidth=0.4)
        bottom = [b + v for b, v in zip(bottom, vals)]
    ax.axvline(model.steps_now, color="#333333", ls=":", lw=1)
    ax.set_xlabel("draft steps")
    ax.set_ylabel("predicted µs per cycle")
    ax.set_xticks(preds["steps"].to_list())
    ax.set_title(f"What-if from a trace at {model.steps_now} steps (dotted)")
    ax.legend(fontsize=8, loc="upper left")
    if preds["tokens_per_s"].is_not_null().any():
        a2 = ax.twinx()
        a2.plot(preds["steps"], preds["tokens_per_s"], color="#222222", marker="o", label="tokens/s")
        a2.set_ylabel("predicted tokens/s")
        a2.set_ylim(bottom=0)
        a2.legend(fontsize=8, loc="upper right")
    return fig
