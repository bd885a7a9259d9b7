"""Ranks paired by cycle, capture windows, cut and lost instances, refusal (synthetic traces).

Two ranks (pid 100 → device 0 → rank 0, pid 200 → device 1 → rank 1), ``n`` cycles ``i`` at
``B = 100_000 (i + 1)``: ``cycle`` [B, B + 9000] with ``draft`` [B + 100, B + 4000] and ``verify``
[B + 4000, B + 8000]. Draft: gemm [B + 1000, B + 1500], then an all-reduce that rank 1 reaches ``D_i``
late: rank 0's runs [B + 1600, B + 1900 + D_i], rank 1's [B + 1600 + D_i, B + 1900 + D_i] (both end
together). Verify: an all-reduce [B + 5000, B + 5400] on both. So, per draft collective, rank 0 waits
``D_i`` (its skew, shorter than its duration) and rank 1 is the straggler with delay ``D_i``; verify
has no wait. Both ranks make a CUDA call at t = 5 (process start), before any range, as real runs do.
"""

from __future__ import annotations

import json
import re
import sqlite3
import subprocess
import sys

import polars as pl
import pytest

from analyze import analyze
from analyze.compute.collectives import cross_rank
from analyze.compute.windows import END_SPREAD_BOUND_NS, WRAP
from analyze.output.text import analyze_table, comm_table
from nvtx_hooks.phases import encode_payload
from tests.helpers.synth import Synth

NCCL = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<(unsigned long)4096>)"
DELAYS = [300, 2000, 400, 500, 700, 600, 900, 800, 1200, 1100, 1000, 350]  # D_i, ns; the largest at cycle 1
GAP = 100_000


def base(i: int) -> int:
    return GAP * (i + 1)


def trace(path, n: int = 12, payload=None, shift: dict | None = None, rank1_from: int | None = None,
          early_call: bool = True):
    """The two-rank trace. ``payload``: per rank, the cycle index of each cycle (None: no payload);
    ``shift``: {cycle: ns} added to rank 1's draft all-reduce; ``rank1_from``: rank 1's first cycle (its
    capture opens just before it, with a CUDA call in the gap)."""
    s = Synth(path, duration=GAP * (n + 2))
    corr = 0
    for rank, pid in ((0, 100), (1, 200)):
        s.device(rank)
        s.domain(pid, pid, "spectrace", 1)
        first = rank1_from if rank == 1 and rank1_from is not None else 0
        if early_call:
            t = base(first) - 50 if first else 5
            s.api(pid, pid, "cudaGetDevice_v3020", t, t + 5, 999)
        for i in range(first, n):
            b, d = base(i), DELAYS[i % len(DELAYS)]
            pay = None if payload is None else encode_payload(4, payload[rank][i])
            s.range(pid, pid, "cycle", b, b + 9000, domain_id=1, payload=pay)
            s.range(pid, pid, "draft", b + 100, b + 4000, domain_id=1)
            s.range(pid, pid, "verify", b + 4000, b + 8000, domain_id=1)
            sh = (shift or {}).get(i, 0) if rank == 1 else 0
            ar = (b + 1600, b + 1900 + d) if rank == 0 else (b + 1600 + d + sh, b + 1900 + d + sh)
            corr += 1
            s.launch(pid, pid, "cudaLaunchKernel_v7000", (b + 200, b + 300), corr,
                     [(b + 1000, b + 1500, "gemm"), (*ar, NCCL)], device=rank)
            corr += 1
            s.launch(pid, pid, "cudaLaunchKernel_v7000", (b + 4100, b + 4200), corr, [(b + 5000, b + 5400, NCCL)],
                     device=rank)
    return s.save()


def cut_copy(src, dst, pid: int, before: int | None = None, after: int | None = None,
             ranges_ending_before: int | None = None, ranges_starting_before: int | None = None):
    """A copy of an export without process ``pid``'s CUDA rows (API calls, GPU ops) that start before
    ``before`` or after ``after``, and without its NVTX ranges that end (or start) before the given time."""
    import shutil

    shutil.copyfile(src, dst)
    con = sqlite3.connect(dst)
    tables = [t for (t,) in con.execute("SELECT name FROM sqlite_master WHERE type='table'")]
    for t in tables:
        cols = {r[1] for r in con.execute(f"PRAGMA table_info('{t}')")}
        g = "globalTid" if "globalTid" in cols else "globalPid" if "globalPid" in cols else None
        if g is None or "start" not in cols:
            continue
        mine = f"(({g} >> 24) & 16777215) = {pid}"
        if t == "NVTX_EVENTS":
            for lim, col in ((ranges_ending_before, 'COALESCE("end", start)'), (ranges_starting_before, "start")):
                if lim is not None:
                    con.execute(f"DELETE FROM {t} WHERE {mine} AND eventType IN (59, 60) AND {col} < ?", (lim,))
            continue
        if before is not None:
            con.execute(f"DELETE FROM {t} WHERE {mine} AND start < ?", (before,))
        if after is not None:
            con.execute(f"DELETE FROM {t} WHERE {mine} AND start > ?", (after,))
    con.commit()
    con.close()
    return dst


def row(df, **eq):
    out = df.filter(pl.all_horizontal([pl.col(k).eq_missing(v) for k, v in eq.items()]))
    assert out.height == 1, (eq, out)
    return out.row(0, named=True)


def codes(diags) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for d in diags:
        out.setdefault(d.code, []).append(d.message)
    return out


def counted(res, phase: str, rank: int) -> list[int]:
    """Start times of the counted instances of ``phase`` on ``rank``."""
    i = res.instances.filter((pl.col("range") == phase) & (pl.col("rank") == rank) & pl.col("left_out").is_null()
                             & (pl.col("i_ops") > 0))
    return sorted(i["start"].to_list())


# ---- pairing by payload and by time, and a cut at the start --------------------------------------------


@pytest.mark.parametrize("payload", [False, True])
def test_uncut_draft_wait_and_straggler(tmp_path, payload):
    pay = {r: list(range(12)) for r in (0, 1)} if payload else None
    res = analyze(trace(tmp_path / "u.sqlite", payload=pay))
    assert [row(res.phases, rank=r, phase="draft")["comm_wait_ns"] for r in (0, 1)] == [sum(DELAYS), 0]
    c = cross_rank([res])
    st = row(c.stragglers, phase="draft", rank=1)
    assert (st["last_arrivals"], st["max_delay_ns"], st["total_delay_ns"]) == (12, 2000, sum(DELAYS))
    assert c.refused.height == 0 and not res.comm_refused.height
    how = codes(res.diagnostics)["INSTANCE_PAIRING"][0]
    assert ("by the payload's cycle index: 'cycle', 'draft', 'verify'" in how) == payload
    assert ("by time" in how) != payload
    assert all(d.level == "info" for d in res.diagnostics if d.code in ("INSTANCE_PAIRING", "WINDOW_CUT"))
    assert "WINDOW_CUT" not in codes(res.diagnostics) and res.instances["left_out"].null_count() == res.instances.height


@pytest.mark.parametrize("payload", [False, True])
def test_rank_cut_mid_cycle_at_the_start(tmp_path, payload):
    """Rank 1's capture opens inside cycle 3 (after its draft launch): cycle 3 is cut on rank 1, cycles 0-2
    were not recorded there; the counted cycles 4-11 give the uncut numbers of those cycles exactly."""
    pay = {r: list(range(12)) for r in (0, 1)} if payload else None
    src = trace(tmp_path / "u.sqlite", payload=pay)
    t = base(3) + 1700
    res = analyze(cut_copy(src, tmp_path / "c.sqlite", 200, before=t, ranges_ending_before=t))
    kept = [base(i) + 100 for i in range(4, 12)]
    assert counted(res, "draft", 0) == counted(res, "draft", 1) == kept
    assert [row(res.phases, rank=r, phase="draft")["instances"] for r in (0, 1)] == [8, 8]
    # all-rank rows sum the same 8 cycles on each rank, for every phase
    assert res.phases.group_by("phase").agg(pl.col("instances").unique()).sort("phase")["instances"].to_list() == \
        [[8], [8]]
    want = sum(DELAYS[4:12])
    assert [row(res.phases, rank=r, phase="draft")["comm_wait_ns"] for r in (0, 1)] == [want, 0]
    st = row(cross_rank([res]).stragglers, phase="draft", rank=1)
    assert (st["last_arrivals"], st["max_delay_ns"]) == (8, max(DELAYS[4:12]))
    c = codes(res.diagnostics)
    # rank 1's cycle 3 is cut (its verify is whole); its draft lost its launch, so it has no GPU work at all
    assert c["WINDOW_CUT"][0].startswith("rank 1: 1 instance(s) with GPU work cut by its capture window "
                                         f"({(base(3) + 1600 + DELAYS[3]) / 1e6:,.3f}–1.205 ms): at its start 'cycle' ×1;")
    # rank 0's cycles 0-3: 0-2 absent on rank 1 (not recording), 3 cut there; the verify of rank 1's cut cycle
    msg = " ".join(c["UNPAIRED_INSTANCES"])
    assert "rank 0: 12 instance(s)" in msg and "'cycle' ×4 (0.100–0.409 ms)" in msg
    assert "rank 1: 1 instance(s)" in msg and "'verify' ×1 (0.404–0.408 ms)" in msg
    if not payload:
        assert "rank 1's n-th = rank 0's (n+3)-th" in c["INSTANCE_PAIRING"][0]


def test_window_opening_a_whole_cycle_late_by_time(tmp_path):
    """Rank 1 records from cycle 5 on, its capture opening between cycles (a CUDA call in the gap): the offset
    of 5 instances is found, nothing is cut, and rank 0's cycles 0-4 are left out."""
    res = analyze(trace(tmp_path / "late.sqlite", rank1_from=5))
    c = codes(res.diagnostics)
    assert "'draft' (rank 1's n-th = rank 0's (n+5)-th, ends 0.0 µs apart)" in c["INSTANCE_PAIRING"][0]
    assert "WINDOW_CUT" not in c
    assert counted(res, "draft", 0) == counted(res, "draft", 1) == [base(i) + 100 for i in range(5, 12)]
    assert [row(res.phases, rank=r, phase="draft")["comm_wait_ns"] for r in (0, 1)] == [sum(DELAYS[5:12]), 0]
    assert "rank 0: 15 instance(s)" in c["UNPAIRED_INSTANCES"][0]
    assert all(d.level == "info" for d in res.diagnostics if d.code == "UNPAIRED_INSTANCES")


def test_lost_tail_on_rank_0(tmp_path):
    """Rank 0's CUDA rows stop inside cycle 8's draft (its ranges go on): GPU_TAIL_LOST names the rank, the lost
    span and the cycles; cycles 8-11 are left out on both ranks."""
    src = trace(tmp_path / "u.sqlite", payload={r: list(range(12)) for r in (0, 1)})
    t = base(8) + 1200
    res = analyze(cut_copy(src, tmp_path / "t.sqlite", 100, after=t))
    msg = codes(res.diagnostics)["GPU_TAIL_LOST"]
    assert len(msg) == 1 and msg[0].startswith("rank 0: its GPU rows stop at 0.901 ms but the run goes on to 1.209 ms")
    lost = (base(11) + 9000) - (base(8) + 1500)
    assert f"({lost / 1e6:,.3f} ms lost): 3 top-level instance(s) ('cycle') have ranges but no GPU work" in msg[0]
    assert "2 instance(s) are cut at its last GPU op" in msg[0]  # cycle 8 and its draft (its gemm ran)
    assert counted(res, "cycle", 0) == counted(res, "cycle", 1) == [base(i) for i in range(8)]
    assert [row(res.phases, rank=r, phase="draft")["comm_wait_ns"] for r in (0, 1)] == [sum(DELAYS[:8]), 0]
    assert res.ranks.select("window_start_ns", "window_end_ns", "ranges_start_ns", "ranges_end_ns").rows() == [
        (5, base(8) + 1500, base(0), base(11) + 9000), (5, base(11) + 5400, base(0), base(11) + 9000)]


# ---- payload: wrap of the 24-bit cycle index ----------------------------------------------------------------


def test_cycle_index_wraps_at_2_24(tmp_path):
    """Rank 0 counts cycles W-3 .. W+2 (W = 2^24: the payload shows W-3, W-2, W-1, 0, 1, 2); rank 1's capture opens
    after the wrap and records 0, 1, 2 only: they pair with rank 0's last three."""
    idx = [WRAP - 3, WRAP - 2, WRAP - 1, 0, 1, 2]
    res = analyze(trace(tmp_path / "w.sqlite", n=6, payload={0: idx, 1: idx}, rank1_from=3))
    assert counted(res, "cycle", 0) == counted(res, "cycle", 1) == [base(i) for i in (3, 4, 5)]
    assert [row(res.phases, rank=r, phase="draft")["comm_wait_ns"] for r in (0, 1)] == [sum(DELAYS[3:6]), 0]
    assert res.instances.filter(pl.col("range") == "cycle").sort("rank", "start")["cycle"].to_list() == [
        WRAP - 3, WRAP - 2, WRAP - 1, WRAP, WRAP + 1, WRAP + 2, WRAP, WRAP + 1, WRAP + 2]


# ---- refusal and the per-instance check ---------------------------------------------------------------------


def test_wrong_cycle_indices_are_refused_not_reported(tmp_path, capsys):
    """Rank 1's payload is one cycle off (its cycle i says i + 1): cycles pair a cycle apart, their all-reduces
    end about 100 µs apart (> the bound): no wait, skew or straggler numbers for draft or verify, anywhere."""
    idx = list(range(12))
    res = analyze(trace(tmp_path / "off.sqlite", payload={0: idx, 1: [i + 1 for i in idx]}))
    assert END_SPREAD_BOUND_NS < GAP
    # rank 0's cycle i + 1 pairs with rank 1's cycle i: draft ends GAP + D_(i+1) - D_i apart (p50 of 11: the 6th)
    draft = sorted(GAP + DELAYS[i + 1] - DELAYS[i] for i in range(11))[5]
    assert res.comm_refused.select("phase", "collectives", "end_spread_p50_ns").rows() == [
        ("draft", 11, draft), ("verify", 11, GAP)]
    d = row(res.phases, rank=0, phase="draft")
    assert d["comm_wait_ns"] is None and d["comm_transfer_ns"] is None
    assert row(res.phases_all, phase="draft")["comm_wait_ns"] is None
    assert f"draft: 11 matched collectives end {draft / 1e3:,.1f} µs apart (p50) > 50.0 µs" in analyze_table(res)
    assert any(m.startswith("'draft': its 11 matched collectives do not end together")
               for m in codes(res.diagnostics)["COMM_REFUSED"])
    c = cross_rank([res])
    assert c.stragglers.filter(pl.col("phase") == "draft").height == 0
    dr = c.collectives.filter(pl.col("phase") == "draft")
    assert dr["wait_ns"].null_count() == dr.height == 2 and dr["count"].to_list() == [11, 11]
    assert [r["phase"] for r in c.to_dict()["refused"]] == ["draft", "verify"]
    assert "Refused: no wait, skew or straggler numbers" in comm_table(c)
    from analyze.cli import main

    assert main(["comm", str(tmp_path / "off.sqlite"), "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [r["phase"] for r in doc["refused"]] == ["draft", "verify"]
    assert not doc["stragglers"]


def test_instance_whose_collectives_do_not_end_together_is_left_out(tmp_path):
    """By time: rank 1's cycle-6 draft all-reduce is moved 300 µs later; the offset stays 0, the per-instance
    check leaves that draft (and cycle 6) out on both ranks."""
    res = analyze(trace(tmp_path / "mis.sqlite", shift={6: 300_000}))
    c = codes(res.diagnostics)
    assert c["MISALIGNED_INSTANCES"] == [
        "rank 1: 2 instance(s) could not be paired by time (their collectives do not end within 50 µs of the "
        "reference rank's): 'cycle' ×1 (0.700–0.709 ms), 'draft' ×1 (0.700–0.704 ms); left out"]
    assert counted(res, "draft", 0) == counted(res, "draft", 1) == [base(i) + 100 for i in range(12) if i != 6]
    assert [row(res.phases, rank=r, phase="draft")["comm_wait_ns"] for r in (0, 1)] == [sum(DELAYS) - DELAYS[6], 0]
    assert res.comm_refused.height == 0


# ---- several reports ---------------------------------------------------------------------------------------


def test_split_into_per_rank_reports_pairs_the_same(tmp_path):
    """Rank 1 cut at the start, then each rank in its own report (clocks agree): the merge pairs the same cycles."""
    src = trace(tmp_path / "u.sqlite")
    t = base(3) + 1700
    cut = cut_copy(src, tmp_path / "c.sqlite", 200, before=t, ranges_ending_before=t)
    one = analyze(cut)
    parts = []
    for pid in (100, 200):
        p = tmp_path / f"r{pid}.sqlite"
        cut_copy(cut, p, 300 - pid, before=10**12)  # drop the other process's CUDA rows and ranges
        con = sqlite3.connect(p)
        con.execute("DELETE FROM NVTX_EVENTS WHERE ((globalTid >> 24) & 16777215) = ?", (300 - pid,))
        con.execute("INSERT INTO TARGET_INFO_SESSION_START_TIME (utcEpochNs) VALUES (1700000000000000000)")
        con.commit()
        con.close()
        parts.append(str(p))
    m = analyze(parts)
    cols = ["rank", "phase", "instances", "span_ns", "comm_wait_ns", "comm_transfer_ns"]
    assert m.phases.select(cols).sort("rank", "phase").equals(one.phases.select(cols).sort("rank", "phase"))
    assert m.instances.filter(pl.col("left_out").is_null()).height == one.instances.filter(
        pl.col("left_out").is_null()).height
    assert "UNPAIRED_INSTANCES" in codes(m.diagnostics)
    st = row(cross_rank([analyze(p) for p in parts]).stragglers, phase="draft", rank=1)
    assert st["max_delay_ns"] == max(DELAYS[4:12])


# ---- workload: CUPTI flush --------------------------------------------------------------------------------


def test_flush_cupti_calls_every_loaded_libcupti(tmp_path):
    """A stand-in libcupti.so records the flag it is flushed with; flush_cupti finds it in the process's maps."""
    import shutil

    if not shutil.which("cc"):
        pytest.skip("no C compiler")
    src = tmp_path / "cupti.c"
    src.write_text("int flags = -1;\nint cuptiActivityFlushAll(unsigned f) { flags = (int)f; return 0; }\n")
    lib = tmp_path / "libcupti.so.13"
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(lib), str(src)], check=True)
    code = (f"import ctypes; from nvtx_hooks.capture.workload import flush_cupti; l = ctypes.CDLL({str(lib)!r}); "
            "print(flush_cupti(), ctypes.c_int.in_dll(l, 'flags').value)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["1", "1"]  # one library flushed, with CUPTI_ACTIVITY_FLAG_FLUSH_FORCED
    none = subprocess.run([sys.executable, "-c", "from nvtx_hooks.capture.workload import flush_cupti; "
                           "print(flush_cupti())"], capture_output=True, text=True, check=True).stdout.strip()
    assert none == "0"


@pytest.mark.slow  # three processes per run (a launcher and two torch ranks over gloo); make test-all (CI) runs it
@pytest.mark.parametrize("mode", ["flush", "os"])
def test_two_ranks_end_either_way(mode):
    """Both endings of a rank of several (NCCL teardown then a normal exit, or os._exit) finish cleanly (gloo)."""
    pytest.importorskip("torch", reason="the workload needs torch")
    cmd = [sys.executable, "-m", "nvtx_hooks.capture.workload", "--device", "cpu", "--hidden", "32", "--ffn", "64",
           "--layers", "2", "--cycles", "2", "--warmup", "1", "--host-us", "0", "--nproc", "2", "--exit", mode]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr[-2000:]
    assert sorted(int(x) for x in re.findall(r"\{\"rank\": (\d)", r.stdout)) == [0, 1]
