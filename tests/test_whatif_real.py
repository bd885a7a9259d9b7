"""What-if on the bundled real H200 steps sweep (tests/data/h200_tp1, the embedded workload, steps 1..4).

The bound (10 %) is the acceptance criterion; the measured errors are in the README.
"""

from __future__ import annotations

import polars as pl
import pytest

from analyze import analyze
from analyze.compute.tokens import summary
from analyze.compute.whatif import validate
from analyze.compute.whatif_fit import fit
from nvtx_hooks.capture import samples


@pytest.fixture(scope="module")
def sweep():
    return {s: analyze(samples.path(f"tp1_steps{s}")) for s in (1, 2, 3, 4)}


def test_manifest_and_payload_are_read(sweep):
    t = summary(sweep[2])
    assert (t.steps, t.source, t.batch_size) == (2, "payload", 4.0)
    assert fit(sweep[2]).steps_now == 2  # from the bundled manifest


def test_predicted_cycle_time_within_10pct(sweep):
    v = validate(sweep)
    assert v.height == 16
    assert v.filter(pl.col("from_steps") == pl.col("steps"))["error_pct"].abs().max() < 1e-9
    assert v["error_pct"].abs().max() < 10


def test_validate_over_repeated_runs(sweep):
    """Repeated runs of one step count: measured = the median of the runs' periods (tokens.DEFINITION), every
    run's model predicts every step count, the spread is (max − min) / median of the runs."""
    other = analyze(samples.path("tp1_s3_graph"))  # another 3-step run (the step sweep's 32-layer capture)
    a, b = summary(sweep[3]).period_ns, summary(other).period_ns
    assert abs(a / b - 1) > 0.01  # really different runs
    v = validate({3: [sweep[3], other, sweep[3]], 1: sweep[1]})
    assert v.height == 4 * 2 and v["from_run"].to_list() == [0, 0, 0, 0, 1, 1, 2, 2]  # 1 run at 1 step, 3 at 3
    three = v.filter(pl.col("steps") == 3)
    assert three["measured_ns"].unique().to_list() == [pytest.approx(a)]  # median of (a, b, a)
    assert three["runs"].unique().to_list() == [3]
    assert three["measured_spread_pct"][0] == pytest.approx(100 * abs(a - b) / a)
    own = three.filter(pl.col("from_steps") == 3).sort("from_run")
    assert own["predicted_ns"].to_list() == pytest.approx([a, b, a])  # a model replays its own run exactly
    assert own["error_pct"][1] == pytest.approx(100 * (b - a) / a)
    one = v.filter(pl.col("steps") == 1)
    assert one["runs"].unique().to_list() == [1] and one["measured_spread_pct"].unique().to_list() == [0.0]
    assert one.filter(pl.col("from_steps") == 1)["error_pct"][0] == pytest.approx(0, abs=1e-9)


def test_a_phase_launched_by_two_calls_in_a_window_replays():
    """tp1_sched_cpu (CPU sampling): each cycle's verify is launched by two key calls, so the replay's window holds
    its unit twice. The slots of what follows it were joined on both (rows repeated: more items per window than
    slots, an IndexError). The twins are one call now (API_TWINS); the replay of the measured cycles is exact."""
    from analyze.compute.whatif_replay import replay

    res = analyze(samples.path("tp1_sched_cpu"))
    r = replay(res)
    assert r.windows > 100 and (r.n_items <= r.a["s"].shape[1]).all()
    period, _, _ = r.run({})
    assert abs(float(period.mean()) - float(r.period.mean())) / float(r.period.mean()) < 0.01
    assert fit(res).predict(3).measured
