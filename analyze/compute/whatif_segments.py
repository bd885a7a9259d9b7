"""The what-if per batch size: one model per segment of cycles of one decode batch size (:func:`fit_segments`),
joined with the same batch size's models of runs at other step counts (:func:`join_runs`), calibrated on a log of
the workload without a profiler (:func:`calibrate`).
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import polars as pl

from ..model import InputError, Result
from . import view
from .cycles import cycles
from .scalars import to_float
from .tokens import summary
from .whatif_fit import fit, solve_alpha, steps_known
from .whatif_model import Model, SegmentModel, interpolate

__all__ = ["fit_segments", "run_alpha", "join_runs", "MIN_LOG_LINES", "calibrate"]

_MIN_SEGMENT_CYCLES = 5  # a segment's own model needs this many typical steady cycles
_OWN_ALPHA_CYCLES = 100  # ... and this many to use its own acceptance rather than the whole run's


def fit_segments(res: Result, steps_now: int | None = None, alpha: float | None = None,
                 as_traced: bool = False) -> list[SegmentModel]:
    """One model per batch size of the trace (:func:`analyze.compute.anatomy.segments`: the cycles of one decode
    batch size and step count; a segment visited several times, as a serving run does, is one model over all its
    visits). Each (batch size, steps) is fitted on its own steady cycles **at its own step count** (the cycles'
    payload, 0 included: verify only; else inferred; else ``steps_now``/the trace's) and moves from its typical
    period (the p50 of its cycles in no class of slower ones: a prefill or the first cycles after a batch change are
    not what the next cycle at another step count would take). A batch size measured at several step counts (an
    adaptive run) keeps each as a measured point: its :class:`SegmentModel` predicts each step count from the one
    measured nearest (``others``). Verify's cost per extra verified token is *measured* across segments: their
    verify times at their verified tokens per cycle (batch × (steps + 1)) make a curve, interpolated for each
    segment's other step counts (extrapolated beyond its ends; said): 0 steps is verify over the batch's own tokens.
    A 0-step segment measured no draft: its draft time per step is interpolated in the batch size between the
    other segments' (said). None when the trace has one segment only (the whole-trace model is its model)."""
    import dataclasses

    from . import anatomy

    visits: dict[str, list[anatomy.Segment]] = {}
    for g in anatomy.segments(res):
        visits.setdefault(g.key, []).append(g)
    groups = [v for v in visits.values() if sum(g.cycles for g in v) >= _MIN_SEGMENT_CYCLES]
    if len(groups) < 2:
        return []
    c = cycles(res)
    fallback: tuple[int, str] | None = None
    # acceptance: the segment's own when it has enough cycles to measure it, else the whole run's (one draft
    # model, one data set: a few dozen cycles measure α to ± 0.1, which moves the best step count); the measured
    # rates per draft position, when the marks give them, are the run's in every model (fit) and take α's place
    try:
        pooled = alpha if alpha is not None else run_alpha(res, steps_known(res, steps_now)[0])
    except InputError:
        pooled = None  # (a segment whose steps are unknown refuses below, as the whole run did)
    fits: list[tuple[anatomy.Segment, list[int], int, float, Model]] = []
    for group in sorted(groups, key=lambda v: (v[0].batch_size is None, v[0].batch_size or 0,
                                               -1 if v[0].steps is None else v[0].steps, v[0].segment)):
        g, ids = group[0], [x.segment for x in group]
        if g.steps is not None:
            steps, how = g.steps, f"this segment's cycles ({g.steps_source or 'payload'})"
        else:
            if fallback is None:
                fallback = steps_known(res, steps_now)
            steps, how = fallback
        one = dataclasses.replace(res.cycle_choice, segment=tuple(ids) if len(ids) > 1 else g.segment)
        typ = c.filter(pl.col("steady") & pl.col("segment").is_in(ids) & pl.col("cycle_class").is_null()
                       & ~pl.col("slow") & pl.col("period_ns").is_not_null())
        if typ.height < _MIN_SEGMENT_CYCLES:
            continue
        period = to_float(typ["period_ns"].median())
        own = alpha is None and steps >= 1 and typ.select("key").unique().height >= _OWN_ALPHA_CYCLES
        try:
            m = fit(view.with_choice(res, one), steps, alpha=None if own else pooled, as_traced=as_traced,
                    period_ns=period, steps_how=how)
        except InputError:
            continue
        m.notes.append("acceptance α measured on this segment's own cycles" if own else
                       f"acceptance α of the whole run (this segment has fewer than {_OWN_ALPHA_CYCLES} cycles"
                       f"{' or drafts nothing' if steps == 0 else ''})")
        fits.append((g, ids, typ.height, period, m))
    # a 0-step segment's draft time per step: the other segments' (draft ∝ steps), interpolated in the batch size
    per_step = tuple(sorted({float(g.batch_size): m.cost_ns.get("draft", 0.0) / m.steps_now
                             for g, _, _, _, m in fits if g.batch_size and m.steps_now >= 1
                             and m.cost_ns.get("draft")}.items()))
    for g, _, _, _, m in fits:
        if m.steps_now == 0 and per_step and g.batch_size:
            m.draft_per_step_ns = interpolate(per_step, float(g.batch_size))
            m.notes.append(f"0 steps measured (verify only, no draft): draft GPU time per step "
                           f"{m.draft_per_step_ns / 1e3:.1f} µs, interpolated in the batch size between the other "
                           "segments' (" + ", ".join(f"batch {b:g}: {v / 1e3:.1f} µs" for b, v in per_step) + ")")
    # the verify curve: each segment's verify time at the tokens it verifies per cycle
    pts: dict[float, list[float]] = {}
    for g, _, _, _, m in fits:
        if g.batch_size and "verify" in m.cost_ns:
            pts.setdefault(float(g.batch_size * (m.steps_now + 1)), []).append(m.cost_ns["verify"])
    if len(pts) >= 2:
        curve = tuple(sorted((t, float(np.median(v))) for t, v in pts.items()))
        for _, _, _, _, m in fits:
            m.verify_points, m.verify_source = curve, "segments"
            m._runs.clear()
            m.other_ns = m.predict(m.steps_now).other_ns
    # one SegmentModel per batch size: its most-measured step count first, the others as measured points
    out: list[SegmentModel] = []
    by_batch: dict[object, list[tuple[anatomy.Segment, list[int], int, float, Model]]] = {}
    for f in fits:
        by_batch.setdefault(f[0].batch_size if f[0].batch_size is not None else f[0].key, []).append(f)
    for fs in by_batch.values():
        g, _, n, period, m = max(fs, key=lambda f: (f[2], f[4].steps_now))
        key = f"batch {g.batch_size}" if g.batch_size is not None else g.key
        sm = SegmentModel(g.segment, key, g.batch_size, n, g.first_cycle, period, m,
                          others=tuple(f[4] for f in fs if f[4] is not m))
        out.append(sm)
    return out


def run_alpha(res: Result, steps: int) -> float | None:
    """The whole run's per-token acceptance α (from its accepted tokens per request per cycle), None unknown."""
    tk = summary(res, steps=steps)
    return solve_alpha(tk.accepted_per_request, steps) if tk.accepted_per_request is not None else None


def join_runs(segments: list[SegmentModel], runs: Iterable[tuple[str, Result]], alpha: float | None,
              as_traced: bool = False) -> list[str]:
    """Join each segment with the same batch size's models from runs of the same workload at other step counts
    (``runs``: each run's name and analysed Result; ``whatif --other-steps``), fitted with ``alpha``, this run's
    acceptance; notes on what was not joined. InputError when a run's step count is neither recorded nor
    inferable."""
    notes, unused = [], []  # the runs' own notes first, then the batch sizes not joined
    by_batch = {sm.batch_size: sm for sm in segments if sm.batch_size}
    for name, ro in runs:
        try:
            steps, how = steps_known(ro, None)
        except InputError as e:
            raise InputError(f"--other-steps {name}: the number of draft steps is not recorded (no manifest "
                             "with speculative.steps beside it) and cannot be inferred", e.code) from None
        if how.startswith("inferred"):
            notes.append(f"{name}: {steps} draft steps, {how}")
        segs = fit_segments(ro, steps, alpha=alpha, as_traced=as_traced)
        if not segs:
            notes.append(f"{name}: fewer than two batch sizes with enough cycles: not used")
        for o in segs:
            if o.batch_size in by_batch:
                by_batch[o.batch_size].others += (o.model,)
        left = sorted(b for b in {o.batch_size for o in segs} - set(by_batch) if b is not None)
        if left:
            unused.append(f"{name}: batch sizes {', '.join(map(str, left))} are not in the main run: not used")
    return notes + unused


MIN_LOG_LINES = 3  # decode log lines a batch size needs to be calibrated: one may hold a batch change's slow cycles


def calibrate(m: Model, periods: pl.DataFrame, source: str) -> list[str]:
    """Calibrate the predictions on a log of the same workload without a profiler at the measured step count
    (``periods``: :func:`analyze.read.server_log.decode_periods`, per batch size ``period_ns``): each segment's
    excess over it at the measured steps — per cycle, on the host (the profiler's cost and the run's own
    variation, docs/whatif-per-batch.md) — is taken off every predicted period of that batch size, the joined
    runs' too. Without segments, the whole run's model when the log has its batch size. A batch size needs
    :data:`MIN_LOG_LINES` lines (a line's interval may hold the slower cycles after a batch change: with two lines
    per batch size, H200 logs were up to 18 % off the runs' typical period). Notes on what was and was not
    calibrated."""
    enough = periods.filter(pl.col("lines") >= MIN_LOG_LINES)
    by_batch = dict(zip(enough["batch_size"].to_list(), enough["period_ns"].to_list()))

    def excess(model: Model, unprofiled_ns: float) -> float:  # the capture's period at its steps over the log's
        return model.cycle(model.steps_now) - unprofiled_ns

    if not m.segments:
        bs = round(m.batch_size) if m.batch_size is not None else None
        if bs not in by_batch:
            return [f"--unprofiled-log {source}: fewer than {MIN_LOG_LINES} decode lines at this run's batch size "
                    f"({bs}): not calibrated"]
        m.calibration_ns = excess(m, by_batch[bs])
        return [f"calibrated on {source}: {m.cycle(m.steps_now) / 1e3:,.1f} µs per cycle in the capture, "
                f"{by_batch[bs] / 1e3:,.1f} µs without the profiler: {m.calibration_ns / 1e3:+,.1f} µs taken off "
                "every predicted period"]
    segs = [sm for sm in m.segments if sm.batch_size in by_batch]
    offsets = []
    for sm in segs:
        sm.unprofiled_ns = by_batch[sm.batch_size]
        off = excess(sm.model, sm.unprofiled_ns)
        offsets.append(f"{sm.batch_size} {off / 1e3:+,.1f} µs")
        for o in (sm.model, *sm.others):
            o.calibration_ns = off
    notes = []
    if segs:
        notes.append(f"calibrated on {source} (the periods without a profiler at {m.steps_now} steps): per batch size "
                     "the capture's excess per cycle taken off every predicted period: " + ", ".join(offsets)
                     + "; the whole-run table above is not calibrated")
    left = [str(sm.batch_size) for sm in m.segments if sm not in segs]
    if left:
        notes.append(f"--unprofiled-log {source}: fewer than {MIN_LOG_LINES} decode lines at batch size "
                     f"{', '.join(left)}: not calibrated")
    return notes
