"""Tokens: vectorised payload decode vs nvtx_hooks.phases.decode_payload; tokens per cycle from payload/manifest."""

from __future__ import annotations

import polars as pl
import pytest
from hypothesis import given
from hypothesis import strategies as st

from analyze import analyze
from analyze.compute.cycles import cycles
from analyze.compute.payload import decode_frame
from analyze.compute.tokens import summary
from analyze.read.manifest import manifest_path
from nvtx_hooks.phases import decode_payload, encode_payload
from tests.helpers import eagle_synth as es


@given(st.lists(st.one_of(
    st.builds(encode_payload, st.integers(0, 70_000), st.integers(0, 2**26),
              st.one_of(st.none(), st.integers(0, 2**21)), st.one_of(st.none(), st.integers(0, 40))),
    st.builds(lambda b, c, a: encode_payload(b, c, a, version=1), st.integers(0, 70_000), st.integers(0, 2**26),
              st.one_of(st.none(), st.integers(0, 2**21))),
    st.integers(-(2**63), 2**63 - 1)), min_size=1, max_size=50))
def test_decode_matches_scalar_decoder(values):
    """Payload versions 1 and 2 (and random bits): the columns the analysis decodes equal the scalar decoder's."""
    got = decode_frame(pl.DataFrame({"int64": values}, schema={"int64": pl.Int64}))
    for v, row in zip(values, got.select("batch_size", "cycle_index", "accept_length").iter_rows(named=True)):
        d = decode_payload(v)
        if d is None:
            assert row == {"batch_size": None, "cycle_index": None, "accept_length": None}
        else:
            assert row == {k: d[k] for k in row}


def test_uint64_column_is_read_too():
    v = encode_payload(4, 7, 9)
    got = decode_frame(pl.DataFrame({"uint64": [v, None], "int64": [None, None]}))
    assert got.row(0, named=True)["accept_length"] == 9 and got["batch_size"].to_list() == [4, None]


@pytest.mark.parametrize("accept_on", ["cycle", "draft_extend", "mark"])
def test_tokens_per_cycle_from_payload(tmp_path, accept_on):
    res = analyze(es.eagle(tmp_path / "e.sqlite", accept_on=accept_on, prefix="eagle3."))
    c = cycles(res).sort("rank", "n")
    # tokens = accept + batch = 0+2, 2+2, 4+2, 6+2 on each rank; period 10 000 ns (previous cycle's last GPU op
    # → this one's: the first cycle has none)
    assert c["tokens"].to_list() == [2, 4, 6, 8] * 2
    assert c["period_ns"].to_list() == [None, 10_000, 10_000, 10_000] * 2
    t = summary(res)
    # over the cycles with a period (1..3): tokens (4 + 6 + 8) / 3, accepted per request (1 + 2 + 3) / 3
    assert (t.kind, t.source, t.cycles, t.steps, t.steady_cycles) == ("cycle", "payload", 8, 3, 6)
    assert t.tokens_per_cycle == 6.0 and t.accepted_per_request == 2.0
    assert t.tokens_per_s == pytest.approx(6 / 10_000e-9)
    # accepted per request 1, 2, 3: nearest-rank median 2, p90 3
    assert (t.acceptance_source, t.accepted_cycles, t.accepted_p50, t.accepted_p90) == (
        "marks" if accept_on == "mark" else "payload", 3, 2.0, 3.0)
    assert c["accept_source"].to_list() == ["marks" if accept_on == "mark" else "payload"] * 8


def test_baseline_tokens_per_step(tmp_path):
    t = summary(analyze(es.baseline(tmp_path / "b.sqlite")))
    assert (t.kind, t.source, t.tokens_per_cycle, t.period_ns) == ("decode_step", "payload", 2.0, 3000.0)
    assert t.tokens_per_s == pytest.approx(2 / 3000e-9)


def test_baseline_tokens_from_manifest(tmp_path):
    p = es.baseline(tmp_path / "m.sqlite", payload=False, manifest=True)
    assert manifest_path(p).name == "m.manifest.json"
    t = summary(analyze(p))
    assert (t.source, t.tokens_per_cycle, t.batch_size) == ("manifest", 2.0, 2.0)


def test_unknown_tokens(tmp_path):
    t = summary(analyze(es.baseline(tmp_path / "n.sqlite", payload=False)))
    assert t.tokens_per_cycle is None and t.tokens_per_s is None and t.period_ns == 3000.0
