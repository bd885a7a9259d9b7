"""Range sequence, nesting and safety of the SGLang patches, on the fake SGLang in tests/fake_sglang."""

from __future__ import annotations

import logging
import sys
import types

import pytest

from nvtx_hooks import patch, ranges
from nvtx_hooks.phases import accept_histograms, decode_payload
from tests.helpers.fake_hooks import shape as _shape

V1_CYCLE = ["cycle", "  draft", "  verify", "  !accept_histogram", "  draft_extend"]


def _p(bs, cyc, acc=None, steps=3, next_round=False, in_prefill_batch=False):
    """A decoded version-2 payload."""
    return {"batch_size": bs, "cycle_index": cyc, "accept_length": acc, "steps": steps, "next_round": next_round,
            "in_prefill_batch": in_prefill_batch}


def test_v1_decode_cycle(rec):
    patch.install("0.5.5")
    from sglang.srt.speculative.common import Batch
    from sglang.srt.speculative.eagle_worker import LOG, EAGLEWorker

    LOG.clear()
    w = EAGLEWorker(accept=[2, 0, 3])
    w.forward_batch_generation(Batch(3))
    w.speculative_num_steps = 4  # v1 adaptive (0.5.11+) changes it between cycles
    w.forward_batch_generation(Batch(3))
    assert _shape(rec) == V1_CYCLE * 2
    # exact call list, payloads included
    assert [e[1] if e[0] != "pop" else "pop" for e in rec[:9]] == [
        "cycle", "draft", "pop", "verify", "pop", "accept_histogram", "draft_extend", "pop", "pop"]
    pay = [decode_payload(e[2]) for e in rec if e[0] == "push"]
    assert pay[:4] == [_p(3, 1), _p(3, 1), _p(3, 1), _p(3, 1, acc=5)]  # cycle, draft, verify, draft_extend
    assert pay[4:] == [_p(3, 2, steps=4), _p(3, 2, steps=4), _p(3, 2, steps=4), _p(3, 2, acc=5, steps=4)]
    # the histogram of [2, 0, 3] accepted drafts: one request each at 0, 2 and 3
    assert accept_histograms([e[2] for e in rec if e[0] == "mark"]) == {1: [1, 0, 1, 1], 2: [1, 0, 1, 1]}
    assert LOG == [("draft_graph", "replay"), ("extend_graph", "replay")] * 2  # originals really ran


def test_v1_prefill(rec):
    patch.install("0.5.5")
    from sglang.srt.speculative.common import Batch
    from sglang.srt.speculative.eagle_worker import EAGLEWorker

    EAGLEWorker().forward_batch_generation(Batch(4, "extend"))
    assert _shape(rec) == ["prefill", "  prefill_target_extend", "  prefill_draft_extend"]
    assert decode_payload(rec[0][2]) == _p(4, 0, steps=None)


def test_v2_decode_and_prefill(rec):
    patch.install("0.5.5")
    from sglang.srt.speculative.common import Batch
    from sglang.srt.speculative.standalone_worker_v2 import StandaloneWorkerV2

    w = StandaloneWorkerV2()  # inherits the EAGLEWorkerV2 patches
    w.forward_batch_generation(Batch(2, "extend"))
    w.forward_batch_generation(Batch(2))
    assert _shape(rec) == [
        "prefill", "  prefill_target_extend", "  prefill_draft_extend",
        "cycle", "  draft", "  verify", "  draft_extend",
    ]
    pay = {e[1]: decode_payload(e[2]) for e in rec if e[0] == "push" and e[2] is not None}
    assert pay == {"prefill": _p(2, 0, steps=None), "cycle": _p(2, 1), "draft": _p(2, 1), "verify": _p(2, 1),
                   "draft_extend": _p(2, 1)}  # v2: the accept lengths stay on the GPU (the accept mark has them)


def test_target_forward_outside_prefill_has_no_range(rec):
    patch.install("0.5.5")
    from sglang.srt.managers.tp_worker import TpModelWorker
    from sglang.srt.speculative.common import Batch

    TpModelWorker().forward_batch_generation(Batch(1))
    assert rec == []


@pytest.mark.parametrize("where", ["draft", "verify"])
def test_exception_pops_and_propagates(rec, where):
    patch.install("0.5.5")
    from sglang.srt.speculative.common import Batch
    from sglang.srt.speculative.eagle_worker import EAGLEWorker

    with pytest.raises(RuntimeError, match=f"{where} failed"):
        EAGLEWorker(fail_in=where).forward_batch_generation(Batch(1))
    assert _shape(rec) == ["cycle", "  draft"] + (["  verify"] if where == "verify" else [])
    assert patch._tls.stack == []
    rec.clear()
    EAGLEWorker().forward_batch_generation(Batch(1))  # next cycle is clean
    assert _shape(rec) == V1_CYCLE


def test_already_imported_is_patched_and_install_is_idempotent(rec):
    from sglang.srt.speculative.common import Batch
    from sglang.srt.speculative.eagle_worker import EAGLEWorker

    orig = EAGLEWorker.__dict__["draft"]
    patch.install("0.5.5")
    patch.install("0.5.5")
    patch.install()
    assert EAGLEWorker.__dict__["draft"].__spectrace_wrapped__ is orig
    EAGLEWorker().forward_batch_generation(Batch(1))
    assert _shape(rec) == V1_CYCLE
    assert sum(1 for f in sys.meta_path if isinstance(f, patch._Finder)) == 1


def test_uninstall_restores(rec):
    from sglang.srt.speculative import eagle_worker_v2 as m2
    from sglang.srt.speculative.common import Batch

    before = dict(vars(m2.EAGLEWorkerV2)), dict(vars(m2.EagleDraftWorker))
    patch.install("0.5.5")
    assert any(p.endswith("EAGLEWorkerV2.verify") for p in patch.patched())
    assert vars(m2.EAGLEWorkerV2)["verify"] is not before[0]["verify"]
    patch.uninstall()
    assert dict(vars(m2.EAGLEWorkerV2)) == before[0] and dict(vars(m2.EagleDraftWorker)) == before[1]
    assert patch.patched() == [] and not any(isinstance(f, patch._Finder) for f in sys.meta_path)
    m2.EAGLEWorkerV2().forward_batch_generation(Batch(2))
    assert rec == []


def test_unknown_version_warns_once_and_patches_nothing(rec):
    seen = []
    h = logging.Handler()
    h.emit = lambda r: seen.append(r.getMessage())
    patch.log.addHandler(h)
    try:
        assert patch.install("0.9.1") == []
        assert patch.install("0.9.1") == []
        assert patch.install("0.0.0.dev0") == []
    finally:
        patch.log.removeHandler(h)
    assert len([s for s in seen if "not in the target table" in s]) == 1
    from sglang.srt.speculative.common import Batch
    from sglang.srt.speculative.eagle_worker import EAGLEWorker

    assert not hasattr(EAGLEWorker.__dict__["draft"], "__spectrace_wrapped__")
    EAGLEWorker().forward_batch_generation(Batch(1))
    assert rec == [] and not patch.installed()


def test_hook_errors_do_not_break_the_call(rec):
    patch.install("0.5.5")
    from sglang.srt.speculative.common import Batch
    from sglang.srt.speculative.eagle_worker import LOG, EAGLEWorker

    class BadBatch(Batch):
        @property
        def reqs(self):
            raise ValueError("boom")

        @reqs.setter
        def reqs(self, v):
            pass

    seen = []
    h = logging.Handler()
    h.emit = lambda r: seen.append(r.getMessage())
    patch.log.addHandler(h)
    try:
        LOG.clear()
        out = EAGLEWorker(accept=[1]).forward_batch_generation(BadBatch(1))
        EAGLEWorker(accept=[1]).forward_batch_generation(BadBatch(1))
    finally:
        patch.log.removeHandler(h)
    assert out[3] == 1 and len(LOG) == 4  # the server's work ran normally
    # the entry hook failed (no cycle range); the inner phases still nest correctly; the draft outside a cycle
    # reads its own batch, which fails: its range opens without a payload
    assert _shape(rec) == ["draft", "verify", "!accept_histogram", "draft_extend"] * 2
    assert [e[2] for e in rec if e[0] == "push" and e[1] == "draft"] == [None, None]
    assert len([s for s in seen if "boom" in s]) == 2  # reported once per site: the entry, the draft's payload


def test_no_ranges_while_torch_compiles(rec, monkeypatch):
    fake_torch = types.ModuleType("torch")
    fake_torch.compiler = types.SimpleNamespace(is_compiling=lambda: True)
    monkeypatch.setitem(sys.modules, "torch", fake_torch)
    monkeypatch.setattr(patch, "_is_compiling", None)
    patch.install("0.5.5")
    from sglang.srt.speculative.common import Batch
    from sglang.srt.speculative.eagle_worker import LOG, EAGLEWorker

    LOG.clear()
    EAGLEWorker().forward_batch_generation(Batch(1))
    assert rec == [] and LOG  # work done, nothing emitted
    monkeypatch.setattr(patch, "_is_compiling", None)
    monkeypatch.delitem(sys.modules, "torch")
    EAGLEWorker().forward_batch_generation(Batch(1))
    assert _shape(rec) == V1_CYCLE


def test_no_bookkeeping_when_ranges_are_off(rec, monkeypatch):
    monkeypatch.setattr(ranges, "_on", False)
    patch.install("0.5.5")
    from sglang.srt.speculative.common import Batch
    from sglang.srt.speculative.eagle_worker import EAGLEWorker

    EAGLEWorker().forward_batch_generation(Batch(1))
    assert rec == [] and patch._cycle[0] == 0


def test_steps_route_failure_leaves_them_unknown(rec):
    """A changed adaptive controller: the cycle still opens, its steps unknown, the error said once; without a
    controller the worker's own count."""
    seen, h = [], logging.Handler()
    h.emit = lambda r: seen.append(r.getMessage())
    patch.log.addHandler(h)

    class Broken:
        def get_steps_for_batch(self, bs):
            raise KeyError("no route")

    w = types.SimpleNamespace(adaptive_controller=types.SimpleNamespace(params=Broken()), speculative_num_steps=3)
    b = types.SimpleNamespace(seq_lens=types.SimpleNamespace(shape=(4,)), reqs=[0] * 4)
    try:
        assert patch._route_steps(w, b) is None
        assert patch._route_steps(w, b) is None
    finally:
        patch.log.removeHandler(h)
    assert len([s for s in seen if "adaptive step route" in s]) == 1
    w.adaptive_controller = None
    assert patch._route_steps(w, b) == 3
    w.speculative_num_steps = True  # not an int count: unknown, not 1
    assert patch._route_steps(w, b) is None


def test_layout_defaults_to_the_released_one(monkeypatch):
    monkeypatch.delitem(sys.modules, "sglang.srt.speculative.eagle_worker_common", raising=False)
    assert patch.layout() == "worker-step"
    common = types.ModuleType("sglang.srt.speculative.eagle_worker_common")
    monkeypatch.setitem(sys.modules, common.__name__, common)
    assert patch.layout() == "worker-step"
    common.eagle_forward_generation = lambda *a: None
    assert patch.layout() == "shared-step"
