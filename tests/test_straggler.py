"""The one straggler rule (:mod:`analyze.compute.straggler`) on hand-made rows, and the shapes of its tables.

Each phase below is built so that exactly one threshold decides it; the expected verdicts are worked out in the
comments, not by the code under test.
"""

from __future__ import annotations

import polars as pl
import pytest

from analyze import analyze
from analyze.compute import steady_tables, straggler
from tests.helpers.paths import tp2


def rows(*r: tuple) -> pl.DataFrame:
    """``collectives.stragglers``-shaped rows: (phase, rank, collectives, caused_wait_ns, wait_share)."""
    return pl.DataFrame([{"domain": "d", "phase": p, "rank": k, "collectives": n, "last_arrivals": 1, "share": 0.5,
                          "mean_delay_ns": 1, "total_delay_ns": 1, "max_delay_ns": 1, "caused_wait_ns": w,
                          "wait_share": s} for p, k, n, w, s in r], schema=straggler.STRAGGLERS)


ST = rows(
    ("a", 0, 10, 600, 0.6), ("a", 1, 10, 400, 0.4),  # rank 0 caused 60 %: the straggler
    ("b", 1, 10, 500, 0.5), ("b", 0, 10, 500, 0.5),  # a tie at exactly half: the lower rank, named (>= half)
    ("c", 0, 10, 400, 0.4), ("c", 1, 10, 350, 0.35),  # nobody caused half: none
    ("e", 1, 4, 900, 0.9),  # 4 collectives only: named, but not by a finding
    (None, 0, 3, 800, 1.0),  # outside any phase: never named
    ("f", 0, 10, 0, 0.0),  # no waiting: none
)


def test_the_share_rule_alone():
    v = straggler.verdict(ST)
    assert v.select("phase", "rank").rows() == [("a", 0), ("b", 0), ("e", 1)]
    assert v.schema == straggler.STRAGGLERS


def test_over_the_steady_cycles_the_floor_and_the_untrusted_phases():
    # 100 cycles of 10 µs: the floor is 1 % of 10,000 ns = 100 ns of waiting per cycle, i.e. 10,000 ns in all...
    assert straggler.verdict(ST, straggler.PerCycle(100, 10_000.0)).height == 0  # ... which no phase reaches
    # 4 cycles: a 600/4 = 150, b 125, e 225 ns per cycle, all at least 100
    v = straggler.verdict(ST, straggler.PerCycle(4, 10_000.0))
    assert v.select("phase", "rank", "per_cycle_ns").rows() == [("a", 0, 150.0), ("b", 0, 125.0), ("e", 1, 225.0)]
    # 5 cycles: b's 500 / 5 = 100 ns is exactly the floor (kept), a 120, e 180
    assert straggler.verdict(ST, straggler.PerCycle(5, 10_000.0))["phase"].to_list() == ["a", "b", "e"]
    # 6 cycles: b 83.3 ns is below it
    assert straggler.verdict(ST, straggler.PerCycle(6, 10_000.0))["phase"].to_list() == ["a", "e"]
    assert straggler.verdict(ST, straggler.PerCycle(4, 10_000.0), untrusted={"a"})["phase"].to_list() == ["b", "e"]
    assert v.schema == straggler.VERDICT


def test_a_finding_needs_enough_collectives():
    v = straggler.verdict(ST, straggler.PerCycle(4, 10_000.0), min_collectives=straggler.MIN_COLLECTIVES)
    assert v["phase"].to_list() == ["a", "b"]  # e has 4 < 5


def test_an_empty_verdict_has_the_columns_of_a_full_one():
    assert straggler.verdict(ST.head(0)).schema == straggler.STRAGGLERS
    assert straggler.verdict(ST.head(0), straggler.PerCycle(4, 1.0)).schema == straggler.VERDICT
    assert straggler.verdict(ST, straggler.PerCycle(100, 1e9)).schema == straggler.VERDICT  # all dropped


@pytest.fixture(scope="module")
def straggling(tmp_path_factory):
    return analyze(tp2("tp2_straggler", tmp_path_factory.mktemp("straggler")), cache=False)


def test_the_steady_tables_have_one_shape_with_and_without_collectives(straggling):
    from nvtx_hooks.capture import samples

    alone = analyze(samples.path("tp1_graph"))  # one H200: no collective matched across ranks
    assert steady_tables.stragglers(alone).height == 0 and steady_tables.stragglers(straggling).height
    for res in (straggling, alone):
        assert steady_tables.stragglers(res).schema == straggler.STRAGGLERS
        assert steady_tables.straggler_verdict(res).schema == straggler.VERDICT
    # the capture's injected delay: rank 1 sleeps 500 µs before every verify (tests/data/h200_tp2/README.md)
    assert steady_tables.straggler_verdict(straggling).select("phase", "rank").rows() == [("verify", 1)]
