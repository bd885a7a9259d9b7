"""The embedded workload on CPU (gloo for two ranks, no CUDA graphs): phases, payloads, knobs."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from nvtx_hooks.capture import workload
from nvtx_hooks.phases import decode_payload

TINY = ["--device", "cpu", "--hidden", "32", "--ffn", "64", "--layers", "2", "--cycles", "4", "--warmup", "1",
        "--host-us", "0"]


class Recorder:
    """Stands in for nvtx_hooks.ranges: records (depth, name, payload)."""

    def __init__(self):
        self.events, self.depth = [], 0

    def push(self, name, payload=None):
        self.events.append((self.depth, name, payload))
        self.depth += 1

    def pop(self):
        self.depth -= 1

    def mark(self, name, payload=None):
        self.events.append((self.depth, "mark:" + name, payload))


@pytest.fixture
def torch():
    return pytest.importorskip("torch", reason="the workload needs torch (pip install torch==2.13.0)")


def run(args, monkeypatch):
    rec = Recorder()
    monkeypatch.setattr(workload, "_ranges", lambda on: rec if on else workload._NoRanges)
    out = workload.run(workload.build_parser().parse_args(args))
    return out, rec


def test_cycle_structure_and_payloads(torch, monkeypatch):
    out, rec = run([*TINY, "--steps", "2"], monkeypatch)
    assert rec.depth == 0
    names = [(d, n) for d, n, _ in rec.events]
    assert names[:5] == [(0, "cycle"), (1, "draft"), (1, "verify"), (1, "draft_extend"), (1, "host_overhead")]
    assert len(names) == 5 * 5  # 1 warmup + 4 measured cycles
    cycles = [decode_payload(p) for _, n, p in rec.events if n == "cycle"]
    assert [c["cycle_index"] for c in cycles] == [0, 1, 2, 3, 4]
    sched = workload.accept_lengths(5, 2, 0)
    assert [c["accept_length"] for c in cycles] == [4 * (a - 1) for a in sched]
    assert all(c["batch_size"] == 4 for c in cycles)
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


def test_two_ranks_over_gloo_with_delay(torch):
    cmd = [sys.executable, "-m", "nvtx_hooks.capture.workload", *TINY, "--nproc", "2", "--delay-rank", "1",
           "--delay-us", "2000"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr[-2000:]
    # two processes share stdout: their lines may interleave
    recs = sorted((json.loads(x) for x in re.findall(r'\{"rank".*?\}', r.stdout)), key=lambda x: x["rank"])
    assert [x["rank"] for x in recs] == [0, 1] and all(x["world"] == 2 for x in recs)
    assert [x["delay_us"] for x in recs] == [0, 2000]
    assert all(x["wall_s"] >= 4 * 0.002 for x in recs)  # rank 0 waits for rank 1 in every all-reduce


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
    cmd = workload.torchrun_command(2, workload.to_argv(a))
    assert cmd[1:5] == ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
    assert "--nproc" not in cmd[5:]
