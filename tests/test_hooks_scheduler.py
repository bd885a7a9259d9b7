"""The scheduler's host ranges (``scheduler.<method>``, spectrace domain) on the fake SGLang's event loops: where
they sit, that an idle loop emits none, that SGLang's own scheduler NVTX ranges switch them off, and that they
add no device access."""

from __future__ import annotations

import sys
import types

import pytest

from nvtx_hooks import patch, ranges
from nvtx_hooks.phases import SCHEDULER_RANGES
from tests.helpers.fake_hooks import shape as _shape

CYCLE = ["    cycle", "      draft", "      verify", "      draft_extend"]
RUN = ["  scheduler.run_batch"] + CYCLE
POLL = ["  scheduler.recv_requests", "  scheduler.process_input_requests", "  scheduler.get_next_batch_to_run"]
RESULT = ["  scheduler.process_batch_result", "    !accept", "    !accept_histogram"]
SHAPES = [pytest.param("0.5.10", False, id="0.5.10-scheduler-recv"),
          pytest.param("0.5.23", True, id="0.5.23-receiver-component")]


def _outline(rec):
    return ["  " + x for x in _shape(rec, hosts=True)]


def _scheduler(components, **kw):
    from sglang.srt.managers.scheduler import CALLS, Scheduler
    from sglang.srt.speculative.eagle_worker_v2 import EAGLEWorkerV2

    CALLS.clear()
    return Scheduler(EAGLEWorkerV2(accept=[[1, 0, 2]]), components=components, **kw)


def _batches(*specs):
    from sglang.srt.speculative.common import Batch

    return [None if s is None else Batch(*s) for s in specs]


@pytest.mark.parametrize("version,components", SHAPES)
def test_overlap_loop(rec, version, components):
    """Overlap: iteration k polls, schedules, launches batch k (its cycle inside run_batch), then processes batch
    k-1's result (its marks inside process_batch_result). The first iteration after idle has no poll ranges (the
    loop was idle until its get_next_batch_to_run returned a batch); the last one's get_next returns none."""
    patch.install(version)
    s = _scheduler(components)
    s.event_loop_overlap(_batches((3,), (3,), None))
    assert _outline(rec) == RUN + POLL + RUN + RESULT + POLL + RESULT
    from sglang.srt.managers.scheduler import CALLS

    assert [c[0] for c in CALLS].count("recv_requests") == 3  # the work ran every iteration, ranges or not
    # in their own domain (spectrace.host), never in the phases' (spectrace), no payload
    assert {e[1] for e in rec if e[0] == "hpush"} == {p.name for p in SCHEDULER_RANGES}
    assert not any(e[1].startswith("scheduler.") for e in rec if e[0] == "push")
    assert all(e[2] is None for e in rec if e[0] == "hpush")


@pytest.mark.parametrize("version,components", SHAPES)
def test_normal_loop(rec, version, components):
    """Without overlap each batch's result is processed right after it ran, inside the same iteration."""
    patch.install(version)
    s = _scheduler(components, enable_overlap=False)
    s.event_loop_normal(_batches((3,), (3,), (3,)))
    assert _outline(rec) == RUN + RESULT + (POLL + RUN + RESULT) * 2


def test_an_idle_loop_emits_nothing(rec):
    """An idle scheduler spins through recv/process_input/get_next thousands of times a second: no ranges then,
    only around the iteration that follows a batch."""
    patch.install("0.5.23")
    s = _scheduler(True)
    s.event_loop_overlap(_batches(None, None, None, (3,), None, None, None, None))
    assert _outline(rec) == RUN + POLL + RESULT
    from sglang.srt.managers.scheduler import CALLS

    assert [c[0] for c in CALLS].count("get_next_batch_to_run") == 8


def test_sglang_own_scheduler_ranges_switch_them_off(rec, monkeypatch):
    """SGLANG_ENABLE_NVTX_SCHEDULER (as SGLang decided it at import: nvtx_utils.NVTX_SCHEDULER_ENABLED): SGLang emits
    scheduler.* itself (default domain); the hooks add none, so a capture never has both."""
    own = types.ModuleType("sglang.srt.utils.nvtx_utils")
    own.NVTX_SCHEDULER_ENABLED = True
    monkeypatch.setitem(sys.modules, "sglang.srt.utils.nvtx_utils", own)
    patch.install("0.5.23")
    s = _scheduler(True)
    s.event_loop_overlap(_batches((3,), (3,), None))
    assert _outline(rec) == [x[2:] for x in CYCLE] * 2 + [x[2:] for x in RESULT[1:]] * 2
    assert not any(p.endswith((".run_batch", ".recv_requests")) for p in patch.patched())
    assert any(p.endswith("EAGLEWorkerV2.verify") for p in patch.patched())  # the rest as usual


def test_switched_off_by_the_environment(rec, monkeypatch):
    monkeypatch.setenv(patch.SCHEDULER_ENV, "0")
    patch.install("0.5.23")
    _scheduler(True).event_loop_overlap(_batches((3,), (3,), None))
    assert not any(e[0] == "hpush" for e in rec)
    assert not any(p.startswith("sglang.srt.managers.scheduler.") or ".request_receiver." in p
                   for p in patch.patched())


def test_no_device_access_added(rec, monkeypatch):
    """The host ranges read nothing but the scheduler's return value: the fake device sees the same accesses."""
    from sglang.srt.fake_device import COUNTS

    def run():
        COUNTS.clear()
        _scheduler(True).event_loop_overlap(_batches((2, "extend"), (3,), (3,), None))
        return dict(COUNTS)

    plain = run()
    patch.install("0.5.23")
    assert run() == plain and any(e[1] == "scheduler.run_batch" for e in rec if e[0] == "hpush")


def test_an_exception_pops_and_propagates(rec, monkeypatch):
    patch.install("0.5.23")
    s = _scheduler(True)

    def boom(batch):
        raise RuntimeError("worker failed")

    monkeypatch.setattr(s.model_worker, "forward_batch_generation", boom)
    with pytest.raises(RuntimeError, match="worker failed"):
        s.event_loop_overlap(_batches((3,), None))
    assert _outline(rec) == ["  scheduler.run_batch"] and patch._tls.stack == []


def test_nothing_when_no_tool_is_attached(rec, monkeypatch):
    monkeypatch.setattr(ranges, "_on", False)
    patch.install("0.5.23")
    _scheduler(True).event_loop_overlap(_batches((3,), (3,), None))
    assert rec == [] and patch._tls.busy is False
