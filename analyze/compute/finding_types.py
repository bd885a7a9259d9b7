"""The values the findings' rules work with (:mod:`analyze.compute.findings`): what a rule reads
(:class:`RuleContext`), what it finds (:class:`RuleHit`), the part of the cycle a hit claims (:class:`Claim`, the
tiers of :func:`analyze.compute.findings.partition`), a rule (:class:`Rule`) and a ranked :class:`Finding`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING

import polars as pl

from ..model import Result
from ..read import results
from . import anatomy
from .steady_cycles import Selection

if TYPE_CHECKING:
    from .whatif_model import Model

__all__ = ["RuleContext", "Finding", "RuleHit", "Claim", "CYCLE", "CAUSE", "PIECE", "PHASE", "WHOLE", "Rule"]


@dataclass
class RuleContext:
    """What the rules read: the steady-state tables of one analysed trace."""

    res: Result
    period_ns: float
    budget: pl.DataFrame
    phases: pl.DataFrame  # per rank, steady
    seams: pl.DataFrame  # seam instances, steady, with launch timing
    stragglers: pl.DataFrame
    info: Selection  # which cycles are the steady state, and why
    model: Model | None  # the what-if model, when it could be fitted
    cycles: pl.DataFrame  # rank, ncyc: steady cycles per rank
    untrusted: set[str]  # phases whose matched collectives do not end together: no straggler or wait findings
    classes: list[anatomy.CycleClass] = field(default_factory=list)  # the slower cycles that recur, rare stalls


@results.cacheable
@dataclass(frozen=True)
class Finding:
    """One ranked finding: what costs cycle time, the evidence, and what to try.

    ``code``: the rule (:data:`RULES`); ``severity``: ``high``/``medium``/``low`` from ``share``, the impact's share
    of the cycle period; ``impact_ns``: the cycle time it explains (ns per cycle); ``phase``/``rank``: where
    (``rank`` None when all ranks are about the same; ``rank_is``: ``worst`` when it holds on several ranks and
    ``rank`` has the most of it, ``only`` when it is about that rank alone); ``every``: N when it happens every
    N-th cycle, with ``extra_ns`` per affected cycle, ``cycles`` of them; ``evidence``; ``action``: what to try.
    Each microsecond is counted once (:func:`partition`): ``impact_ns`` is what is left to this finding of the
    ``gross_ns`` it found after the findings that name a cause took theirs; ``claims``: the budget pieces it holds
    (``piece``, ``ns`` per cycle); ``counted_under``: the findings holding the rest (``code``, ``phase``, ``rank``,
    ``ns``).
    """

    code: str
    severity: str
    phase: str | None
    rank: int | None
    every: int | None
    extra_ns: float | None
    cycles: int | None
    evidence: str
    action: str
    impact_ns: float
    share: float
    rank_is: str | None

    gross_ns: float = 0.0
    claims: tuple[dict, ...] = ()
    counted_under: tuple[dict, ...] = ()

    def to_dict(self) -> dict:
        """The finding as the JSON document has it (``findings`` of ``spectrace analyze --format json``)."""
        return {f.name: (list(v) if isinstance(v := getattr(self, f.name), tuple) else v) for f in fields(self)}


@dataclass(frozen=True)
class RuleHit:
    """What a rule found, before :func:`find` sizes it against the cycle period and makes it a :class:`Finding`
    (the fields of the same name; ``worst``: ``rank`` has the most of it among several ranks, else it is about
    that rank alone; ``action``: in place of the rule's own; ``host_bound``: which of the two gap rules)."""

    impact_ns: float
    evidence: str
    phase: str | None = None
    rank: int | None = None
    worst: bool = False
    every: int | None = None
    extra_ns: float | None = None
    cycles: int | None = None
    action: str | None = None
    host_bound: bool = False
    cycle_class: anatomy.CycleClass | None = None  # the class of slower cycles it is about (its pieces: its claims)


@dataclass(frozen=True)
class Claim:
    """Part of the mean steady cycle a hit says it explains: ``ns`` per cycle (mean over ranks) taken from the
    budget's leaves ``pieces``, in that order (:func:`partition`). A leaf is a cycle-budget piece (``between
    cycles``, a seam ``draft → verify``) or a phase's part (``verify/compute``, ``verify/comm``, ``verify/idle``);
    :data:`CYCLE` is what no other claim took of the cycle period."""

    pieces: tuple[str, ...]
    ns: float


CYCLE = "cycle"  # the leaf of claims that name no piece: the period less what the other findings took
# Tiers of :func:`partition`: a claim that names a cause (a late rank, a class of slower cycles) takes its µs first;
# then the pieces' own rules (the gap, a seam, communication, idle); then a phase's bound; then what names no piece.
CAUSE, PIECE, PHASE, WHOLE = 0, 1, 2, 3


@dataclass(frozen=True)
class Rule:
    code: str
    looks_at: str
    action: str
    check: Callable[[RuleContext], list[RuleHit]]
    tier: int = WHOLE  # :func:`partition`'s order (CAUSE first)
    claims: Callable[[RuleHit], list[Claim]] | None = None  # None: the hit claims CYCLE
