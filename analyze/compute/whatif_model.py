"""The what-if's fitted model and its predictions: :class:`Model` (one trace, or one batch size's cycles of it) and
:class:`SegmentModel` (one batch size, with the models of other runs at other step counts), each predicting the
cycle period, tokens per cycle and tokens/s at any draft step count (:class:`Prediction`; how they are fitted:
:mod:`analyze.compute.whatif_fit`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field, fields

import numpy as np

from ..read import results
from .whatif_replay import Replay

__all__ = ["MAX_STEPS", "NEAR_BEST", "Prediction", "Model", "SegmentModel", "interpolate"]

MAX_STEPS = 10


@dataclass(frozen=True)
class Prediction:
    """The what-if at ``steps`` draft steps: the cycle period and its parts (ns per cycle: draft, verify and
    draft_extend GPU time, the seams inside the cycle, the rest), tokens per cycle and tokens/s (None when the
    acceptance is unknown); ``measured``: the step count the trace ran; ``extrapolated``: beyond what was measured
    (:meth:`Model.extrapolated`); ``from_steps``: the run a batch size's prediction comes from
    (:meth:`SegmentModel.predict`; None for a model's own)."""

    steps: int
    cycle_ns: float
    draft_ns: float
    verify_ns: float
    draft_extend_ns: float
    seams_ns: float
    other_ns: float
    tokens_per_cycle: float | None
    tokens_per_s: float | None
    measured: bool
    extrapolated: bool
    from_steps: int | None = None

    def as_dict(self) -> dict:
        """As the JSON has it (``from_steps`` only for a batch size's)."""
        return {f.name: getattr(self, f.name) for f in fields(self)
                if f.name != "from_steps" or self.from_steps is not None}


# ---- the model ----------------------------------------------------------------------------------------


@results.cacheable
@dataclass
class Model:
    """The fitted costs (ns per cycle), acceptance and replay of one trace."""

    steps_now: int
    period_ns: float  # measured: the cycle period (tokens.DEFINITION: mean over the steady cycles)
    cost_ns: dict[str, float]  # phase → min-over-ranks span per cycle, median over cycles
    other_ns: float
    verify_per_token_ns: float  # b: per verified token per request
    extend_per_token_ns: float  # e1
    batch_size: float | None
    alpha: float | None  # per-token acceptance; None = unknown
    accepted_now: float | None  # accepted draft tokens per request per cycle, measured
    notes: list[str] = field(default_factory=list)
    replay: Replay | None = None
    launch_cut_ns: float = 0.0  # per graph node beyond the smallest graph's, taken off each graph launch
    launch_cut_from: int = 0  # that smallest graph's node count
    graph_mode: str | None = None
    probe: dict | None = None  # fitted on the graph-level pass of a pair: the probe effect (analyze.compute.probe)
    # verify's GPU time as a function of the tokens it verifies per cycle, measured at these points (segments of
    # other batch sizes): (tokens, ns), sorted; None: the linear ``verify_per_token_ns`` (baseline, or assumed)
    verify_points: tuple[tuple[float, float], ...] | None = None
    # "baseline", "segments" (the points above), "gpu_metrics" (a prior from verify's measured bound:
    # :func:`_verify_prior`) or "assumed" (0 per token)
    verify_source: str = "assumed"
    verify_prior: dict | None = None  # with "gpu_metrics": verify's utilisation row the prior was taken from
    steps_source: str = "given"  # how steps_now is known (_steps_known): given, the manifest's, or inferred
    alpha_given: bool = False  # alpha is the caller's (--acceptance), not measured
    segments: list[SegmentModel] = field(default_factory=list)  # one per batch size (fit_segments), when several
    # the capture's excess over the run without a profiler at steps_now (whatif --unprofiled-log: calibrate), per
    # cycle: taken off every predicted period (None: not calibrated)
    calibration_ns: float | None = None
    # Replay.run per (phase deltas, launch cut), reduced to what predict, cycle and seams ask of it (the windows'
    # mean change of period, each seam's median, the within-cycle seams' median): not its per-window arrays
    _runs: dict[tuple, tuple[float, dict[str, float], float]] = field(default_factory=dict, repr=False, compare=False)
    # the run's conditional acceptance per draft position (analyze.compute.acceptance.PositionRates), when its
    # accept_histogram marks measure it: used in place of the geometric α (beyond the last one: that rate repeated)
    accept_rates: tuple[float, ...] | None = None
    # draft GPU time per step when it is not this model's own draft cost / steps_now: a 0-step segment's (no
    # draft measured), borrowed from the segments of other batch sizes (whatif_segments.fit_segments)
    draft_per_step_ns: float | None = None

    @property
    def _cut(self) -> tuple[float, int]:
        return self.launch_cut_ns, self.launch_cut_from

    def deltas(self, steps: int) -> dict[str, float]:
        """Change of each model phase's GPU span per cycle from ``steps_now`` to ``steps``."""
        out = {"draft": self.draft(steps) - self.draft(self.steps_now),
               "verify": self.verify(steps) - self.verify(self.steps_now), "draft_extend": 0.0}
        tok, tok0 = self.tokens_per_cycle(steps), self.tokens_per_cycle(self.steps_now)
        if tok is not None and tok0 is not None:
            out["draft_extend"] = self.extend_per_token_ns * (tok - tok0)
        return out

    def draft(self, steps: int) -> float:
        if self.draft_per_step_ns is not None:
            return self.draft_per_step_ns * steps
        return self.cost_ns.get("draft", 0.0) * steps / self.steps_now if self.steps_now else 0.0

    def verify(self, steps: int) -> float:
        if self.verify_points and self.batch_size:
            b = self.batch_size
            return self.cost_ns.get("verify", 0.0) + interpolate(self.verify_points, b * (steps + 1)) - interpolate(
                self.verify_points, b * (self.steps_now + 1))
        return self.cost_ns.get("verify", 0.0) + self.verify_per_token_ns * (steps - self.steps_now)

    def extrapolated(self, steps: int) -> bool:
        """Whether the prediction at ``steps`` leaves what was measured: more than one step from the trace's own
        step count, any draft from a trace that ran 0 steps (its draft, draft_extend and their host work were not
        measured at this batch size: on a held-out capture, batch 16 at 0 steps, 1-3 steps came out 5-13 % short),
        or verified tokens outside the measured points of the verify curve."""
        if abs(steps - self.steps_now) > 1 or self.steps_now == 0 and steps > 0:
            return True
        if self.verify_points and self.batch_size:
            t = self.batch_size * (steps + 1)
            return not self.verify_points[0][0] <= t <= self.verify_points[-1][0]
        return False

    def expected_accepted(self, steps: int) -> float | None:
        """Expected accepted draft tokens per request at ``steps``: from the measured rates per draft position
        when known (beyond the last measured position, its rate repeated), else ``α + α² + … + α^steps``."""
        if self.accept_rates and not self.alpha_given:
            total, reach = 0.0, 1.0
            for j in range(steps):
                reach *= self.accept_rates[min(j, len(self.accept_rates) - 1)]
                total += reach
            return total
        if self.alpha is None:
            return None
        a = self.alpha
        return sum(a ** i for i in range(1, steps + 1))

    def tokens_per_cycle(self, steps: int) -> float | None:
        k = self.expected_accepted(steps)
        return None if k is None or self.batch_size is None else self.batch_size * (1 + k)

    def _replayed(self, steps: int) -> tuple[float, dict[str, float], float]:
        """:meth:`Replay.run` at ``steps`` reduced (kept: predict, cycle and seams ask for the same replay): the
        replayed windows' mean change of period, each seam's median GPU idle, the median of the seams' sum."""
        key = (tuple(sorted(self.deltas(steps).items())), self._cut)
        if key not in self._runs:
            r = self.replay
            if r is None:
                raise ValueError("a Model without its Replay cannot predict (fit builds both)")
            period, seams, gap = r.run(dict(key[0]), self._cut)
            flat = gap.reshape(-1)
            self._runs[key] = (float(np.mean(period - r.period)) if r.windows else 0.0,
                               {lab: float(np.median(np.maximum(flat[at], 0.0))) for lab, at in r.seam_slots().items()},
                               float(np.median(seams)) if r.windows else 0.0)
        return self._runs[key]

    def cycle(self, steps: int) -> float:
        """Predicted cycle period: the mean of the replayed steady periods (the measured one without a replay)."""
        if self.replay is None or self.replay.windows == 0:
            return self.period_ns + sum(self.deltas(steps).values())
        # The replayed windows' mean change, on the measured period (a window runs from one cycle's first GPU
        # op to the next's; the period, tokens.DEFINITION, from the previous cycle's last op to its own).
        return self.period_ns + self._replayed(steps)[0]

    def seams(self, steps: int) -> dict[str, float]:
        """Predicted GPU idle of each seam inside a cycle (median over cycles and ranks)."""
        if self.replay is None or self.replay.windows == 0:
            return {}
        return dict(self._replayed(steps)[1])

    def seams_total(self, steps: int) -> float:
        if self.replay is None or self.replay.windows == 0:
            return 0.0
        return self._replayed(steps)[2]

    def predict(self, steps: int) -> Prediction:
        s0 = self.steps_now
        d, v = self.draft(steps), self.verify(steps)
        e = self.cost_ns.get("draft_extend", 0.0) + self.deltas(steps)["draft_extend"]
        tok = self.tokens_per_cycle(steps)
        cyc = self.cycle(steps) - (self.calibration_ns or 0.0)
        seam = self.seams_total(steps)
        return Prediction(steps=steps, cycle_ns=cyc, draft_ns=d, verify_ns=v, draft_extend_ns=e, seams_ns=seam,
                          other_ns=cyc - d - v - e - seam, tokens_per_cycle=tok,
                          tokens_per_s=tok / cyc * 1e9 if tok is not None and cyc > 0 else None,
                          measured=steps == s0, extrapolated=self.extrapolated(steps))

    def predictions(self, max_steps: int = MAX_STEPS) -> list[Prediction]:
        return [self.predict(s) for s in range(1, max_steps + 1)]

    def best(self, max_steps: int = MAX_STEPS, measured_only: bool = False) -> Prediction | None:
        """The step count with the most tokens/s, or None when acceptance is unknown (``measured_only``: among the
        predictions that are not extrapolated)."""
        return _best(self.predictions(max_steps), measured_only)

    def verify_text(self) -> str:
        """How verify's cost per extra verified token is known: measured (segments, baseline) or assumed."""
        if self.segments and self.verify_source == "assumed":  # the whole run of a trace with several batch sizes
            return (f"the whole run mixes {len(self.segments)} batch sizes: its verify GPU time is ASSUMED "
                    "independent of the verified tokens (one average); per batch size it is measured — each "
                    "segment's verify time at the tokens it verifies per cycle makes a curve (the per-segment models)")
        if self.verify_source == "segments" and self.verify_points:
            pts = ", ".join(f"{t:,.0f} tokens {v / 1e3:,.0f} µs" for t, v in self.verify_points)
            return ("verify GPU time interpolated in the tokens it verifies per cycle, measured on the segments of "
                    f"other batch sizes ({pts}); outside them extrapolated")
        if self.verify_source == "gpu_metrics" and self.verify_prior:
            p = self.verify_prior
            return (f"verify GPU time {self.verify_per_token_ns / 1e3:+.2f} µs per extra verified token per request: "
                    f"a PRIOR from verify's measured hardware bound, not a measured slope — {p['bound']}-bound "
                    f"(DRAM read {p['dram_read_pct']:.0f} % of peak, tensor cores {p['tensor_active_pct']:.0f} % "
                    f"active over {p['samples']:,} GPU-metrics samples); the tensor-active share of verify's time "
                    "taken to grow with the tokens, the rest (weight reads) not; give --baseline, or a trace with "
                    "several batch sizes, to measure it")
        if self.verify_source == "baseline":
            return (f"verify GPU time {self.verify_per_token_ns / 1e3:+.2f} µs per extra verified token per request "
                    "(measured against the baseline's decode step)")
        return ("verify GPU time ASSUMED independent of the verified tokens (+0.00 µs per extra token: decode "
                "memory-bound): not measured; give --baseline, or a trace with several batch sizes")

    def assumptions(self) -> list[str]:
        """What the predictions assume, with this trace's numbers (``whatif --explain``)."""
        r = self.replay
        dflt = (r.defaults if r is not None else {}) | {}
        n = r.windows if r is not None else 0
        rest = len(r.rest) if r is not None else 0
        out = [
            f"draft GPU time ∝ steps: {self.cost_ns.get('draft', 0) / 1e3:.1f} µs at {self.steps_now} steps "
            "(smallest span over ranks per cycle, median over cycles; no fixed part)",
            self.verify_text(),
            f"draft_extend GPU time {self.extend_per_token_ns / 1e3:+.2f} µs per generated token",
            "each cycle is replayed on the trace's own timelines: host calls in their order, the time between "
            "them unchanged (the host's own work does not depend on the step count)",
            "launch calls take the time they took; a launch that returned after the earlier GPU work ended is "
            "slow, not blocked: it does not move with the GPU (README: what the bundled sweep shows)",
            "sync-like calls return at max(start + own time, end of the GPU work they wait for + return latency)"
            f" (median return latency {dflt.get('return_latency', 0) / 1e3:.1f} µs)",
            "the GPU runs the phases of a rank in launch order, one queue: a phase starts at max(launch end + "
            f"launch latency, previous phase end + device gap) (medians where not bound: latency "
            f"{dflt.get('launch_latency', 0) / 1e3:.1f} µs, gap {dflt.get('device_gap', 0) / 1e3:.1f} µs)",
            f"predicted cycle = the measured cycle period moved by the mean change over {n} replayed windows "
            f"(first GPU op of a steady cycle → first of the next{f'; {rest} cycles not replayed' if rest else ''});"
            " ranks replayed independently (their skew stays as measured)",
        ]
        if self.launch_cut_ns:
            out.append(f"node-level graph tracing adds {self.launch_cut_ns / 1e3:.2f} µs per graph node to each "
                       "graph launch call on the host (slope of launch time over node count across this trace's "
                       f"graph launches); removed beyond the smallest graph's {self.launch_cut_from} nodes before "
                       "the replay (--as-traced keeps it; --timing GRAPH measures launches without it)")
        elif self.graph_mode == "Node":
            out.append("node-level graph trace replayed as traced: its graph launch calls keep node tracing's "
                       "host cost")
        return out


def _best(predictions: list[Prediction], measured_only: bool) -> Prediction | None:
    """The prediction with the most tokens/s (``measured_only``: among those not extrapolated); None without any."""
    rows = [p for p in predictions if p.tokens_per_s is not None and not (measured_only and p.extrapolated)]
    return max(rows, key=lambda p: p.tokens_per_s or 0.0) if rows else None


def interpolate(points: tuple[tuple[float, float], ...], x: float) -> float:
    """Piecewise-linear ``f(x)`` through ``points`` (sorted by x), extended by the end segments' slopes."""
    if len(points) == 1:
        return points[0][1]
    i = 1
    while i < len(points) - 1 and x > points[i][0]:
        i += 1
    (x0, y0), (x1, y1) = points[i - 1], points[i]
    return y0 + (y1 - y0) * (x - x0) / (x1 - x0) if x1 != x0 else y1


# predicted tokens/s this close to the best's is a tie: runs of the same workload without a profiler differ by
# 2.1 % at the median (max − min over six runs, docs/whatif-per-batch.md)
NEAR_BEST = 0.02




@results.cacheable
@dataclass
class SegmentModel:
    """The what-if of one segment (cycles of one batch size): its own costs, acceptance and predictions.

    ``others``: the same batch size's models from runs of the same workload at other step counts (``whatif
    --other-steps``). A prediction at ``steps`` comes from the run measured nearest to it (this one on a tie):
    at a step count some run measured, the prediction is that run's measured period; it is extrapolated more
    than one step from every measured count."""

    segment: int
    key: str
    batch_size: int | None
    cycles: int  # typical steady cycles the model is fitted on (all ranks)
    first_cycle: int
    period_ns: float  # the segment's typical cycle period (p50 of its typical steady cycles): what it moves from
    model: Model
    others: tuple[Model, ...] = ()
    unprofiled_ns: float | None = None  # the period without a profiler at the measured steps (calibrate), if known

    @property
    def measured_steps(self) -> list[int]:
        """The step counts this batch size was measured at (this run's first)."""
        return list(dict.fromkeys(m.steps_now for m in (self.model, *self.others)))

    def model_for(self, steps: int) -> Model:
        """The model of the run measured nearest to ``steps`` (this run's on a tie)."""
        return min((self.model, *self.others), key=lambda m: abs(m.steps_now - steps))

    def predict(self, steps: int) -> Prediction:
        m = self.model_for(steps)
        return dataclasses.replace(m.predict(steps), from_steps=m.steps_now)

    def predictions(self, max_steps: int = MAX_STEPS) -> list[Prediction]:
        """0 (verify only: SGLang's adaptive tiers run it) … ``max_steps`` draft steps."""
        return [self.predict(s) for s in range(0, max_steps + 1)]

    def best(self, max_steps: int = MAX_STEPS, measured_only: bool = False) -> Prediction | None:
        """As :meth:`Model.best`, over the predictions of every run."""
        return _best(self.predictions(max_steps), measured_only)

    def near_best(self, max_steps: int = MAX_STEPS) -> list[int]:
        """The step counts, not extrapolated, predicted within :data:`NEAR_BEST` of the best's tokens/s (the best
        first): a tie within what runs of the same workload differ by."""
        preds = self.predictions(max_steps)
        best = _best(preds, measured_only=True)
        if best is None:
            return []
        top = best.tokens_per_s or 0.0
        near = [p.steps for p in preds if p.tokens_per_s is not None
                and not p.extrapolated and p.tokens_per_s >= top * (1 - NEAR_BEST)]
        return [best.steps, *(s for s in near if s != best.steps)]

    def as_dict(self, max_steps: int = MAX_STEPS) -> dict:
        m = self.model
        preds = [{k: getattr(p, k) for k in ("steps", "cycle_ns", "tokens_per_s", "tokens_per_cycle", "verify_ns",
                                             "measured", "extrapolated", "from_steps")}
                 for p in self.predictions(max_steps)]
        best, now = self.best(max_steps, measured_only=True), self.predict(m.steps_now)
        best_any = self.best(max_steps)
        gain = (best.tokens_per_s / now.tokens_per_s - 1
                if best and best.tokens_per_s is not None and now.tokens_per_s else None)
        return {"segment": self.segment, "key": self.key, "batch_size": self.batch_size, "cycles": self.cycles,
                "first_cycle": self.first_cycle, "period_ns": self.period_ns, "steps_now": m.steps_now,
                "measured_steps": self.measured_steps,
                **({"unprofiled_period_ns": self.unprofiled_ns, "calibration_ns": m.calibration_ns}
                   if self.unprofiled_ns is not None else {}),
                "alpha": m.alpha, "verify_source": m.verify_source, "predictions": preds,
                "best_steps": best.steps if best else None, "near_best_steps": self.near_best(max_steps),
                "gain": gain,
                "best_steps_extrapolated": best_any.steps if best_any and best_any.extrapolated
                and best_any.steps != (best.steps if best else None) else None}
