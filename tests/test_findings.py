"""Findings on hand-computed synthetic traces (tests/helpers/eagle_synth.py): each rule's hit, impact and rank."""

from __future__ import annotations

import re

import pytest

from analyze import analyze
from analyze.compute import anatomy, findings, nccl_evidence
from analyze.compute.whatif_fit import fit
from tests.helpers import eagle_synth as es

PERIODS = [30_000, 20_000] + [10_000] * 5 + [25_000] + [10_000] * 3
STARTS = [10_000 + sum(PERIODS[:i]) for i in range(12)]
STEADY = [3, 4, 5, 6, 7, 9, 10, 11]  # cycle k's period is the start gap before it: 0-2 warm-up, 8 a rare stall
TOKENS = [es.ACCEPT[i % 4] + es.BATCH for i in range(12)]


def by_code(found):
    out: dict = {}
    for f in found:
        out.setdefault(f.code, []).append(f)
    return out


@pytest.fixture(scope="module")
def res(tmp_path_factory):
    return analyze(es.eagle(tmp_path_factory.mktemp("fd") / "w.sqlite", cycles=12, starts=STARTS))


def test_rules_on_the_synthetic_cycle(res):
    found = findings.find(res)
    f = by_code(found)
    # gap between cycles: last op at +7100, next cycle's first at +10 000 → 3900 of 10 000 ns; the next cycle's
    # first launch call (+200) comes after the last op: host-bound; the same on both ranks
    gap = f["GAP_HOST_BOUND"][0]
    assert (gap.impact_ns, gap.severity, gap.rank, gap.phase) == (3_900, "high", None, None)
    assert "GAP_GPU_BOUND" not in f
    # seams: every next phase was launched (API at +1100/+2100/+3100) before the earlier one's GPU work ended,
    # so the GPU-side wait is "blocked": draft→verify 2500 − (1600 + w): 400 (rank 0), 800 (rank 1)
    seams = {x.phase: x for x in f["SEAM_BLOCKED_LAUNCH"]}
    dv = seams["draft → verify"]
    assert (dv.impact_ns, dv.rank, dv.rank_is, dv.severity) == (600, 1, "worst", "medium")
    ext = sum(100 + 25 * TOKENS[i] for i in STEADY) / len(STEADY)  # draft_extend span over the steady cycles
    assert seams["draft_extend → host_overhead"].impact_ns == pytest.approx(1_400 - ext)
    assert seams["verify → draft_extend"].impact_ns == 100 and "SEAM_HOST_BOUND" not in f
    # draft: comm 500 + 100 of span 1100 + 700 (33 %); no wait (both ranks start together): impact = transfer
    c = f["COMM_SHARE"][0]
    assert (c.phase, c.impact_ns, c.severity) == ("draft", 300, "medium")
    # one rare stall of 25 000 against a median of 10 000: 15 000 over 8 steady cycles
    assert f["STALLS"][0].impact_ns == pytest.approx(15_000 / 8)
    assert "RECURRING_SLOW_CYCLES" not in f and f["STALLS"][0].every is None
    assert "STRAGGLER_RANK" not in f and "PHASE_IDLE" not in f
    # ranked by impact, severity from the share of the 10 000 ns cycle
    assert [x.impact_ns for x in found] == sorted((x.impact_ns for x in found), reverse=True)
    assert all(x.share == pytest.approx(x.impact_ns / 10_000) for x in found)
    assert all(set(x.to_dict()) >= {"code", "severity", "phase", "rank", "evidence", "action"} for x in found)
    assert all(x.action == next(r.action for r in findings.RULES if r.code == x.code)
               for x in found if x.code not in ("COMM_SHARE", "SEAM_BLOCKED_LAUNCH", "GAP_HOST_BOUND"))
    # the stall's extra time is between cycles (where the host launches the next): the host-stall advice
    (where,) = [c for c in anatomy.cycle_classes(res) if c.kind == "stall"]
    assert where.piece == "between cycles" and f["STALLS"][0].action.startswith("Intermittent host stalls")
    # node-level graph tracing is advised about only on a node-level capture
    node = res.trace.graph_trace_mode == "Node"
    assert all(("traced CUDA graphs node by node" in x.action) == node for x in f["SEAM_BLOCKED_LAUNCH"])
    # the draft's all-reduce kernel is ..._RING_LL and nothing recorded the environment: the protocol is unknown
    # (NCCL names the kernel ..._RING_LL under Simple too), the advice holds for any of them
    assert c.action.startswith("The NCCL protocol this run used is unknown") and "LL protocol" not in c.action
    # no host range or CPU sample: the gap's host time is unattributed, and the advice says how to name it
    assert "SGLANG_ENABLE_NVTX_SCHEDULER=1" in gap.action and "--cpu-sampling" in gap.action


def test_whatif_finding_follows_the_model(res):
    m = fit(res)
    best, now = m.best(measured_only=True), m.predict(m.steps_now)  # never an extrapolated step count
    f = by_code(findings.find(res, m)).get("WHATIF_STEPS")
    gain = best.tokens_per_s / now.tokens_per_s - 1
    if best.steps == m.steps_now or gain < findings.GAIN:
        assert f is None
    else:
        assert f[0].impact_ns == pytest.approx(gain * 10_000) and f"{best.steps} draft steps" in f[0].evidence


def test_straggler_rank(tmp_path):
    r = analyze(es.eagle(tmp_path / "s.sqlite", cycles=8, straggler=600))
    f = by_code(findings.find(r))
    s = f["STRAGGLER_RANK"][0]
    # rank 1 starts every draft all-reduce 600 ns after rank 0, which waits 600 ns per cycle
    assert (s.rank, s.phase, s.impact_ns, s.rank_is) == (1, "draft", 600, "only")
    assert "8 of 8" in s.evidence


def test_phase_idle_and_gpu_bound_gap(tmp_path):
    """Idle inside a phase, and a gap between cycles whose next cycle was launched before the GPU finished."""
    from tests.helpers.synth import Synth

    path = tmp_path / "i.sqlite"
    s = Synth(path, duration=200_000)
    corr = 0
    for i in range(8):
        b = 10_000 + 10_000 * i
        s.range(100, 100, "cycle", b, b + 9_000)
        s.range(100, 100, "verify", b + 100, b + 8_000)
        # two kernels inside verify, 2000 apart (span 9200, idle 2000); the second runs past the cycle's end,
        # until b + 10 200, after the next cycle's first launch call (b + 10 150)
        for api, (k0, k1) in ((b + 150, (1_000, 2_500)), (b + 300, (4_500, 10_200))):
            corr += 1
            s.launch(100, 100, "cudaLaunchKernel_v7000", (api, api + 50), corr, [(b + k0, b + k1, "gemm")])
    r = analyze(s.save(), ranges="cycle|verify")
    f = by_code(findings.find(r))
    idle = f["PHASE_IDLE"][0]
    assert (idle.phase, idle.impact_ns, idle.rank, idle.severity) == ("verify", 2_000, 0, "high")
    # gap: last op at +10 200, next first at +11 000 → 800; the next cycle's first launch (+10 150) came before
    # the last op ended → the wait is on the GPU side
    g = f["GAP_GPU_BOUND"][0]
    assert (g.impact_ns, g.severity) == (800, "medium") and "GAP_HOST_BOUND" not in f


def test_no_straggler_when_collectives_do_not_end_together(tmp_path):
    """Rank 1's payload is a cycle off (tests/test_rank_windows.py): instances pair a cycle apart and their
    all-reduces end ~100 µs apart. The pairing is refused, not reported as a straggler: no finding, no split,
    and the report says why."""
    from test_rank_windows import trace

    from analyze.cli import main
    from analyze.compute import steady_tables

    idx = list(range(12))
    path = trace(tmp_path / "off.sqlite", payload={0: idx, 1: [i + 1 for i in idx]})
    res = analyze(path)
    m = steady_tables.matching(res)
    assert not m["trusted"].any() and set(m["phase"]) == {"draft", "verify"}
    assert set(res.comm_refused["phase"]) == {"draft", "verify"}
    f = by_code(findings.find(res))
    assert "STRAGGLER_RANK" not in f
    assert all("no wait/transfer split" in x.evidence for x in f.get("COMM_SHARE", []))
    out = tmp_path / "rep"
    assert main(["report", str(path), "-o", str(out), "--steps-now", "3"]) == 0
    page = (out / "index.html").read_text()
    notes = page[page.index('<div id="comm-notes">'):]
    assert "draft: no wait/transfer split and no stragglers shown" in notes
    assert "<h3>Stragglers</h3>" not in page


def test_ragged_window_pairs_by_cycle_and_names_no_false_straggler():
    """tp2_rank0_window: rank 1's window opens a cycle late; paired by cycle, every phase's collectives
    end together and no rank is a straggler by milliseconds (it looked 2.2 ms late at every all-reduce before)."""
    from analyze.compute import steady_tables
    from tests.helpers.paths import TRACES, need

    res = analyze(need(TRACES / "tp2_rank0_window.sqlite"))
    m = steady_tables.matching(res)
    assert m.height and m["trusted"].all() and (m["end_spread_p50_ns"] < 20_000).all()
    st = steady_tables.stragglers(res)
    assert st.height and st["max_delay_ns"].max() < 1_000_000
    assert all(x.impact_ns < 1_000_000 for x in by_code(findings.find(res)).get("STRAGGLER_RANK", []))


def test_comm_advice_knows_the_nccl_protocol(tmp_path):
    """COMM_SHARE's advice starts from the protocol the run is known to have had: the recorded environment's
    NCCL_PROTO (the bundled tp2_nccl_ll / tp2_nccl_simple manifests); never "try NCCL_PROTO=LL" on an LL run. Without
    the manifest nothing says the protocol: the Simple capture's kernels are named ..._RING_LL, and no finding may
    assert a protocol (issue 37: it said "This run uses NCCL's LL protocol" and advised against the best move)."""
    import json
    import sqlite3

    from analyze.compute.findings import find
    from tests.helpers.paths import TP2, tp2

    def found(name: str, manifest: bool = True) -> list:
        d = tmp_path / ("m" if manifest else "bare")
        d.mkdir(exist_ok=True)
        p = tp2(name, d)
        if not manifest:
            p.with_suffix(".manifest.json").unlink(missing_ok=True)
        return find(analyze(p))

    def advice(name: str, manifest: bool = True) -> list[str]:
        return [f.action for f in found(name, manifest) if f.code == "COMM_SHARE"]

    assert json.loads((TP2 / "tp2_nccl_ll.manifest.json").read_text())["nccl_env"]["NCCL_PROTO"] == "LL"
    assert json.loads((TP2 / "tp2_nccl_simple.manifest.json").read_text())["nccl_env"]["NCCL_PROTO"] == "Simple"
    ll = advice("tp2_nccl_ll")
    assert ll and all(a.startswith("This run was set to NCCL's LL protocol (NCCL_PROTO in the capture's recorded "
                                   "environment). LL is already the lowest-latency protocol: next try NCCL_ALGO")
                      for a in ll)
    assert not any("NCCL_PROTO=LL" in a for a in ll)
    simple = advice("tp2_nccl_simple")
    assert simple and all(a.startswith("This run was set to NCCL's Simple protocol") and "try NCCL_PROTO=LL" in a
                          for a in simple)
    # the Simple capture without its manifest: its NCCL kernels say RING_LL, yet no finding names a protocol
    fs = found("tp2_nccl_simple", manifest=False)
    with sqlite3.connect(tmp_path / "bare" / "tp2_nccl_simple.sqlite") as con:
        names = [n for (n,) in con.execute("SELECT DISTINCT s.value FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds "
                                           "s ON s.id = k.shortName WHERE s.value LIKE 'ncclDevKernel%'")]
    assert names and all("RING_LL" in n for n in names), names
    assert any(f.code == "COMM_SHARE" for f in fs)
    for f in fs:
        text = f.evidence + " " + f.action
        assert not re.search(r"(LL|LL128|Simple) protocol\b|protocol is (LL|Simple)|uses NCCL", text), text
    assert all(a.startswith("The NCCL protocol this run used is unknown") for a in advice("tp2_nccl_simple", False))


def test_nccl_setting_only_from_the_recorded_environment(tmp_path):
    """No manifest: no setting (the kernel's name is no evidence); a manifest without NCCL_PROTO: unset, NCCL's own
    choice; an unusual value is said as recorded."""
    import json

    from tests.helpers.paths import tp2

    p = tp2("tp2_nccl_simple", tmp_path)
    man = p.with_suffix(".manifest.json")
    doc = json.loads(man.read_text())
    res = analyze(p)
    assert nccl_evidence.nccl_setting(res) == nccl_evidence.NcclSetting("Simple", None, "NCCL_PROTO in the capture's recorded "
                                                                              "environment")
    doc["nccl_env"] = {}
    man.write_text(json.dumps(doc))
    got = nccl_evidence.nccl_setting(res)
    assert got is not None and got.proto is None and "unset" in got.source
    assert nccl_evidence.comm_action(got).startswith("This run left the protocol to NCCL")
    doc["nccl_env"] = {"NCCL_PROTO": "^LL128", "NCCL_ALGO": "Tree"}
    man.write_text(json.dumps(doc))
    got = nccl_evidence.nccl_setting(res)
    assert got == nccl_evidence.NcclSetting(None, "Tree", "NCCL_PROTO=^LL128 in the capture's recorded environment")
    man.unlink()
    assert nccl_evidence.nccl_setting(res) is None
