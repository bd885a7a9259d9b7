"""Payload encode/decode and the ranges API without a profiler."""

from __future__ import annotations

import pytest

from nvtx_hooks import ranges
from nvtx_hooks.phases import (
    PAYLOAD_FIELDS,
    PAYLOAD_FIELDS_V2,
    PAYLOAD_LAYOUTS,
    PAYLOAD_VERSION,
    accept_histograms,
    decode_accept_histogram,
    decode_payload,
    encode_accept_histogram,
    encode_payload,
    histogram_of,
)


@pytest.mark.parametrize(
    "bs,cyc,acc",
    [(1, 0, None), (1, 0, 0), (64, 12345, 200), (65535, (1 << 24) - 1, (1 << 20) - 2), (8, 3, 17)],
)
def test_version1_round_trip(bs, cyc, acc):
    v = encode_payload(bs, cyc, acc, version=1)
    assert 0 <= v < (1 << 63)  # fits int64Value and uint64Value
    # the version-1 bits, written out by hand: what every capture made before version 2 holds
    assert v == (1 << 60) | ((0 if acc is None else acc + 1) << 40) | (cyc << 16) | bs
    d = decode_payload(v)
    assert d == {"batch_size": bs, "cycle_index": cyc, "accept_length": acc}
    assert tuple(d) == PAYLOAD_FIELDS
    assert decode_payload(v - (1 << 64)) == d  # a signed view of the same bits decodes the same


def test_version1_saturation_and_wrap():
    d = decode_payload(encode_payload(70000, (1 << 24) + 5, 1 << 21, version=1))
    assert d == {"batch_size": 65535, "cycle_index": 5, "accept_length": (1 << 20) - 2}
    with pytest.raises(ValueError, match="no steps"):
        encode_payload(1, 1, steps=3, version=1)


@pytest.mark.parametrize(
    "bs,cyc,acc,steps,nxt,pre",
    [(1, 0, None, None, False, False), (1, 0, 0, 0, False, False), (64, 12345, 200, 3, False, False),
     (65535, (1 << 24) - 1, 8190, 30, True, True), (8, 3, None, 4, True, False), (48, 9, 17, 1, False, True)],
)
def test_version2_round_trip(bs, cyc, acc, steps, nxt, pre):
    v = encode_payload(bs, cyc, acc, steps, next_round=nxt, in_prefill_batch=pre)
    assert 0 <= v < (1 << 63) and v >> 60 == PAYLOAD_VERSION == 2
    # the bits by hand: batch and cycle where version 1 has them, accept 13 bits at 40, steps+1 at 53, flags 58, 59
    assert v == ((2 << 60) | (int(pre) << 59) | (int(nxt) << 58) | ((0 if steps is None else steps + 1) << 53)
                 | ((0 if acc is None else acc + 1) << 40) | (cyc << 16) | bs)
    d = decode_payload(v)
    assert d == {"batch_size": bs, "cycle_index": cyc, "accept_length": acc, "steps": steps, "next_round": nxt,
                 "in_prefill_batch": pre}
    assert tuple(d) == PAYLOAD_FIELDS_V2
    assert decode_payload(v - (1 << 64)) == d


def test_version2_zero_steps_is_not_unknown_and_saturation():
    assert decode_payload(encode_payload(4, 1, steps=0))["steps"] == 0
    assert decode_payload(encode_payload(4, 1))["steps"] is None
    assert decode_payload(encode_payload(4, 1, steps=31))["steps"] is None  # too many to hold: unknown, not wrong
    assert decode_payload(encode_payload(4, 1, steps=-1))["steps"] is None
    d = decode_payload(encode_payload(70000, (1 << 24) + 5, 1 << 21, 2))
    assert (d["batch_size"], d["cycle_index"], d["accept_length"], d["steps"]) == (65535, 5, 8190, 2)


def test_layouts_table_matches_the_coder():
    """PAYLOAD_LAYOUTS (what vectorised decoders read) describes exactly what encode_payload writes."""
    for version, layout in PAYLOAD_LAYOUTS.items():
        covered = 0
        for _name, shift, bits, _offset in layout:
            mask = ((1 << bits) - 1) << shift
            assert covered & mask == 0  # no overlap
            covered |= mask
        assert covered == (1 << 60) - 1, version  # every bit below the version field is one field's
    v = encode_payload(5, 6, 7, 8, next_round=True)
    got = {n: ((v >> sh) & ((1 << b) - 1)) - (off if (v >> sh) & ((1 << b) - 1) else 0)
           for n, sh, b, off in PAYLOAD_LAYOUTS[2]}
    assert got == {"batch_size": 5, "cycle_index": 6, "accept_length": 7, "steps": 8, "next_round": 1,
                   "in_prefill_batch": 0}


def test_foreign_payloads_are_rejected():
    assert decode_payload(None) is None
    assert decode_payload(0) is None
    assert decode_payload(42) is None
    assert decode_payload(-1) is None
    assert decode_payload(encode_accept_histogram(3, [1, 2])[0]) is None  # a histogram mark is not a cycle payload
    assert decode_accept_histogram(encode_payload(1, 2, 3)) is None
    assert decode_accept_histogram(None) is None


def test_histogram_of():
    assert histogram_of([2, 0, 3, 2]) == [1, 0, 2, 1]
    assert histogram_of([]) == []
    assert histogram_of([0, 0]) == [2]


def test_histogram_mark_bits_by_hand():
    """[3, 1, 0, 2]: largest count 3 fits 3 bits (code 0, 9 slots): one mark, slots at bits 31, 34, 37, 40."""
    (v,) = encode_accept_histogram(77, [3, 1, 0, 2])
    assert v == (3 << 60) | (0 << 29) | (0 << 24) | 77 | (3 << 31) | (1 << 34) | (0 << 37) | (2 << 40)
    d = decode_accept_histogram(v)
    assert d == {"cycle_index": 77, "first_position": 0, "counts": [3, 1, 0, 2, 0, 0, 0, 0, 0]}
    assert accept_histograms([v]) == {77: [3, 1, 0, 2]}


@pytest.mark.parametrize("counts,marks", [
    ([7] * 9, 1), ([7] * 10, 2), ([8, 0, 1], 1), ([31] * 5, 1), ([32, 0, 0, 0, 1], 2), ([127, 0, 5], 1),
    ([16383, 1, 0, 0, 0, 0, 0, 0, 1], 2), ([5] + [0] * 20 + [1], 2), ([0] * 30 + [1], 1), ([0, 0], 0),
])
def test_histogram_round_trip_and_mark_count(counts, marks):
    """The narrowest width that holds the largest count; all-zero chunks are not emitted; decode merges back."""
    vals = encode_accept_histogram(1 << 24 | 9, counts)  # the cycle index wraps like the cycle's
    assert len(vals) == marks and all(0 <= v < (1 << 63) for v in vals)
    want = list(counts)
    while len(want) > 1 and want[-1] == 0:
        want.pop()
    assert accept_histograms(vals + [encode_payload(1, 9)]) == ({9: want} if any(counts) else {})


def test_histogram_limits():
    with pytest.raises(ValueError, match="does not fit"):
        encode_accept_histogram(1, [16384])
    with pytest.raises(ValueError, match="past 30"):
        encode_accept_histogram(1, [0] * 31 + [1])
    with pytest.raises(ValueError, match="non-negative"):
        encode_accept_histogram(1, [-1])
    assert encode_accept_histogram(1, []) == []


def test_forced_real_calls_balance():
    """The real nvtx calls run (as NVTX no-ops without a tool) and exceptions still pop."""
    pytest.importorskip("nvtx")
    was = ranges.enabled()
    try:
        assert ranges.set_enabled(True, force=True)
        ranges.push("cycle", encode_payload(2, 1))
        ranges.host.push("scheduler.run_batch")  # the host domain's own stack
        ranges.push("not_a_phase")
        ranges.host.push("scheduler.not_a_stage")
        ranges.mark("verify", 3)
        ranges.host.pop()
        ranges.pop()
        ranges.host.pop()
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
