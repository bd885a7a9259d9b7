# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Where the time goes: one trace
#
# Per rank and per phase GPU compute / communication / idle, a few cycles on the timeline, the seams
# between phases, the run over time, tokens, and the what-if over draft steps.
# Reads `$SPECTRACE_REPORT` (an nsys SQLite export), else the bundled H200 capture `tp1_node`
# (`--steps-now` comes from the manifest; set `SPECTRACE_STEPS` for a trace without one).

# %%
import os

import polars as pl

from analyze import analyze
from analyze.compute.tokens import summary
from analyze.compute.whatif import fit
from analyze.model import InputError
from analyze.output import plots
from analyze.output.text import whatif_table
from nvtx_hooks.capture import samples

REPORT = os.environ.get("SPECTRACE_REPORT") or str(samples.path("tp1_node"))
STEPS = int(os.environ["SPECTRACE_STEPS"]) if os.environ.get("SPECTRACE_STEPS") else None
res = analyze(REPORT)
print(REPORT, "·", res.ranks.height, "rank(s) ·", res.selection)

# %% [markdown]
# ## Phases (all ranks; span = compute + comm + idle, ns)

# %%
res.phases_all.select("phase", "ranks", "instances", "span_ns", "compute_ns", "comm_ns", "idle_ns")

# %%
plots.phase_bars(res)

# %% [markdown]
# ## A few cycles on the GPU

# %%
plots.timeline(res)

# %% [markdown]
# ## Idle inside phases and in the seams between them

# %%
res.seams_all.select("parent", "from", "to", "instances", "idle_ns", "busy_ns")

# %%
plots.distributions(res)

# %% [markdown]
# ## Over the run: warm-up and drift

# %%
plots.per_cycle(res)

# %%
split = plots.comm_split(res.phases)  # None without issue 5's wait/transfer columns or without communication
split

# %% [markdown]
# ## Tokens and the what-if over draft steps

# %%
tk = summary(res, steps=STEPS)
pl.DataFrame([tk.as_dict()])

# %%
try:
    model = fit(res, STEPS)
    print(whatif_table(model))
    display(plots.whatif_curve(model))  # noqa: F821
except InputError as e:
    print("no what-if:", e)
