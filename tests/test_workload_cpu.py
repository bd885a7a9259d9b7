"""The embedded workload on CPU (gloo for two ranks, no CUDA graphs): phases, payloads, knobs."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time

import pytest

from nvtx_hooks.capture import manifest, workload
from nvtx_hooks.phases import accept_histograms, decode_payload

TINY = ["--device", "cpu", "--hidden", "32", "--ffn", "64", "--layers", "2", "--cycles", "4", "--warmup", "1",
        "--host-us", "0"]


class Recorder:
    """Stands in for nvtx_hooks.ranges: records (depth, name, payload) per event, its perf_counter time in
    ``times``, and the open ranges in ``stack``; ``host`` (the spectrace.host domain's) records into the same
    lists, and the names it opened into ``host_names``."""

    def __init__(self):
        self.events, self.times, self.stack, self.depth = [], [], [], 0
        self.host_names = []
        rec = self

        class Host:
            @staticmethod
            def push(name, payload=None):
                rec.host_names.append(name)
                rec.push(name, payload)

            @staticmethod
            def pop():
                rec.pop()

        self.host = Host

    def push(self, name, payload=None):
        self.times.append(time.perf_counter())
        self.events.append((self.depth, name, payload))
        self.stack.append(name)
        self.depth += 1

    def pop(self):
        self.stack.pop()
        self.depth -= 1

    def mark(self, name, payload=None):
        self.times.append(time.perf_counter())
        self.events.append((self.depth, "mark:" + name, payload))


@pytest.fixture
def torch():
    """torch, with one intra-op thread while the test runs: these tests time the workload's host work, and an
    OpenMP pool on a shared 2-core machine stalls whole phases for tenths of a second (measured under load 12:
    the timing tests failed with the default pool, passed with one thread)."""
    t = pytest.importorskip("torch", reason="the workload needs torch (pip install torch==2.13.0)")
    was = t.get_num_threads()
    t.set_num_threads(1)
    yield t
    t.set_num_threads(was)


def run(args, monkeypatch, rec=None):
    rec = rec or Recorder()
    monkeypatch.setattr(workload, "_ranges", lambda on: rec if on else workload._NoRanges)
    out = workload.run(workload.build_parser().parse_args(args))
    return out, rec


def run_ranks(cmd: list[str]) -> list[dict]:
    """Run the workload on several ranks; their JSON records, by rank."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}  # one intra-op thread per rank (see the torch fixture)
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=180, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    # two processes share stdout: their lines may interleave, so decode each record where it starts
    dec = json.JSONDecoder()
    recs = [dec.raw_decode(r.stdout, m.start())[0] for m in re.finditer(r'\{"rank": \d+, "world"', r.stdout)]
    return sorted(recs, key=lambda x: x["rank"])


def test_cycle_structure_and_payloads(torch, monkeypatch):
    out, rec = run([*TINY, "--steps", "2"], monkeypatch)
    assert rec.depth == 0
    names = [(d, n) for d, n, _ in rec.events]
    # v1-like: the accept lengths are on the host after verify, so its histogram mark follows it (as the hooks')
    assert names[:6] == [(0, "cycle"), (1, "draft"), (1, "verify"), (1, "mark:accept_histogram"),
                         (1, "draft_extend"), (1, "host_overhead")]
    assert len(names) == 6 * 5  # 1 warmup + 4 measured cycles
    cycles = [decode_payload(p) for _, n, p in rec.events if n == "cycle"]
    assert [c["cycle_index"] for c in cycles] == [0, 1, 2, 3, 4]
    sched = workload.accept_lengths(5, 2, 0)
    assert [c["accept_length"] for c in cycles] == [4 * (a - 1) for a in sched]
    assert all(c["batch_size"] == 4 and c["steps"] == 2 for c in cycles)
    assert accept_histograms([p for _, n, p in rec.events if n == "mark:accept_histogram"]) == {
        i: [0] * (a - 1) + [4] for i, a in enumerate(sched)}  # every request of a cycle accepts alike
    assert out["mode"] == "eagle" and out["cycles"] == 4 and out["graphs"] is False
    assert out["tokens_per_cycle"] == 4 * sum(sched[1:]) / 4


def test_v2_mode_marks_acceptance_one_cycle_later(torch, monkeypatch):
    """SGLang v2-like: no range payload carries the accept length; cycle i's ``accept`` mark comes after cycle
    i+1's ranges (outside them), with cycle i's index; the marks equal the workload's own record."""
    out, rec = run([*TINY, "--steps", "2", "--v2"], monkeypatch)
    assert rec.depth == 0
    ranges = [decode_payload(p) for _, n, p in rec.events if n in ("cycle", "draft_extend")]
    assert ranges and all(r["accept_length"] is None for r in ranges)
    order = [(d, n) for d, n, _ in rec.events if n in ("cycle", "mark:accept")]
    # warm-up cycle 0, then measured 1..4: marks trail their cycle by one, the last one after the loop
    assert order == [(0, "cycle"), (0, "mark:accept"), (0, "cycle"), (0, "cycle"), (0, "mark:accept"),
                     (0, "cycle"), (0, "mark:accept"), (0, "cycle"), (0, "mark:accept"), (0, "mark:accept")]
    marks = [decode_payload(p) for _, n, p in rec.events if n == "mark:accept"]
    assert [m["cycle_index"] for m in marks] == [0, 1, 2, 3, 4]
    sched = workload.accept_lengths(5, 2, 0)
    assert [m["accept_length"] for m in marks] == [4 * (a - 1) for a in sched]
    assert out["accept_lengths"] == {1: sched[1], 2: sched[2], 3: sched[3], 4: sched[4]}


def test_baseline_emits_decode_steps(torch, monkeypatch):
    out, rec = run([*TINY, "--baseline"], monkeypatch)
    assert {n for _, n, _ in rec.events} == {"decode_step"} and len(rec.events) == 5
    assert out["mode"] == "baseline" and out["tokens_per_cycle"] == 4


def test_ranges_off_emits_nothing(torch, monkeypatch):
    _, rec = run([*TINY, "--no-ranges"], monkeypatch)
    assert rec.events == []


@pytest.mark.slow  # three processes (a launcher and two torch ranks over gloo); make test-all (CI) runs it
def test_two_ranks_over_gloo_with_delay(torch):
    cmd = [sys.executable, "-m", "nvtx_hooks.capture.workload", *TINY, "--nproc", "2", "--delay-rank", "1",
           "--delay-us", "2000"]
    recs = run_ranks(cmd)
    assert [x["rank"] for x in recs] == [0, 1] and all(x["world"] == 2 for x in recs)
    assert [x["delay_us"] for x in recs] == [0, 2000]
    assert all(x["wall_s"] >= 4 * 0.002 for x in recs)  # rank 0 waits for rank 1 in every all-reduce
    # the defaults: every cycle (warm-up 0 included), before verify; measured on the straggler only
    for x in recs:
        d = x["delay"]
        assert (d["rank"], d["every"], d["offset"], d["before"], d["us"], d["cycles"]) == (
            1, 1, 0, "verify", 2000, [0, 1, 2, 3, 4])
    assert recs[0]["delay"]["measured_us_mean"] is None and recs[1]["delay"]["measured_us_mean"] >= 2000


@pytest.mark.parametrize("wait", ["sleep", "spin"])
def test_host_wait_sleeps_or_spins(torch, monkeypatch, wait):
    """``--host-wait``: host_overhead's HOST_US either sleeps (one time.sleep per cycle) or keeps the host
    busy on the clock (no sleep at all); either way each measured cycle takes at least HOST_US."""
    import time as _time

    slept = []
    monkeypatch.setattr(workload.time, "sleep", lambda s: (slept.append(s), _time.perf_counter()))
    args = [*TINY[:-2], "--host-us", "2000", "--host-wait", wait]
    out, _ = run(args, monkeypatch)
    assert slept == ([0.002] * 5 if wait == "sleep" else [])
    if wait == "spin":
        assert out["wall_s"] >= 4 * 0.002
        assert out["period_median_us"] >= 2000  # push to push of the measured cycles


def test_demo_workload_subcommand(torch, capsys):
    from analyze.cli import main

    assert main(["demo-workload", *TINY, "--steps", "1"]) == 0
    rec = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert rec["steps"] == 1 and rec["device"] == "cpu"


def test_argv_round_trip_and_torchrun_command():
    p = workload.build_parser()
    a = p.parse_args(["--steps", "2", "--no-graphs", "--baseline", "--delay-rank", "1", "--delay-us", "5",
                      "--nproc", "2", "--host-wait", "spin"])
    assert p.parse_args(workload.to_argv(a)) == a
    b = p.parse_args(["--schedule", "1:40, 2:40", "--prompt-len", "64", "--stall-every", "5", "--stall-us", "400",
                      "--delay-rank", "0", "--delay-us", "500", "--delay-every", "4", "--delay-offset", "3",
                      "--delay-before", "draft"])
    assert b.schedule == "1:40,2:40" and p.parse_args(workload.to_argv(b)) == b
    cmd = workload.torchrun_command(2, workload.to_argv(a))
    assert cmd[1:5] == ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
    assert "--nproc" not in cmd[5:]


@pytest.mark.parametrize("before", ["draft", "verify"])
def test_periodic_straggler(torch, monkeypatch, before):
    """``--delay-every 3 --delay-offset 1``: the straggler (rank 0 here) waits in cycles 1 and 4 of 0..4 (the
    warm-up cycle 0 counts), just before pushing ``before``; the record lists those cycles and the time the
    waits took."""
    args = [*TINY, "--delay-rank", "0", "--delay-us", "200000", "--delay-every", "3", "--delay-offset", "1",
            "--delay-before", before, "--host-wait", "spin"]
    out, rec = run(args, monkeypatch)
    names = [n for _, n, _ in rec.events]
    gaps = {}  # cycle index -> (cycle push -> draft push, draft push -> verify push), s
    for k, (_, n, p) in enumerate(rec.events):
        if n == "cycle":
            assert names[k + 1: k + 3] == ["draft", "verify"]
            gaps[decode_payload(p)["cycle_index"]] = (rec.times[k + 1] - rec.times[k],
                                                      rec.times[k + 2] - rec.times[k + 1])
    assert sorted(gaps) == [0, 1, 2, 3, 4]
    where = 0 if before == "draft" else 1
    # the wait is 200 ms; the rest of a gap is tiny CPU work (µs; tens of ms on a loaded 2-core machine)
    # (cycle 0's gaps also hold the first calls' one-time set-up, which a loaded machine can stretch past 0.2 s)
    assert all(gaps[i][where] >= 0.2 for i in (1, 4)), gaps
    assert all(gaps[i][where] < 0.1 for i in (2, 3)), gaps
    assert all(gaps[i][1 - where] < 0.1 for i in (1, 2, 3, 4)), gaps  # the other gap has no wait
    d = out["delay"]
    assert (d["rank"], d["every"], d["offset"], d["before"], d["us"], d["cycles"]) == (0, 3, 1, before, 200000, [1, 4])
    # at least what was asked, and inside the gaps it delayed (no wall-clock bound: a loaded machine spins longer)
    gap_us = 1e6 * sum(gaps[i][where] for i in (1, 4)) / 2
    assert 200000 <= d["measured_us_mean"] <= gap_us, (d["measured_us_mean"], gap_us)
    assert out["delay_us"] == 200000


@pytest.mark.parametrize("us", [0, 1000])
def test_stall_between_cycles_outside_ranges(torch, monkeypatch, us):
    """``--stall-every 2 --stall-us US`` with 3 warm-up cycles: a busy spin before cycles 2, 4 and 6 (i > 0,
    i % 2 == 0; cycle 2 is a warm-up one), with no range open and the next event that cycle's push; none at
    all for 0 µs."""
    rec = Recorder()
    seen = []  # (open ranges, events so far, seconds) at each spin
    real_spin = workload.spin
    monkeypatch.setattr(workload, "spin", lambda s: (seen.append((list(rec.stack), len(rec.events), s)),
                                                     real_spin(s)))
    out, rec = run([*TINY, "--warmup", "3", "--stall-every", "2", "--stall-us", str(us)], monkeypatch, rec)
    assert rec.depth == 0 and len([e for e in rec.events if not e[1].startswith("mark:")]) == 7 * 5
    if us == 0:
        assert seen == [] and "stall" not in out
        return
    assert [(stack, s) for stack, _, s in seen] == [([], 0.001)] * 3
    after = [rec.events[k] for _, k, _ in seen]  # the event right after each stall
    assert [(d, n, decode_payload(p)["cycle_index"]) for d, n, p in after] == [
        (0, "cycle", 2), (0, "cycle", 4), (0, "cycle", 6)]
    # each stalled cycle's push comes at least 1 ms after its predecessor's last event
    for _, k, _ in seen:
        assert rec.times[k] - rec.times[k - 1] >= 0.001
    st = out["stall"]
    assert (st["every"], st["us"], st["cycles"]) == (2, 1000, [2, 4, 6])
    assert 1000 <= st["measured_us_mean"] < 5000


@pytest.mark.parametrize("v2", [False, True])
def test_schedule_segments_and_prefill(torch, monkeypatch, v2):
    """``--schedule 1:2,3:2,2:1`` (1 warm-up cycle at size 1): cycles 0..5 at sizes 1,1,1,3,3,2; one prefill
    of the 2 new requests (2 × prompt-len tokens through the target, then one draft layer) between cycles 2
    and 3, none when the batch shrinks; the record's segments say so."""
    import torch as t

    rec = Recorder()
    rows = []  # (innermost range, tokens) per layer: gelu's input rows
    gelu = t.nn.functional.gelu
    monkeypatch.setattr(t.nn.functional, "gelu", lambda x: (rows.append((rec.stack[-1] if rec.stack else None,
                                                                         x.shape[0])), gelu(x))[1])
    args = [*TINY, "--schedule", "1:2,3:2,2:1", "--prompt-len", "8", *(["--v2"] if v2 else [])]
    out, rec = run(args, monkeypatch, rec)
    assert rec.depth == 0
    top = [(n, decode_payload(p)) for d, n, p in rec.events if d == 0 and not n.startswith("mark:")]
    assert [n for n, _ in top] == ["cycle"] * 3 + ["prefill"] + ["cycle"] * 3
    assert [p["batch_size"] for n, p in top if n == "cycle"] == [1, 1, 1, 3, 3, 2]
    assert [p["cycle_index"] for n, p in top if n == "cycle"] == [0, 1, 2, 3, 4, 5]
    assert (top[3][1]["batch_size"], top[3][1]["cycle_index"]) == (2, 2)  # new requests; the last cycle's index
    k = next(k for k, (_, n, _) in enumerate(rec.events) if n == "prefill")
    assert [(d, n) for d, n, _ in rec.events[k: k + 4]] == [
        (0, "prefill"), (1, "prefill_target_extend"), (1, "prefill_draft_extend"), (0, "cycle")]
    assert sum(n.startswith("prefill") for _, n, _ in rec.events) == 3
    # the target's 2 layers over 2 × 8 prompt tokens, one draft layer over their hidden states
    assert [r for r in rows if r[0] == "prefill_target_extend"] == [("prefill_target_extend", 16)] * 2
    assert [r for r in rows if r[0] == "prefill_draft_extend"] == [("prefill_draft_extend", 16)]
    assert {r for r in rows if r[0] == "verify"} == {("verify", 4 * b) for b in (1, 3, 2)}  # 3 steps + 1
    if v2:
        marks = [decode_payload(p) for _, n, p in rec.events if n == "mark:accept"]
        assert [(m["cycle_index"], m["batch_size"]) for m in marks] == list(enumerate([1, 1, 1, 3, 3, 2]))
    sched = workload.accept_lengths(6, 3, 0)
    assert out["cycles"] == 5 and out["batch"] is None and "period_median_us" not in out
    assert out["tokens_per_cycle"] == pytest.approx(
        sum(b * a for b, a in zip([1, 1, 3, 3, 2], sched[1:])) / 5)
    segs = out["segments"]
    assert [(s["batch"], s["cycles"], s["first_cycle"], s["prefill"]) for s in segs] == [
        (1, 2, 1, False), (3, 2, 3, True), (2, 1, 5, False)]
    assert segs[0]["prefill_ms"] is None and segs[2]["prefill_ms"] is None and segs[1]["prefill_ms"] > 0
    assert segs[0]["period_median_us"] > 0 and segs[1]["period_median_us"] > 0
    assert segs[2]["period_median_us"] is None  # one cycle: no pair


def test_schedule_period_and_prefill_time(torch, monkeypatch):
    """A segment's ``period_median_us`` is push to push within it (at least the spun host time per cycle);
    the prefill between two segments (made 200 ms long here) counts in its ``prefill_ms``, in no period."""

    class SlowPrefill(Recorder):
        def push(self, name, payload=None):
            super().push(name, payload)
            if name == "prefill":
                time.sleep(0.2)

    args = [*TINY[:-2], "--host-us", "3000", "--host-wait", "spin", "--schedule", "2:5,4:5"]
    out, rec = run(args, monkeypatch, SlowPrefill())
    segs = out["segments"]
    assert [s["prefill"] for s in segs] == [False, True] and segs[1]["prefill_ms"] >= 200
    assert all(3000 <= s["period_median_us"] < 100_000 for s in segs)  # the median of 4 periods each


@pytest.mark.parametrize("bad", ["", "4", "1:2,", "0:3", "2:0", "-1:2", "a:b", "1:2:3", "1.5:2"])
def test_bad_schedule_is_refused_in_one_line(bad, capsys):
    with pytest.raises(SystemExit) as e:
        workload.main(["--device", "cpu", f"--schedule={bad}"])
    assert e.value.code == 2
    err = [ln for ln in capsys.readouterr().err.splitlines() if "error:" in ln]
    assert len(err) == 1 and "argument --schedule: segment" in err[0]


@pytest.mark.parametrize(("argv", "says"), [
    (["--schedule", "1:2", "--baseline"], "cannot be combined with --baseline"),
    (["--delay-every", "3", "--delay-offset", "3"], "--delay-offset 3 must be below --delay-every 3"),
    (["--stall-every", "0"], "argument --stall-every: must be at least 1"),
    (["--prompt-len", "0"], "argument --prompt-len: must be at least 1"),
    (["--decode-log-interval", "-1"], "argument --decode-log-interval: must be at least 0"),
])
def test_conflicting_options_are_refused_in_one_line(argv, says, capsys):
    with pytest.raises(SystemExit) as e:
        workload.main(["--device", "cpu", *argv])
    assert e.value.code == 2
    err = [ln for ln in capsys.readouterr().err.splitlines() if "error:" in ln]
    assert len(err) == 1 and says in err[0]


@pytest.mark.slow  # three processes (a launcher and two torch ranks over gloo); make test-all (CI) runs it
def test_two_ranks_over_gloo_with_schedule(torch):
    """Both ranks run the same schedule (prefill included: its layers all-reduce too) and stalls."""
    cmd = [sys.executable, "-m", "nvtx_hooks.capture.workload", *TINY, "--nproc", "2", "--schedule", "1:2,3:2,2:1",
           "--prompt-len", "8", "--stall-every", "2", "--stall-us", "500"]
    recs = run_ranks(cmd)
    assert [x["rank"] for x in recs] == [0, 1] and all(x["world"] == 2 and x["cycles"] == 5 for x in recs)
    for x in recs:
        assert [(s["batch"], s["first_cycle"], s["prefill"]) for s in x["segments"]] == [
            (1, 1, False), (3, 3, True), (2, 5, False)]
        assert x["segments"][1]["prefill_ms"] > 0
        assert x["stall"]["cycles"] == [2, 4] and x["stall"]["measured_us_mean"] >= 500
        assert "delay" not in x


def test_manifest_records_the_schedule_not_one_batch():
    """With --schedule the manifest has no single batch size (the analysis must not multiply by one)."""
    cmd = ["python", "-m", "nvtx_hooks.capture.workload", "--batch", "4", "--schedule", "1:40,2:40,4:20",
           "--stall-every", "10", "--stall-us", "1000", "--delay-rank", "0", "--delay-us", "500",
           "--delay-every", "4", "--delay-before", "draft"]
    cfg = manifest.speculative_config(cmd)
    assert cfg["batch"] is None and cfg["schedule"] == [[1, 40], [2, 40], [4, 20]] and cfg["cycles"] == 100
    assert cfg["prompt_len"] == 128 and (cfg["stall_every"], cfg["stall_us"]) == (10, 1000)
    assert (cfg["delay_rank"], cfg["delay_us"], cfg["delay_every"], cfg["delay_offset"], cfg["delay_before"]) == (
        0, 500, 4, 0, "draft")
    plain = manifest.speculative_config(cmd[:5])
    assert plain["batch"] == 4 and "schedule" not in plain and "stall_us" not in plain
    # a command the workload refused: its settings are left out, nothing raises
    bad = manifest.speculative_config([*cmd[:3], "--schedule", "1:0"])
    assert bad == {"workload": "nvtx_hooks.capture.workload", "algorithm": "eagle-shaped"}


def test_geometric_acceptance():
    """--accept-rate A: each draft token accepted with probability A until the first rejection."""
    import statistics

    for steps in (1, 3, 4):
        a = workload.accept_lengths(20_000, steps, 0, 0.7)
        assert set(a) <= set(range(1, steps + 2))
        assert statistics.mean(a) - 1 == pytest.approx(sum(0.7 ** i for i in range(1, steps + 1)), abs=0.02)
    assert workload.accept_lengths(5, 3, 0) == workload.accept_lengths(5, 3, 0, None)  # the default: uniform
    with pytest.raises(SystemExit):
        workload.build_parser().parse_args(["--accept-rate", "1.5"])


def test_decode_log_lines_as_sglang_writes_them(torch, monkeypatch, capsys, tmp_path):
    """--decode-log-interval N: per batch size one 'Decode batch' line per N measured cycles (the interval's last
    push inside the batch size), its accept length the mean of those cycles' accepted tokens (the record's, --v2),
    and its period (running_req × accept len / gen throughput) at least the spun host time of a cycle."""
    from analyze.read.server_log import decode_periods

    args = [*TINY[:-2], "--host-us", "3000", "--host-wait", "spin", "--schedule", "2:7,4:7", "--v2",
            "--decode-log-interval", "2"]
    out, _ = run(args, monkeypatch)
    lines = [x for x in capsys.readouterr().err.splitlines() if "Decode batch" in x]
    acc = {int(k): v for k, v in out["accept_lengths"].items()}
    first = min(acc)
    want = [(b, f"{sum(acc[j + k] for k in range(2)) / 2:.2f}") for b, s in ((2, first), (4, first + 7))
            for j in range(s, s + 5, 2)]
    assert [(int(x.split("#running-req: ")[1].split(",")[0]), x.split("accept len: ")[1].split(",")[0])
            for x in lines] == want
    log = tmp_path / "decode.log"
    log.write_text("\n".join(lines) + "\n")
    got = decode_periods(log)
    assert got["batch_size"].to_list() == [2, 4] and got["lines"].to_list() == [3, 3]
    assert all(3.0e6 <= p < 1e8 for p in got["period_ns"].to_list())
