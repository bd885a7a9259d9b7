"""What recurs, second round (issue 37 item 5): a change of level inside a segment is reported as a level shift
("from cycle N on, +X µs", where it sits), a second, non-periodic mode holds every cycle of it, and a cycle in two
classes (a periodic one after a level shift) holds each cause's extra once. On synthetic per-cycle series (the
injected values known exactly) and on the real H200 captures of the workload's `--level-shift` and random stalls
(tests/data/h200_tp1: tp1_sched_shift, tp1_sched_stalls; the truth is each manifest's `program_output`)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from analyze import analyze
from analyze.compute import anatomy, findings
from analyze.compute.cycles import cycles
from analyze.compute.steady_cycles import _shifts, flag_cycles
from nvtx_hooks.capture import samples

US = 1_000
DATA = Path(__file__).parent / "data" / "h200_tp1"


def series(t_us: np.ndarray) -> pl.DataFrame:
    """One rank's cycles with periods ``t_us`` (the first cycle has none), one batch size, keyed by their index."""
    n = len(t_us)
    period = (np.asarray(t_us) * US).astype(np.int64)
    return pl.DataFrame({
        "rank": [0] * n, "n": list(range(n)), "kind": ["cycle"] * n, "range_id": list(range(n)),
        "period_ns": [None, *period[1:].tolist()], "prefill_ns": [0] * n, "prefills": [0] * n,
        "payload_batch": [4] * n, "graphs": ["1"] * n, "i_first": np.cumsum(period).tolist(),
        "cycle_index": list(range(n)), "pair_key": list(range(n))},
        schema_overrides={"period_ns": pl.Int64})


def classes_of(t_us: np.ndarray):
    f = flag_cycles(series(t_us))
    return f.selection, f.cycles


def test_a_level_shift_with_a_periodic_class_on_top():
    """1,900 µs cycles (noise 15 µs), +500 µs every 8th cycle, +400 µs from cycle 130 on: the shift is found at its
    cycle with its size, and the periodic cycles after it hold their 500 µs, not 900."""
    rng = np.random.default_rng(1)
    n = 250
    i = np.arange(n)
    t = 1_900 + rng.normal(0, 15, n) + 500 * (i % 8 == 3) + 400 * (i >= 130)
    sel, _ = classes_of(t)
    (sh,) = [c for c in sel.classes if c.kind == "shift"]
    assert abs(sh.onset_key - 130) <= 3 and sh.until_key is None
    assert sh.extra_ns == pytest.approx(400 * US, rel=0.2)
    (ev,) = [c for c in sel.classes if c.kind == "every"]
    assert (ev.every, ev.offset) == (8, 3) and ev.extra_ns == pytest.approx(500 * US, rel=0.2)
    assert "from cycle 13" in sel.text and "(a level shift)" in sel.text


def test_a_ramp_is_no_level_shift():
    """The period growing steadily (+400 µs over the run, as a growing context does) is no step."""
    rng = np.random.default_rng(2)
    t = 1_900 + rng.normal(0, 15, 250) + np.linspace(0, 400, 250)
    assert not [c for c in classes_of(t)[0].classes if c.kind == "shift"]
    assert _shifts(t) == []


def test_no_shift_in_noise_nor_in_random_stalls():
    rng = np.random.default_rng(3)
    t = 1_900 + rng.normal(0, 15, 400)
    assert _shifts(t) == []
    t = t + 600 * (rng.random(400) < 0.25)
    assert _shifts(t) == []


def test_a_second_mode_holds_all_its_cycles():
    """28 % of the cycles +300 µs at random (noise 50 µs): the band (13 % over the typical level) cuts the mode's
    cycles, a sixth of them under it; the mode's class still holds ≥ 90 % of them (all that are nearer its level
    than the typical one), with its extra within 20 %; issue 37: about two thirds, the rest marked slow in no class."""
    rng = np.random.default_rng(4)
    n = 400
    stalled = rng.random(n) < 0.28
    stalled[:10] = False
    t = 1_900 + rng.normal(0, 50, n) + 300 * stalled
    sel, cyc = classes_of(t)
    (mode,) = [c for c in sel.classes if c.kind == "mode"]
    held = set(cyc.filter(pl.col("cycle_class") == mode.id)["key"].to_list())
    want = set(np.flatnonzero(stalled).tolist())
    assert len(held & want) >= 0.9 * len(want)
    assert len(held - want) <= 0.02 * n
    assert mode.extra_ns == pytest.approx(300 * US, rel=0.2)


def truth(name: str) -> dict:
    rec = json.loads((DATA / f"{name}.manifest.json").read_text())["program_output"][0]
    (extra,) = rec["scheduler"]["extras"] if "extras" in rec["scheduler"] else rec["extras"]
    return extra


def test_the_real_level_shift():
    """tp1_sched_shift: +400 µs in get_next_batch_to_run from cycle 130 on (the workload's record): the onset within
    ±3 cycles, the size within 20 %, between cycles (the host's time), a LEVEL_SHIFT finding that holds its µs."""
    t = truth("tp1_sched_shift")
    res = analyze(samples.path("tp1_sched_shift"))
    shifts = [c for c in anatomy.cycle_classes(res) if c.kind == "shift" and c.until_key is None]
    (sh,) = shifts
    assert abs(sh.onset_key - t["from"]) <= 3
    assert sh.extra_ns == pytest.approx(t["us"] * US, rel=0.2)
    assert sh.piece == "between cycles"
    assert sh.affected >= 0.9 * len(t["cycles"])
    f = [x for x in findings.find(res) if x.code == "LEVEL_SHIFT" and x.extra_ns == sh.extra_ns]
    assert f and f[0].evidence.startswith(f"from cycle {sh.onset_key} on (a level shift)")


def test_the_real_random_stalls():
    """tp1_sched_stalls: +600 µs in recv_requests with p = 0.25 (seeded; the record lists the cycles): the second
    mode's class holds ≥ 90 % of the stalled cycles, its extra within 20 %."""
    t = truth("tp1_sched_stalls")
    res = analyze(samples.path("tp1_sched_stalls"))
    (mode,) = [c for c in anatomy.cycle_classes(res) if c.kind == "mode"]
    c = cycles(res)
    held = set(c.filter(pl.col("cycle_class") == mode.id)["key"].to_list())
    want = set(t["cycles"])
    assert len(held & want) >= 0.9 * len(want)
    assert mode.extra_ns == pytest.approx(t["us"] * US, rel=0.2)
    assert mode.piece == "between cycles"


def test_a_stall_is_said_above_its_own_band():
    """Two batch sizes (1,000 and 3,000 µs cycles): a 1,500 µs stall of the first is above its own band, below the
    other's; the first line names each batch size's band, never "above 3,300 µs: … (1,500 µs)" (issue 37: "rare
    stalls (above 3,144.1 µs …: 212 (3,093 µs) …")."""
    rng = np.random.default_rng(5)
    t = np.concatenate([1_000 + rng.normal(0, 5, 100), 3_000 + rng.normal(0, 15, 100)])
    t[60] = 1_500
    frame = series(t).with_columns(payload_batch=pl.Series([1] * 100 + [8] * 100))
    sel = flag_cycles(frame).selection
    (st,) = sel.stalls
    assert st.key == 60 and st.limit_ns is not None and st.limit_ns < 1_500 * US < sel.limit_ns
    assert f"1 rare stall (above {st.limit_ns / 1e3:,.1f} µs, not recurring: cycle 60 (1,500 µs))" in sel.text
    # a stall in each batch size: each above its own band, both bands said
    t[160] = 4_500
    sel = flag_cycles(series(t).with_columns(payload_batch=pl.Series([1] * 100 + [8] * 100))).selection
    lo, hi = sorted(s.limit_ns for s in sel.stalls)
    assert f"2 rare stalls (each above its batch size's band, {lo / 1e3:,.1f}–{hi / 1e3:,.1f} µs" in sel.text
    assert all(s.period_ns > s.limit_ns for s in sel.stalls)
