"""The best draft-step count per batch size from one trace, checked against a real sweep.

`tests/device/best_steps_per_batch.sh` on one H200: the workload's serving schedule (batch 1, 8, 32, 128; 30 cycles each;
acceptance geometric, α = 0.7) captured at 1..4 draft steps (graph level), and run 3 times at each step count
without a profiler (`tp1_sweep_plain.jsonl`: per segment the host-measured median period). The what-if per
segment is fitted on the 3-step capture alone; the runs without a profiler are the truth.
"""

from __future__ import annotations

import json

import pytest

from analyze import analyze, whatif
from analyze.cli import main
from analyze.compute import findings
from analyze.output import sglang_config
from bench.segments_table import plain_medians
from nvtx_hooks.capture import samples

ALPHA = 0.7  # the workload's acceptance: E[accepted drafts | S] = α + … + α^S


def plain() -> dict:
    """(batch size, steps) → the median over the runs of the segment's host-measured median period (µs)."""
    return plain_medians(["tp1_sweep_plain.jsonl"])


@pytest.fixture(scope="module")
def model():
    return whatif(samples.path("tp1_sweep_s3_graph"))


def test_one_model_per_batch_size_with_verify_measured_across_them(model):
    segs = [sm.as_dict(4) for sm in model.segments]
    assert [d["batch_size"] for d in segs] == [1, 8, 32, 128]
    assert all(d["verify_source"] == "segments" for d in segs)
    # the verify curve: each batch size's verify at 4 tokens per request (3 steps), growing with the tokens
    pts = model.segments[0].model.verify_points
    assert [t for t, _ in pts] == [4, 32, 128, 512] and [v for _, v in pts] == sorted(v for _, v in pts)
    assert pts[-1][1] > 2 * pts[0][1]  # 512 tokens per cycle: verify is compute-bound


# The measured accuracy (README "What-if per batch size"): within 4 % wherever the verify curve is measured
# close by; the 128-request segment, whose verify grows unevenly between the measured 128 and 512 tokens per
# cycle (GEMM tiles), and the 32-request one at 4 steps (160 tokens, interpolated towards 512) are further off.
BOUND = {(1, 1): 4, (1, 2): 4, (1, 4): 4, (8, 1): 4, (8, 2): 4, (8, 4): 4, (32, 1): 4, (32, 2): 4, (32, 4): 8,
         (128, 1): 4, (128, 2): 12, (128, 4): 7}


def test_predicted_periods_against_runs_without_a_profiler(model):
    truth = plain()
    for sm in model.segments:
        for steps in (1, 2, 4):
            pred = sm.model.predict(steps).cycle_ns / 1e3
            err = 100 * (pred / truth[(sm.batch_size, steps)] - 1)
            assert abs(err) <= BOUND[(sm.batch_size, steps)], (sm.key, steps, round(err, 1))


def test_best_steps_per_batch_size(model):
    truth = plain()

    def tokens_per_s(bs, steps):
        return bs * (1 + sum(ALPHA ** i for i in range(1, steps + 1))) / truth[(bs, steps)]

    for sm in model.segments:
        d = sm.as_dict(4)
        best = d["best_steps"]
        assert abs(best - 3) <= 1  # never more than one step from what was measured
        sweep = max((2, 3, 4), key=lambda s: tokens_per_s(sm.batch_size, s))  # the same candidates
        if sm.batch_size in (1, 8):  # memory-bound verify: more steps pay
            assert best == sweep == 4
    # the sweep's best at 128 requests is 1 step: two steps from the measured 3, so extrapolated here
    d128 = model.segments[-1].as_dict(4)
    assert d128["predictions"][0]["extrapolated"] and d128["best_steps"] == 2


def test_sglang_config_reads_back(model, tmp_path):
    path = tmp_path / "tiers.json"
    src = samples.path("tp1_sweep_s3_graph")
    assert main(["whatif", str(src), "--sglang-config", str(path), "--max-steps", "4"]) == 0
    cfg = json.loads(path.read_text())
    # SGLang 0.5.23's own reading (adaptive_spec_params._load_adaptive_config and _find_closest_bs)
    bs_entries = {int(k): v for k, v in cfg.items() if k.isdigit()}
    for v in bs_entries.values():
        steps = v["candidate_steps"]
        assert isinstance(steps, list) and steps and all(isinstance(x, int) and x >= 0 for x in steps)
    keys = sorted(bs_entries)

    def route(bs):
        import bisect

        return bs_entries[keys[max(0, bisect.bisect_right(keys, bs) - 1)]]["candidate_steps"]

    best = {sm.batch_size: sm.as_dict(4)["best_steps"] for sm in model.segments}
    for bs, b in best.items():
        assert b in route(bs) and 3 in route(bs)  # the best and the current one
    # adjacent batch sizes with the same best step count share a tier
    tiers = cfg["_spectrace"]["tiers"]
    assert all(a["best_steps"] != b["best_steps"] for a, b in zip(tiers, tiers[1:]))
    assert keys[0] == 1
    assert main(["whatif", str(src), "--sglang-config", str(src)]) == 2  # never the input


def test_no_finding_recommends_an_extrapolated_or_assumed_step_count():
    res = analyze(samples.path("tp1_node"))  # the demo: one batch size, no baseline
    (f,) = [x for x in findings.find(res) if x.code == "WHATIF_STEPS"]
    assert "ASSUMED" in f.evidence and "extrapolated, not recommended" in f.evidence
    m = whatif(samples.path("tp1_node"))
    near = m.best(measured_only=True)
    assert abs(near.steps - m.steps_now) <= 1 and f"at {near.steps} draft steps" in f.evidence
    assert m.best().extrapolated  # the overall best is further out, and said to be


def test_per_batch_finding_on_the_serving_sweep():
    res = analyze(samples.path("tp1_sweep_s3_graph"))
    found = findings.find(res)
    (f,) = [x for x in found if x.code == "WHATIF_STEPS_PER_BATCH"]
    assert "batch 1: 4" in f.evidence and "batch 128: 2" in f.evidence
    assert not [x for x in found if x.code == "WHATIF_STEPS"]  # one average model: right for no batch size


def test_tiers_merge_and_keep_the_current_step():
    segs = [{"batch_size": 1, "best_steps": 4}, {"batch_size": 8, "best_steps": 4},
            {"batch_size": 32, "best_steps": 3}, {"batch_size": 128, "best_steps": None}]
    t = sglang_config.tiers(segs, 3)
    assert [(x.batch_from, x.best_steps, x.candidate_steps, x.batch_sizes) for x in t] == [
        (1, 4, (3, 4), (1, 8)), (32, 3, (3,), (32, 128))]
