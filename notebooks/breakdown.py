# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Where the time goes: one trace
#
# The steady state (warm-up and rare stalls left out, what recurs kept), the cycle budget, the slower cycles and
# where their time sits, the segments of one batch size, the ranked findings, then per rank and per phase GPU
# compute / communication / idle, a few cycles on the timeline, the seams between phases, the run over time,
# and the what-if over draft steps.
# Reads `$SPECTRACE_REPORT` (an nsys SQLite export), else the bundled H200 capture `tp1_serve_graph` (a
# serving-shaped run: batch 1 → 4 → 16 → 64 → 16 → 4, a prefill when the batch grows, 1 ms of host work every
# 10th cycle; `--steps-now` comes from the manifest; set `SPECTRACE_STEPS` for a trace without one).

# %%
import os

import polars as pl

from analyze import InputError, analyze, findings_text, plots, whatif, whatif_table
from nvtx_hooks.capture import samples

REPORT = os.environ.get("SPECTRACE_REPORT") or str(samples.path("tp1_serve_graph"))
STEPS = int(os.environ["SPECTRACE_STEPS"]) if os.environ.get("SPECTRACE_STEPS") else None
res = analyze(REPORT)
print(REPORT, "·", res.ranks.height, "rank(s) ·", res.selection)
steady = res.steady  # the steady state: what `spectrace analyze` prints first
print(steady.selection["text"])

# %% [markdown]
# ## The cycle budget: where one steady cycle goes, per rank

# %%
plots.budget(res)

# %%
steady.budget.select("rank", "segment", "kind", "ns", "share", "gpu_idle_ns")

# %% [markdown]
# ## Slower cycles: what recurs (kept, described) and the rare stalls (left out)

# %%
for c in steady.cycle_classes:
    print(("kept · " if c.kept else "left out · ") + c.text)

# %%
pl.DataFrame([p | {"class": c.label} for c in steady.cycle_classes for p in c.pieces])

# %% [markdown]
# ## Every cycle on one chart: its period per rank, coloured by its class
#
# The report's chart is interactive (hover a cycle for its budget pieces, click it for a Gantt across ranks);
# `timeline(REPORT)` (`spectrace timeline`) writes every cycle op by op for ui.perfetto.dev, with the findings on
# the cycles they name.

# %%
plots.cycle_periods(res)

# %% [markdown]
# ## Segments: cycles of one batch size

# %%
pl.DataFrame([s.as_dict() for s in steady.segments]).drop("budget")

# %% [markdown]
# ## What to change first: ranked findings

# %%
print("\n".join(findings_text(steady.findings)))

# %% [markdown]
# ## Phases per instance, steady state (ns; span = compute + comm + idle)

# %%
steady.phases_all.select("phase", "ranks", "instances", "span_mean_ns", "span_p50_ns", "span_p90_ns",
                                "compute_mean_ns", "comm_mean_ns", "idle_mean_ns")

# %%
plots.phase_bars(res)

# %%
plots.rank_heatmap(res)  # None with one rank

# %% [markdown]
# ## GPU utilisation per phase (with `spectrace trace --gpu-metrics`; empty otherwise)
#
# Time-weighted means of nsys GPU-metrics samples over each phase instance's GPU span, percent of peak:
# memory-bound (DRAM read high, tensor cores idle) means extra draft tokens are cheap in verify
# (docs/gpu-metrics.md).

# %%
util = steady.utilisation
util.filter(pl.col("rank").is_null()).select(
    "phase", "scope", "sm_active_pct", "sm_issue_pct", "tensor_active_pct", "dram_read_pct", "dram_write_pct",
    "samples", "instances", "short", "bound", "note") if util.height else util

# %%
plots.utilisation_bars(res)  # None without GPU-metrics samples

# %% [markdown]
# ## A few cycles on the GPU

# %%
plots.timeline(res)

# %% [markdown]
# ## Idle inside phases and in the seams between them

# %%
steady.seams_all.select("parent", "from", "to", "instances", "idle_mean_ns", "idle_p50_ns", "idle_p90_ns")

# %%
plots.distributions(res)

# %% [markdown]
# ## Over the run: warm-up, stalls, recurring slow cycles and drift (shaded: left out of the steady state)

# %%
plots.per_cycle(res)

# %%
split = plots.comm_split(steady.phases)  # None without communication
split

# %% [markdown]
# ## Tokens and the what-if over draft steps

# %%
tk = steady.tokens_with_steps(STEPS)
pl.DataFrame([tk.as_dict()])

# %%
try:
    model = whatif(res, STEPS)
    print(whatif_table(model))
    display(plots.whatif_curve(model))  # noqa: F821
except InputError as e:
    print("no what-if:", e)
