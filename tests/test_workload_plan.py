"""The workload's plan (nvtx_hooks/capture/plan.py): segments, acceptance, injected host time; pure Python."""

from __future__ import annotations

import random
import time

import pytest

from nvtx_hooks.capture import plan as pl
from nvtx_hooks.capture import workload


def test_adaptive_segments():
    assert pl.parse_adaptive("1:4,8:3,32:1,64:0,8:3", 50) == [
        pl.Segment(1, 4, 50), pl.Segment(8, 3, 50), pl.Segment(32, 1, 50), pl.Segment(64, 0, 50),
        pl.Segment(8, 3, 50)]
    assert pl.parse_adaptive(" 2:0:7 ,4:2", 9) == [pl.Segment(2, 0, 7), pl.Segment(4, 2, 9)]
    for bad in ("", "4", "1:2:3:4", "0:1", "1:-1", "1:2:0", "a:1", "1:31"):
        with pytest.raises(ValueError):
            pl.parse_adaptive(bad, 10)


@pytest.mark.parametrize("text,want", [
    ("get_next_batch_to_run:500:every=8", pl.Extra("get_next_batch_to_run", 500, every=8)),
    ("between:100:every=4+3", pl.Extra("between", 100, every=4, offset=3)),
    ("process_batch_result:300:p=0.25", pl.Extra("process_batch_result", 300, prob=0.25)),
    ("recv_requests:200:from=150", pl.Extra("recv_requests", 200, start=150)),
    ("host_overhead:0:from=0", pl.Extra("host_overhead", 0, start=0)),
])
def test_extra_rules(text, want):
    got = pl.parse_extra(text)
    assert got == want and pl.parse_extra(f"{got.piece}:{got.us}:{got.rule}") == got


@pytest.mark.parametrize("bad", ["run_batch:1:every=2", "x:1:every=2", "between:-1:every=2", "between:1:every=0",
                                 "between:1:every=2+2", "between:1:p=1.5", "between:1:from=-1", "between:1",
                                 "between:1:often=2", "between:a:p=0.1"])
def test_extra_refused(bad):
    with pytest.raises(ValueError, match="PIECE:US"):
        pl.parse_extra(bad)


def test_extra_cycles():
    xs = [pl.Extra("between", 1, every=8), pl.Extra("between", 1, prob=0.25), pl.Extra("between", 1, start=290),
          pl.Extra("between", 1, every=3, offset=2)]
    got = pl.extra_cycles(xs, 300, seed=7)
    assert got[0] == list(range(8, 300, 8)) and got[2] == list(range(290, 300)) and got[3] == list(range(2, 300, 3))
    assert 0 not in got[1] and 50 < len(got[1]) < 100  # 299 draws at p 0.25: 75 expected
    assert pl.extra_cycles(xs, 300, seed=7) == got  # seeded: the same on every rank and every run
    assert pl.extra_cycles(xs, 300, seed=8)[1] != got[1]
    # each probabilistic extra draws from its own stream (seed and position): two at one p differ
    two = pl.extra_cycles([xs[1], xs[1]], 300, seed=7)
    assert two[0] != two[1]


def test_drafts_reproduce_the_historical_schedules():
    """Without a profile every request of a cycle accepts alike, drawn exactly as accept_lengths always drew."""
    for rate in (None, 0.7):
        old = [1 + d[0] for d in pl.plan_drafts([(3, 4)] * 50, 5, rate, None)]
        rng = random.Random(5)
        if rate is None:
            want = [rng.randint(1, 5) for _ in range(50)]
        else:
            want = []
            for _ in range(50):
                k = 0
                while k < 4 and rng.random() < rate:
                    k += 1
                want.append(k + 1)
        assert old == want == workload.accept_lengths(50, 4, 5, rate)
    assert all(ds == [ds[0]] * 3 for ds in pl.plan_drafts([(3, 4)] * 20, 1, None, None))
    assert pl.plan_drafts([(2, 0)] * 5, 1, None, (0.9,)) == [[0, 0]] * 5  # 0 steps: nothing to accept


def test_profile_is_the_conditional_acceptance_per_position():
    profile = (0.9, 0.6, 0.3)
    drafts = [d for ds in pl.plan_drafts([(100, 5)] * 400, 3, None, profile) for d in ds]  # 40,000 requests
    at = [sum(d >= j for d in drafts) for j in range(6)]  # requests that accepted at least j drafts
    cond = [at[j] / at[j - 1] for j in range(1, 6)]
    for got, want in zip(cond, (0.9, 0.6, 0.3, 0.3, 0.3)):  # past the list: its last value
        assert got == pytest.approx(want, abs=0.03)
    assert max(drafts) <= 5


def test_parsers_refuse_in_one_line():
    assert pl.parse_profile("0.9,0.5") == (0.9, 0.5)
    for bad in ("", "x", "1.2", "0.5,-0.1"):
        with pytest.raises(ValueError, match="probabilities"):
            pl.parse_profile(bad)
    assert pl.parse_scheduler_us("recv_requests=5")["recv_requests"] == 5
    assert pl.parse_scheduler_us("recv_requests=5")["get_next_batch_to_run"] == 150
    for bad in ("run_batch=5", "recv_requests", "recv_requests=-1", "x=1"):
        with pytest.raises(ValueError, match="NAME=US"):
            pl.parse_scheduler_us(bad)


def test_busy_function_spends_its_time_in_python():
    t = time.perf_counter()
    pl.spectrace_busy_python(0.003)
    assert time.perf_counter() - t >= 0.003
    assert pl.spectrace_busy_python.__name__ == pl.BUSY_FUNCTION
    assert pl.range_name("get_next_batch_to_run") == "scheduler.get_next_batch_to_run"
    assert pl.SCHEDULER_FUNCTIONS == ("recv_requests", "process_input_requests", "get_next_batch_to_run",
                                      "process_batch_result")
