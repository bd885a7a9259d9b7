"""What if the speculative decoder drafted N steps instead? A cost model fitted on one trace.

Inputs, per decode cycle, from one trace at ``S0`` draft steps (phases recognised by base name with any
prefix: ``draft``, ``verify``, ``draft_extend``; a cycle is a ``cycle`` range):

- each phase's cost is its GPU span (first op → last op) per cycle, taking for each cycle the *smallest*
  span over the TP ranks (a rank that arrived late does not wait in its first all-reduce, so its span is
  the work; the others' extra span is skew, which stays in *other* below), then the median over cycles;
- every number comes from the steady-state cycles (:mod:`analyze.compute.steady`: warm-up and stalls
  left out, or the user's ``--skip-cycles``/``--window``);
- the cycle period ``P0``: the one definition of :data:`analyze.compute.tokens.DEFINITION` (first GPU op of
  a cycle → first GPU op of the next, mean over the steady cycles), the number ``analyze``, ``compare``
  and the report print;
- ``other = P0 − draft − verify − draft_extend``: host overhead, the seams between phases, the gap between
  cycles and rank skew. Assumed not to depend on the step count.

Model for ``S`` steps (chain drafting, top-k 1: ``S + 1`` tokens verified per request):

- ``draft(S) = draft(S0) · S / S0`` (each step runs the draft model once; no fixed part);
- ``verify(S) = a + b · (S + 1)``: with a baseline trace (``decode_step`` verifies 1 token per request),
  the line through (1, baseline step) and (S0 + 1, verify); without one ``b = 0`` (decode is
  memory-bound: verifying a few more tokens costs nothing), which *under*-predicts large steps;
- ``draft_extend(S) = e0 + e1 · tokens(S)`` fitted over the cycles when accept lengths are known (least
  squares), else constant;
- acceptance: accepted draft tokens per request ``E[k | S] = α + α² + … + α^S`` (each draft token is
  accepted with probability α independently, given its predecessors were); α is solved so that
  ``E[k | S0]`` equals the measured mean; ``tokens(S) = batch · (1 + E[k | S])``; tokens/s =
  tokens(S) / cycle(S). Without known acceptance only cycle times are predicted (``--acceptance`` sets α).

Validated on real step sweeps of the embedded workload (README: "Reports, comparison and what-if").
"""

from __future__ import annotations

from dataclasses import dataclass, field

import polars as pl

from ..model import InputError
from . import headline
from .tokens import base_expr, cycles, speculative, summary

MODEL_PHASES = ("draft", "verify", "draft_extend")
MAX_STEPS = 10


def cycle_phases(res) -> pl.DataFrame:
    """Per rank and cycle (``n``): each child phase's GPU span (``x_span_ns``) by base name, one row each."""
    c = cycles(res).filter((pl.col("kind") == "cycle") & pl.col("steady")).select(
        "rank", "n", parent="range_id", tokens="tokens",
                                                                accept_length="accept_length",
                                                                batch_size="batch_size")
    kids = res.instances.with_columns(phase=base_expr()).select("parent", "phase", "x_span_ns", "x_ops")
    return (c.join(kids, on="parent").filter(pl.col("x_ops") > 0)
            .group_by("rank", "n", "phase").agg(pl.col("x_span_ns").sum(), pl.col("tokens").first(),
                                                pl.col("accept_length").first(), pl.col("batch_size").first()))


@dataclass
class Model:
    """The fitted costs (ns per cycle) and acceptance of one trace."""

    steps_now: int
    period_ns: float
    cost_ns: dict[str, float]  # phase → min-over-ranks span per cycle, mean over cycles
    other_ns: float
    verify_per_token_ns: float  # b: per verified token per request
    extend_per_token_ns: float  # e1
    batch_size: float | None
    alpha: float | None  # per-token acceptance; None = unknown
    accepted_now: float | None  # accepted draft tokens per request per cycle, measured
    notes: list[str] = field(default_factory=list)
    ready: dict[str, float] = field(default_factory=dict)  # "X→Y": CPU-bound start of Y after X's GPU start
    seam_floor: dict[str, float] = field(default_factory=dict)  # "X→Y": smallest GPU gap X end → Y start

    def seams(self, steps: int) -> dict[str, float]:
        """Predicted GPU idle between consecutive model phases: max(floor, ready − span of the earlier)."""
        spans = {"draft": self.draft(steps), "verify": self.verify(steps)}
        out = {}
        for key, r in self.ready.items():
            x = key.split("→")[0]
            out[key] = max(self.seam_floor.get(key, 0.0), r - spans.get(x, self.cost_ns.get(x, 0.0)))
        return out

    def draft(self, steps: int) -> float:
        return self.cost_ns.get("draft", 0.0) * steps / self.steps_now

    def verify(self, steps: int) -> float:
        return self.cost_ns.get("verify", 0.0) + self.verify_per_token_ns * (steps - self.steps_now)

    def expected_accepted(self, steps: int) -> float | None:
        if self.alpha is None:
            return None
        a = self.alpha
        return sum(a ** i for i in range(1, steps + 1))

    def tokens_per_cycle(self, steps: int) -> float | None:
        k = self.expected_accepted(steps)
        return None if k is None or self.batch_size is None else self.batch_size * (1 + k)

    def predict(self, steps: int) -> dict:
        s0 = self.steps_now
        d, v = self.draft(steps), self.verify(steps)
        e = self.cost_ns.get("draft_extend", 0.0)
        tok, tok0 = self.tokens_per_cycle(steps), self.tokens_per_cycle(s0)
        if tok is not None and tok0 is not None:
            e += self.extend_per_token_ns * (tok - tok0)
        seam = sum(self.seams(steps).values())
        cyc = d + v + e + seam + self.other_ns
        return {
            "steps": steps, "cycle_ns": cyc, "draft_ns": d, "verify_ns": v, "draft_extend_ns": e,
            "seams_ns": seam, "other_ns": self.other_ns, "tokens_per_cycle": tok,
            "tokens_per_s": tok / cyc * 1e9 if tok is not None and cyc > 0 else None,
            "measured": steps == s0,
        }

    def predictions(self, max_steps: int = MAX_STEPS) -> list[dict]:
        return [self.predict(s) for s in range(1, max_steps + 1)]

    def best(self, max_steps: int = MAX_STEPS) -> dict | None:
        """The step count with the most tokens/s, or None when acceptance is unknown."""
        rows = [p for p in self.predictions(max_steps) if p["tokens_per_s"] is not None]
        return max(rows, key=lambda p: p["tokens_per_s"]) if rows else None


def theil_sen(xy: pl.DataFrame) -> float:
    """Median of the pairwise slopes of ``x, y`` (robust to warm-up and stall outliers)."""
    p = xy.with_row_index("i").join(xy.with_row_index("j"), how="cross", suffix="2")
    p = p.filter((pl.col("i") < pl.col("j")) & (pl.col("x") != pl.col("x2")))
    return float(p.select(((pl.col("y2") - pl.col("y")) / (pl.col("x2") - pl.col("x"))).median()).item() or 0.0)


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


def launch_bounds(res) -> tuple[dict[str, float], dict[str, float]]:
    """Per transition X→Y of consecutive model phases: when Y can start at the earliest because of the CPU,
    relative to X's first GPU op (median over cycles of [Y's first launch call − X's first GPU op] + the
    smallest launch-to-GPU latency of Y seen), and the smallest GPU gap X → Y (both ns)."""
    inst = (headline.instances(res).filter(pl.col("steady") & (pl.col("x_ops") > 0)).with_columns(phase=base_expr())
            .filter(pl.col("phase").is_in(MODEL_PHASES))
            .select("rank", "parent", "phase", "x_first", "x_last", a="x_first_launch"))
    ready, floor = {}, {}
    for x, y in zip(MODEL_PHASES, MODEL_PHASES[1:]):
        j = inst.filter(pl.col("phase") == x).join(inst.filter(pl.col("phase") == y), on=["rank", "parent"],
                                                   suffix="_y").filter(pl.col("a_y").is_not_null())
        if j.height == 0:
            continue
        g = j.select(o=(pl.col("a_y") - pl.col("x_first")).median(), lam=(pl.col("x_first_y") - pl.col("a_y")).min(),
                     gap=(pl.col("x_first_y") - pl.col("x_last")).clip(lower_bound=0).min()).row(0, named=True)
        ready[f"{x}→{y}"], floor[f"{x}→{y}"] = float(g["o"] + g["lam"]), float(g["gap"])
    return ready, floor


def steps_of(res, steps_now: int | None) -> int:
    """The trace's draft step count: the caller's, else the manifest's; InputError when unknown."""
    if steps_now is not None:
        if steps_now < 1:
            raise InputError(f"--steps-now must be >= 1, not {steps_now}")
        return steps_now
    spec = speculative(res.trace.path)
    if isinstance(spec.get("steps"), int) and spec["steps"] >= 1 and not spec.get("baseline"):
        return spec["steps"]
    raise InputError(f"{res.trace.path}: the number of draft steps is not recorded (no manifest with "
                     "speculative.steps beside it); pass --steps-now N", "NO_STEPS")


def fit(res, steps_now: int | None = None, baseline=None, alpha: float | None = None) -> Model:
    """Fit the cost model on one analysed trace (``baseline``: an analysed decode_step trace, optional)."""
    s0 = steps_of(res, steps_now)
    cp = cycle_phases(res)
    if cp.height == 0:
        raise InputError(f"{res.trace.path}: no cycle ranges with draft/verify phases inside; what-if needs "
                         "an EAGLE trace (cycle ⊃ draft, verify, draft_extend)", "NO_CYCLES")
    per = (cp.filter(pl.col("phase").is_in(MODEL_PHASES))
           .group_by("n", "phase").agg(pl.col("x_span_ns").min(), pl.col("tokens").first()))
    cost = dict(per.group_by("phase").agg(pl.col("x_span_ns").median()).sort("phase").iter_rows())
    if "verify" not in cost:
        raise InputError(f"{res.trace.path}: no verify phase inside the cycles", "NO_VERIFY")
    tk = summary(res, steps=s0)
    period = tk.period_ns if tk.kind == "cycle" else None
    if period is None:
        raise InputError(f"{res.trace.path}: fewer than two cycles per rank; no cycle period", "NO_PERIOD")
    notes = []
    ready, floor = launch_bounds(res)
    model = Model(s0, float(period), {k: float(v) for k, v in cost.items()}, 0.0, 0.0, 0.0, None, None, None,
                  ready=ready, seam_floor=floor)
    seams0 = sum(model.seams(s0).values())
    other = period - sum(cost.get(p, 0.0) for p in MODEL_PHASES) - seams0
    b = 0.0
    if baseline is not None:
        bt = summary(baseline)
        step = cycles(baseline).filter((pl.col("kind") == "decode_step") & pl.col("steady")).group_by("n") \
            .agg(pl.col("i_span_ns").min())["i_span_ns"].median()
        if step is None:
            notes.append(f"{baseline.trace.path} has no decode_step ranges: not used for the verify slope")
        else:
            b = (cost["verify"] - step) / s0
            if b < 0:
                notes.append(f"the baseline step ({step / 1e3:.1f} µs) is slower than verify: slope clipped to 0")
                b = 0.0
            notes.append(f"verify cost per verified token per request from the baseline step ({step / 1e3:.1f} µs, "
                         f"batch {bt.batch_size}): {b / 1e3:.2f} µs")
    else:
        notes.append("no baseline: verify cost assumed independent of the number of verified tokens")
    e1 = 0.0
    ext = per.filter((pl.col("phase") == "draft_extend") & pl.col("tokens").is_not_null())
    if ext.height >= 3 and ext["tokens"].n_unique() > 1:
        e1 = theil_sen(ext.select(x="tokens", y="x_span_ns"))
    if tk.accepted_per_request is not None:
        where = "the hooks' accept marks" if tk.acceptance_source == "marks" else "the range payload"
        notes.append(f"acceptance measured on {tk.accepted_cycles} cycles ({where}): mean {tk.accepted_per_request:.2f}, "
                     f"p50 {tk.accepted_p50:g}, p90 {tk.accepted_p90:g} accepted "
                     "draft tokens per request")
    if alpha is None and tk.accepted_per_request is not None:
        alpha = solve_alpha(tk.accepted_per_request, s0)
    elif alpha is None:
        notes.append("acceptance unknown (no accept-length payload): cycle times only; --acceptance sets it")
    batch = tk.batch_size
    if alpha is not None and batch is None:
        batch = 1.0
        notes.append("batch size unknown: tokens and tokens/s are per request")
    return Model(s0, float(period), {k: float(v) for k, v in cost.items()}, float(other), b, e1,
                 batch, alpha, tk.accepted_per_request, notes, ready, floor)


def to_dict(m: Model, max_steps: int = MAX_STEPS) -> dict:
    """The JSON document: ``{"predictions": [...], "best": ..., "model": ...}``."""
    best = m.best(max_steps)
    return {
        "predictions": m.predictions(max_steps),
        "best": best["steps"] if best else None,
        "model": {
            "steps_now": m.steps_now, "period_ns": m.period_ns, "cost_ns": m.cost_ns, "other_ns": m.other_ns,
            "verify_per_token_ns": m.verify_per_token_ns, "extend_per_token_ns": m.extend_per_token_ns,
            "batch_size": m.batch_size, "alpha": m.alpha, "accepted_per_request": m.accepted_now,
            "seam_ready_ns": m.ready, "seam_floor_ns": m.seam_floor,
            "notes": m.notes,
        },
    }


def validate(results: dict[int, object], baseline=None) -> pl.DataFrame:
    """Predicted vs measured cycle time: a model from each trace (steps → analysed Result) predicts the others."""
    measured = {s: (fit(r, s).period_ns, summary(r, steps=s).tokens_per_cycle) for s, r in results.items()}
    rows = []
    for s0, r in results.items():
        m = fit(r, s0, baseline=baseline)
        for s, (meas, tok) in measured.items():
            p = m.predict(s)
            pred, ptok = p["cycle_ns"], p["tokens_per_cycle"]
            rows.append({"from_steps": s0, "steps": s, "predicted_ns": pred, "measured_ns": meas,
                         "error_pct": 100 * (pred - meas) / meas, "predicted_tokens": ptok, "measured_tokens": tok,
                         "tokens_error_pct": 100 * (ptok - tok) / tok if ptok is not None and tok else None})
    return pl.DataFrame(rows).sort("from_steps", "steps")
