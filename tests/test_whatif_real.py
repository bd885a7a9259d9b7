"""What-if on the bundled real H200 steps sweep (tests/data/h200_tp1, the embedded workload, steps 1..4).

The bound (10 %) is the acceptance criterion; the measured errors are in the README.
"""

from __future__ import annotations

import polars as pl
import pytest

from analyze import analyze
from analyze.compute.tokens import summary
from analyze.compute.whatif import fit, validate
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
