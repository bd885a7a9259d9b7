"""Ranked findings: what in a trace costs cycle time, the evidence, and what to try.

Every rule is one row of :data:`RULES`: a code, what it looks at, what to try, and a check over the
steady-state numbers (:mod:`analyze.compute.steady_tables`) that returns hits. A hit's *impact* is the
cycle time (ns per cycle, mean over ranks unless the rule names a rank) it explains; findings are
ranked by impact, and the severity is the impact's share of the cycle period: ``high`` from
:data:`HIGH`, ``medium`` from :data:`MEDIUM`, ``low`` below (hits under :data:`FLOOR` are dropped).

Collectives whose matched kernels do not end together across ranks (:func:`analyze.compute.steady_tables.matching`)
give no straggler finding and no wait/transfer split: their pairing is suspect, and a wrong straggler sends an
engineer after a problem that does not exist.

Host late vs blocked (seams and the gap between cycles): for each transition, the next range's first
launch call (its CUDA API start, ``i_first_launch``) is compared with the end of the earlier GPU work.
Launched after it: the GPU waited for the CPU (*host-bound*). Launched before it, yet the GPU started
later: the launch or the GPU queue held it (*blocked*: a synchronous call, an event wait, a launch queue).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import polars as pl

from ..model import InputError, Result
from ..read import packed_keys
from . import anatomy, cycle_budget, host_gaps, steady_cycles, steady_tables, straggler, utilisation, view
from .cycles import selection
from .finding_types import CAUSE, CYCLE, PHASE, PIECE, Claim, Finding, Rule, RuleContext, RuleHit
from .nccl_evidence import comm_action, nccl_setting
from .payload import CYCLE_NAMES, base_expr
from .scalars import real, to_float
from .tokens import summary

if TYPE_CHECKING:
    from .whatif_model import Model

__all__ = ["HIGH", "MEDIUM", "FLOOR", "RULES", "COMM_SHARE", "IDLE_SHARE", "GAIN", "SAME", "launch_timing",
           "PHASE_SHARE", "severity", "partition", "RuleInputs", "rule_inputs", "known", "context", "find",
           "findings_at"]

HIGH, MEDIUM, FLOOR = 0.10, 0.03, 0.01
COMM_SHARE = 0.10  # a phase's communication share of its span worth a finding
IDLE_SHARE = 0.15  # idle between a phase's own ops, as a share of its span
GAIN = 0.03  # a what-if step count predicted this much faster is worth trying


def _us(ns: float) -> str:
    return f"{ns / 1e3:,.1f} µs"


def _pct(x: float) -> str:
    return f"{100 * x:.0f} %" if x >= 0.1 else f"{100 * x:.1f} %"


SAME = 0.02  # ranks within this fraction of each other count as "the same on every rank"


@dataclass(frozen=True)
class _OverRanks:
    """A quantity over ranks: its mean, the rank with the most (None when all ranks are about the same), the range."""

    mean: float
    rank: int | None
    max: float
    min: float
    ranks: int
    worst: bool  # several ranks, not about the same: ``rank`` has the most


def _over_ranks(df: pl.DataFrame, col: str) -> _OverRanks:
    """``col`` over the ranks of ``df`` (:class:`_OverRanks`)."""
    w = df.sort(col, "rank", descending=[True, False]).row(0, named=True)
    mean, lo, hi = to_float(df[col].mean()), to_float(df[col].min()), float(w[col])
    same = df.height > 1 and hi - lo <= SAME * abs(mean)
    return _OverRanks(mean=mean, rank=None if same else w["rank"], max=hi, min=lo, ranks=df.height,
                      worst=df.height > 1 and not same)


def _ranks_txt(o: _OverRanks) -> str:
    if o.ranks == 1:
        return f"rank {o.rank}"
    if o.rank is None:
        return f"about the same on all {o.ranks} ranks"
    return f"mean over {o.ranks} ranks; most on rank {o.rank} ({_us(o.max)}), least {_us(o.min)}"


# ---- the launch side of seams --------------------------------------------------------------------------


def launch_timing(res: Result) -> pl.DataFrame:
    """Steady seam instances with ``late_ns`` (the GPU idle before the next range's first launch call began:
    the CPU was late) and ``held_ns`` (the rest of the gap: launched in time, started later)."""
    s = steady_tables.steady_seam_instances(res)
    if s.height == 0:
        return s
    nxt = res.instances.filter(pl.col("rank").is_not_null()).select("rank", "range_id", launch="i_first_launch")
    gap = (pl.col("b") - pl.col("a")).clip(lower_bound=0)
    return (packed_keys.join(s, nxt, ["rank", "range_id"], how="left")
            .with_columns(late_ns=(pl.col("launch") - pl.col("a")).clip(lower_bound=0).fill_null(0))
            .with_columns(late_ns=pl.min_horizontal("late_ns", gap))
            .with_columns(held_ns=gap - pl.col("late_ns"), host_late=pl.col("launch") > pl.col("a")))


# ---- the rules --------------------------------------------------------------------------------------------


def _gap(ctx: RuleContext) -> list[RuleHit]:
    g = ctx.budget.filter(pl.col("kind") == "gap")
    if g.height == 0:
        return []
    o = _over_ranks(g, "ns")
    s = ctx.seams.filter(pl.col("parent").is_null()).filter(base_expr("prev_range").is_in(CYCLE_NAMES)
                                                             & base_expr("range").is_in(CYCLE_NAMES))
    late = to_float(s["host_late"].mean()) if s.height else None
    ev = (f"the GPU is idle {_us(o.mean)} between the last GPU op of a cycle and the first of the next = "
          f"{_pct(o.mean / ctx.period_ns)} of the {_us(ctx.period_ns)} cycle ({_ranks_txt(o)})")
    if late is not None:
        ev += (f"; the next cycle's first launch call came after the previous cycle's GPU work had finished in "
               f"{_pct(late)} of cycles (host-bound)" if late >= 0.5 else
               f"; in {_pct(1 - late)} of cycles the next cycle was launched before the GPU finished, so the "
               "wait is on the GPU side (a sync or event), not the CPU")
    return [RuleHit(o.mean, ev, rank=o.rank, worst=o.worst, host_bound=late is None or late >= 0.5)]


def _seam(ctx: RuleContext, blocked: bool) -> list[RuleHit]:
    s = ctx.seams.filter(pl.col("parent").is_not_null())
    if s.height == 0:
        return []
    per = (s.group_by("rank", "prev_range", "range")
           .agg(late=pl.col("late_ns").sum(), held=pl.col("held_ns").sum(), n=pl.len(),
                share=pl.col("host_late").mean(), idle=pl.col("idle_ns").sum()))
    # per cycle: instances are one per cycle on each rank
    per = per.with_columns(late=pl.col("late") / pl.col("n"), held=pl.col("held") / pl.col("n"),
                           idle=pl.col("idle") / pl.col("n"))
    col = "held" if blocked else "late"
    out = []
    for (f, t), grp in per.group_by("prev_range", "range", maintain_order=True):
        o = _over_ranks(grp, col)
        if o.mean <= 0:
            continue
        if blocked:
            ev = (f"between {f} and {t} the GPU waits {_us(o.mean)} per cycle after the next launch call was "
                  f"already made ({_ranks_txt(o)}): the launch or the GPU queue held it")
        else:
            ev = (f"between {f} and {t} the GPU waits {_us(o.mean)} per cycle for the CPU to launch {t} "
                  f"({_ranks_txt(o)}; launched after {f}'s GPU work ended in {_pct(to_float(grp['share'].mean()))} "
                  "of cycles)")
        out.append(RuleHit(o.mean, ev, phase=f"{f} → {t}", rank=o.rank, worst=o.worst))
    return out


_HOST_ITEMS = 3  # the host items a host-bound gap finding names


def _host_items(ctx: RuleContext, gap: str, hit: RuleHit) -> RuleHit:
    """``hit`` (a host-bound gap or seam) with the items of its host windows (:mod:`analyze.compute.host_gaps`):
    the largest, µs per cycle (mean over ranks, or ``hit.rank``'s), and what to try for each; as it was when the
    capture names none."""
    hg = host_gaps.host_gaps(ctx.res)
    top = hg.top(gap, hit.rank if hit.worst or hit.rank is not None else None, _HOST_ITEMS)
    if top.height == 0:
        return hit
    win = hg.windows.filter((pl.col("scope") == "steady") & (pl.col("gap") == gap))
    if hit.rank is not None:
        win = win.filter(pl.col("rank") == hit.rank)
    window = to_float(win["window_ns"].mean()) if win.height else 0.0
    named = [r for r in top.iter_rows(named=True) if r["item"] != host_gaps.UNATTRIBUTED]
    grew = {c["item"]: c for c in hg.classes if c["gap"] == gap and c["label"] != "rare stalls (left out)"
            and (hit.rank is None or c["rank"] == hit.rank)}

    def one(r: dict) -> str:
        out = f"{r['item']} {_us(r['ns'])}"
        if r["wait_ns"] >= 0.1 * r["ns"] and r["kind"] == "range":
            out += f" ({_us(r['wait_ns'])} of it waiting for the GPU in CUDA calls)"
        if r["item"] in grew:
            out += f" ({grew[r['item']]['label']}: +{_us(grew[r['item']]['delta_ns'])})"
        py = hg.python_frames.filter((pl.col("gap") == gap) & (pl.col("item") == r["item"])
                                     & ((pl.col("rank") == hit.rank) if hit.rank is not None else pl.lit(True)))
        if py.height:  # what the Python samples inside it were running (innermost frame), most first
            f = py.sort("samples", descending=True).row(0, named=True)
            out += f" (Python samples in it: {f['frame']} in {_pct(f['share'])})"
        return out

    ev = (f"; the launching thread's time in it, {_us(window)} per cycle from the end of the GPU work to the next "
          f"launch call: " + ", ".join(one(r) for r in top.iter_rows(named=True)) + " per cycle")
    rest = hg.items.filter((pl.col("scope") == "steady") & (pl.col("gap") == gap)
                           & (pl.col("item") == host_gaps.UNATTRIBUTED))
    if rest.height and host_gaps.UNATTRIBUTED not in top["item"].to_list():
        ev += f" (unattributed {_us(to_float(rest['ns'].mean()))})"
    tips = [f"`{r['item']}`: {host_gaps.item_advice(r['item'])}" for r in named if host_gaps.item_advice(r["item"])]
    if not named or not hg.has_ranges or not hg.sampled:
        missing = [] if hg.has_ranges else ["SGLANG_ENABLE_NVTX_SCHEDULER=1 (or spectrace trace's hooks) names the "
                                            "scheduler functions"]
        if not hg.sampled:
            missing.append("spectrace trace --cpu-sampling records where the thread is")
        if rest.height and to_float(rest["ns"].mean()) > 0:
            tips.append(f"`unattributed` {_us(to_float(rest['ns'].mean()))} per cycle: " + "; ".join(missing)
                        if missing else f"unattributed: {host_gaps.item_advice(host_gaps.UNATTRIBUTED)}")
    action = ". ".join(tips) + "." if tips else None
    return RuleHit(hit.impact_ns, hit.evidence + ev, phase=hit.phase, rank=hit.rank, worst=hit.worst,
                   every=hit.every, extra_ns=hit.extra_ns, cycles=hit.cycles, action=action or hit.action,
                   host_bound=hit.host_bound)


def _gap_host(ctx: RuleContext) -> list[RuleHit]:
    """GAP_HOST_BOUND: the host-bound gap between cycles, with its host items."""
    return [_host_items(ctx, cycle_budget.GAP, h) for h in _gap(ctx) if h.host_bound]


def _seam_host(ctx: RuleContext) -> list[RuleHit]:
    """SEAM_HOST_BOUND: each seam the CPU launched late, with its host items."""
    return [_host_items(ctx, h.phase, h) if h.phase else h for h in _seam(ctx, blocked=False)]


def _comm(ctx: RuleContext) -> list[RuleHit]:
    p = ctx.phases.filter(pl.col("comm_ns") > 0)
    out = []
    for (name,), grp in p.group_by("phase", maintain_order=True):
        share = float(real(grp["comm_ns"].sum()) / real(grp["span_ns"].sum()))
        if share < COMM_SHARE:
            continue
        grp = _per_cycle(ctx, grp, "comm_ns").with_columns(
            transfer=pl.col("comm_transfer_ns") / pl.col("ncyc"), wait=pl.col("comm_wait_ns") / pl.col("ncyc"))
        # What a faster collective could save: the transfer, when wait/transfer are known, else the union.
        split = float(real(grp["transfer"].sum()) + real(grp["wait"].sum())) > 0 and name not in ctx.untrusted
        impact = to_float(grp["transfer"].mean()) if split else to_float(grp["per"].mean())
        o = _over_ranks(grp, "per")
        ev = (f"{name}: communication {_us(o.mean)} per cycle = {_pct(share)} of its GPU span, "
              f"{_pct(o.mean / ctx.period_ns)} of the cycle ({_ranks_txt(o)})")
        if split:
            ev += (f"; of the collectives' kernel time {_us(to_float(grp['transfer'].mean()))} is transfer and "
                   f"{_us(to_float(grp['wait'].mean()))} waiting for the last rank")
        elif name in ctx.untrusted:
            ev += "; no wait/transfer split: its matched collectives do not end together (matching suspect)"
        out.append(RuleHit(impact, ev, phase=name, action=comm_action(nccl_setting(ctx.res, name))))
    return out


def _per_cycle(ctx: RuleContext, df: pl.DataFrame, col: str) -> pl.DataFrame:
    """``df`` (per rank) with ``per``: ``col`` summed over the steady state / the rank's steady cycles."""
    return df.join(ctx.cycles, on="rank", how="left").with_columns(per=pl.col(col) / pl.col("ncyc"))


def _class_stragglers(ctx: RuleContext) -> list:
    return [c for c in ctx.classes if c.kept and c.affected and c.waiting_ranks and c.rank is not None]


def _straggler(ctx: RuleContext) -> list[RuleHit]:
    """One straggler verdict (:func:`analyze.compute.straggler.verdict`, the rank that caused most of a phase's
    collective waiting), named with its class when it is late only in a recurring class of cycles."""
    out = []
    verdict = steady_tables.straggler_verdict(ctx.res)
    for c in _class_stragglers(ctx):
        v = verdict.filter((pl.col("phase") == c.phase) & (pl.col("rank") == c.rank))
        waits = (f"; over all steady cycles the other ranks wait {_us(v['per_cycle_ns'][0])} per cycle in "
                 f"{c.phase}'s collectives for rank {c.rank} ({_pct(v['wait_share'][0])} of that waiting)"
                 if v.height else "")
        out.append(RuleHit(c.per_cycle_ns, (
            f"{c.text}; {_us(c.per_cycle_ns)} per steady cycle on average ("
            + ("the late rank from the matched collectives of those cycles" if c.evidence == "collectives"
               else "the late rank from the cycle budget of those cycles") + ")" + waits),
            phase=c.phase, rank=c.rank, every=c.every, extra_ns=c.extra_ns, cycles=c.affected, cycle_class=c))
    v = steady_tables.straggler_verdict(ctx.res, min_collectives=straggler.MIN_COLLECTIVES)
    named = {(h.rank, h.phase) for h in out}
    for r in v.iter_rows(named=True):
        if (r["rank"], r["phase"]) in named:
            continue
        wait = r["per_cycle_ns"]
        out.append(RuleHit(wait, (
            f"rank {r['rank']} caused {_pct(r['wait_share'])} of the waiting in {r['phase']}'s collectives: the "
            f"other ranks wait {_us(wait)} per cycle for it (it arrives last at {r['last_arrivals']} of "
            f"{r['collectives']}, on average {_us(r['mean_delay_ns'])} after the next-latest rank)"),
            phase=r["phase"], rank=r["rank"]))
    return out


_LOOK = ("a CPU-sampled capture (`spectrace trace --cpu-sampling`) at those cycles shows what the host does; the "
         "piece that grew says where to look.")
# RECURRING_SLOW_CYCLES' advice by the kind of class (what the class shows; the rule's row is the every-N one's)
_RECURRING_ACTION = {
    "prefill": "The cycle after a prefill pays for it (per-batch setup, new requests' state, a graph not yet "
               "captured for the new shape): chunked prefill or a mixed batch spreads it; " + _LOOK,
    "batch change": "The first cycles of a new batch size are slower (allocation, a CUDA graph captured or "
                    "selected for the new size): capture graphs for every batch size before serving; " + _LOOK,
    "mode": "A second, slower mode at no period: something intermittent (a thread or process contending for the "
            "core, a cache or pool refill, GC, a lock) makes a share of the cycles slower; " + _LOOK,
}


def _recurring(ctx: RuleContext) -> list[RuleHit]:
    """Classes of slower cycles that recur (kept in the steady state) without one late rank."""
    out = []
    for c in ctx.classes:
        if not c.kept or not c.affected or c in _class_stragglers(ctx) or c.kind == "shift":
            continue
        out.append(RuleHit(c.per_cycle_ns, (
            f"{c.text}; {_us(c.per_cycle_ns)} per steady cycle on average (kept in the numbers above: it recurs)"),
            phase=c.phase, rank=c.rank, every=c.every, extra_ns=c.extra_ns, cycles=c.affected, cycle_class=c,
            action=_RECURRING_ACTION.get(c.kind)))
    return out


def _shift(ctx: RuleContext) -> list[RuleHit]:
    """Level shifts (:mod:`analyze.compute.steady_cycles`): from a cycle on, every cycle of the segment slower by
    the same amount, where that time sits (:mod:`analyze.compute.anatomy`); without one late rank (that is a
    straggler's)."""
    out = []
    for c in ctx.classes:
        if c.kind != "shift" or not c.kept or not c.affected or c in _class_stragglers(ctx):
            continue
        out.append(RuleHit(c.per_cycle_ns, (
            f"{c.text} (over the {_us(c.typical_ns)} of the level before it); {_us(c.per_cycle_ns)} per steady "
            "cycle on average (kept in the numbers above: the run stays at it"
            + (")" if c.until_key is None else f" until cycle {c.until_key})")),
            phase=c.phase, rank=c.rank, extra_ns=c.extra_ns, cycles=c.affected, cycle_class=c))
    return out


def _idle(ctx: RuleContext) -> list[RuleHit]:
    p = ctx.phases.filter(pl.col("idle_ns") > 0)
    out = []
    for (name,), grp in p.group_by("phase", maintain_order=True):
        share = float(real(grp["idle_ns"].sum()) / real(grp["span_ns"].sum()))
        if share < IDLE_SHARE:
            continue
        o = _over_ranks(_per_cycle(ctx, grp, "idle_ns"), "per")
        out.append(RuleHit(o.mean, (
            f"{name}: the GPU is idle {_us(o.mean)} per cycle between {name}'s own operations = {_pct(share)} "
            f"of its span ({_ranks_txt(o)})"), phase=name, rank=o.rank, worst=o.worst))
    return out


def _stalls(ctx: RuleContext) -> list[RuleHit]:
    st = ctx.info.stalls
    if not st or not ctx.info.steady:
        return []
    excess = sum(s.excess_ns for s in st)
    per = excess / max(ctx.info.steady, 1)
    kept = ctx.info.how != "detected"
    worst = max(st, key=lambda s: s.period_ns)
    where = next((c for c in ctx.classes if c.kind == "stall"), None)
    on_host = where is not None and where.piece == cycle_budget.GAP
    action = None if on_host else (
        f"Intermittent stalls in {where.piece if where and where.piece else 'the cycle'} (not between cycles): on "
        "the GPU side (a clock or power drop, another process on the GPU: `nvidia-smi -q -d CLOCK,PERFORMANCE`) or a "
        "launch held by the host (GC: `gc.freeze()` after warm-up, logging); line the stalled cycles' times up with a "
        "CPU-sampled capture.")
    return [RuleHit(per, (
        f"{len(st)} cycle(s) took longer than {_us(ctx.info.limit_ns or 0.0)} (median period "
        f"{_us(ctx.info.median_ns or 0.0)}) and do not recur, the worst cycle {worst.key} at {_us(worst.period_ns)}; "
        f"together {_us(excess)} more than median cycles, {_us(per)} per steady cycle"
        + (f"; {where.text}" if where else "")
        + (" (kept in the numbers: you chose the cycles)" if kept else " (left out of the numbers above)")),
        phase=where.phase if where else None, extra_ns=excess / len(st), cycles=len(st), action=action)]


def _left_out(ctx: RuleContext) -> list[RuleHit]:
    share = ctx.info.left_out_share
    if ctx.info.how != "detected" or share <= steady_cycles.LEFT_OUT_WARN:
        return []
    n = ctx.info.post_warmup
    return [RuleHit(share * ctx.period_ns, (
        f"{share:.0%} of the {n} cycles after warm-up are left out of the steady state (rare stalls and pauses): "
        "the headline numbers describe the rest only"))]


def _whatif(ctx: RuleContext) -> list[RuleHit]:
    """The step count the what-if predicts faster, among the predictions within one step of what was measured
    (an extrapolated one is named as such, never recommended), with how verify's growth is known."""
    m = ctx.model
    if m is None or m.segments:  # several batch sizes: one average model is right for none (WHATIF_STEPS_PER_BATCH)
        return []
    best, now = m.best(measured_only=True), m.predict(m.steps_now)
    far = m.best()
    if best is None or best.tokens_per_s is None or best.steps == m.steps_now or not now.tokens_per_s:
        return []
    gain = best.tokens_per_s / now.tokens_per_s - 1
    if gain < GAIN:
        return []
    ev = (f"the what-if model predicts {best.tokens_per_s:,.0f} tokens/s at {best.steps} draft steps against "
          f"{now.tokens_per_s:,.0f} at the current {m.steps_now} (+{_pct(gain)}; acceptance α = {m.alpha:.2f} "
          "fitted on this trace, model assumptions in `spectrace whatif --explain`)")
    if m.verify_source == "assumed":
        ev += ("; verify's cost per extra verified token is ASSUMED 0 (not measured: no baseline, one batch size): "
               "the gain is an upper bound until a run at that step count confirms it")
    elif m.verify_source == "gpu_metrics" and m.verify_prior is not None:  # "gpu_metrics" comes with its prior
        ev += (f"; verify's cost per extra verified token is a PRIOR from its measured {m.verify_prior['bound']}-bound "
               "GPU metrics (not a measured slope): confirm with a run at that step count")
    if far is not None and far.steps != best.steps:
        ev += (f"; {far.steps} steps predicts more ({far.tokens_per_s:,.0f} tokens/s) but is "
               f"{abs(far.steps - m.steps_now)} steps from the measured {m.steps_now}: extrapolated, not "
               "recommended")
    return [RuleHit(gain * ctx.period_ns, ev)]


def _verify_how(source: str) -> str:
    return {"segments": "measured across the batch sizes", "gpu_metrics": "a prior from its measured GPU metrics",
            "baseline": "measured against the baseline"}.get(source, "assumed")


def _whatif_per_batch(ctx: RuleContext) -> list[RuleHit]:
    """Different best step counts for different batch sizes (the what-if per segment)."""
    from .whatif_model import NEAR_BEST

    m = ctx.model
    segs = [sm.as_dict() for sm in (m.segments if m is not None else [])]
    best = {d["key"]: d["best_steps"] for d in segs if d["best_steps"] is not None}
    if len(set(best.values())) < 2:
        return []
    gain = max((d["gain"] or 0.0) for d in segs)
    ties = {d["key"]: d["near_best_steps"][1:] for d in segs}
    per = ", ".join(f"{k}: {v}" + (f" (≈ {', '.join(map(str, ties[k]))} within {100 * NEAR_BEST:.0f} %)" if ties.get(k) else "")
                    for k, v in best.items())
    runs = sorted({s for d in segs for s in d["measured_steps"]})
    return [RuleHit(gain * ctx.period_ns, (
        f"the best draft-step count depends on the batch size ({per}; predicted from each batch size's own "
        f"cycles, within one step of the measured {', '.join(map(str, runs))}; verify's growth "
        f"{_verify_how(segs[0]['verify_source'])}); up to "
        f"+{_pct(gain)} tokens/s in one of them"))]


def _node_level(ctx: RuleContext, hit: RuleHit) -> RuleHit:
    """SEAM_BLOCKED_LAUNCH's hit, with the node-level tracing's part of the advice when the capture is node-level
    (the trace says so: ``graph_trace_mode``), and only then."""
    if (ctx.res.trace.graph_trace_mode or "").lower() != "node":
        return hit
    from dataclasses import replace

    return replace(hit, action=("A blocked launch or a queued dependency: a synchronous call, an event wait, a full "
                                "launch queue; this capture traced CUDA graphs node by node, which also blocks graph "
                                "launches: compare with a graph-level capture (`--cuda-graph-trace=graph`)."))


def _phase_of(hit: RuleHit) -> str:
    """The phase a hit is about, without a segment's scope (``verify (batch 1)`` → ``verify``)."""
    return (hit.phase or "").split(" (")[0]


def _piece(hit: RuleHit) -> list[Claim]:
    """A hit about one budget piece (the gap between cycles, a seam) claims that piece."""
    return [Claim((hit.phase or cycle_budget.GAP,), hit.impact_ns)]


def _part(part: str) -> Callable[[RuleHit], list[Claim]]:
    """A hit about one part of a phase (its communication, its idle) claims that part."""
    return lambda hit: [Claim((f"{_phase_of(hit)}/{part}",), hit.impact_ns)]


def _whole_phase(hit: RuleHit) -> list[Claim]:
    p = _phase_of(hit)
    return [Claim((f"{p}/compute", f"{p}/idle", f"{p}/comm"), hit.impact_ns)]


def _cause(hit: RuleHit) -> list[Claim]:
    """A hit that names a cause claims where that cause's time sits: a class of slower cycles its pieces that grew
    (each piece's growth over the ranks, per steady cycle, scaled to the class's time per cycle); a late rank
    without a class the communication of the phase the others wait in, then (the late rank's own delay, which the
    budget does not place) the rest of the cycle."""
    c = hit.cycle_class
    if c is None:  # the waiting ranks' share of the phase's communication, the rest (the late rank's) of the cycle
        ph = _phase_of(hit)
        return [Claim((f"{ph}/comm", f"{ph}/idle", CYCLE) if ph else (CYCLE,), hit.impact_ns)]
    nranks = max(len({p["rank"] for p in c.pieces}), 1)
    grew: dict[tuple[str, str], float] = {}
    for p in c.pieces:
        if p["delta_ns"] > 0:
            grew[(p["segment"], p["kind"])] = grew.get((p["segment"], p["kind"]), 0.0) + p["delta_ns"] / nranks
    total = sum(grew.values())
    if total <= 0:
        return [Claim((CYCLE,), hit.impact_ns)]
    out = []
    for (seg, kind), ns in sorted(grew.items(), key=lambda kv: -kv[1]):
        if kind != "phase":
            leaves: tuple[str, ...] = (seg,)
        elif c.waiting_ranks and seg == c.phase:  # the others wait for the late rank in its collectives
            leaves = (f"{seg}/comm", f"{seg}/idle", f"{seg}/compute")
        else:
            leaves = (f"{seg}/compute", f"{seg}/idle", f"{seg}/comm")
        out.append(Claim(leaves, hit.impact_ns * ns / total))
    return out


def _leaves(ctx: RuleContext) -> dict[str, float]:
    """The mean steady cycle's leaves (:class:`Claim`) over the ranks, ns per cycle; :data:`CYCLE` the period."""
    b = ctx.budget
    out: dict[str, float] = {CYCLE: ctx.period_ns}
    if b.height == 0:
        return out
    m = (b.group_by("segment", "kind").agg(pl.col("ns", "compute_ns", "comm_ns", "idle_ns").mean())
         .sort("segment"))
    for r in m.iter_rows(named=True):
        if r["kind"] == "phase" and r["compute_ns"] is not None:
            for part in ("compute", "comm", "idle"):
                out[f"{r['segment']}/{part}"] = max(float(r[f"{part}_ns"] or 0.0), 0.0)
        else:
            out[r["segment"]] = max(float(r["ns"] or 0.0), 0.0)
    return out


@dataclass
class _Share:
    """One hit's part of the cycle after :func:`partition`: what it holds per leaf, who holds the rest."""

    rule: Rule
    hit: RuleHit
    held: dict[str, float] = field(default_factory=dict)
    under: dict[int, float] = field(default_factory=dict)  # index of the other share → ns it holds of this claim

    @property
    def ns(self) -> float:
        return sum(self.held.values())


def partition(ctx: RuleContext, hits: list[tuple[Rule, RuleHit]]) -> list[_Share]:
    """Each microsecond of the mean steady cycle given to one finding (issue 37): every hit claims leaves of the
    cycle budget (:class:`Claim`, from its rule's ``claims``); claims are served tier by tier (:data:`CAUSE` first:
    a late rank's delay and the waiting it causes are its own, not the gap's or the collective's), the larger first
    within a tier, each from what the earlier ones left of its leaves, in the order it lists them; :data:`CYCLE`
    claims (and every claim) also take from the period, so that the findings together never exceed it. A hit left
    with less than it claimed refers to the findings that hold the rest (``under``)."""
    left = _leaves(ctx)
    holder: dict[str, list[tuple[int, float]]] = {}  # leaf → (share, ns held), who took it
    shares = [_Share(rule, hit) for rule, hit in hits]
    order = sorted(range(len(shares)), key=lambda i: (shares[i].rule.tier, -shares[i].hit.impact_ns, i))
    for i in order:
        sh = shares[i]
        claims = sh.rule.claims(sh.hit) if sh.rule.claims is not None else [Claim((CYCLE,), sh.hit.impact_ns)]
        for cl in claims:
            want = cl.ns
            for leaf in cl.pieces:
                if want <= 0:
                    break
                avail = left.get(leaf, 0.0) if leaf != CYCLE else left[CYCLE]
                took = min(want, avail, left[CYCLE])
                if took > 0:
                    sh.held[leaf] = sh.held.get(leaf, 0.0) + took
                    holder.setdefault(leaf, []).append((i, took))
                    left[CYCLE] -= took
                    if leaf != CYCLE:
                        left[leaf] = avail - took
                    want -= took
            if want > 0:  # held by the findings that took these leaves before it (or beyond the budget)
                for leaf in cl.pieces:
                    for j, ns in holder.get(leaf, []):
                        if j != i and want > 0:
                            part = min(ns, want)
                            sh.under[j] = sh.under.get(j, 0.0) + part
                            want -= part
    return shares


RULES: tuple[Rule, ...] = (
    Rule("GAP_HOST_BOUND", "GPU idle between cycles, the next cycle launched late by the CPU",
         "Cut the CPU work between decode iterations: scheduler bookkeeping, sampling, `.tolist()`/`.item()` "
         "syncs, logging, Python overhead; keep SGLang's overlap scheduler on; check the CUDA-graph launch "
         "latency. `nsys profile -s cpu` shows where the host thread is.", _gap_host, PIECE, _piece),
    Rule("GAP_GPU_BOUND", "GPU idle between cycles although the next cycle was already launched",
         "The next cycle waits on something on the GPU side: a device sync, an event wait or a copy before its "
         "first kernel; look at the first API calls of a cycle in the nsys timeline.",
         lambda c: [h for h in _gap(c) if not h.host_bound], PIECE, _piece),
    Rule("SEAM_HOST_BOUND", "GPU idle between two phases of a cycle, the next phase launched late by the CPU",
         "Move host work out of the transition (syncs, allocations, Python between the two launches) or capture "
         "both phases in one CUDA graph.", _seam_host, PIECE, _piece),
    Rule("SEAM_BLOCKED_LAUNCH", "GPU idle between two phases although the next was launched in time",
         "A blocked launch or a queued dependency: a synchronous call, an event wait, a full launch queue.",
         lambda c: [_node_level(c, h) for h in _seam(c, blocked=True)], PIECE, _piece),
    Rule("COMM_SHARE", "communication share of a phase's GPU span",
         "Try NCCL_PROTO (LL, LL128, Simple) and NCCL_ALGO, measuring each with `spectrace compare`; "
         "SGLang's custom all-reduce (do not pass --disable-custom-all-reduce; needs NVLink/P2P), NVLS or "
         "symmetric-memory all-reduce on NVSwitch, or a smaller TP size for this model.", _comm, PIECE,
         _part("comm")),
    Rule("STRAGGLER_RANK", "one rank arriving last at a phase's collectives while the others wait",
         "Find what delays that rank before the phase: its host thread (CPU affinity / NUMA binding, a busy "
         "core, GC), an extra sync or print on that rank only, a slower or throttled GPU (`nvidia-smi -q -d "
         "CLOCK,PERFORMANCE`), uneven work across ranks.", _straggler, CAUSE, _cause),
    Rule("PHASE_IDLE", "GPU idle between a phase's own operations",
         "Between the phase's own operations the GPU ran nothing of it: a launch that came late (eager kernel "
         "launches, host syncs such as `.item()` or DtoH copies, allocations) or a wait on another stream or event; "
         "one instance in the nsys timeline shows which; capture the phase in a CUDA graph or remove the syncs.", _idle, PIECE, _part("idle")),
    Rule("RECURRING_SLOW_CYCLES", "a class of slower cycles that recurs: every N-th cycle, after a prefill or "
         "a batch-size change, or a second mode",
         "Something runs on that schedule: the scheduler's periodic work (metrics or logging every N steps, "
         "memory checks, a periodic sync, allocation or cache flush), or per-batch setup after a prefill. Make it "
         "asynchronous, cheaper or rarer; a CPU-sampled capture (`nsys profile -s cpu`) at those cycles shows "
         "what it is.", _recurring, CAUSE, _cause),
    Rule("LEVEL_SHIFT", "a change of level: from one cycle on, every cycle of a batch size slower by the same amount",
         "Something changed at that cycle and stayed: line its time up with the server's log (a new request mix, a "
         "cache or pool that filled, a background thread or process that started, a frequency or power change); "
         "the piece it sits in says where to look (between cycles: the host's scheduler loop, which a CPU-sampled "
         "capture, `spectrace trace --cpu-sampling`, shows; a phase: its GPU work).", _shift, CAUSE, _cause),
    Rule("STALLS", "rare cycles much slower than the median that do not recur (stalls in time)",
         "Intermittent host stalls (the stalled cycles' extra time is between cycles, where the host launches the "
         "next): Python GC (`gc.freeze()` after warm-up), logging, other processes on the "
         "cores, CPU frequency; line the stalled cycles' times up with a CPU-sampled capture.", _stalls),
    Rule("LEFT_OUT", "a large share of the cycles left out of the steady state",
         "Look at the per-cycle figure: pauses (idle, no requests) or stalls this frequent are part of how the "
         "run behaves; choose the cycles with --window or --skip-cycles 0 to see them in the numbers.", _left_out),
    Rule("WHATIF_STEPS", "a draft-step count the what-if model predicts to be faster",
         "Try --speculative-num-steps at the predicted count (for top-k 1, --speculative-num-draft-tokens = "
         "steps + 1) and measure it against this run with `spectrace compare`.", _whatif),
    Rule("WHATIF_STEPS_PER_BATCH", "different best draft-step counts for different batch sizes",
         "Let SGLang choose the steps per batch size: `spectrace whatif REPORT --sglang-config tiers.json`, then "
         "`--speculative-adaptive --speculative-adaptive-config tiers.json`; measure it against this run with "
         "`spectrace compare`.", _whatif_per_batch),
    Rule("PHASE_MEMORY_BOUND", "a phase over 10 % of the cycle that reads DRAM at >= 60 % of peak with tensor "
         "cores <= 20 % active (GPU-metrics samples)",
         "Extra draft tokens are cheap in verify: try more steps or a larger draft tree (--speculative-num-steps, "
         "--speculative-eagle-topk, --speculative-num-draft-tokens) and measure it with `spectrace compare`; "
         "the weights are read once per forward whatever the token count while the GPU is memory-bound.",
         lambda ctx: _bound(ctx, "memory"), PHASE, _whole_phase),
    Rule("PHASE_COMPUTE_BOUND", "a phase over 10 % of the cycle whose tensor cores are >= 50 % active (or SM "
         "issue >= 60 %) with DRAM read < 60 % of peak (GPU-metrics samples)",
         "Extra draft tokens cost their full weight in verify: fewer steps or a smaller draft tree (or a smaller "
         "batch per step) is more likely to pay; check the what-if and measure with `spectrace compare`.",
         lambda ctx: _bound(ctx, "compute"), PHASE, _whole_phase),
)


def _pt(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.0f} %"


PHASE_SHARE = 0.10  # a phase this share of the cycle (or more) gets a memory-/compute-bound finding


def _bound(ctx: RuleContext, which: str) -> list[RuleHit]:
    """Phases over :data:`PHASE_SHARE` of the cycle whose GPU-metrics samples say ``which`` bound
    (:func:`analyze.compute.utilisation.bound_expr`), over the steady state; where the steady state as a whole is
    mixed, per decode-batch segment (``verify (batch 1)``). Impact: the phase's time per steady cycle in that
    scope. Phases that do not run every cycle (a prefill now and then) are left to the other rules. Nothing without
    GPU-metrics samples."""
    u = utilisation.phases(ctx.res)
    if u.height == 0 or not ctx.period_ns:
        return []
    ncyc = to_float(ctx.cycles["ncyc"].mean() or 0) if ctx.cycles.height else 0.0
    rows = u.filter(pl.col("rank").is_null() & (pl.col("instances") > 0))
    steady_rows = rows.filter(pl.col("scope") == "steady")
    segs = rows.filter(~pl.col("scope").is_in(["steady", "all"]))
    settled = set(steady_rows.filter(pl.col("bound").is_in(["memory", "compute"]))["phase"].to_list())
    out = []
    for r in [*steady_rows.iter_rows(named=True), *segs.iter_rows(named=True)]:
        if r["bound"] != which or (r["scope"] != "steady" and r["phase"] in settled):
            continue
        per_inst = r["sampled_ns"] / max(r["instances"], 1)
        # a phase of the cycle (not a prefill every few hundred cycles) at least PHASE_SHARE of it
        once_a_cycle = r["instances"] + r["short"] >= (0.5 * ncyc if r["scope"] == "steady" else 5)
        if per_inst < PHASE_SHARE * ctx.period_ns or not once_a_cycle:
            continue
        scope = "" if r["scope"] == "steady" else f" ({r['scope']})"
        out.append(RuleHit(
            r["sampled_ns"] / ncyc if ncyc else per_inst,
            (f"{r['phase']}{scope}: DRAM read {_pt(r['dram_read_pct'])} of peak, tensor cores active "
             f"{_pt(r['tensor_active_pct'])}, SMs active {_pt(r['sm_active_pct'])}, SM issue "
             f"{_pt(r['sm_issue_pct'])} ({r['samples']:,} GPU-metrics samples over {r['instances']} "
             f"instances, {_us(per_inst)} each)"),
            phase=f"{r['phase']}{scope}"))
    return out


def severity(share: float) -> str:
    return "high" if share >= HIGH else "medium" if share >= MEDIUM else "low"


@dataclass
class RuleInputs:
    """The steady-state tables the rules read (each a table of its own, kept with the result), made together."""

    cycles: pl.DataFrame  # rank, ncyc: steady cycles per rank
    budget: pl.DataFrame
    phases: pl.DataFrame
    stragglers: pl.DataFrame
    classes: list[anatomy.CycleClass]
    untrusted: set[str]


@view.table(kept=False, releases=(steady_tables.matched, steady_tables.per_collective))
def rule_inputs(res: Result) -> RuleInputs:
    """The steady-state tables the rules read (:class:`RuleInputs`), made before the what-if fit, the biggest
    working set here: the steady matched collectives they are made from are let go of once they are (declared:
    ``releases``), so that the fit and the rest of a document share no large intermediate."""
    ncyc = steady_tables.cycles_per_rank(res).rename({"cycles": "ncyc"})
    budget, phases, stragglers = cycle_budget.budget(res), steady_tables.steady_phases(res), steady_tables.stragglers(res)
    classes = anatomy.cycle_classes(res)
    untrusted = set(steady_tables.matching(res).filter(~pl.col("trusted"))["phase"].to_list())
    return RuleInputs(ncyc, budget, phases, stragglers, classes, untrusted)


def known(res: Result) -> bool:
    """Whether :func:`find` (the default model) has the findings without making them (made in this process, or kept
    with the result in the cache)."""
    return view.known(_findings, res)


def context(res: Result, model: Model | None = None) -> RuleContext:
    """The rules' inputs for one analysed trace (``model``: a fitted what-if model, else one is tried, with its
    per-segment models when the run has several batch sizes)."""
    tables = rule_inputs(res)
    seams = launch_timing(res)
    if model is None:
        from . import whatif

        try:
            model = whatif.fitted(res)
        except InputError:
            model = None
    return RuleContext(res=res, period_ns=float(summary(res).period_ns or 0.0), budget=tables.budget,
                       phases=tables.phases, seams=seams, stragglers=tables.stragglers, info=selection(res),
                       model=model, cycles=tables.cycles, untrusted=tables.untrusted, classes=tables.classes)


def find(res: Result, model: Model | None = None) -> list[Finding]:
    """Ranked findings (:class:`Finding`), biggest impact first; ``model``: a fitted what-if model (else one is
    tried). ``Result.steady.findings`` has them with the default model. With the default model they are a table kept
    with the result (:mod:`analyze.compute.view`): a second command on the same capture reads them."""
    return _findings(res) if model is None else _find(res, model)


@view.table(name="findings")
def _findings(res: Result) -> list[Finding]:
    """:func:`find` with the default model."""
    return _find(res, None)


@view.table(params=("steps_now",))
def findings_at(res: Result, steps_now: int | None) -> list[Finding]:
    """:func:`find` with the what-if model fitted at ``steps_now`` draft steps (:func:`analyze.compute.whatif.fitted`;
    the report's, kept with the result as the model is)."""
    from . import whatif

    return _find(res, whatif.fitted(res, steps_now))


def _what(hit: RuleHit) -> str:
    """How a referral names another finding: its class of cycles and phase (``every 4th cycle, draft``)."""
    return ", ".join(x for x in (hit.cycle_class.label if hit.cycle_class else None, hit.phase) if x)


def _find(res, model) -> list[Finding]:
    ctx = context(res, model)
    if not ctx.period_ns:
        return []
    hits = [(rule, hit) for rule in RULES for hit in rule.check(ctx) if hit.impact_ns / ctx.period_ns >= FLOOR]
    shares = partition(ctx, hits)
    out = []
    for sh in shares:
        rule, hit = sh.rule, sh.hit
        share = sh.ns / ctx.period_ns
        if share < FLOOR:
            continue
        under = tuple({"code": shares[j].rule.code, "phase": shares[j].hit.phase, "rank": shares[j].hit.rank,
                       "ns": ns} for j, ns in sorted(sh.under.items(), key=lambda kv: -kv[1]) if ns > 0)
        evidence = hit.evidence
        if under:
            evidence += "; " + ", ".join(
                f"{_us(float(u['ns'] or 0.0))} of it counted under {u['code']}" + (f" ({w})" if (w := _what(shares[j].hit)) else "")
                for (j, _), u in zip(sorted(sh.under.items(), key=lambda kv: -kv[1]), under, strict=False)) \
                + f": {_us(sh.ns)} per cycle here"
        out.append(Finding(code=rule.code, severity=severity(share), phase=hit.phase,
                           rank=hit.rank, every=hit.every, extra_ns=hit.extra_ns,
                           cycles=hit.cycles, evidence=evidence,
                           action=hit.action or rule.action,
                           impact_ns=sh.ns, share=share,
                           rank_is="worst" if hit.worst else "only" if hit.rank is not None
                           else None, gross_ns=hit.impact_ns,
                           claims=tuple({"piece": k, "ns": v} for k, v in sh.held.items()),
                           counted_under=under))
    return sorted(out, key=lambda f: -f.impact_ns)
