"""Payload encode/decode and the ranges API without a profiler."""

from __future__ import annotations

import pytest

from nvtx_hooks import ranges
from nvtx_hooks.phases import PAYLOAD_FIELDS, decode_payload, encode_payload


@pytest.mark.parametrize(
    "bs,cyc,acc",
    [(1, 0, None), (1, 0, 0), (64, 12345, 200), (65535, (1 << 24) - 1, (1 << 20) - 2), (8, 3, 17)],
)
def test_round_trip(bs, cyc, acc):
    v = encode_payload(bs, cyc, acc)
    assert 0 <= v < (1 << 63)  # fits int64Value and uint64Value
    d = decode_payload(v)
    assert d == {"batch_size": bs, "cycle_index": cyc, "accept_length": acc}
    assert tuple(d) == PAYLOAD_FIELDS
    assert decode_payload(v - (1 << 64)) == d  # a signed view of the same bits decodes the same


def test_saturation_and_wrap():
    d = decode_payload(encode_payload(70000, (1 << 24) + 5, 1 << 21))
    assert d == {"batch_size": 65535, "cycle_index": 5, "accept_length": (1 << 20) - 2}


def test_foreign_payloads_are_rejected():
    assert decode_payload(None) is None
    assert decode_payload(0) is None
    assert decode_payload(42) is None
    assert decode_payload(-1) is None


def test_forced_real_calls_balance():
    """The real nvtx calls run (as NVTX no-ops without a tool) and exceptions still pop."""
    pytest.importorskip("nvtx")
    was = ranges.enabled()
    try:
        assert ranges.set_enabled(True, force=True)
        ranges.push("cycle", encode_payload(2, 1))
        ranges.push("not_a_phase")
        ranges.mark("verify", 3)
        ranges.pop()
        ranges.pop()
        with pytest.raises(KeyError):
            with ranges.phase_range("draft"):
                raise KeyError("x")
    finally:
        ranges.set_enabled(was)


def test_disabled_is_noop():
    was = ranges.enabled()
    ranges.set_enabled(False)
    try:
        assert not ranges.enabled()
        ranges.push("verify")
        ranges.pop()
        ranges.pop()  # unbalanced pops are harmless when off
    finally:
        ranges.set_enabled(was)
