"""Slow-cycle anatomy and segments: what recurs, by how much, where it sits, and the run cut by batch size.

**Classes** (:func:`cycle_classes`): for each class of slower cycles that :mod:`analyze.compute.steady_cycles` found
(every N-th cycle, after a prefill, after a batch-size change, a second mode) and for the rare stalls it left
out: how many cycles, which, the extra time per affected cycle over the typical cycle of its segment, and
where that time sits: the cycle-budget pieces (:func:`analyze.compute.cycle_budget.cycle_pieces`: between
cycles, prefill, each phase and seam) that grew, per rank, from the mean over the affected cycles minus the
mean over the typical steady cycles of the same segments.

When a phase grew on some ranks but not on another whose pieces *before* that phase grew instead, that other
rank arrived late and the first ones waited for it (in the phase's collectives); when the phase has matched
collectives in those cycles, the late rank is the one that caused most of their waiting
(:func:`analyze.compute.straggler.verdict`, the one straggler rule), which overrides the budget's reading. A class with a late rank is a straggler class: "every 4th cycle rank 1
starts draft ≈ 540 µs late; rank 0 waits in draft".

**Segments** (:func:`segments`): the runs of cycles of one decode batch size (the payload's; without a payload,
of the same CUDA graphs replayed, since each batch size has its own graphs) with their steady cycles' period
p50/p90/mean, prefills and mean cycle budget (over all ranks).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import polars as pl

from ..model import Result
from ..read import packed_keys, results
from . import collectives, cycle_budget, steady_tables, straggler, view
from .cycles import selection
from .scalars import to_float, to_int
from .steady_cycles import SlowClass, class_label

__all__ = ["CycleClass", "cycle_classes", "Segment", "segments"]

_GROW = 0.5  # a piece that grew by this share of a class's extra time holds it
_SHOWN = 0.1  # pieces that grew by less than this share of the extra time are not listed


@results.cacheable
@dataclass
class CycleClass:
    """One class of slower cycles and where its extra time sits (JSON: ``cycle_classes``)."""

    id: int | None  # steady's class id; None for the rare stalls left out
    kind: str  # every, prefill, batch change, mode, shift, stall
    label: str
    every: int | None
    offset: int | None
    kept: bool  # in the steady state (a recurring class) or left out (rare stalls)
    slots: int  # cycles in the class (every N: its slots after warm-up)
    affected: int  # of them, slower than the band
    keys: list[int]  # the affected cycles (first 20)
    extra_ns: float  # per affected cycle, over the typical cycle of its segment
    typical_ns: float
    per_cycle_ns: float  # extra_ns × affected / steady cycles: what it adds to the mean period
    rank: int | None  # the late rank (a straggler class), else the rank where the extra time sits most
    phase: str | None  # the phase the other ranks wait in, or the phase that grew
    piece: str | None  # the budget piece that holds most of the extra time (e.g. "between cycles")
    waiting_ranks: list[int] = field(default_factory=list)
    late_ns: float | None = None  # how late the late rank started the phase (growth of its pieces before it)
    wait_ns: float | None = None  # the waiting ranks' growth of the phase
    evidence: str = ""  # "collectives" or "budget"
    pieces: list[dict] = field(default_factory=list)  # rank, segment, kind, class_ns, typical_ns, delta_ns
    text: str = ""
    onset_key: int | None = None  # a level shift (kind ``shift``): its first cycle, and its last when it ends
    until_key: int | None = None

    def as_dict(self) -> dict:
        return asdict(self)


@view.table()
def cycle_classes(res: Result) -> list[CycleClass]:
    """The classes of slower cycles with their anatomy (module docstring), the recurring ones first."""
    info = selection(res)
    c = cycle_budget.main_cycles(res)
    if c.height == 0 or not info.classes and not info.stalls:
        return []
    # Typical cycles: steady, in no class but a level shift's (the normal cycles of their level), weighed per segment
    # and level (``segment`` below: a class's cycles against the typical ones of their own level, so that a cycle of
    # a periodic class after a level shift holds the periodic extra only, and the shift's is the shift's).
    shifts = [cl.id for cl in info.classes if cl.kind == "shift"]
    level = pl.col("level") if "level" in c.columns else pl.lit(0)
    c = c.with_columns(_batch_segment=pl.col("segment"), segment=pl.col("segment") * 1_000 + level.fill_null(0))
    typical = c.filter(pl.col("steady") & (pl.col("cycle_class").is_null() | pl.col("cycle_class").is_in(shifts))
                       & ~pl.col("slow"))
    steady_n = max(c.filter("steady").select("key").unique().height, 1)
    out = []
    groups = [(cl, c.filter((pl.col("cycle_class") == cl.id) & (pl.col("slow") | pl.lit(cl.kind == "shift"))
                            & pl.col("steady")))
              for cl in info.classes]
    if info.stalls:
        n = len(info.stalls)
        st = SlowClass(id=None, kind="stall", every=None, offset=None, slots=n,
                       extra_ns=sum(x.excess_ns for x in info.stalls) / n,
                       typical_ns=sum(x.period_ns - x.excess_ns for x in info.stalls) / n)
        groups.append((st, c.filter(pl.col("key").is_in([s.key for s in info.stalls]))))
    for cl, members in groups:
        if members.height == 0:
            continue
        typ = typical
        if cl.kind == "shift":  # against the level before it, in the same segment (relabelled as the class's)
            seg = to_int(members["segment"].min())
            typ = (typical.filter(pl.col("segment") == seg - 1)
                   .with_columns(segment=pl.lit(seg, c.schema["segment"])))
        out.append(_anatomy(res, cl, members, typ, steady_n))
    return out


def _deltas(res: Result, members: pl.DataFrame, typical: pl.DataFrame) -> pl.DataFrame:
    """Per rank and budget piece: the mean over the class's cycles, the mean over typical cycles of the same
    segments (weighted as the class's cycles fall in them), and the difference (prefill pieces left out: a
    class's extra time is over its cycles' periods without their prefill). One pass over the pieces, joined on
    one packed (rank, cycle) key (:func:`analyze.read.packed_keys.with_key`; on the two columns if they do not
    pack)."""
    typ = typical.filter(pl.col("segment").is_in(members["segment"].unique().implode()))
    if typ.height == 0:
        typ = typical
    pieces = cycle_budget.cycle_pieces(res).filter(pl.col("kind") != "prefill")
    (members, typ, pieces), on = packed_keys.with_key((members, typ, pieces), ["rank", "key"], "_rank_cycle")
    cycle = list(dict.fromkeys([*on, "rank"]))  # the join key and the rank
    roles = pl.concat([members.select(*cycle, seg="segment", role=pl.lit(1)),
                       typ.select(*cycle, seg="segment", role=pl.lit(0))]).unique(on, keep="first")
    # sorted after each group_by: the sums below then add in one order, so the output is the same every run (the
    # pieces' ns and order are whole numbers: summed exactly in any order, so the pieces are not sorted first)
    n = roles.group_by("rank", "role", "seg").agg(_n=pl.len()).sort("rank", "role", "seg")
    p = (pieces.select(*cycle, "segment", "kind", "order", "ns")
         .join(roles.drop([c for c in cycle if c not in on]), on=on)
         .group_by("rank", "role", "seg", "segment", "kind").agg(pl.col("ns").sum(), pl.col("order").mean())
         .join(n, on=["rank", "role", "seg"]).sort("rank", "role", "segment", "kind", "seg"))
    # the class: every one of its cycles counts once; typical: each segment's mean, weighted by the class's share
    w = (n.filter(pl.col("role") == 1).with_columns(_w=pl.col("_n") / pl.col("_n").sum().over("rank"))
         .select("rank", "seg", "_w"))
    typ_segs = n.filter(pl.col("role") == 0).select("rank", "seg")
    w = w.join(typ_segs, on=["rank", "seg"], how="semi").with_columns(_w=pl.col("_w") / pl.col("_w").sum().over("rank"))
    if w.height == 0:  # no typical cycle in the class's segments: every typical cycle's segment, equally
        w = typ_segs.with_columns(_w=1.0 / pl.len().over("rank"))
    nm = n.filter(pl.col("role") == 1).group_by("rank").agg(_m=pl.col("_n").sum())
    mine = (p.filter(pl.col("role") == 1).group_by("rank", "segment", "kind")
            .agg(class_ns=pl.col("ns").sum(), order=pl.col("order").mean())
            .join(nm, on="rank").with_columns(class_ns=pl.col("class_ns") / pl.col("_m")).drop("_m"))
    base = (p.filter(pl.col("role") == 0).join(w, on=["rank", "seg"])
            .group_by("rank", "segment", "kind")
            .agg(typical_ns=(pl.col("ns") / pl.col("_n") * pl.col("_w")).sum(), _o=pl.col("order").mean()))
    return (mine.join(base, on=["rank", "segment", "kind"], how="full", coalesce=True)
            .with_columns(pl.col("class_ns", "typical_ns").fill_null(0.0), order=pl.coalesce("order", "_o"),
                          segment=pl.col("segment").cast(pl.String), kind=pl.col("kind").cast(pl.String))
            .drop("_o").with_columns(delta_ns=pl.col("class_ns") - pl.col("typical_ns"))
            .sort("rank", "order", "segment"))


def _anatomy(res: Result, cl: SlowClass, members: pl.DataFrame, typical: pl.DataFrame, steady_n: int) -> CycleClass:
    keys = members.select("key").unique().sort("key")["key"].to_list()
    extra, typical_ns = float(cl.extra_ns or 0.0), float(cl.typical_ns or 0.0)
    d = _deltas(res, members, typical)
    ranks = sorted(d["rank"].unique().to_list())
    label = class_label(cl) if cl.kind != "stall" else "rare stalls (left out)"
    kept = cl.kind != "stall"
    out = CycleClass(id=cl.id, kind=cl.kind, label=label, every=cl.every, offset=cl.offset,
                     kept=kept, slots=int(cl.slots or len(keys)), affected=len(keys), keys=keys[:20],
                     extra_ns=extra, typical_ns=typical_ns,
                     per_cycle_ns=extra * len(keys) / steady_n if kept else 0.0,
                     rank=None, phase=None, piece=None, onset_key=getattr(cl, "onset_key", None),
                     until_key=getattr(cl, "until_key", None))
    floor = max(abs(extra), 1.0)
    out.pieces = (d.filter(pl.col("delta_ns").abs() >= _SHOWN * floor)
                  .select("rank", "segment", "kind", "class_ns", "typical_ns", "delta_ns").to_dicts())
    # The piece that holds most of it (mean over ranks), and the rank where it sits most.
    by_piece = d.group_by("segment", "kind").agg(pl.col("delta_ns").mean()).sort("delta_ns", descending=True)
    if by_piece.height:
        out.piece = by_piece["segment"][0]
    _late_rank(res, out, d, members, ranks, extra)
    if out.rank is None and len(ranks) > 1:
        tot = d.filter(pl.col("delta_ns") > 0).group_by("rank").agg(pl.col("delta_ns").sum()).sort(
            "delta_ns", "rank", descending=[True, False])
        if tot.height and (tot.height == 1 or tot["delta_ns"][1] < _GROW * tot["delta_ns"][0]):
            out.rank = int(tot["rank"][0])
    elif out.rank is None:
        out.rank = ranks[0] if ranks else None
    if out.phase is None:
        top = by_piece.filter(pl.col("kind") == "phase")
        if top.height and top["delta_ns"][0] >= _GROW * floor:
            out.phase = top["segment"][0]
    out.text = _describe(out)
    return out


def _late_rank(res: Result, out: CycleClass, d: pl.DataFrame, members: pl.DataFrame, ranks: list, extra: float) -> None:
    """Set the late rank, the phase the others wait in and the waiting ranks (module docstring): the phase is
    the one whose span grew most on some rank; its matched collectives in these cycles, when it has any, name the
    rank that caused the waiting, else the rank whose pieces before the phase grew while the phase did not."""
    if len(ranks) < 2 or extra <= 0:
        return
    ph = d.filter(pl.col("kind") == "phase")
    if ph.height == 0:
        return
    grow = ph.group_by("segment").agg(pl.col("delta_ns").max(), order=pl.col("order").mean()).sort(
        "delta_ns", descending=True)
    if grow["delta_ns"][0] < _GROW * extra:
        return
    phase, order = grow["segment"][0], grow["order"][0]
    mine = ph.filter(pl.col("segment") == phase)
    waiting = sorted(mine.filter(pl.col("delta_ns") >= _GROW * extra)["rank"].to_list())
    before = (d.filter(pl.col("order") < order).group_by("rank").agg(pre=pl.col("delta_ns").sum())
              .join(mine.select("rank", "delta_ns"), on="rank", how="left"))
    cand = before.filter(~pl.col("rank").is_in(waiting)).sort("pre", "rank", descending=[True, False])
    late = int(cand["rank"][0]) if cand.height and cand["pre"][0] >= _GROW * extra else None
    evidence = "budget"
    st = _class_stragglers(res, members, phase)
    if st is not None:
        v = straggler.verdict(st)  # over the class's cycles: the share rule (no cycle period to weigh against)
        if v.height:
            late, evidence = int(v["rank"][0]), "collectives"
            waiting = [r for r in waiting if r != late] or [r for r in ranks if r != late]
    if late is None:
        return
    pre = before.filter(pl.col("rank") == late)["pre"]
    out.rank, out.phase, out.waiting_ranks, out.evidence = late, phase, waiting, evidence
    out.late_ns = float(pre[0]) if pre.len() else None
    w = mine.filter(pl.col("rank").is_in(waiting))["delta_ns"]
    out.wait_ns = to_float(w.mean()) if w.len() else None


def _class_stragglers(res: Result, members: pl.DataFrame, phase: str) -> pl.DataFrame | None:
    """:func:`collectives.stragglers` over the matched collectives of ``phase`` in the class's cycles (None without
    any, or when the phase's collectives do not end together)."""
    if phase in steady_tables.matching(res).filter(~pl.col("trusted"))["phase"].to_list():
        return None
    m = steady_tables.matched(res)
    m = m.filter(pl.col("phase") == phase) if m.height else m
    if m.height == 0:
        return None
    inst = steady_tables.instances_marked_steady(res)
    inside = packed_keys.semi_join(inst.select("rank", "range_id", "top", "range").filter(pl.col("range") == phase),
                                   members.select("rank", top="range_id"), ["rank", "top"])
    m = packed_keys.semi_join(m, inside, ["rank", "range_id"])
    return collectives.stragglers(m) if m.height else None


def _us(ns: float | None) -> str:
    return "–" if ns is None else f"{ns / 1e3:,.1f} µs"


def _keys(keys: list[int], n: int) -> str:
    return ", ".join(str(k) for k in keys[:5]) + (" …" if n > 5 else "")


def _describe(c: CycleClass) -> str:
    """One sentence: which cycles, how much slower, where, and who was late (when one rank was)."""
    head = f"{c.label}: {c.affected} cycle{'s' if c.affected != 1 else ''} ({_keys(c.keys, c.affected)}) " \
           f"+{_us(c.extra_ns)} each"
    if c.waiting_ranks and c.rank is not None:
        w = ", ".join(str(r) for r in c.waiting_ranks)
        how = "in its collectives" if c.evidence == "collectives" else "its span grew"
        return (f"{head}: rank {c.rank} starts {c.phase} ≈ {_us(c.late_ns)} late; rank{'s' if len(c.waiting_ranks) > 1 else ''}"
                f" {w} wait{'s' if len(c.waiting_ranks) == 1 else ''} in {c.phase} (+{_us(c.wait_ns)}, {how})")
    where = c.piece or "the cycle"
    grown = [p for p in c.pieces if p["segment"] == where]
    on = ""
    if grown:
        top = max(grown, key=lambda p: p["delta_ns"])
        on = f" (+{_us(top['delta_ns'])}" + (f" on rank {c.rank})" if c.rank is not None else ")")
    return f"{head}, in {where}{on}"


@results.cacheable
@dataclass
class Segment:
    """A run of cycles of one decode batch size (JSON: ``segments``)."""

    segment: int
    key: str  # "batch 4" (the payload's batch size), or "graphs 2+5" (the CUDA graphs its cycles replayed)
    batch_size: int | None  # from the payload; None when the segment is known by its graphs
    first_cycle: int
    last_cycle: int
    cycles: int  # steady cycles with a period, all ranks
    prefills: int  # prefill batches that ran before its cycles (per rank, max)
    period_p50_ns: float | None
    period_p90_ns: float | None
    period_mean_ns: float | None
    budget: list[dict] = field(default_factory=list)  # segment (piece), kind, ns, share: mean over its cycles

    def as_dict(self) -> dict:
        return asdict(self)


@view.table()
def segments(res: Result) -> list[Segment]:
    """The run cut into segments of one batch size (module docstring); none when the payload has no batch size."""
    info = selection(res)
    if not info.segments:
        return []
    c = cycle_budget.main_cycles(res)
    out = []
    one = len(info.segments) == 1
    for sg in info.segments:
        mine = c.filter(pl.col("segment") == sg.segment)
        st = mine.filter("steady")
        p = st["period_ns"]
        # one segment is the whole steady state: its budget is the headline budget's mean over ranks
        b = (cycle_budget.budget(res).group_by("segment", "kind").agg(pl.col("order").mean(), pl.col("ns").mean(),
                                                                  pl.col("share").mean()).sort("order")
             if one else cycle_budget.mean_budget(res, st.select("rank", "key"), by_rank=False))
        out.append(Segment(
            segment=sg.segment, key=sg.key or "all",
            batch_size=sg.batch_size, first_cycle=sg.first_key, last_cycle=sg.last_key, cycles=st.height,
            prefills=to_int(mine.group_by("rank").agg(pl.col("prefills").sum())["prefills"].max() or 0),
            period_p50_ns=to_float(p.median()) if p.len() else None,
            period_p90_ns=to_float(p.quantile(0.9, "nearest")) if p.len() else None,
            period_mean_ns=to_float(p.mean()) if p.len() else None,
            budget=b.select("segment", "kind", "ns", "share").to_dicts()))
    return out
