"""Steady state, headline tables and the cycle budget on a hand-computed synthetic trace (tests/helpers/eagle_synth.py).

Twelve cycles on 2 ranks whose starts are 30 000, 20 000, then 10 000 apart except 25 000 between cycles 7 and 8.
A cycle's period runs from the previous cycle's last GPU op to its own (every cycle's work lies at the same
offsets from its start), so cycle k's period is the start gap before it: none for cycle 0, then 30 000, 20 000,
10 000 × 5, 25 000 (cycle 8: it started late), 10 000 × 3. Median 10 000, MAD 0, so the band is 10 % (limit
11 000); three in-band cycles in a row first from cycle 3, so cycles 0-2 are warm-up and cycle 8 a rare stall
(one slow cycle, no class): 8 steady cycles per rank.
"""

from __future__ import annotations

import polars as pl
import pytest

from analyze import analyze
from analyze.cli import main
from analyze.compute import cycle_budget, steady_cycles, steady_tables
from analyze.compute.cycles import cycles, selection
from analyze.compute.tokens import summary
from analyze.model import InputError, Window
from tests.helpers import eagle_synth as es

PERIODS = [30_000, 20_000] + [10_000] * 5 + [25_000] + [10_000] * 3  # 11 periods, 12 cycles
STARTS = [10_000 + sum(PERIODS[:i]) for i in range(12)]
TOKENS = [es.ACCEPT[i % 4] + es.BATCH for i in range(12)]
STEADY = [3, 4, 5, 6, 7, 9, 10, 11]


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    return es.eagle(tmp_path_factory.mktemp("st") / "w.sqlite", cycles=12, starts=STARTS)


@pytest.fixture(scope="module")
def res(path):
    return analyze(path)


def test_warmup_and_stall_are_detected(res):
    c = cycles(res).sort("rank", "n")
    assert c.filter(pl.col("rank") == 0)["why"].to_list() == ["warm-up"] * 3 + [None] * 5 + ["stall"] + [None] * 3
    assert c.filter("steady").group_by("rank").len()["len"].to_list() == [8, 8]
    info = selection(res)
    assert (info["how"], info["warmup"], info["steady"], info["cycles"], info["left_out"]) == ("detected", 3, 8, 12, 4)
    assert info["limit_ns"] == pytest.approx(11_000) and info["median_ns"] == 10_000
    assert [s["key"] for s in info["stalls"]] == [8] and info["stalls"][0]["excess_ns"] == 15_000
    assert info["classes"] == [] and c["cycle_class"].null_count() == c.height
    assert "3 warm-up" in info["text"] and "1 rare stall" in info["text"] and "cycle 8" in info["text"]


def test_one_period_and_tokens_per_s(res):
    t = summary(res)
    assert t.period_ns == 10_000 and t.steady_cycles == 16 and t.cycles == 24
    tpc = sum(TOKENS[i] for i in STEADY) / len(STEADY)
    assert t.tokens_per_cycle == pytest.approx(tpc) and t.tokens_per_s == pytest.approx(tpc / 10_000e-9)


@pytest.mark.parametrize(("choice", "period", "n"), [
    ({"skip_cycles": 0}, sum(PERIODS) / 11, 12),  # every cycle; the first has no period
    ({"skip_cycles": 3}, sum(PERIODS[2:]) / 9, 9),  # cycles 3..11: the start gaps before them
    ({"window": "2:7"}, 12_000, 5),  # cycles 2..6: 20 000 and 4 × 10 000
])
def test_user_choice(path, choice, period, n):
    r = analyze(path, **choice)
    assert summary(r).period_ns == pytest.approx(period)
    assert selection(r)["steady"] == n
    assert steady_tables.steady_phases_all_ranks(r).filter(pl.col("phase") == "verify")["instances"].item() == 2 * n


def test_time_window_and_bad_choices(path):
    # cycles whose first GPU op (start + 1000) lies in [STARTS[4], STARTS[9]): cycles 4..8
    r = analyze(path, window=f"{STARTS[4]}ns:{STARTS[9] / 1e3}us")
    assert sorted(cycles(r).filter(pl.col("steady") & (pl.col("rank") == 0))["n"].to_list()) == [4, 5, 6, 7, 8]
    with pytest.raises(InputError, match="leaves no cycle"):
        analyze(path, window="1s:2s")
    for bad in ("5", "a:b", "5:2", "1.5:3", "1s:5"):
        with pytest.raises(InputError):
            steady_cycles.parse_window(bad)
    with pytest.raises(InputError):
        steady_cycles.check_choice(1, "2:3")
    assert steady_cycles.parse_window(":40") == Window("cycle", None, 40, ":40")


def test_steady_tables_leave_out_warmup_and_stall(res):
    ph = steady_tables.steady_phases(res)
    v = ph.filter((pl.col("rank") == 0) & (pl.col("phase") == "verify")).row(0, named=True)
    assert (v["instances"], v["span_ns"], v["span_p50_ns"], v["span_p90_ns"]) == (8, 24_000, 3_000, 3_000)
    d = ph.filter((pl.col("rank") == 0) & (pl.col("phase") == "draft")).row(0, named=True)
    assert (d["compute_mean_ns"], d["comm_mean_ns"], d["idle_mean_ns"], d["comm_p90_ns"]) == (600, 500, 0, 500)
    assert res.phases.filter((pl.col("rank") == 0) & (pl.col("phase") == "verify"))["instances"].item() == 12
    # a seam counts with the steady instance it leads into: the cycle → cycle seam before each steady cycle
    # (3..7, 9..11): 8 per rank, gap 10 000 − 6 100 each
    s = steady_tables.steady_seams_all_ranks(res).filter(pl.col("from") == "cycle").row(0, named=True)
    assert (s["instances"], s["idle_p50_ns"]) == (16, 3_900)


def test_budget_adds_up_to_the_period(res):
    b = cycle_budget.budget(res)
    r0 = {row["segment"]: row["ns"] for row in b.filter(pl.col("rank") == 0).iter_rows(named=True)}
    # steady cycles (all have a period): 3..7 and 9..11; draft_extend E = 100 + 25 tokens
    ext = sum(100 + 25 * TOKENS[i] for i in STEADY) / len(STEADY)
    assert r0["draft"] == 1_100 and r0["draft → verify"] == 400 and r0["verify"] == 3_000
    assert r0["verify → draft_extend"] == 100 and r0["draft_extend"] == pytest.approx(ext)
    assert r0["draft_extend → host_overhead"] == pytest.approx(1_400 - ext) and r0["host_overhead"] == 100
    assert r0["between cycles"] == 3_900  # previous cycle's last op (B + 7100) → this one's first (B' + 1000)
    assert b.filter(pl.col("rank") == 0)["segment"][0] == "between cycles"  # the wait before the cycle comes first
    assert b.group_by("rank").agg(pl.col("ns").sum(), pl.col("share").sum()).sort("rank").rows() == [
        (0, pytest.approx(10_000), pytest.approx(1.0)), (1, pytest.approx(10_000), pytest.approx(1.0))]
    assert b.filter((pl.col("rank") == 1) & (pl.col("segment") == "draft"))["ns"].item() == 700
    assert b.filter(pl.col("kind") == "gap")["gpu_idle_ns"].to_list() == [3_900, 3_900]
    # every cycle's pieces add up to its own period
    p = cycle_budget.cycle_pieces(res).group_by("rank", "key").agg(pl.col("ns").sum())
    per = cycles(res).select("rank", "key", "period_ns").drop_nulls()
    assert p.join(per, on=["rank", "key"]).filter(pl.col("ns") != pl.col("period_ns")).height == 0
    assert p.height == per.height == 22


def test_prefill_pieces_land_on_the_cycle_that_follows(tmp_path):
    # a prefill before each rank's first cycle (GPU [2100, 2600]) and one between cycles 3 and 4 ([49700, 50200]);
    # cycles 10 000 apart, so cycle 4's period 10 000 = gap (51 000 − 47 100 − 500) + prefill 500 + its work
    r = analyze(es.eagle(tmp_path / "p.sqlite", cycles=8, prefills=(2_000, 49_600)))
    c = cycles(r).sort("rank", "n")
    assert c.filter(pl.col("rank") == 0)["prefill_ns"].to_list() == [500, 0, 0, 0, 500, 0, 0, 0]
    p = cycle_budget.cycle_pieces(r)
    pre = p.filter(pl.col("kind") == "prefill")
    # the first cycle has no period, so its prefill is no piece of any cycle's: never moved onto cycle 1
    assert pre.select("rank", "key", "ns").sort("rank").rows() == [(0, 4, 500.0), (1, 4, 500.0)]
    assert p.filter((pl.col("kind") == "gap") & (pl.col("key") == 4))["ns"].to_list() == [3_400, 3_400]
    assert p.filter((pl.col("kind") == "gap") & (pl.col("key") == 1))["ns"].to_list() == [3_900, 3_900]
    s = p.group_by("rank", "key").agg(pl.col("ns").sum()).join(
        c.select("rank", "key", "period_ns").drop_nulls(), on=["rank", "key"])
    assert s.height == 14 and s.filter(pl.col("ns") != pl.col("period_ns")).height == 0


def test_top_kernels(res):
    k = steady_tables.kernels(res)
    nccl = k.filter((pl.col("phase") == "draft") & pl.col("name").str.starts_with("nccl")).row(0, named=True)
    # 8 steady cycles per rank, one all-reduce each: 500 and 100 ns → per rank per cycle (500 + 100) / 2
    assert (nccl["count"], nccl["kernel_ns"], nccl["per_cycle_ns"]) == (16, 8 * 600, 300)
    assert k.filter(pl.col("phase") == "verify")["share"].to_list() == [1.0]


def test_cli_text_json_and_tables(path, capsys):
    assert main(["analyze", str(path)]) == 0
    out = capsys.readouterr().out
    assert out.index("Steady state: 8 of 12 cycles") < out.index("Cycle budget") < out.index("Phases per instance") \
        < out.index("Whole run") < out.index("Findings")
    assert main(["analyze", str(path), "--format", "json", "-q"]) == 0
    import json

    d = json.loads(capsys.readouterr().out)
    assert d["steady"]["warmup"] == 3 and d["tokens"]["period_ns"] == 10_000
    v = next(p for p in d["phases_steady"] if p["rank"] == 0 and p["phase"] == "verify")
    assert {"span_mean_ns", "span_p50_ns", "span_p90_ns", "idle_p50_ns", "compute_p90_ns"} <= set(v)
    assert {f["code"] for f in d["findings"]} >= {"GAP_HOST_BOUND", "STALLS"}
    for name in ("budget", "kernels", "phases_steady", "cycles"):  # --table without --format csv: that table
        assert main(["analyze", str(path), "--table", name, "-q"]) == 0
        assert capsys.readouterr().out.count("\n") > 2
    assert main(["analyze", str(path), "--table", "budget", "--format", "json", "-q"]) == 0
    assert len(json.loads(capsys.readouterr().out)["budget"]) == 16
    assert main(["analyze", str(path), "--table", "nope"]) == 2
    assert main(["analyze", str(path), "--skip-cycles", "1", "--window", "1:3"]) == 2  # argparse: mutually exclusive


def _marks_by_joins(res) -> pl.DataFrame:
    """steady_tables.steady_marks as it was (each top realigned by a join on the ids, the top's start joined on its rank): the
    reference of test_steady_marks_row_for_row."""
    inst = res.instances
    ids = ["report", "range_id"] if "report" in inst.columns else ["range_id"]
    rep = ids[:-1]
    cur = inst.select(*ids, top=pl.col("range_id"), up=pl.col("parent"))
    up = inst.select(*rep, up="range_id", _up2="parent")
    while cur["up"].null_count() < cur.height:
        cur = (cur.join(up, on=[*rep, "up"], how="left")
               .with_columns(top=pl.coalesce("up", "top"), up=pl.col("_up2")).drop("_up2"))
    narrow = inst.select(*ids, "rank", "start")
    narrow = narrow.with_columns(top=narrow.join(cur.select(*ids, "top"), on=ids, how="left", maintain_order="left")["top"])
    cyc = cycles(res)
    flags = cyc.select("rank", top="range_id", _cyc=pl.col("steady"))
    env = cyc.filter("steady").group_by("rank").agg(_a=pl.col("start").min(), _b=pl.col("end").max())
    tops = narrow.select("rank", *rep, top="range_id", _tstart="start")
    narrow = (narrow.join(flags, on=["rank", "top"], how="left", maintain_order="left")
              .join(tops, on=["rank", *rep, "top"], how="left", maintain_order="left")
              .join(env, on="rank", how="left", maintain_order="left")
              .with_columns(_has=pl.col("rank").is_in(cyc["rank"].unique().implode())))
    inside = (pl.col("_tstart") >= pl.col("_a")) & (pl.col("_tstart") <= pl.col("_b"))
    steady = (pl.when(pl.col("_cyc").is_not_null()).then(pl.col("_cyc"))
              .when(pl.col("rank").is_null() | ~pl.col("_has")).then(True)
              .otherwise(inside.fill_null(False)))
    return narrow.select(top="top", steady=steady)


def test_steady_marks_row_for_row(res, tmp_path):
    """The steady marks (outermost range and whether it counts) carry the top's rank and start up the nesting levels:
    the same, row for row, as realigning the tops and joining their starts (one trace, two merged reports with the
    same range ids, a trace with prefills outside the cycles)."""
    paths = [es.chained(tmp_path / f"{n}.sqlite", "Graph") for n in ("a", "b")]
    import sqlite3

    con = sqlite3.connect(paths[1])
    con.execute("PRAGMA user_version = 1")
    con.close()
    pre = es.eagle(tmp_path / "p.sqlite", cycles=8, prefills=(2_000, 49_600))
    for r in (res, analyze(paths, jobs=1), analyze(pre)):
        got = steady_tables.steady_marks.make(r)
        assert got.height == r.instances.height and got.equals(_marks_by_joins(r))
