"""The steady state of an analysed trace, as one object: ``res.steady`` (:attr:`analyze.model.Result.steady`).

Everything ``spectrace analyze`` prints over the steady cycles (warm-up and rare stalls left out, what recurs
kept: :mod:`analyze.compute.steady_cycles`) is an attribute of :class:`SteadyState`: the cycle budget, the phases
and seams per instance, the tokens, the slower cycles, the segments of one batch size, the stragglers, the ranked
findings and the GPU utilisation. Each attribute calls the function that computes it
(:mod:`analyze.compute.steady_tables`, :mod:`~analyze.compute.cycle_budget`, :mod:`~analyze.compute.tokens`,
:mod:`~analyze.compute.anatomy`, :mod:`~analyze.compute.findings`, :mod:`~analyze.compute.utilisation`); each is a
derived table
(:mod:`analyze.compute.view`), made once per result and cycle choice, so that the CLI, the report and a
notebook share the tables.

A :class:`SteadyState` holds nothing but its :class:`~analyze.model.Result`: ``res.steady`` builds one on each
access (the class is attached to the Result by :func:`analyze.api.analyze`, the model layer does not import
this one), and ``SteadyState(res)`` works on any Result, one built by hand too. The cycle choice is the
Result's (``analyze(..., skip_cycles=, window=)``).
"""

from __future__ import annotations

import polars as pl

from ..model import Result
from . import anatomy, cycle_budget, findings, host_gaps, steady_tables, utilisation
from .anatomy import CycleClass, Segment
from .cycles import cycles, selection
from .findings import Finding
from .host_gaps import HostGaps
from .steady_cycles import Selection
from .tokens import Tokens, summary

__all__ = ["SteadyState"]


class SteadyState:
    """The steady-state view of one analysed trace (module docstring): ``res.steady.phases``, ``.budget``, ..."""

    def __init__(self, res: Result):
        self.result = res

    def __repr__(self) -> str:
        return f"SteadyState({self.selection['text']!r})"

    @property
    def selection(self) -> Selection:
        """Which cycles are the steady state and why (:class:`~analyze.compute.steady_cycles.Selection`): ``text``
        (the sentence ``analyze`` prints, also ``selection["text"]``), ``how``, counts, stalls, classes, segments."""
        return selection(self.result)

    @property
    def cycles(self) -> pl.DataFrame:
        """Every cycle per rank (``rank, key, kind, period_ns, tokens, ...``) with ``steady`` flagging the kept ones."""
        return cycles(self.result)

    @property
    def tokens(self) -> Tokens:
        """The cycle period (mean, p50, p90), tokens per cycle, tokens/s and the acceptance over the steady cycles."""
        return summary(self.result)

    def tokens_with_steps(self, steps: int | None) -> Tokens:
        """:attr:`tokens` for a trace whose number of draft steps is known to the caller only (no manifest)."""
        return summary(self.result, steps=steps)

    @property
    def budget(self) -> pl.DataFrame:
        """Where one steady cycle goes, per rank: ``rank, segment, kind, ns, share, gpu_idle_ns`` (the pieces add
        up to the cycle period)."""
        return cycle_budget.budget(self.result)

    @property
    def phases(self) -> pl.DataFrame:
        """Per rank and phase: sums, per-instance mean/p50/p90 of span, compute, comm and idle, the comm
        wait/transfer split."""
        return steady_tables.steady_phases(self.result)

    @property
    def phases_all(self) -> pl.DataFrame:
        """Per phase over all ranks (``ranks``: how many had it)."""
        return steady_tables.steady_phases_all_ranks(self.result)

    @property
    def seams(self) -> pl.DataFrame:
        """Per rank and seam (``parent, from, to``): the idle between consecutive phases, with what bound it."""
        return steady_tables.steady_seams(self.result)

    @property
    def seams_all(self) -> pl.DataFrame:
        """Per seam over all ranks."""
        return steady_tables.steady_seams_all_ranks(self.result)

    @property
    def instances(self) -> pl.DataFrame:
        """Every range instance with ``steady`` (in a steady cycle) and its cycle ``key``."""
        return steady_tables.instances_marked_steady(self.result)

    @property
    def kernels(self) -> pl.DataFrame:
        """GPU operations per phase, all ranks, biggest first, with per-cycle time and count."""
        return steady_tables.kernels(self.result)

    @property
    def stragglers(self) -> pl.DataFrame:
        """Per phase and rank: last arrivals at matched collectives and the waiting they caused."""
        return steady_tables.stragglers(self.result)

    @property
    def straggler(self) -> pl.DataFrame:
        """The straggler of each phase (the one ``analyze``, ``comm``, ``compare`` and the report name), with
        ``per_cycle_ns``; no row when no rank makes the others wait enough."""
        return steady_tables.straggler_verdict(self.result)

    @property
    def cycle_classes(self) -> list[CycleClass]:
        """The slower cycles: classes that recur (kept, described) and the rare stalls (left out)."""
        return anatomy.cycle_classes(self.result)

    @property
    def host_gaps(self) -> HostGaps:
        """What the launching thread did in the host-bound gaps (between cycles, host-bound seams): per rank, gap and
        item (host range, CUDA API call kind, unattributed), µs per steady cycle; per segment, per class of slower
        cycles, and the CPU samples' top frames (:mod:`analyze.compute.host_gaps`)."""
        return host_gaps.host_gaps(self.result)

    @property
    def segments(self) -> list[Segment]:
        """The run cut into segments of one decode batch size (none without a batch size in the payload)."""
        return anatomy.segments(self.result)

    @property
    def findings(self) -> list[Finding]:
        """The ranked findings, biggest impact first (:func:`analyze.compute.findings.find`, with the what-if
        model fitted on this trace when it can be)."""
        return findings.find(self.result)

    @property
    def utilisation(self) -> pl.DataFrame:
        """GPU-metrics samples per phase (percent of peak, ``bound``); empty without ``--gpu-metrics``."""
        return utilisation.phases(self.result)

    @property
    def utilisation_seams(self) -> pl.DataFrame:
        """GPU-metrics samples over the seams; empty without ``--gpu-metrics``."""
        return utilisation.seams(self.result)
