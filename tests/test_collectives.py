"""Cross-rank communication on synthetic exports with a delay injected on one rank (answers by hand).

Rank 0 is pid 100 on device 0, rank 1 is pid 200 on device 1; the spectrace domain is id 1.
Per collective: last = max start over ranks, skew = last - own start, wait = min(duration, skew),
transfer = duration - wait. Every expected number is derived in the comments.
"""

from __future__ import annotations

import json
import subprocess
import sys

import polars as pl
import pytest

from analyze import analyze
from analyze.compute.collectives import cross_rank
from tests.helpers.synth import Synth

NCCL = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<(unsigned long)4096>)"
CAR = "void sglang::cross_device_reduce_1stage<__nv_bfloat16, 8>(sglang::RankData*, sglang::RankSignals, int)"
UTC = 1_700_000_000_000_000_000

# Per rank: (draft#0 AR1, draft#0 AR2, verify CAR, draft#1 AR, outside AR) as (start, end).
R0 = [(2000, 3000), (3100, 3400), (5500, 6000), (9500, 9700), (13500, 14500)]
R1 = [(2600, 3000), (3100, 3400), (5400, 6000), (9800, 9900), (14000, 14500)]  # late by 600, 0, -100, 300, 500


def rank_rows(s: Synth, pid: int, dev: int, ks, shift: int = 0, extra: bool = False) -> None:
    """One rank: draft#0 [1000,5000], verify [5000,9000], draft#1 [9000,12000], then an AR outside any range."""
    t = shift
    s.device(dev)
    s.domain(pid, pid, "spectrace", 1, t=t + 1)
    s.range(pid, pid, "draft", t + 1000, t + 5000, domain_id=1)
    s.range(pid, pid, "verify", t + 5000, t + 9000, domain_id=1)
    s.range(pid, pid, "draft", t + 9000, t + 12000, domain_id=1)
    (a1, a2, car, a3, out) = [(a + t, b + t) for a, b in ks]
    s.launch(pid, pid, "cudaGraphLaunch_v10000", (t + 1100, t + 1200), 1,
             [(t + 1300, t + 1800, "gemm"), (*a1, NCCL), (*a2, NCCL)], device=dev)
    ops = [(*car, CAR)] + ([(t + 6500, t + 6600, CAR)] if extra else [])
    s.launch(pid, pid, "cudaLaunchKernel_v7000", (t + 5100, t + 5200), 2, ops, device=dev)
    s.launch(pid, pid, "cudaLaunchKernel_v7000", (t + 9100, t + 9200), 3, [(*a3, NCCL)], device=dev)
    s.launch(pid, pid, "cudaLaunchKernel_v7000", (t + 13000, t + 13100), 4, [(*out, NCCL)], device=dev)


def one_report(path, extra=False):
    s = Synth(path, duration=100_000)
    rank_rows(s, 100, 0, R0)
    rank_rows(s, 200, 1, R1, extra=extra)
    return s.save()


def per_rank_reports(tmp, shift: int, utc_delta: int):
    """Rank 1 in its own report whose clock reads ``shift`` ns ahead and whose utcEpochNs says ``utc_delta``."""
    a = Synth(tmp / "r0.sqlite", duration=100_000)
    rank_rows(a, 100, 0, R0)
    a.insert("TARGET_INFO_SESSION_START_TIME", utcEpochNs=UTC)
    b = Synth(tmp / "r1.sqlite", duration=100_000)
    rank_rows(b, 200, 1, R1, shift=shift)
    b.insert("TARGET_INFO_SESSION_START_TIME", utcEpochNs=UTC + utc_delta)
    return a.save(), b.save()


@pytest.fixture(scope="module")
def rep(tmp_path_factory):
    return cross_rank([analyze(one_report(tmp_path_factory.mktemp("c") / "one.sqlite"))])


def row(df, **eq):
    out = df.filter(pl.all_horizontal([pl.col(k).eq_missing(v) for k, v in eq.items()]))
    assert out.height == 1, (eq, out)
    return out.row(0, named=True)


def test_every_collective_matched(rep):
    assert rep.kernels.height == 10 and rep.matched.height == 10 and rep.mismatches.height == 0
    assert rep.clock["alignment"].startswith("one report")


def test_wait_transfer_per_collective(rep):
    m = rep.matched.sort("start")
    got = m.select("rank", "phase", "k", "j", "duration_ns", "wait_ns", "transfer_ns", "skew_ns").rows()
    assert got == [
        # draft#0 AR1: last = 2600; rank 0 skew 600 < dur 1000 -> wait 600, transfer 400; rank 1 wait 0
        (0, "draft", 0, 0, 1000, 600, 400, 600), (1, "draft", 0, 0, 400, 0, 400, 0),
        # draft#0 AR2: both start at 3100: nobody waits
        (0, "draft", 0, 1, 300, 0, 300, 0), (1, "draft", 0, 1, 300, 0, 300, 0),
        # verify CAR: rank 1 first (5400), rank 0 last (5500): rank 1 waits 100 of 600
        (1, "verify", 0, 0, 600, 100, 500, 100), (0, "verify", 0, 0, 500, 0, 500, 0),
        # draft#1 AR: rank 1 starts 9800, after rank 0 ended (9700): wait clipped to rank 0's duration 200
        (0, "draft", 1, 0, 200, 200, 0, 300), (1, "draft", 1, 0, 100, 0, 100, 0),
        # outside any phase: rank 1 late by 500
        (0, None, -1, 0, 1000, 500, 500, 500), (1, None, -1, 0, 500, 0, 500, 0),
    ]
    assert (m["wait_ns"] + m["transfer_ns"] == m["duration_ns"]).all()


def test_summary_per_phase_and_rank(rep):
    s = rep.collectives
    d0 = row(s, rank=0, phase="draft", name=NCCL)
    # durations 1000+300+200, waits 600+0+200, skews {600, 0, 300}: p50 (nearest) 300, p99 600
    assert (d0["count"], d0["duration_ns"], d0["wait_ns"], d0["transfer_ns"]) == (3, 1500, 800, 700)
    assert (d0["skew_p50_ns"], d0["skew_p99_ns"], d0["instances"]) == (300, 600, 2)
    d1 = row(s, rank=1, phase="draft", name=NCCL)
    assert (d1["count"], d1["duration_ns"], d1["wait_ns"], d1["transfer_ns"], d1["skew_p99_ns"]) == (3, 800, 0, 800, 0)
    v1 = row(s, rank=1, phase="verify", name=CAR)
    assert (v1["family"], v1["duration_ns"], v1["wait_ns"], v1["transfer_ns"], v1["skew_p50_ns"]) == \
        ("custom_ar", 600, 100, 500, 100)
    o0 = row(s, rank=0, phase=None, name=NCCL)
    assert (o0["count"], o0["wait_ns"], o0["transfer_ns"]) == (1, 500, 500)


def test_stragglers(rep):
    st = rep.stragglers
    # draft: rank 1 last in AR1 (by 600) and draft#1 (by 300); AR2 is a tie, nobody's
    r = row(st, phase="draft", rank=1)
    assert (r["collectives"], r["last_arrivals"], r["mean_delay_ns"], r["total_delay_ns"], r["max_delay_ns"]) == \
        (3, 2, 450, 900, 600)
    assert row(st, phase="draft", rank=0)["last_arrivals"] == 0
    assert (row(st, phase="verify", rank=0)["last_arrivals"], row(st, phase="verify", rank=0)["mean_delay_ns"]) == (1, 100)
    assert row(st, phase=None, rank=1)["mean_delay_ns"] == 500
    assert st.row(0, named=True)["phase"] == "draft" and st.row(0, named=True)["rank"] == 1


def test_analyze_gains_wait_and_transfer(tmp_path):
    res = analyze(one_report(tmp_path / "a.sqlite"))
    d = row(res.phases, rank=0, phase="draft")
    assert (d["comm_wait_ns"], d["comm_transfer_ns"]) == (800, 700)
    v = row(res.phases, rank=1, phase="verify")
    assert (v["comm_wait_ns"], v["comm_transfer_ns"]) == (100, 500)
    a = row(res.phases_all, phase="draft")
    assert (a["comm_wait_ns"], a["comm_transfer_ns"]) == (800, 1500)
    assert "comm_wait_ns" in res.to_dict()["phases"][0]
    from analyze.output.text import analyze_table as table

    assert "Collectives matched across ranks" in table(res)


def test_count_mismatch_is_reported_and_left_unmatched(tmp_path):
    res = analyze(one_report(tmp_path / "m.sqlite", extra=True))  # rank 1: a second CAR in verify
    rep = cross_rank([res])
    assert rep.mismatches.select("phase", "k").rows() == [("verify", 0)]
    assert rep.kernels.height - rep.matched.height == 3  # the verify group: 1 + 2 kernels
    msg = [d.message for d in rep.diagnostics if d.code == "COMM_MISMATCH"]
    assert msg and "phase 'verify' instance 0" in msg[0] and "rank 0: 1, rank 1: 2" in msg[0]
    assert any(d.code == "COMM_MISMATCH" for d in res.diagnostics)
    assert row(res.phases, rank=1, phase="verify")["comm_wait_ns"] == 0  # unmatched: no split
    assert row(res.phases, rank=0, phase="draft")["comm_wait_ns"] == 800  # other groups still matched


@pytest.mark.parametrize("shift,utc_delta", [(0, 0), (50_000, -50_000), (50_000, -20_000), (7_000, 0)])
def test_several_reports_aligned(tmp_path, rep, shift, utc_delta):
    """Rank 1's report counts ``shift`` ns ahead; utcEpochNs explains ``-utc_delta`` of it; end times the rest."""
    a, b = per_rank_reports(tmp_path, shift, utc_delta)
    multi = cross_rank([analyze(a), analyze(b)])
    pr = multi.clock["per_report"]
    assert [p["session_offset_ns"] for p in pr] == [0, utc_delta]
    # every collective's ends agree except draft#1's (200 apart): the median end skew is the clock error
    assert pr[1]["refine_ns"] == -(shift + utc_delta)
    assert multi.clock["alignment"] == "session start (utcEpochNs) + median skew of collective end times"
    assert multi.clock["end_spread_p50_ns"] == 0 and multi.clock["end_spread_max_ns"] == 200
    cols = ["rank", "phase", "name", "count", "duration_ns", "wait_ns", "transfer_ns", "skew_p50_ns", "skew_p99_ns"]
    assert multi.collectives.select(cols).equals(rep.collectives.select(cols))
    assert multi.ranks.select("rank", "report", "pid").rows() == [(0, 0, 100), (1, 1, 200)]


def cli(*args, code=0):
    p = subprocess.run([sys.executable, "-m", "analyze.cli", "comm", *map(str, args)], capture_output=True, text=True)
    assert p.returncode == code, p.stderr
    return p.stdout, p.stderr


def test_cli_json_and_table(tmp_path):
    path = one_report(tmp_path / "cli.sqlite")
    d = json.loads(cli(path, "--format", "json")[0])
    for c in d["collectives"]:
        assert {"rank", "phase", "name", "count", "duration_ns", "wait_ns", "transfer_ns", "skew_p50_ns",
                "skew_p99_ns"} <= set(c)
        assert c["wait_ns"] + c["transfer_ns"] == c["duration_ns"]
    for s in d["stragglers"]:
        assert {"phase", "rank", "last_arrivals", "mean_delay_ns"} <= set(s)
    assert d["matching"]["unmatched_kernels"] == 0
    out, _ = cli(path)
    assert "one report: all processes share the nsys session clock" in out and "(none)" in out
    a, b = per_rank_reports(tmp_path, 5000, 0)
    d = json.loads(cli(a, b, "--format", "json")[0])
    assert d["clock"]["per_report"][1]["refine_ns"] == -5000
    _, err = cli(a, a, code=2)
    assert "twice" in err


def test_extra_phase_instance_on_one_rank_is_flagged(tmp_path, rep):
    """Rank 1 runs one more communicating draft first, while rank 0 is already recording (both ranks' first
    CUDA calls, at 50 and 60, come before any range, as in a real run): the instances are paired by time (rank 1's second draft is rank 0's first), so every other
    draft collective matches as in the two-rank fixture; the extra one is named, counted in rank 1's sums,
    and its collective has no partner."""
    s = Synth(tmp_path / "x.sqlite", duration=100_000)
    rank_rows(s, 100, 0, R0)
    rank_rows(s, 200, 1, R1)
    s.api(100, 100, "cudaGetDevice_v3020", 50, 55, 99)
    s.api(200, 200, "cudaGetDevice_v3020", 60, 65, 99)
    s.range(200, 200, "draft", 100, 900, domain_id=1)
    s.launch(200, 200, "cudaLaunchKernel_v7000", (200, 300), 9, [(500, 600, NCCL)], device=1)
    res = analyze(s.save())
    x = cross_rank([res])
    codes = {d.code: d.message for d in x.diagnostics}
    assert "rank 1: 1 instance(s) missing on another rank while it was recording: 'draft' ×1 (0.000–0.001 ms)" \
        in codes["UNPAIRED_INSTANCES"]
    assert "rank 1's n-th = rank 0's (n-1)-th" in codes["INSTANCE_PAIRING"]
    # the extra instance is the first key (0); its one kernel is the only unmatched one
    assert x.mismatches.select("phase", "k").rows() == [("draft", 0)]
    assert "phase 'draft' instance 0" in codes["COMM_MISMATCH"] and "at 0.000500 ms" in codes["COMM_MISMATCH"]
    assert x.kernels.height - x.matched.height == 1 and x.left_out_kernels == 0
    cols = ["rank", "phase", "name", "count", "duration_ns", "wait_ns", "transfer_ns", "skew_p50_ns", "skew_p99_ns"]
    assert x.collectives.select(cols).equals(rep.collectives.select(cols))
    assert x.stragglers.equals(rep.stragglers)
    assert [row(res.phases, rank=r, phase="draft")["instances"] for r in (0, 1)] == [2, 3]


def test_within_keeps_the_chosen_instances_and_every_kernel_outside_phases(rep):
    """Narrowed to verify's instances: its CAR (1 a rank) and the AR outside any range (1 a rank) stay, in the
    matched rows' order; the 3 draft kernels a rank go (6 of 10). ``within`` consumes what it is given: a shallow
    copy here, so the module's result keeps its rows."""
    import dataclasses

    from analyze.compute.collectives import within

    full = rep.matched
    keys = full.filter(pl.col("phase") == "verify").select("rank", "range_id")
    chosen = {(r["rank"], r["range_id"]) for r in keys.to_dicts()}
    want = [r for r in full.to_dicts() if r["k"] < 0 or (r["rank"], r["range_id"]) in chosen]
    given = dataclasses.replace(rep)
    got = within(given, keys, "the verify instances")
    assert len(want) == 4 and got.matched.to_dicts() == want
    assert got.outside_cycles == 6 and given.matched.height == 0 and rep.matched.height == 10
    assert sorted(got.collectives["phase"].to_list(), key=str) == [None, None, "verify", "verify"]
    assert got.cycles == "the verify instances"


def test_cross_rank_narrowed_by_keys_is_within_of_the_whole_run(tmp_path_factory):
    """``cross_rank(..., keys=, cycles=)`` (the comm verb's path: the whole run's tables never made) gives what
    ``within`` of the whole run's result gives, every field: verify's collectives and the ones outside any range,
    the whole run's refused phases, clock and diagnostics; and without keys what it gave before (4 of 10 rows)."""
    import dataclasses

    from analyze.compute.collectives import within

    res = analyze(one_report(tmp_path_factory.mktemp("k") / "one.sqlite"))
    whole = cross_rank([res])
    keys = whole.matched.filter(pl.col("phase") == "verify").select("rank", "range_id")
    want = within(dataclasses.replace(whole), keys, "the verify instances")
    got = cross_rank([res], keys=keys, cycles="the verify instances")
    assert got.matched.height == 4 and whole.matched.height == 10 and got.outside_cycles == 6
    for f in dataclasses.fields(got):
        a, b = getattr(got, f.name), getattr(want, f.name)
        assert (a.equals(b) if isinstance(a, pl.DataFrame) else a == b), f.name
