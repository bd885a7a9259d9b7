"""Cross-rank communication on real captures: the TP=2 EAGLE-3 probe and nsys-ai's 2-GPU torchrun fixtures."""

from __future__ import annotations

import shutil
import sqlite3

import polars as pl
import pytest

from analyze import analyze
from analyze.compute.collectives import cross_rank
from analyze.output.text import comm_table as table
from tests.helpers.paths import EXTERNAL, PROBE, need

NSYS_AI = EXTERNAL / "nsys-ai"


@pytest.fixture(scope="module")
def probe():
    return analyze(need(PROBE))


@pytest.fixture(scope="module")
def rep(probe):
    return cross_rank([probe])


def identity(rep):
    m, c = rep.matched, rep.collectives
    assert (m["wait_ns"] + m["transfer_ns"] == m["duration_ns"]).all()
    assert (c["wait_ns"] + c["transfer_ns"] == c["duration_ns"]).all()
    assert (m["wait_ns"] >= 0).all() and (m["transfer_ns"] >= 0).all()


def test_probe_counts_match_across_ranks(rep):
    # 1191 bf16 + 1 f32 all-reduce kernels per rank, all paired; none left over
    assert rep.kernels.height == 2384 and rep.matched.height == 2384 and rep.mismatches.height == 0
    assert not [d for d in rep.diagnostics if d.level != "info"]
    identity(rep)
    # one clock: the two ranks of a collective end within ~1 µs of each other
    assert rep.clock["end_spread_max_ns"] < 2_000


def test_probe_first_draft_instances_wait_for_rank_1(rep):
    m = rep.matched.filter(pl.col("phase") == "eagle3.draft")
    # first draft instance: rank 1 arrives last at both all-reduces
    assert m.filter(pl.col("k") == 0, pl.col("is_last"))["rank"].to_list() == [1, 1]
    # second draft instance: rank 0's 8.27 ms all-reduce is almost all waiting for rank 1
    r0 = m.filter(pl.col("k") == 1, pl.col("j") == 0, pl.col("rank") == 0).row(0, named=True)
    r1 = m.filter(pl.col("k") == 1, pl.col("j") == 0, pl.col("rank") == 1).row(0, named=True)
    assert r1["is_last"] and r1["delay_ns"] == 8_266_933
    assert (r0["duration_ns"], r0["wait_ns"], r0["transfer_ns"]) == (8_273_640, 8_266_933, 6_707)
    assert r1["wait_ns"] == 0


def test_probe_stragglers_and_phase_split(rep, probe):
    st = rep.stragglers.filter(pl.col("phase") == "eagle3.draft").sort("last_arrivals", descending=True)
    assert st.row(0, named=True)["rank"] == 1 and st.row(0, named=True)["last_arrivals"] == 95
    ph = probe.phases.filter(pl.col("phase") == "eagle3.draft").sort("rank")
    assert ph["comm_wait_ns"].to_list() == [11_950_987, 17_312]
    # wait + transfer is the summed kernel time of the matched collectives (comm_ns is their union)
    c = rep.collectives.filter(pl.col("phase") == "eagle3.draft").sort("rank")
    assert (ph["comm_wait_ns"] + ph["comm_transfer_ns"]).to_list() == c["duration_ns"].to_list()
    assert "eagle3.draft" in table(rep)


def split_probe(tmp, pid_keep: int, shift: int = 0, utc_delta: int = 0):
    """A copy of the probe holding one process, its clock reading ``shift`` ns ahead, utcEpochNs moved by ``utc_delta``."""
    out = tmp / f"probe_{pid_keep}.sqlite"
    shutil.copy(need(PROBE), out)
    con = sqlite3.connect(out)
    for (t,) in con.execute("SELECT name FROM sqlite_master WHERE type='table'").fetchall():
        cols = [r[1] for r in con.execute(f"PRAGMA table_info('{t}')")]
        g = "globalTid" if "globalTid" in cols else "globalPid" if "globalPid" in cols else None
        if g:
            con.execute(f"DELETE FROM {t} WHERE {g} > 0 AND (({g} >> 24) & 16777215) != ?", (pid_keep,))
        if shift and {"start", "end"} <= set(cols):
            con.execute(f'UPDATE {t} SET start = start + ?, "end" = "end" + ?', (shift, shift))
    con.execute("UPDATE ANALYSIS_DETAILS SET duration = duration + ?", (shift,))
    con.execute("UPDATE TARGET_INFO_SESSION_START_TIME SET utcEpochNs = utcEpochNs + ?", (utc_delta,))
    con.commit()
    con.close()
    return out


def test_probe_split_into_two_reports_realigns(tmp_path, rep):
    """Rank 1's report reads 50 µs ahead, 20 µs of which its utcEpochNs explains: end times find the other 30."""
    a = analyze(split_probe(tmp_path, 1412))
    b = analyze(split_probe(tmp_path, 1413, shift=50_000, utc_delta=-20_000))
    multi = cross_rank([a, b])
    pr = multi.clock["per_report"]
    assert pr[1]["session_offset_ns"] == -20_000
    # on the one true clock, rank 1's collectives end a median of `med` ns after rank 0's
    e = rep.matched.pivot("rank", index=["phase", "k", "name", "j"], values="end")
    med = (e["1"] - e["0"]).median()
    assert abs(pr[1]["refine_ns"] - (-30_000 - med)) <= 1
    assert multi.clock["alignment"] == "session start (utcEpochNs) + median skew of collective end times"
    assert multi.matched.height == 2384 and multi.mismatches.height == 0
    identity(multi)
    r = multi.matched.filter(pl.col("phase") == "eagle3.draft", pl.col("k") == 1, pl.col("j") == 0, pl.col("is_last"))
    assert r["rank"].to_list() == [1] and abs(r["delay_ns"][0] - 8_266_933) <= abs(med) + 1


@pytest.mark.parametrize("name,collectives", [("mfu_2gpu_before", 33), ("mfu_2gpu_after", 31)])
def test_nsys_ai_sendrecv_fixtures(name, collectives):
    res = analyze(need(NSYS_AI / f"{name}.sqlite"), ranges=".")
    rep = cross_rank([res])
    assert rep.mismatches.height == 0 and rep.matched.height == 2 * collectives
    assert rep.matched.filter(pl.col("k") >= 0)["phase"].unique().to_list() == ["ncclGroupEnd"]
    identity(rep)
    p = res.phases.filter(pl.col("phase") == "ncclGroupEnd")
    assert (p["comm_wait_ns"] + p["comm_transfer_ns"] <= p["kernel_ns"]).all()
    assert rep.to_dict()["matching"]["unmatched_kernels"] == 0 and table(rep)


def test_nsys_ai_fixture_without_communication():
    res = analyze(need(NSYS_AI / "h100_2gpu_1s.sqlite"), ranges=".")
    rep = cross_rank([res])
    assert rep.kernels.height == 0 and rep.collectives.height == 0
    assert [d.code for d in rep.diagnostics] == ["COMM_CLOCK", "COMM_NONE"]
    assert (res.phases["comm_wait_ns"] == 0).all() and table(rep)
