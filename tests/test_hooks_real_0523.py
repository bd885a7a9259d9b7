"""The hooks on SGLang 0.5.23's real decode step (the wheel's own ``EAGLEWorkerV2`` methods and adaptive controller,
run over stub collaborators: tests/helpers/real_sglang.py), as released and rewritten into #31499's shape.

Every branch of ``forward_batch_generation`` that skips or adds a hooked method: adaptive steps per batch size (the
step count on every range, known before SGLang activates it), 0 steps (no draft), 0 steps without draft_extend
(``SGLANG_SPEC_SKIP_ZERO_STEP_DRAFT_EXTEND``), pipeline parallel (the next round's draft after draft_extend, and a
cycle that drafts nothing), DP-attention coordination (a decode cycle inside a batch classified as prefill).
"""

from __future__ import annotations

import pytest

from nvtx_hooks import patch
from nvtx_hooks.check import FetchError, fetch_sglang
from nvtx_hooks.phases import decode_payload
from tests.helpers import real_sglang, sglang_stubs
from tests.helpers.fake_hooks import record
from tests.helpers.fake_hooks import shape as _shape

pytestmark = pytest.mark.slow  # the 0.5.23 wheel's sources (fetched once from PyPI, then cached)

TIERS = {1: [4], 8: [3], 32: [1], 64: [0]}  # batch size -> candidate steps (one each: a fixed route)
CYCLE = ["cycle", "  draft", "  verify", "  draft_extend"]
ZERO = ["cycle", "  verify", "  draft_extend"]


@pytest.fixture(scope="module")
def wheel():
    try:
        return fetch_sglang("0.5.23")
    except FetchError as e:
        pytest.skip(f"cannot fetch sglang==0.5.23 from PyPI (offline?): {e}")


@pytest.fixture(params=[False, True], ids=["as-released", "31499-shared-step"])
def step(request, wheel, tmp_path, monkeypatch):
    """(the generated eagle_worker_v2 module, the recorded events: NVTX calls and the stubs' log in one list)."""
    root = real_sglang.build(wheel, tmp_path / "pkg", shared=request.param)
    gen = record(monkeypatch, root)
    events = next(gen)
    sglang_stubs.reset()
    monkeypatch.setattr(sglang_stubs, "LOG", events)  # what SGLang's stub collaborators did, in the same timeline
    patch.install("0.5.23")
    from sglang.srt.speculative import eagle_worker_v2

    yield eagle_worker_v2, events, request.param
    sglang_stubs.reset()
    next(gen, None)


def _nvtx(events):
    return [e for e in events if e[0] in ("push", "pop", "mark")]


def _pay(events, name):
    return [decode_payload(e[2]) for e in events if e[0] == "push" and e[1] == name]


def test_layout_and_what_was_patched(step):
    m, _, shared = step
    assert patch.layout() == ("shared-step" if shared else "worker-step")
    done = patch.patched()
    assert ("sglang.srt.speculative.eagle_worker_common.run_eagle_verify" in done) is shared
    assert ("sglang.srt.speculative.eagle_worker_v2.EAGLEWorkerV2.verify" in done) is (not shared)
    assert "sglang.srt.speculative.eagle_worker_v2.EAGLEWorkerV2._forward_dp_spec_prefill_coordination" in done


def test_adaptive_steps_per_batch_size(step, tmp_path):
    """Tiers 1:4, 8:3, 32:1, 64:0: every range carries the step count its cycle ran with; the 0-step cycle has no
    draft range (SGLang builds a trivial verify input instead); the count is on the cycle before SGLang switches."""
    m, ev, _ = step
    w = m.EAGLEWorkerV2(steps=3, adaptive=TIERS, tmp=tmp_path)
    for bs in (1, 8, 32, 64, 8):
        w.forward_batch_generation(sglang_stubs.Batch(bs))
    assert _shape(_nvtx(ev)) == CYCLE * 3 + ZERO + CYCLE
    want = [(1, 4), (8, 3), (32, 1), (64, 0), (8, 3)]
    for name in ("cycle", "verify", "draft_extend"):
        assert [(p["batch_size"], p["steps"]) for p in _pay(ev, name)] == want, name
        assert [p["cycle_index"] for p in _pay(ev, name)] == [1, 2, 3, 4, 5]
    assert [(p["batch_size"], p["steps"], p["next_round"]) for p in _pay(ev, "draft")] == [
        (1, 4, False), (8, 3, False), (32, 1, False), (8, 3, False)]
    # the timeline: cycle pushed (steps known), then SGLang switches to them, then the draft runs with them
    first = [e for e in ev if e[0] not in ("pop", "log")][:4]
    assert [e[1] if e[0] == "push" else e[0] for e in first] == ["cycle", "switch", "draft", "draft"]
    assert decode_payload(first[0][2])["steps"] == 4 and first[1] == ("switch", 4) and first[3][2] == 4
    assert ("trivial_verify_input", 64) in ev and not any("(steps)" in r for r in patch._reported)


def test_zero_steps_without_draft_extend(step, tmp_path):
    """SGLANG_SPEC_SKIP_ZERO_STEP_DRAFT_EXTEND: a 0-step cycle is verify alone (SGLang stubs the draft input)."""
    m, ev, _ = step
    sglang_stubs.envs.SGLANG_SPEC_SKIP_ZERO_STEP_DRAFT_EXTEND.value = True
    w = m.EAGLEWorkerV2(steps=3, adaptive=TIERS, tmp=tmp_path)
    for bs in (64, 8):
        w.forward_batch_generation(sglang_stubs.Batch(bs))
    assert _shape(_nvtx(ev)) == ["cycle", "  verify"] + CYCLE
    assert [p["steps"] for p in _pay(ev, "cycle")] == [0, 3] and ("skipped_draft_extend", 64) in ev


def test_pipeline_parallel_drafts_the_next_round(step):
    """pp_size 2: after draft_extend the step drafts the next round (with_topology=True): a draft range flagged
    next_round inside this cycle; the next cycle, given that verify input, drafts nothing of its own."""
    m, ev, _ = step
    sglang_stubs.PARALLEL.pp_size = 2
    w = m.EAGLEWorkerV2(steps=3)
    w.forward_batch_generation(sglang_stubs.Batch(4))
    b = sglang_stubs.Batch(4)
    b.spec_info = sglang_stubs.SpecInput(True)  # the scheduler's relayed verify input for this round
    w.forward_batch_generation(b)
    assert _shape(_nvtx(ev)) == CYCLE + ["  draft"] + ["cycle", "  verify", "  draft_extend", "  draft"]
    assert [(p["cycle_index"], p["steps"], p["next_round"]) for p in _pay(ev, "draft")] == [
        (1, 3, False), (1, 3, True), (2, 3, True)]
    assert ("draft", 4, 3, True) in ev


def test_dp_attention_decode_inside_a_prefill_batch(step):
    """DP coordination: a rank that decodes inside a batch classified as prefill (heterogeneous plan) runs a decode
    cycle: it is a cycle (flag in_prefill_batch on it and its phases), its result tagged for the accept mark."""
    m, ev, _ = step
    w = m.EAGLEWorkerV2(steps=3, dp=True)
    plan = ([3, 5], [3, 5], [False, True])  # this rank (0) decodes 3 requests, rank 1 prefills 5
    out = w.forward_batch_generation(sglang_stubs.Batch(3, extend_in_batch=True, coordination=plan))
    assert _shape(_nvtx(ev)) == CYCLE
    for name in ("cycle", "draft", "verify", "draft_extend"):
        (p,) = _pay(ev, name)
        assert (p["batch_size"], p["cycle_index"], p["steps"], p["in_prefill_batch"]) == (3, 1, 3, True), name
    assert getattr(out, patch.TAG) == 1


def test_dp_attention_prefill_rank_and_plain_prefill(step):
    """The prefilling rank of such a batch: prefill (flagged), its idle draft (0 requests) inside; a batch whose
    ranks all prefill goes to _forward_prefill_batch: a plain prefill; coordination off: the entry's prefill."""
    m, ev, _ = step
    w = m.EAGLEWorkerV2(steps=3, dp=True)
    w.forward_batch_generation(sglang_stubs.Batch(5, "extend", extend_in_batch=True,
                                                  coordination=([3, 5], [3, 5], [False, True])))
    w.forward_batch_generation(sglang_stubs.Batch(5, "extend", extend_in_batch=True,
                                                  coordination=([0, 5], [0, 5], [False, True])))
    m.EAGLEWorkerV2(steps=3, dp=False).forward_batch_generation(sglang_stubs.Batch(2, extend_in_batch=True))
    assert _shape(_nvtx(ev)) == ["prefill", "  draft", "  prefill_draft_extend", "prefill", "  prefill_draft_extend",
                                 "prefill", "  prefill_draft_extend"]
    assert [(p["batch_size"], p["in_prefill_batch"]) for p in _pay(ev, "prefill")] == [
        (5, True), (5, False), (2, False)]
    (d,) = _pay(ev, "draft")
    assert (d["batch_size"], d["steps"], d["in_prefill_batch"], d["next_round"]) == (0, 3, True, False)
    assert patch._cycle[0] == 0  # no decode cycle ran
