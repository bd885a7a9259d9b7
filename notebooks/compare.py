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
# # EAGLE vs baseline, and the what-if against a real steps sweep
#
# `$SPECTRACE_BASELINE` (A) and `$SPECTRACE_REPORT` (B), else the bundled H200 captures `tp1_baseline`
# (no speculation) and `tp1_node` (EAGLE-shaped, 3 steps). Phases match by base name; Δ = B − A.

# %%
import os

import polars as pl

from analyze import compare, compare_table, plots, whatif_validation
from nvtx_hooks.capture import samples

A = os.environ.get("SPECTRACE_BASELINE") or str(samples.path("tp1_baseline"))
B = os.environ.get("SPECTRACE_REPORT") or str(samples.path("tp1_node"))
cmp = compare(A, B)  # a Comparison: .verdict, .rows, .cycle_period, ...; cmp.to_dict() is the JSON
print(compare_table(cmp))

# %% [markdown]
# ## What changed, per cycle
#
# Δ = B − A in µs per cycle for the phases and seams that moved most, split into compute, comm and idle (they add
# up to Δ), with the 95 % bootstrap interval; the cycle period's Δ on top (the report's chart with `--vs`).

# %%
plots.compare_delta(cmp)

# %%
pl.DataFrame(cmp.rows).select("phase", "kind", "a_ns_per_cycle", "b_ns_per_cycle", "delta_ns", "delta_compute_ns",
                              "delta_comm_ns", "delta_idle_ns", "ci_low_ns", "ci_high_ns")

# %% [markdown]
# ## What-if validation on the bundled steps sweep (1..4 draft steps)
#
# A model fitted on each trace predicts the cycle time of the others; `error_pct` = (predicted − measured) /
# measured. Token errors reflect the workload's acceptance (uniform in 1..steps+1 by construction), which the
# model's geometric acceptance does not follow.

# %%
v = whatif_validation({s: samples.path(f"tp1_steps{s}") for s in (1, 2, 3, 4)})
v.pivot(on="steps", index="from_steps", values="error_pct")

# %%
v.filter(pl.col("from_steps") != pl.col("steps")).select(
    mean_abs_error_pct=pl.col("error_pct").abs().mean(), max_abs_error_pct=pl.col("error_pct").abs().max())
