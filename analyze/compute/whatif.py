"""What if the speculative decoder drafted N steps instead? A cost model fitted on one trace, replayed on
the trace's own CPU and GPU timelines.

**Costs** (per decode cycle, from one trace at ``S0`` draft steps; phases recognised by base name with any
prefix: ``draft``, ``verify``, ``draft_extend``; a cycle is a ``cycle`` range): each phase's cost is its GPU
span (first op → last op) per cycle, taking for each cycle the *smallest* span over the TP ranks (a rank that
arrived late does not wait in its first all-reduce, so its span is the work), then the median over cycles.
For ``S`` steps (chain drafting, top-k 1: ``S + 1`` tokens verified per request):

- ``draft(S) = draft(S0) · S / S0`` (each step runs the draft model once; no fixed part);
- ``verify(S) = verify(S0) + b · (S − S0)``: ``b`` from a baseline trace (``decode_step`` verifies 1 token per
  request: the line through (1, baseline step) and (S0 + 1, verify)); without one ``b = 0``;
- ``draft_extend(S) = e0 + e1 · tokens(S)`` (Theil–Sen over the cycles when accept lengths are known);
- acceptance: ``E[k | S] = α + α² + … + α^S``, α solved so that ``E[k | S0]`` is the measured mean;
  ``tokens(S) = batch · (1 + E[k | S])``; tokens/s = tokens(S) / cycle(S).

**Cycle time: a replay** (:class:`Replay`). Each measured cycle is replayed from its first GPU phase to the
next cycle's, with every phase instance's GPU span changed by its phase's cost change (``draft(S) −
draft(S0)``, …) and everything else as the trace recorded it:

- the host runs its key calls (:mod:`analyze.compute.host`: each phase's first launch, every sync-like call) in
  order; the time between two of them is the host's own work and does not change;
- a launch call takes the time it took (a launch that returned after the earlier GPU work ended is slow,
  not blocked: it does not move with the GPU); a sync-like call returns at ``max(start + own time, the GPU
  work it waits for + return latency)``;
- the GPU runs phases in launch order (one queue per rank): a phase starts at ``max(its launch call's
  end + launch latency, the previous phase's end + device gap)``; which term bound it in the trace gives
  that term's value, the other takes its median over the phases where it bound (clipped so that the
  trace is reproduced exactly);
- only the steady-state cycles are replayed (:mod:`analyze.compute.steady_cycles`: warm-up and stalls left out, or
  the user's ``--skip-cycles``/``--window``): windows from a steady cycle's first GPU op to the next steady
  cycle's; predicted cycle = the measured cycle period (:data:`analyze.compute.tokens.DEFINITION`, what
  ``analyze``, ``compare`` and the report print) moved by the mean change of the replayed windows, so that
  the unchanged replay gives exactly that period.

Replaying the trace unchanged reproduces every measured period exactly. On a node-level CUDA-graph trace,
each graph launch call also carries node tracing's cost on the host, which grows with the graph's node
count; unless ``as_traced``, it is estimated (slope of launch time over node count across the trace's graph
launches) and removed from every graph launch before the replay, so that the prediction is for the program,
not for the traced program (the note says how much). ``--timing GRAPH`` fits on a graph-level pass instead.

Validated on real step sweeps of the embedded workload (README: "Reports, comparison and what-if").
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import polars as pl

from ..model import InputError, Result
from . import view
from .tokens import summary
from .whatif_fit import ASSUMED_NOTE, fit, steps_known
from .whatif_model import MAX_STEPS, Model
from .whatif_replay import replay
from .whatif_segments import fit_segments

__all__ = ["with_segments", "fitted", "will_replay", "to_dict", "validate"]



def with_segments(m: Model, res: Result, steps_now: int | None = None, alpha: float | None = None,
                  as_traced: bool = False) -> Model:
    """``m`` (the whole run's model, no baseline) with its per-segment models (:func:`fit_segments`); with several
    batch sizes its note on verify's assumed cost says that the segments measure it."""
    m.segments = fit_segments(res, steps_now, alpha=alpha, as_traced=as_traced)
    if m.segments:
        m.notes = [f"the whole run mixes {len(m.segments)} batch sizes: its verify cost assumed independent of the "
                   "verified tokens (one average); measured per batch size (the per-segment models)"
                   if n == ASSUMED_NOTE else n for n in m.notes]
    return m


def fitted(res: Result, steps_now: int | None = None, alpha: float | None = None, as_traced: bool = False) -> Model:
    """:func:`fit` (no baseline) with its per-segment models (:func:`fit_segments`) and the replays its document
    (:func:`to_dict`) asks for: a table kept with the result (:mod:`analyze.compute.view`), so that a second command
    on the same capture (``whatif``, ``report``, ``analyze``'s findings) reads the model instead of fitting it. One
    object per result and options: callers do not change it."""
    return _fitted(res, steps_now=steps_now, alpha=alpha, as_traced=as_traced)


@view.table(name="whatif_fit", params=("steps_now", "alpha", "as_traced"))
def _fitted(res: Result, steps_now: int | None, alpha: float | None, as_traced: bool) -> Model:
    m = with_segments(fit(res, steps_now, alpha=alpha, as_traced=as_traced), res, steps_now, alpha, as_traced)
    try:
        to_dict(m)  # the replays, kept in the model
    except InputError:
        pass  # (raised again where the document is asked for)
    for r in (m.replay, *(sm.model.replay for sm in m.segments)):
        if r is not None:
            r.let_go()
    return m


def will_replay(res: Result) -> bool:
    """Whether :func:`fitted` (its default options) will build the replay: neither fitted nor kept with the result
    yet, and the draft step count known (what a second thread may build meanwhile)."""
    if view.known(_fitted, res, steps_now=None, alpha=None, as_traced=False):
        return False
    try:
        steps_known(res, None)
    except InputError:
        return False
    return not view.known(replay, res)


def to_dict(m: Model, max_steps: int = MAX_STEPS) -> dict:
    """The JSON document: ``{"predictions": [...], "best": ..., "best_measured": ..., "model": ..., "segments":
    [...]}`` (``best``: over every prediction; ``best_measured``: over those not extrapolated)."""
    best = m.best(max_steps)
    near = m.best(max_steps, measured_only=True)
    return {
        "predictions": [p.as_dict() for p in m.predictions(max_steps)],
        "best": best.steps if best else None,
        "best_measured": near.steps if near else None,
        "model": {
            "steps_now": m.steps_now, "steps_source": m.steps_source, "period_ns": m.period_ns, "cost_ns": m.cost_ns, "other_ns": m.other_ns,
            "verify_per_token_ns": m.verify_per_token_ns, "verify_source": m.verify_source,
            **({"verify_prior": m.verify_prior} if m.verify_prior else {}),
            "extend_per_token_ns": m.extend_per_token_ns,
            "batch_size": m.batch_size, "alpha": m.alpha, "accepted_per_request": m.accepted_now,
            "seams_ns": m.seams(m.steps_now), "launch_cut_per_node_ns": m.launch_cut_ns,
            "launch_cut_from_nodes": m.launch_cut_from,
            "replayed_cycles": m.replay.windows if m.replay is not None else 0,
            "assumptions": m.assumptions(), "notes": m.notes,
        },
        "segments": [sm.as_dict(max_steps) for sm in m.segments],
        **({"probe_effect": m.probe} if m.probe is not None else {}),
    }


def validate(results: dict[int, Result | Sequence[Result]], baseline: Result | None = None,
             as_traced: bool = True) -> pl.DataFrame:
    """Predicted vs measured cycle time: a model from each trace (steps → analysed Result, or a list of repeated
    runs' Results) predicts every step count.

    Measured at ``steps`` = the median over its runs of each run's cycle period (one run: that run's, so a model
    predicts its own period exactly); ``runs``/``measured_spread_pct`` say over how many runs and how far apart
    they were ((max − min) / median), i.e. how much of an error is run-to-run noise. ``from_run`` numbers the
    runs of ``from_steps`` in the order given. ``as_traced`` (default): models keep the traces' own probe
    effect, so that like is compared with like."""
    runs = {s: [r] if isinstance(r, Result) else list(r) for s, r in results.items()}
    models = {s: [fit(r, s, baseline=baseline, as_traced=as_traced) for r in rs] for s, rs in runs.items()}
    measured = {}
    for s, rs in runs.items():
        periods = [m.period_ns for m in models[s]]  # the trace's own period, whatever the fit's options
        toks = [t for t in (summary(r, steps=s).tokens_per_cycle for r in rs) if t is not None]
        med = float(np.median(periods))
        measured[s] = (med, float(np.median(toks)) if toks else None, len(rs),
                       100 * (max(periods) - min(periods)) / med)
    rows = []
    for s0, ms in models.items():
        for i, m in enumerate(ms):
            for s, (meas, tok, n, spread) in measured.items():
                p = m.predict(s)
                pred, ptok = p.cycle_ns, p.tokens_per_cycle
                rows.append({"from_steps": s0, "from_run": i, "steps": s, "predicted_ns": pred, "measured_ns": meas,
                             "error_pct": 100 * (pred - meas) / meas, "runs": n, "measured_spread_pct": spread,
                             "predicted_tokens": ptok, "measured_tokens": tok,
                             "tokens_error_pct": 100 * (ptok - tok) / tok if ptok is not None and tok else None})
    return pl.DataFrame(rows).sort("from_steps", "from_run", "steps")
