"""Each microsecond once (issue 37 item 4): on every bundled capture (tests/data/h200_tp1, tests/data/h200_tp2, the
shared real TP2 traces and the TP2 straggler shapes bench/inject.py builds) the findings partition the mean steady
cycle: each finding's ``claims`` add up to its ``impact_ns``; no budget leaf (a piece of the cycle budget, or a
phase's compute, communication or idle) is claimed past its size (the budget recomputed here from
``cycle_budget.budget``, mean over ranks); all findings together never exceed the cycle period."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import polars as pl
import pytest

from analyze import analyze
from analyze.compute import cycle_budget, findings
from analyze.compute.tokens import summary
from nvtx_hooks.capture import samples
from tests.helpers.paths import TRACES, tp2

ROOT = Path(__file__).parents[1]
TP1 = sorted(p.name.removesuffix(".sqlite.xz") for p in (ROOT / "tests/data/h200_tp1").glob("*.sqlite.xz"))
TP2 = sorted(p.name.removesuffix(".sqlite.xz") for p in (ROOT / "tests/data/h200_tp2").glob("*.sqlite.xz"))
SHARED = sorted(p.name for p in TRACES.glob("*.sqlite")) if TRACES.exists() else []
SHAPES = {"every4_draft": ("tp2_s3_node", ["1:draft:4:0:590"]),
          "every4_graph": ("tp2_s3_graph", ["1:draft:4:0:500"]),
          "two_stragglers": ("tp2_s3_node", ["1:draft:4:0:500", "0:verify:3:1:300"])}


def leaf_sizes(res) -> dict[str, float]:
    """The mean steady cycle's leaves over the ranks (ns per cycle), from the budget, independently of findings."""
    b = cycle_budget.budget(res)
    out: dict[str, float] = {findings.CYCLE: float(summary(res).period_ns or 0.0)}
    per = defaultdict(list)
    for r in b.iter_rows(named=True):
        per[(r["segment"], r["kind"])].append(r)
    for (seg, kind), rows in per.items():
        def mean(col: str, rows: list = rows) -> float:
            return sum(float(r[col] or 0.0) for r in rows) / len(rows)
        if kind == "phase" and rows[0]["compute_ns"] is not None:
            for part in ("compute", "comm", "idle"):
                out[f"{seg}/{part}"] = max(mean(f"{part}_ns"), 0.0)
        else:
            out[seg] = max(mean("ns"), 0.0)
    return out


def check_partition(res) -> list:
    found = findings.find(res)
    period = float(summary(res).period_ns or 0.0)
    if not found:
        return found
    sizes = leaf_sizes(res)
    held: dict[str, float] = defaultdict(float)
    for f in found:
        assert f.impact_ns == pytest.approx(sum(c["ns"] for c in f.claims), rel=1e-9, abs=1e-6), f
        assert f.impact_ns <= f.gross_ns + 1e-6
        for c in f.claims:
            assert c["ns"] > 0
            held[c["piece"]] += c["ns"]
    for piece, ns in held.items():
        if piece != findings.CYCLE:
            assert piece in sizes, (piece, sorted(sizes))
            assert ns <= sizes[piece] * (1 + 1e-9) + 1e-6, (piece, ns, sizes[piece])
    assert sum(f.impact_ns for f in found) <= period * (1 + 1e-9) + 1e-6
    assert [f.impact_ns for f in found] == sorted((f.impact_ns for f in found), reverse=True)
    return found


# A few of every kind in `make test` (recurring classes, a level shift, random stalls, serving segments, GPU metrics,
# eager launches); every capture in `make test-all` (about 2 CPU-minutes more: the slow mark).
FAST = {"tp1_sched_shift", "tp1_sched_stalls", "tp1_stall_every5", "tp1_delay_every4", "tp1_serve_graph",
        "tp1_gpumetrics_graph", "tp1_eager", "tp2_s3_node", "tp2_nccl_simple"}


def _sweep(names: list) -> list:
    return [n if (n.values[0] if hasattr(n, "values") else n) in FAST else
            pytest.param(*(n.values if hasattr(n, "values") else (n,)),
                         marks=[*getattr(n, "marks", ()), pytest.mark.slow])  # every bundled capture: make test-all
            for n in names]


@pytest.mark.parametrize("name", _sweep(TP1))
def test_partition_on_every_tp1_capture(name):
    check_partition(analyze(samples.path(name)))


@pytest.mark.parametrize("name", _sweep(TP2))
def test_partition_on_every_tp2_capture(name, tmp_path):
    check_partition(analyze(tp2(name, tmp_path)))


@pytest.mark.parametrize("name", SHARED)
def test_partition_on_the_shared_traces(name):
    check_partition(analyze(TRACES / name))


@pytest.fixture(scope="module")
def shapes(tmp_path_factory):
    from bench.inject import inject

    d = tmp_path_factory.mktemp("shapes")
    out = {}
    for name, (src, specs) in SHAPES.items():
        out[name] = d / f"{name}.sqlite"
        inject(tp2(src, d), out[name], specs)
    return out


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_partition_on_the_built_straggler_shapes(shapes, name):
    check_partition(analyze(shapes[name]))


def test_the_straggler_counted_once(shapes):
    """Rank 1 starts draft ≈ 590 µs late every 4th cycle: the straggler holds its µs (the late rank's gap and the
    waiting rank's draft) and the gap finding refers to it for the part of the gap that is the straggler's
    (issue 37: both counted the same µs, the gap 503 "of which 141.6 from every 4th cycle" and the straggler 141.6)."""
    res = analyze(shapes["every4_draft"])
    found = check_partition(res)
    (st,) = [f for f in found if f.code == "STRAGGLER_RANK"]
    assert (st.rank, st.phase, st.every) == (1, "draft", 4)
    assert st.impact_ns == pytest.approx(st.gross_ns)  # a cause: nothing of it is anyone else's
    # its µs sit where the budget grew: rank 1's gap between cycles and rank 0's draft
    pieces = {c["piece"].split("/")[0] for c in st.claims}
    assert pieces == {cycle_budget.GAP, "draft"}, st.claims
    # every 4th cycle 590 µs late: 590 / 4 per cycle, within 20 %
    assert st.impact_ns == pytest.approx(590e3 / 4, rel=0.2)
    (gap,) = [f for f in found if f.code == "GAP_HOST_BOUND"]
    assert gap.counted_under and gap.counted_under[0]["code"] == "STRAGGLER_RANK"
    in_gap = sum(c["ns"] for c in st.claims if c["piece"] == cycle_budget.GAP)
    assert gap.gross_ns - gap.impact_ns == pytest.approx(in_gap)
    assert "counted under STRAGGLER_RANK (every 4th cycle, draft)" in gap.evidence


def test_partition_resolves_tiers_on_a_hand_made_budget():
    """Two claims on one leaf: the cause takes its ns first; the piece's rule keeps the rest and refers to it; a
    claim on the whole cycle takes only what the others left of the period."""
    from analyze.compute.finding_types import CAUSE, PIECE, WHOLE, Claim, Rule, RuleContext, RuleHit
    from analyze.compute.findings import partition

    budget = pl.DataFrame({"rank": [0, 1, 0, 1], "segment": ["between cycles"] * 2 + ["draft"] * 2,
                           "kind": ["gap", "gap", "phase", "phase"], "ns": [400.0, 600.0, 500.0, 500.0],
                           "compute_ns": [None, None, 300.0, 400.0], "comm_ns": [None, None, 200.0, 100.0],
                           "idle_ns": [400.0, 600.0, 0.0, 0.0]})
    ctx = RuleContext(res=None, period_ns=1500.0, budget=budget, phases=pl.DataFrame(), seams=pl.DataFrame(),
                      stragglers=pl.DataFrame(), info=None, model=None, cycles=pl.DataFrame(), untrusted=set())
    gap = Rule("GAP", "", "", lambda c: [], PIECE, lambda h: [Claim(("between cycles",), h.impact_ns)])
    cause = Rule("CAUSE", "", "", lambda c: [], CAUSE,
                 lambda h: [Claim(("between cycles",), 100.0), Claim(("draft/comm", "draft/compute"), 200.0)])
    whole = Rule("WHOLE", "", "", lambda c: [], WHOLE, None)
    shares = partition(ctx, [(gap, RuleHit(500.0, "")), (whole, RuleHit(2000.0, "")), (cause, RuleHit(300.0, ""))])
    g, w, c = shares
    assert c.held == {"between cycles": 100.0, "draft/comm": 150.0, "draft/compute": 50.0}
    assert g.held == {"between cycles": 400.0} and g.under == {2: 100.0}
    assert w.held == {findings.CYCLE: 1500.0 - 400.0 - 300.0}
