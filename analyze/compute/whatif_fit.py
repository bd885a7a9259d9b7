"""The what-if's cost model fitted on one analysed trace (:func:`fit`; the method: :mod:`analyze.compute.whatif`).

Each phase's cost per cycle from the steady cycles' GPU spans, the acceptance α from the measured accept
lengths (:func:`solve_alpha`), verify's cost per extra verified token (a baseline, a prior from its GPU metrics,
or assumed 0), draft_extend's per token (Theil–Sen, :func:`_theil_sen`), the draft step count the trace ran
(:func:`steps_known`), node-level tracing's launch cost (:func:`_graph_launch_cost`), and the replay
(:mod:`analyze.compute.whatif_replay`).
"""

from __future__ import annotations

import numpy as np
import polars as pl

from nvtx_hooks.capture.bounds import STEPS_MAX, whole

from ..model import InputError, Result
from ..read.manifest import speculative
from . import acceptance, view
from .cycles import cycles, draft_repeats
from .payload import base_expr
from .scalars import real_or_none, to_float
from .tokens import summary
from .whatif_model import Model
from .whatif_replay import MODEL_PHASES, replay

__all__ = ["ASSUMED_NOTE", "fit", "phase_spans", "solve_alpha", "steps_known"]

ASSUMED_NOTE = "no baseline: verify cost assumed independent of the number of verified tokens"


def _cycle_phases(res: Result) -> pl.DataFrame:
    """Per rank and cycle (``n``): each child phase's GPU span (``x_span_ns``) by base name, one row each."""
    c = cycles(res).filter((pl.col("kind") == "cycle") & pl.col("steady")).select(
        "rank", "n", parent="range_id", tokens="tokens", accept_length="accept_length", batch_size="batch_size")
    kids = phase_spans(res)
    # on the rank too: range ids are unique per report only, and a merged result has several
    return (c.join(kids, on=["rank", "parent"])
            .group_by("rank", "n", "phase").agg(pl.col("x_span_ns").sum(), pl.col("tokens").first(),
                                                pl.col("accept_length").first(), pl.col("batch_size").first()))


@view.table(kept=False, any_choice=True)
def phase_spans(res: Result) -> pl.DataFrame:
    """The phases with GPU work (``rank, parent, x_span_ns, x_ops, phase``: by base name), whatever the cycle
    choice: made once for every batch size's view."""
    return (res.instances.select("rank", "parent", "range", "x_span_ns", "x_ops")
            .filter(pl.col("x_ops") > 0).with_columns(phase=base_expr()).drop("range"))


def fit(res: Result, steps_now: int | None = None, baseline: Result | None = None, alpha: float | None = None,
        as_traced: bool = False, period_ns: float | None = None, steps_how: str | None = None) -> Model:
    """Fit the cost model on one analysed trace (``baseline``: an analysed decode_step trace, optional).

    ``as_traced``: predict the traced program (node tracing's graph launch cost kept); by default it is
    removed on a node-level trace. ``period_ns``: the measured period the predictions move from (default: the
    trace's cycle period). ``steps_how``: how ``steps_now`` is known when the caller knows it (a segment's own
    count, 0 included: verify only); else :func:`steps_known`.
    """
    if steps_how is not None and steps_now is not None:
        s0, how = steps_now, steps_how
    else:
        s0, how = steps_known(res, steps_now)
    cp = _cycle_phases(res)
    if cp.height == 0:
        raise InputError(f"{res.trace.path}: no cycle ranges with draft/verify phases inside; what-if needs "
                         "an EAGLE trace (cycle ⊃ draft, verify, draft_extend)", "NO_CYCLES")
    per = (cp.filter(pl.col("phase").is_in(MODEL_PHASES))
           .group_by("n", "phase").agg(pl.col("x_span_ns").min(), pl.col("tokens").first()))
    cost = {k: float(v) for k, v in per.group_by("phase").agg(pl.col("x_span_ns").median()).sort("phase").iter_rows()}
    if "verify" not in cost:
        raise InputError(f"{res.trace.path}: no verify phase inside the cycles", "NO_VERIFY")
    tk = summary(res, steps=s0)
    period = (tk.period_ns if period_ns is None else period_ns) if tk.kind == "cycle" else None
    if period is None:
        raise InputError(f"{res.trace.path}: fewer than two cycles per rank; no cycle period", "NO_PERIOD")
    notes = []
    b = 0.0
    source = "assumed"
    prior = None
    if baseline is not None:
        bt = summary(baseline)
        step = real_or_none(cycles(baseline).filter((pl.col("kind") == "decode_step") & pl.col("steady"))
                            .group_by("n").agg(pl.col("i_span_ns").min())["i_span_ns"].median())
        if step is None:
            notes.append(f"{baseline.trace.path} has no decode_step ranges: not used for the verify slope")
        else:
            source = "baseline"
            b = (cost["verify"] - step) / s0
            if b < 0:
                notes.append(f"the baseline step ({step / 1e3:.1f} µs) is slower than verify: slope clipped to 0")
                b = 0.0
            notes.append(f"verify cost per verified token per request from the baseline step ({step / 1e3:.1f} µs, "
                         f"batch {bt.batch_size}): {b / 1e3:.2f} µs")
    else:
        prior = _verify_prior(res)
        if prior is None:
            notes.append(ASSUMED_NOTE)
        else:
            source = "gpu_metrics"
            b = cost["verify"] * prior["tensor_active_pct"] / 100 / (s0 + 1)
            notes.append(f"no baseline: verify cost per verified token per request from verify's measured bound "
                         f"({prior['bound']}-bound, tensor cores {prior['tensor_active_pct']:.0f} % active, DRAM "
                         f"read {prior['dram_read_pct']:.0f} %): {b / 1e3:.2f} µs (a prior, docs/gpu-metrics.md)")
    e1 = 0.0
    ext = per.filter((pl.col("phase") == "draft_extend") & pl.col("tokens").is_not_null())
    if ext.height >= 3 and ext["tokens"].n_unique() > 1:
        e1 = _theil_sen(ext.select(x="tokens", y="x_span_ns"))
    if tk.accepted_per_request is not None:
        where = "the hooks' accept marks" if tk.acceptance_source == "marks" else "the range payload"
        notes.append(f"acceptance measured on {tk.accepted_cycles} cycles ({where}): mean {tk.accepted_per_request:.2f}, "
                     f"p50 {tk.accepted_p50:g}, p90 {tk.accepted_p90:g} accepted "
                     "draft tokens per request")
    alpha_given = alpha is not None
    rates = None if alpha_given else acceptance.rates(res)
    if alpha is None and tk.accepted_per_request is not None and s0 >= 1:
        alpha = solve_alpha(tk.accepted_per_request, s0)
    elif alpha is None and rates is not None:
        alpha = rates.rates[0]
    elif alpha is None:
        notes.append("acceptance unknown (no accept-length payload): cycle times only; --acceptance sets it")
    if rates is not None:
        notes.append(f"acceptance per draft position measured ({acceptance.SOURCE}, every cycle of the run: "
                     f"{rates.text()}); expected accepted drafts at S steps = Σ over positions j ≤ S of the product "
                     f"of the rates up to j; beyond position {len(rates.rates)} MODELLED: each further position "
                     f"accepted at the last measured rate, {rates.rates[-1]:.3f}")
    batch = tk.batch_size
    if alpha is not None and batch is None:
        batch = 1.0
        notes.append("batch size unknown: tokens and tokens/s are per request")
    rp = replay(res)
    mode = res.trace.graph_trace_mode
    cut = (0.0, 0)
    if mode == "Node" and not as_traced:
        lc = _graph_launch_cost(res)
        if lc is None:
            notes.append("node-level graph trace with one graph size only: node tracing's launch cost cannot be "
                         "estimated; replayed as traced")
        else:
            cut = lc
    if rp.windows == 0:
        notes.append("no cycle could be replayed (no key host calls: an older result?): phase cost changes are "
                     "added to the measured period")
    m = Model(s0, float(period), cost, 0.0, b, e1, batch, alpha, tk.accepted_per_request, notes, rp, *cut, mode,
              verify_source=source, verify_prior=prior if source == "gpu_metrics" else None, steps_source=how,
              alpha_given=alpha_given, accept_rates=tuple(rates.rates) if rates is not None else None)
    m.other_ns = m.predict(s0).other_ns
    if cut[0]:
        now = m.cycle(s0)
        notes.append(f"node tracing's graph launch cost removed ({cut[0] / 1e3:.2f} µs per node beyond {cut[1]}): "
                     f"the model's cycle at "
                     f"{s0} steps is {now / 1e3:.1f} µs against {period / 1e3:.1f} µs traced "
                     f"({100 * (now / period - 1):+.1f} %)")
    return m


def _verify_prior(res: Result) -> dict | None:
    """Verify's utilisation over the steady state of ``res`` (all ranks; :mod:`analyze.compute.utilisation`) when
    GPU-metrics samples measure it: ``bound, dram_read_pct, tensor_active_pct, samples``; else None.

    The prior for verify's cost per extra verified token when nothing measures it: the share of verify's time its
    tensor cores are active grows with the tokens it verifies, the rest (reading the weights, memory-bound at small
    batch) does not: ``b = verify × tensor_active / (steps + 1)`` per extra token per request. Memory-bound verify
    (tensor cores a few % active) gives almost 0, as the old assumption; compute-bound verify nearly its full
    per-token weight."""
    from . import utilisation

    u = utilisation.phases(res)
    if u.height == 0:
        return None
    row = u.filter(pl.col("rank").is_null() & (pl.col("scope") == "steady") & (pl.col("phase") == "verify")
                   & (pl.col("instances") > 0) & pl.col("tensor_active_pct").is_not_null())
    if row.height == 0:
        return None
    r = row.row(0, named=True)
    return {k: r[k] for k in ("bound", "dram_read_pct", "tensor_active_pct", "samples")}


def _graph_launch_cost(res: Result) -> tuple[float, int] | None:
    """Node tracing's host cost per node of a graph launch and the smallest graph (nodes) of the trace: the
    slope of the median launch time of each node count (Theil–Sen over node counts), or None with fewer
    than two counts. Launches of that smallest graph are the reference: a larger graph's launch is assumed
    to cost the same but for node tracing's cost per extra node."""
    calls = res.host_calls
    if calls is None or calls.height == 0:
        return None
    g = (calls.filter(pl.col("graph") & (pl.col("ops") > 0))
         .group_by("ops").agg(y=(pl.col("end") - pl.col("start")).median()).select(x="ops", y="y").sort("x"))
    if g.height < 2:
        return None
    return max(_theil_sen(g.cast({"x": pl.Float64})), 0.0), int(g["x"][0])


def steps_known(res: Result, steps_now: int | None) -> tuple[int, str]:
    """The trace's draft step count and how it is known: the caller's, else the manifest's, else inferred from the
    draft phase's repeated structure (:func:`_draft_repeats`); InputError when none of them knows it."""
    if steps_now is not None:
        if not (whole(steps_now) and 1 <= steps_now <= STEPS_MAX):
            raise InputError(f"--steps-now (steps_now) must be an integer from 1 to {STEPS_MAX}, not {steps_now!r}",
                             "BAD_OPTION")
        return steps_now, "given"
    spec = speculative(res.trace.path)
    if isinstance(spec.get("steps"), int) and spec["steps"] >= 1 and not spec.get("baseline"):
        return spec["steps"], "the manifest's speculative.steps"
    known = _cycle_steps(res)
    if known is not None:
        return known
    rep = _draft_repeats(res)
    if rep is not None:
        n, names, inst = rep
        return n, (f"inferred: the draft phase's GPU work repeats {n} times per instance "
                   f"({names} kernel names each run a multiple of {n} times in most of {inst} instances); "
                   "--steps-now N if that is wrong")
    raise InputError(f"{res.trace.path}: the number of draft steps is not recorded (no manifest with "
                     "speculative.steps beside it) and cannot be inferred (no draft phase whose kernels repeat: 1 step, "
                     "or a draft that is not a loop); "
                     "pass --steps-now N (Python: steps_now=N; the notebooks: SPECTRACE_STEPS=N)", "NO_STEPS")


def _cycle_steps(res: Result) -> tuple[int, str] | None:
    """The steps the steady cycles ran with when each cycle's is known (:mod:`analyze.compute.cycles`: the payload,
    or 0 without a draft range, or the draft's repeats per batch size): one count, or for an adaptive run (several)
    the most common one of at least 1 step, said to be the whole run's average; None when some are unknown or every
    cycle is verify only."""
    c = cycles(res).filter((pl.col("kind") == "cycle") & pl.col("steady"))
    if c.height == 0 or c["steps"].null_count():
        return None
    counts = (c.filter(pl.col("steps") >= 1).group_by("steps").agg(n=pl.len(), src=pl.col("steps_source").min())
              .sort(["n", "steps"], descending=[True, False]))
    if counts.height == 0:
        return None
    s, src = int(counts["steps"][0]), str(counts["src"][0])
    how = "the cycles' payload" if src == "payload" else f"inferred per segment ({src})"
    every = sorted(c["steps"].unique().to_list())
    if len(every) == 1:
        return (s, how) if src == "payload" else None  # (inferred: the whole trace's repeats say how)
    return s, (f"an adaptive run: its cycles ran {', '.join(map(str, every))} steps ({how}); the whole run is "
               f"modelled from its most common count, {s} (an average, right for no segment: the per-batch-size "
               "table models each segment from its own)")


def _draft_repeats(res: Result) -> tuple[int, int, int] | None:
    """How many times the draft phase's GPU work repeats per instance, over every draft instance of the trace
    (:func:`analyze.compute.cycles.draft_repeats`)."""
    inst = res.instances.select("range_id", "range").filter(base_expr("range") == "draft").select("range_id")
    if inst.height == 0 or res.kernels is None or res.kernels.height == 0:
        return None
    return draft_repeats(res.kernels, inst["range_id"])


def solve_alpha(accepted: float, steps: int) -> float:
    """α in [0, 1] with α + α² + … + α^steps = accepted (bisection; clipped to the reachable range)."""
    if accepted <= 0:
        return 0.0
    if accepted >= steps:
        return 1.0
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        if sum(mid ** i for i in range(1, steps + 1)) < accepted:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


_SLOPES_AT_ONCE = 1 << 22  # Theil–Sen: pairwise slopes computed at a time (32 MB of float64)


def _slope_blocks(x: np.ndarray, y: np.ndarray):
    """The slopes ``(y_j - y_i) / (x_j - x_i)`` of the pairs ``i < j`` with ``x_i != x_j``, a block of rows ``i`` at a
    time (at most about ``_SLOPES_AT_ONCE`` pairs each), as float64 arrays."""
    n = len(x)
    rows = max(1, _SLOPES_AT_ONCE // max(n, 1))
    j = np.arange(n)
    for i0 in range(0, n, rows):
        i = np.arange(i0, min(i0 + rows, n))[:, None]
        keep = (j[None, :] > i) & (x[None, :] != x[i])
        if x.dtype.kind == "f":  # NaN equals NaN, as in polars' comparison
            keep &= ~(np.isnan(x)[None, :] & np.isnan(x[i]))
        ii, jj = np.broadcast_to(i, keep.shape)[keep], np.broadcast_to(j, keep.shape)[keep]
        yield (y[jj] - y[ii]) / (x[jj] - x[ii])


def _theil_sen(xy: pl.DataFrame) -> float:
    """Median of the pairwise slopes of ``x, y`` (robust to warm-up and stall outliers).

    Exact, in memory bounded by ``_SLOPES_AT_ONCE`` whatever the rows (a cross join of 6,000 rows took 1.7 GB): the
    slopes are counted once to find the median's ranks, narrowed to a bracket from a sample of them, and the
    values there selected; the median of the middle two as polars takes it."""
    xy = xy.drop_nulls(["x", "y"])  # a pair with a null has a null slope, which the median leaves out
    x, y = xy["x"].to_numpy(), xy["y"].to_numpy()
    n = len(x)
    # the pairs with two x values: all pairs but those within a group of equal x (the NaNs one group, as above)
    same = np.unique(x, return_counts=True, equal_nan=True)[1]
    total = n * (n - 1) // 2 - int((same * (same - 1) // 2).sum())
    if total == 0:
        return 0.0
    ranks = ((total - 1) // 2, total // 2)  # the middle one or two, 0-based
    step = max(1, total // _SLOPES_AT_ONCE)
    sample = np.sort(np.concatenate([b[::step] for b in _slope_blocks(x, y)]))
    if step == 1 and not np.isnan(sample[ranks[1]]):  # the sample is every slope (NaN sorted last, as polars does)
        return to_float(pl.Series(sample[list(ranks)]).median()) or 0.0
    margin = 4 * int(np.sqrt(len(sample))) + 2
    at = [r * len(sample) // total for r in ranks]
    lo, hi = sample[max(at[0] - margin, 0)], sample[min(at[1] + margin, len(sample) - 1)]
    for bracket in ((lo, hi), (-np.inf, np.inf)):  # the second only if the sample's bracket missed the middle
        below, kept = 0, []
        for b in _slope_blocks(x, y):
            below += int(np.count_nonzero(b < bracket[0]))
            kept.append(b[(b >= bracket[0]) & (b <= bracket[1])])
        inside = np.concatenate(kept)
        if below <= ranks[0] and ranks[1] < below + len(inside):
            inside.sort()
            mid = inside[[r - below for r in ranks]]
            return to_float(pl.Series(mid).median()) or 0.0
    # NaN slopes (a NaN in x or y) are in no range: polars' own median of the cross join, which sorts them last
    p = xy.with_row_index("i").join(xy.with_row_index("j"), how="cross", suffix="2")
    p = p.filter((pl.col("i") < pl.col("j")) & (pl.col("x") != pl.col("x2")))
    return float(p.select(((pl.col("y2") - pl.col("y")) / (pl.col("x2") - pl.col("x"))).median()).item() or 0.0)
