"""The v2 ``accept`` mark: emitted where SGLang's result processing has the accept lengths on the host, with
the index of the cycle that produced them, adding no sync and no copy (fake SGLang in tests/fake_sglang,
modelled on the real 0.5.10 and 0.5.23 scheduler and worker code)."""

from __future__ import annotations

import logging
import sys
import types

import pytest

from nvtx_hooks import patch, ranges
from nvtx_hooks.phases import accept_histograms, decode_payload, histogram_of
from nvtx_hooks.targets import ENTRY, V2, Target
from tests.helpers.fake_hooks import shape as _shape

CYCLE = ["cycle", "  draft", "  verify", "  draft_extend"]
PREFILL = ["prefill", "  prefill_target_extend", "  prefill_draft_extend"]
MARKS = ["!accept", "!accept_histogram"]  # a decode result's marks: its accept count, then its histogram
# Accepted draft tokens per request, per decode cycle (the fake worker cycles through them).
ACCEPT = [[2, 0, 3], [1, 1, 1], [3, 3, 0]]


def _payloads(events, name):
    return [decode_payload(e[2]) for e in events if e[0] in ("push", "mark") and e[1] == name]


def _scheduler(components, accept=ACCEPT, **kw):
    from sglang.srt.managers.scheduler import Scheduler
    from sglang.srt.speculative.eagle_worker_v2 import EAGLEWorkerV2

    return Scheduler(EAGLEWorkerV2(accept=accept), components=components, **kw)


def _batches(*specs):
    from sglang.srt.speculative.common import Batch

    return [None if s is None else Batch(*s) for s in specs]


def _want(cycle, bs, drafts):
    return {"batch_size": bs, "cycle_index": cycle, "accept_length": sum(drafts), "steps": None, "next_round": False,
            "in_prefill_batch": False}


def _hists(events):
    return accept_histograms([e[2] for e in events if e[0] == "mark" and e[1] == "accept_histogram"])


# 0.5.10: SchedulerOutputProcessorMixin._resolve_spec_overlap_token_ids sets num_accepted_tokens;
# 0.5.23: SchedulerBatchResultProcessor._resolve_spec_v2_tokens sets num_correct_drafts.
SHAPES = [pytest.param("0.5.10", False, id="0.5.10-mixin"), pytest.param("0.5.23", True, id="0.5.23-component")]


@pytest.mark.parametrize("version,components", SHAPES)
def test_overlap_marks_the_cycle_whose_result_it_is(rec, version, components):
    """Overlap: cycle N's result is processed after cycle N+1 launched; its mark still says N."""
    patch.install(version)
    s = _scheduler(components)
    s.event_loop_overlap(_batches((3,), (3,), (3,), None))
    assert _shape(rec) == CYCLE + CYCLE + MARKS + CYCLE + MARKS + MARKS
    assert [p["cycle_index"] for p in _payloads(rec, "cycle")] == [1, 2, 3]
    assert _payloads(rec, "accept") == [_want(1, 3, ACCEPT[0]), _want(2, 3, ACCEPT[1]), _want(3, 3, ACCEPT[2])]
    # the mark carries exactly what SGLang's own metrics got for that batch
    assert [(p["batch_size"], p["accept_length"]) for p in _payloads(rec, "accept")] == s.spec_metrics
    # the histograms: the requests of each cycle by accepted drafts, from SGLang's per-request host list
    assert _hists(rec) == {1: [1, 0, 1, 1], 2: [0, 3], 3: [1, 0, 0, 2]}
    assert _hists(rec) == {i + 1: histogram_of(a) for i, a in enumerate(ACCEPT)}
    # the exact call list around the first mark: cycle 2's range closed, then cycle 1's marks (scheduler ranges
    # left out)
    i = next(k for k, e in enumerate(rec) if e[0] == "mark")
    assert [e[1] for e in rec[i: i + 2]] == ["accept", "accept_histogram"]
    inner = [e for e in rec[:i] if e[0] == "push"]
    assert inner[-1][1] == "draft_extend" and decode_payload(inner[-1][2])["cycle_index"] == 2
    nxt = next(e for e in rec[i:] if e[0] == "push" and e[1] == "cycle")
    assert decode_payload(nxt[2])["cycle_index"] == 3


@pytest.mark.parametrize("version,components", SHAPES)
def test_overlap_with_a_prefill_and_an_idle_iteration(rec, version, components):
    """Prefill results give no mark and do not advance the index; a gap (no batch) drains the queue."""
    patch.install(version)
    s = _scheduler(components, accept=[[1, 0], [2, 2]])
    s.event_loop_overlap(_batches((2, "extend"), (2,), None, (2,), (2,), None))
    assert _shape(rec) == PREFILL + CYCLE + MARKS + CYCLE + CYCLE + MARKS + MARKS
    assert _payloads(rec, "accept") == [_want(1, 2, [1, 0]), _want(2, 2, [2, 2]), _want(3, 2, [1, 0])]
    assert len(s.prefill_outputs) == 1 and len(s.decode_outputs) == 3


def test_normal_loop_marks_right_after_its_cycle(rec):
    """Spec v2 without overlap (0.5.23 shape): each result is processed before the next cycle."""
    patch.install("0.5.23")
    s = _scheduler(True, enable_overlap=False)
    s.event_loop_normal(_batches((3,), (3,), (3,)))
    assert _shape(rec) == (CYCLE + MARKS) * 3
    assert [p["cycle_index"] for p in _payloads(rec, "accept")] == [1, 2, 3]
    assert [p["accept_length"] for p in _payloads(rec, "accept")] == [5, 3, 6]


def test_the_version_row_reads_its_own_attribute(rec):
    """The fake result has both counts; 0.5.10's row must read num_accepted_tokens, 0.5.23's num_correct_drafts
    (the other one stays 0, so reading the wrong one would give accept_length 0)."""
    patch.install("0.5.10")
    _scheduler(False).event_loop_normal(_batches((3,)))
    patch.uninstall()
    patch.install("0.5.23")
    _scheduler(True).event_loop_normal(_batches((3,)))
    assert [p["accept_length"] for p in _payloads(rec, "accept")] == [5, 5]


def _run(components):
    """One overlap run of 3 decode cycles and a prefill; returns the fake device's access counts."""
    from sglang.srt.fake_device import COUNTS

    COUNTS.clear()
    s = _scheduler(components)
    s.event_loop_overlap(_batches((2, "extend"), (3,), (3,), (3,), None))
    return dict(COUNTS)


@pytest.mark.parametrize("version,components", SHAPES)
def test_no_sync_or_copy_added(rec, monkeypatch, version, components):
    plain = _run(components)
    # SGLang's own, per batch: 2 non-blocking D2H copies (next_token_ids, accept_lens; the prefill has no
    # accept_lens), 1 event record, 1 synchronize, 2 tolist of host tensors (1 for the prefill); nothing else.
    assert plain == {"to_cpu": 7, "record": 4, "synchronize": 4, "tolist": 7}
    patch.install(version)
    hooked = _run(components)
    assert len(_payloads(rec, "accept")) == 3 and hooked == plain
    rec.clear()
    monkeypatch.setattr(ranges, "_on", False)  # installed, no tool attached
    assert _run(components) == plain and rec == []


def test_nothing_emitted_or_attached_when_ranges_are_off(rec, monkeypatch):
    monkeypatch.setattr(ranges, "_on", False)
    patch.install("0.5.23")
    from sglang.srt.speculative.common import Batch
    from sglang.srt.speculative.eagle_worker_v2 import EAGLEWorkerV2

    out = EAGLEWorkerV2().forward_batch_generation(Batch(2))
    assert not hasattr(out, patch.TAG) and patch._cycle[0] == 0
    _scheduler(True).event_loop_overlap(_batches((2,), None))
    assert rec == []


def test_no_marks_while_torch_compiles(rec, monkeypatch):
    fake_torch = types.ModuleType("torch")
    fake_torch.compiler = types.SimpleNamespace(is_compiling=lambda: True)
    monkeypatch.setitem(sys.modules, "torch", fake_torch)
    monkeypatch.setattr(patch, "_is_compiling", None)
    patch.install("0.5.23")
    s = _scheduler(True)
    s.event_loop_overlap(_batches((3,), None))
    assert rec == [] and s.spec_metrics == [(3, 5)]  # SGLang's work done, nothing emitted


def test_a_result_without_the_cycle_tag_gives_no_mark(rec):
    """A batch the entry hook did not open as a cycle (another spec algorithm, hooks installed mid-run)."""
    patch.install("0.5.23")
    from sglang.srt.fake_device import Event, Tensor
    from sglang.srt.managers.utils import GenerationBatchResult
    from sglang.srt.speculative.common import Batch

    s = _scheduler(True)
    r = GenerationBatchResult(next_token_ids=Tensor([1] * 8, "cpu"), accept_lens=Tensor([2, 1], "cpu"),
                              speculative_num_draft_tokens=4, copy_done=Event())
    s.process_batch_result(Batch(2), r)
    assert _shape(rec, hosts=True) == ["scheduler.process_batch_result"]  # its host range only, no mark
    assert s.spec_metrics == [(2, 1)]


def _errors():
    seen = []
    h = logging.Handler()
    h.emit = lambda r: seen.append(r.getMessage())
    patch.log.addHandler(h)
    return seen, h


def test_the_count_must_be_a_host_int():
    r = types.SimpleNamespace(num_correct_drafts=5, num_accepted_tokens=None)
    assert patch._accepted(r, ("num_correct_drafts",)) == 5
    for bad in (None, 5.0, True, object()):  # a tensor-like value would need a device read: refused
        r.num_correct_drafts = bad
        with pytest.raises(TypeError, match="no int num_correct_drafts"):
            patch._accepted(r, ("num_correct_drafts",))


def test_hook_errors_never_break_result_processing(rec, monkeypatch):
    patch.install("0.5.23")

    def boom(result, attrs):
        raise TypeError("no int num_correct_drafts")

    monkeypatch.setattr(patch, "_accepted", boom)
    seen, h = _errors()
    try:
        s = _scheduler(True)
        s.event_loop_overlap(_batches((3,), (3,), None))
    finally:
        patch.log.removeHandler(h)
    assert _shape(rec) == CYCLE + CYCLE  # no mark, ranges balanced
    assert s.spec_metrics == [(3, 5), (3, 3)] and len(s.decode_outputs) == 2  # SGLang's work intact
    assert len([m for m in seen if "_resolve_spec_v2_tokens" in m and "no int" in m]) == 1  # reported once


def test_a_result_that_refuses_the_tag_is_reported_once(rec, monkeypatch):
    patch.install("0.5.23")
    from sglang.srt.managers.utils import GenerationBatchResult
    from sglang.srt.speculative import eagle_worker_v2 as m2

    class Frozen(GenerationBatchResult):  # as if SGLang made the dataclass slotted
        def __setattr__(self, name, value):
            if name == patch.TAG:
                raise AttributeError("slots")
            super().__setattr__(name, value)

    monkeypatch.setattr(m2, "GenerationBatchResult", Frozen)
    seen, h = _errors()
    try:
        s = _scheduler(True)
        s.event_loop_overlap(_batches((3,), (3,), None))
    finally:
        patch.log.removeHandler(h)
    assert _shape(rec) == CYCLE + CYCLE  # cycles as usual, no mark (no index to give it)
    assert s.spec_metrics == [(3, 5), (3, 3)]
    assert len([m for m in seen if "forward_batch_generation (tag)" in m]) == 1


def test_exception_in_result_processing_propagates_without_a_mark(rec, monkeypatch):
    patch.install("0.5.23")
    from sglang.srt.managers.scheduler_components import batch_result_processor as m

    s = _scheduler(True)
    monkeypatch.setattr(m, "_get_speculative_output_stride", lambda r: (_ for _ in ()).throw(RuntimeError("x")))
    with pytest.raises(RuntimeError, match="x"):
        s.event_loop_overlap(_batches((3,), None))
    assert _shape(rec) == CYCLE and patch._tls.stack == []


def test_uninstall_restores_the_result_processors(rec):
    from sglang.srt.managers import scheduler_output_processor_mixin as mixin
    from sglang.srt.managers.scheduler_components import batch_result_processor as comp

    before = (dict(vars(mixin.SchedulerOutputProcessorMixin)), dict(vars(comp.SchedulerBatchResultProcessor)))
    patch.install("0.5.10")
    assert any(p.endswith("_resolve_spec_overlap_token_ids") for p in patch.patched())
    patch.uninstall()
    patch.install("0.5.23")
    assert any(p.endswith("_resolve_spec_v2_tokens") for p in patch.patched())
    assert not any("scheduler_output_processor_mixin" in p for p in patch.patched())
    patch.uninstall()
    after = (dict(vars(mixin.SchedulerOutputProcessorMixin)), dict(vars(comp.SchedulerBatchResultProcessor)))
    assert after == before


def test_nested_entry_keeps_one_index(rec):
    """A patched subclass entry calling a patched super(): one cycle range, one index for cycle,
    draft_extend and the accept mark (the counter used to advance on the inner call too)."""
    patch.install("0.5.23")
    from sglang.srt.speculative.eagle_worker_v2 import EAGLEWorkerV2

    class Sub(EAGLEWorkerV2):
        def forward_batch_generation(self, model_worker_batch):
            return super().forward_batch_generation(model_worker_batch)

    row = Target(V2, "Sub", ("forward_batch_generation",), "cycle", ENTRY, (0, 5, 4), (0, 5, 23),
                 (("self",), ("model_worker_batch",)), tags_result=True)
    Sub.forward_batch_generation = patch._make_wrapper(Sub.__dict__["forward_batch_generation"], row)
    from sglang.srt.managers.scheduler import Scheduler

    Scheduler(Sub(accept=ACCEPT), components=True).event_loop_overlap(_batches((3,), (3,), None))
    assert _shape(rec) == CYCLE + CYCLE + MARKS + MARKS
    assert [p["cycle_index"] for p in _payloads(rec, "cycle")] == [1, 2]
    assert [p["cycle_index"] for p in _payloads(rec, "draft_extend")] == [1, 2]
    assert [p["cycle_index"] for p in _payloads(rec, "accept")] == [1, 2]


def test_a_per_request_list_that_disagrees_gives_no_histogram(rec, monkeypatch):
    """SGLang's per-request list must sum to its own count: else the accept mark alone, the mismatch said once."""
    patch.install("0.5.23")
    from sglang.srt.managers.scheduler_components import batch_result_processor as m

    orig = m.SchedulerBatchResultProcessor._resolve_spec_v2_tokens.__spectrace_wrapped__

    def skewed(self, result, batch):
        out = orig(self, result, batch)
        result.num_correct_drafts_per_req_cpu = [x + 1 for x in result.num_correct_drafts_per_req_cpu]
        return out

    wrapped = patch._make_wrapper(skewed, m.SchedulerBatchResultProcessor._resolve_spec_v2_tokens.__spectrace_target__)
    monkeypatch.setattr(m.SchedulerBatchResultProcessor, "_resolve_spec_v2_tokens", wrapped)
    seen, h = _errors()
    try:
        _scheduler(True).event_loop_overlap(_batches((3,), (3,), None))
    finally:
        patch.log.removeHandler(h)
    assert _shape(rec) == CYCLE + CYCLE + ["!accept", "!accept"]
    assert len([x for x in seen if "sum to" in x]) == 1
