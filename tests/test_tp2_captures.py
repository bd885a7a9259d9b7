"""Real TP=2 captures made on two H200s this session (tests/device/session.sh 1; tests/data/h200_tp2/README.md).

- ``tp2_all``: the workload captured whole (``--capture all``) with its new exit (CUPTI flush, NCCL teardown):
  complete on every rank.
- ``tp2_straggler``: the capture window opened and closed by rank 0 only (``--profiler-rank 0``, what SGLang
  does), rank 1 sleeping 500 µs before every verify (``--delay-rank 1 --delay-us 500``): ragged windows and a
  known straggler.
- ``tp2_v2``: the workload's SGLang-v2-like mode: accept lengths stay on the GPU and arrive in ``accept``
  marks a cycle later; its manifest keeps the workload's own record of the accept lengths.

Expected numbers come from the capture's manifest (the injected delay, the workload's record) or from SQL on
the export, never from the analysis under test.
"""

from __future__ import annotations

import json

import polars as pl
import pytest
from test_rank_windows import codes, cut_copy
from test_rank_windows_real import check_same_cycles, cycles_sql

from analyze import analyze
from analyze.compute.collectives import cross_rank
from analyze.compute.cycles import cycles
from analyze.compute.tokens import summary
from nvtx_hooks.capture import complete
from tests.helpers.paths import TP2, tp2


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return tmp_path_factory.mktemp("tp2dev")


def manifest(name: str) -> dict:
    return json.loads((TP2 / f"{name}.manifest.json").read_text())


def test_whole_run_capture_is_complete_on_every_rank(data):
    path = tp2("tp2_all", data)
    ranks = complete.ranks(path)
    assert len(ranks) == 2 and all(r.complete and r.lost == 0 for r in ranks)
    res = analyze(path)
    c = codes(res.diagnostics)
    assert not {"GPU_TAIL_LOST", "WINDOW_CUT", "UNPAIRED_INSTANCES"} & set(c)
    per_rank = res.phases.filter(pl.col("phase") == "verify").sort("rank")["instances"].to_list()
    assert per_rank == [33, 33]  # 3 warm-up + 30 measured cycles, all on both ranks


@pytest.fixture(scope="module")
def straggler(data):
    return analyze(tp2("tp2_straggler", data))


def test_injected_straggler_is_named_with_its_delay(straggler):
    spec = manifest("tp2_straggler")["speculative"]
    assert (spec["delay_rank"], spec["delay_us"]) == (1, 500)
    assert "payload" in codes(straggler.diagnostics)["INSTANCE_PAIRING"][0]
    assert straggler.comm_refused.height == 0
    c = cross_rank([straggler])
    st = c.stragglers.filter(pl.col("phase") == "verify").sort("last_arrivals", descending=True).row(0, named=True)
    assert st["rank"] == 1 and 0.9 * 500_000 <= st["max_delay_ns"] <= 1.1 * 500_000
    # the ranks otherwise run in lock step: the typical arrival skew is microseconds, not the injected delay
    assert (c.collectives["skew_p50_ns"] < 20_000).all()
    # rank 0 waits for rank 1 in verify about once per cycle by about the injected delay
    wait = straggler.phases.filter(pl.col("phase") == "verify").sort("rank")["comm_wait_ns"].to_list()
    n = int(straggler.phases.filter((pl.col("phase") == "verify") & (pl.col("rank") == 0))["instances"][0])
    assert 0.8 * 500_000 * n <= wait[0] <= 1.1 * 500_000 * n and wait[1] < 0.05 * wait[0]


@pytest.mark.parametrize("phase", ["draft", "verify"])
def test_cut_mid_cycle_keeps_the_same_numbers(straggler, data, tmp_path, phase):
    """Rank 1 cut inside cycle 12: over the cycles both keep, per-rank wait, straggler and max delay unchanged."""
    path = data / "tp2_straggler.sqlite"
    pid1 = manifest("tp2_straggler")["ranks"][1]["pid"]
    c12 = next(c for c in cycles_sql(path, pid1) if c[2] == 12)
    t = c12[0] + (c12[1] - c12[0]) // 2
    cut = analyze(cut_copy(path, tmp_path / "cut.sqlite", pid1, before=t, ranges_ending_before=t))
    pid0 = manifest("tp2_straggler")["ranks"][0]["pid"]
    after = [c for c in cycles_sql(path, pid0) if c[2] > 12]  # rank 0's later cycles, from the export
    check_same_cycles(straggler, cut, phase, len(after))


def test_v2_acceptance_from_marks_equals_the_workload_record(data):
    """SGLang v2: per cycle, the accepted tokens measured from the accept marks equal what the workload used."""
    res = analyze(tp2("tp2_v2", data))
    records = [r for r in manifest("tp2_v2")["program_output"] if "accept_lengths" in r]
    assert len(records) == 2
    c = cycles(res)
    for rec in records:
        want = {int(k): v for k, v in rec["accept_lengths"].items()}  # per request, bonus token included
        got = c.filter((pl.col("rank") == rec["rank"]) & pl.col("cycle_index").is_in(list(want)))
        assert got.height == len(want) == 30
        assert set(got["accept_source"]) == {"marks"}
        assert {ci: a // b + 1 for ci, a, b in got.select("cycle_index", "accept_length", "batch_size").rows()} == want
    t = summary(res)
    assert t.acceptance_source == "marks" and t.accepted_cycles > 0
