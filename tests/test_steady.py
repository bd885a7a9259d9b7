"""Steady state, headline tables and the cycle budget on a hand-computed synthetic trace (tests/eagle_synth.py).

Twelve cycles on 2 ranks whose periods are 30 000, 20 000, then 10 000 except a 25 000 stall at cycle 7:
median 10 000, MAD 0, so the band is 10 % (limit 11 000); the period settles at cycle 2 (three in-band periods
from there), so cycles 0-1 are warm-up and cycle 7 a stall: 9 steady cycles per rank.
"""

from __future__ import annotations

import eagle_synth as es
import polars as pl
import pytest

from analyze import analyze
from analyze.cli import main
from analyze.compute import headline, steady
from analyze.compute.tokens import cycles, selection, summary
from analyze.model import InputError

PERIODS = [30_000, 20_000] + [10_000] * 5 + [25_000] + [10_000] * 3  # 11 periods, 12 cycles
STARTS = [10_000 + sum(PERIODS[:i]) for i in range(12)]
TOKENS = [es.ACCEPT[i % 4] + es.BATCH for i in range(12)]
STEADY = [2, 3, 4, 5, 6, 8, 9, 10, 11]


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    return es.eagle(tmp_path_factory.mktemp("st") / "w.sqlite", cycles=12, starts=STARTS)


@pytest.fixture(scope="module")
def res(path):
    return analyze(path)


def test_warmup_and_stall_are_detected(res):
    c = cycles(res).sort("rank", "n")
    assert c.filter(pl.col("rank") == 0)["why"].to_list() == ["warm-up"] * 2 + [None] * 5 + ["stall"] + [None] * 4
    assert c.filter("steady").group_by("rank").len()["len"].to_list() == [9, 9]
    info = selection(res)
    assert (info["how"], info["warmup"], info["steady"], info["cycles"], info["left_out"]) == ("detected", 2, 9, 12, 3)
    assert info["limit_ns"] == pytest.approx(11_000) and info["median_ns"] == 10_000
    assert [s["n"] for s in info["stalls"]] == [7] and info["stalls"][0]["excess_ns"] == 15_000
    assert "2 warm-up" in info["text"] and "1 stall" in info["text"] and "cycle 7" in info["text"]


def test_one_period_and_tokens_per_s(res):
    t = summary(res)
    assert t.period_ns == 10_000 and t.steady_cycles == 18 and t.cycles == 24
    tpc = sum(TOKENS[i] for i in STEADY) / len(STEADY)
    assert t.tokens_per_cycle == pytest.approx(tpc) and t.tokens_per_s == pytest.approx(tpc / 10_000e-9)


@pytest.mark.parametrize(("choice", "period", "n"), [
    ({"skip_cycles": 0}, sum(PERIODS) / 11, 12),
    ({"skip_cycles": 3}, sum(PERIODS[3:]) / 8, 9),
    ({"window": "2:7"}, 10_000, 5),
])
def test_user_choice(path, choice, period, n):
    r = analyze(path, **choice)
    assert summary(r).period_ns == pytest.approx(period)
    assert selection(r)["steady"] == n
    assert headline.phases_all(r).filter(pl.col("phase") == "verify")["instances"].item() == 2 * n


def test_time_window_and_bad_choices(path):
    # cycles whose first GPU op (start + 1000) lies in [STARTS[4], STARTS[9]): cycles 4..8
    r = analyze(path, window=f"{STARTS[4]}ns:{STARTS[9] / 1e3}us")
    assert sorted(cycles(r).filter(pl.col("steady") & (pl.col("rank") == 0))["n"].to_list()) == [4, 5, 6, 7, 8]
    with pytest.raises(InputError, match="leaves no cycle"):
        analyze(path, window="1s:2s")
    for bad in ("5", "a:b", "5:2", "1.5:3", "1s:5"):
        with pytest.raises(InputError):
            steady.parse_window(bad)
    with pytest.raises(InputError):
        steady.check_choice(1, "2:3")
    assert steady.parse_window(":40") == {"unit": "cycle", "start": None, "end": 40, "text": ":40"}


def test_steady_tables_leave_out_warmup_and_stall(res):
    ph = headline.phases(res)
    v = ph.filter((pl.col("rank") == 0) & (pl.col("phase") == "verify")).row(0, named=True)
    assert (v["instances"], v["span_ns"], v["span_p50_ns"], v["span_p90_ns"]) == (9, 27_000, 3_000, 3_000)
    d = ph.filter((pl.col("rank") == 0) & (pl.col("phase") == "draft")).row(0, named=True)
    assert (d["compute_mean_ns"], d["comm_mean_ns"], d["idle_mean_ns"], d["comm_p90_ns"]) == (600, 500, 0, 500)
    assert res.phases.filter((pl.col("rank") == 0) & (pl.col("phase") == "verify"))["instances"].item() == 12
    # seams only between steady instances; the top-level cycle → cycle seam needs both cycles steady
    s = headline.seams_all(res).filter(pl.col("from") == "cycle").row(0, named=True)
    # steady pairs (n-1, n) with both steady: 3,4,5,6 and 9,10,11 -> 7 per rank, gap 10 000 − 6 100 each
    assert (s["instances"], s["idle_p50_ns"]) == (14, 3_900)


def test_budget_adds_up_to_the_period(res):
    b = headline.budget(res)
    r0 = {row["segment"]: row["ns"] for row in b.filter(pl.col("rank") == 0).iter_rows(named=True)}
    # steady cycles with a period: 2..6 and 8..10; draft_extend E = 100 + 25 tokens
    ext = sum(100 + 25 * TOKENS[i] for i in (2, 3, 4, 5, 6, 8, 9, 10)) / 8
    assert r0["draft"] == 1_100 and r0["draft → verify"] == 400 and r0["verify"] == 3_000
    assert r0["verify → draft_extend"] == 100 and r0["draft_extend"] == pytest.approx(ext)
    assert r0["draft_extend → host_overhead"] == pytest.approx(1_400 - ext) and r0["host_overhead"] == 100
    assert r0["between cycles"] == 3_900
    assert b.group_by("rank").agg(pl.col("ns").sum(), pl.col("share").sum()).sort("rank").rows() == [
        (0, pytest.approx(10_000), pytest.approx(1.0)), (1, pytest.approx(10_000), pytest.approx(1.0))]
    assert b.filter((pl.col("rank") == 1) & (pl.col("segment") == "draft"))["ns"].item() == 700
    assert b.filter(pl.col("kind") == "gap")["gpu_idle_ns"].to_list() == [3_900, 3_900]


def test_top_kernels(res):
    k = headline.kernels(res)
    nccl = k.filter((pl.col("phase") == "draft") & pl.col("name").str.starts_with("nccl")).row(0, named=True)
    # 9 steady cycles per rank, one all-reduce each: 500 and 100 ns → per rank per cycle (500 + 100) / 2
    assert (nccl["count"], nccl["kernel_ns"], nccl["per_cycle_ns"]) == (18, 9 * 600, 300)
    assert k.filter(pl.col("phase") == "verify")["share"].to_list() == [1.0]


def test_cli_text_json_and_tables(path, capsys):
    assert main(["analyze", str(path)]) == 0
    out = capsys.readouterr().out
    assert out.index("Steady state: 9 of 12 cycles") < out.index("Cycle budget") < out.index("Phases per instance") \
        < out.index("Whole run") < out.index("Findings")
    assert main(["analyze", str(path), "--format", "json", "-q"]) == 0
    import json

    d = json.loads(capsys.readouterr().out)
    assert d["steady"]["warmup"] == 2 and d["tokens"]["period_ns"] == 10_000
    v = next(p for p in d["phases_steady"] if p["rank"] == 0 and p["phase"] == "verify")
    assert {"span_mean_ns", "span_p50_ns", "span_p90_ns", "idle_p50_ns", "compute_p90_ns"} <= set(v)
    assert {f["code"] for f in d["findings"]} >= {"GAP_HOST_BOUND", "STALLS"}
    for name in ("budget", "kernels", "phases_steady", "cycles"):  # --table without --format csv: that table
        assert main(["analyze", str(path), "--table", name, "-q"]) == 0
        assert capsys.readouterr().out.count("\n") > 2
    assert main(["analyze", str(path), "--table", "budget", "--format", "json", "-q"]) == 0
    assert len(json.loads(capsys.readouterr().out)["budget"]) == 16
    assert main(["analyze", str(path), "--table", "nope"]) == 2
    with pytest.raises(SystemExit) as e:  # argparse: mutually exclusive
        main(["analyze", str(path), "--skip-cycles", "1", "--window", "1:3"])
    assert e.value.code == 2
