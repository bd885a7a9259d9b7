"""The workload's new knobs on CPU: adaptive segments (0 steps included), per-position acceptance, the scheduler
emulation (SGLang's loop, overlap, range domains, busy Python work), injected host time; every record field checked
against what the run emitted."""

from __future__ import annotations

import pytest

from nvtx_hooks.capture import manifest, workload
from nvtx_hooks.capture import plan as pl
from nvtx_hooks.phases import accept_histograms, decode_payload, histogram_of
from tests.test_workload_cpu import TINY, Recorder, run, run_ranks
from tests.test_workload_cpu import torch as torch  # noqa: F401  (the fixture: one intra-op thread)

SCHED = ["--device", "cpu", "--hidden", "32", "--ffn", "64", "--layers", "2", "--cycles", "4", "--warmup", "1",
         "--scheduler", "--scheduler-us", "recv_requests=0,process_input_requests=0,get_next_batch_to_run=0,"
         "process_batch_result=0"]


def _marks(rec, name):
    return [p for _, n, p in rec.events if n == "mark:" + name]


def test_adaptive_segments_steps_and_graph_shapes(torch, monkeypatch):
    """--adaptive 1:2:3,4:0:2,2:1:2 (warm-up at 1:2): every range's payload has its cycle's steps; 0-step cycles
    have no draft; each (batch, steps) its own verify shape (batch × (steps + 1) tokens); a prefill when it grows."""
    rec = Recorder()
    rows = []  # (innermost range, tokens) of each layer
    gelu = torch.nn.functional.gelu
    monkeypatch.setattr(torch.nn.functional, "gelu", lambda x: (rows.append((rec.stack[-1] if rec.stack else None,
                                                                             x.shape[0])), gelu(x))[1])
    out, rec = run([*TINY, "--adaptive", "1:2:3,4:0:2,2:1:2", "--prompt-len", "4"], monkeypatch, rec)
    assert rec.depth == 0
    cyc = [decode_payload(p) for _, n, p in rec.events if n == "cycle"]
    assert [(c["cycle_index"], c["batch_size"], c["steps"]) for c in cyc] == [
        (0, 1, 2), (1, 1, 2), (2, 1, 2), (3, 1, 2), (4, 4, 0), (5, 4, 0), (6, 2, 1), (7, 2, 1)]
    for name in ("draft", "verify", "draft_extend"):
        got = [(p["cycle_index"], p["steps"]) for p in (decode_payload(q) for _, n, q in rec.events if n == name)]
        want = [(c["cycle_index"], c["steps"]) for c in cyc if name != "draft" or c["steps"]]
        assert got == want, name
    assert {r for r in rows if r[0] == "verify"} == {("verify", 3), ("verify", 4), ("verify", 4)}  # 1×3, 4×1, 2×2
    assert [r for r in rows if r[0] == "draft"] == [("draft", 1)] * 2 * 4 + [("draft", 2)] * 2  # steps × batch
    top = [n for d, n, _ in rec.events if d == 0]
    assert top.count("prefill") == 1 and top.index("prefill") == 4  # before cycle 4 (1 -> 4 requests)
    assert out["steps"] is None and out["batch"] is None and "period_median_us" not in out
    assert [(s["batch"], s["steps"], s["cycles"], s["first_cycle"], s["prefill"]) for s in out["segments"]] == [
        (1, 2, 3, 1, False), (4, 0, 2, 4, True), (2, 1, 2, 6, False)]
    assert out["zero_step_draft_extend"] == "run"
    a = out["acceptance"]["segments"]
    assert [(s["batch"], s["steps"], s["requests"]) for s in a] == [(1, 2, 3), (4, 0, 8), (2, 1, 4)]
    assert a[1]["histogram"] == [8] and a[1]["accepted_at_position"] == []  # 0 steps: nothing drafted


def test_zero_steps_skip_draft_extend(torch, monkeypatch):
    out, rec = run([*TINY, "--adaptive", "2:0:2,2:1:1", "--zero-step-draft-extend", "skip"], monkeypatch)
    by_cycle: dict[int, list[str]] = {}
    cur = None
    for d, n, p in rec.events:
        if n == "cycle":
            cur = decode_payload(p)["cycle_index"]
        elif d == 1 and not n.startswith("mark:"):
            by_cycle.setdefault(cur, []).append(n)
    assert by_cycle == {0: ["verify", "host_overhead"], 1: ["verify", "host_overhead"],
                        2: ["verify", "host_overhead"], 3: ["draft", "verify", "draft_extend", "host_overhead"]}
    assert out["zero_step_draft_extend"] == "skip"


@pytest.mark.parametrize("v2", [False, True])
def test_accept_profile_histograms(torch, monkeypatch, v2):
    """--accept-profile: each request its own accepted drafts; the marks' histograms are the record's, per cycle;
    the segment's accepted_at_position counts the requests that accepted at least j drafts."""
    args = [*TINY, "--batch", "16", "--cycles", "6", "--steps", "3", "--accept-profile", "0.8,0.5",
            *(["--v2"] if v2 else [])]
    out, rec = run(args, monkeypatch)
    drafts = pl.plan_drafts([(16, 3)] * 7, 0, None, (0.8, 0.5))
    marks = accept_histograms(_marks(rec, "accept_histogram"))
    assert marks == {j: histogram_of(drafts[j]) for j in range(7)}  # warm-up cycle 0 included
    assert out["accept_histograms"] == {j: histogram_of(drafts[j]) for j in range(1, 7)}
    seg = out["acceptance"]["segments"][0]
    flat = [d for ds in drafts[1:] for d in ds]
    assert seg["requests"] == 96 and seg["histogram"] == [flat.count(k) for k in range(4)]
    assert seg["accepted_at_position"] == [sum(d >= j for d in flat) for j in (1, 2, 3)]
    assert out["acceptance"]["model"] == "profile" and out["acceptance"]["profile"] == [0.8, 0.5]
    assert "accept_lengths" not in out  # requests of a cycle differ: the histograms are the truth
    acc = [decode_payload(p)["accept_length"] for p in _marks(rec, "accept")] if v2 else [
        decode_payload(p)["accept_length"] for _, n, p in rec.events if n == "cycle"]
    assert acc == [sum(ds) for ds in drafts]
    assert out["tokens_per_cycle"] == pytest.approx(sum(16 + sum(ds) for ds in drafts[1:]) / 6)


def _iteration_outline(rec, upto):
    return [(d, n) for d, n, _ in rec.events][:upto]


def test_scheduler_loop_normal(torch, monkeypatch):
    """--scheduler: one iteration = recv, process_input, get_next, run_batch ⊃ cycle, process_batch_result ⊃ the
    accept marks of the cycle it just ran (a .tolist() of its accept lengths: a D2H copy that waits)."""
    out, rec = run(SCHED, monkeypatch)
    it = [(0, "scheduler.recv_requests"), (0, "scheduler.process_input_requests"),
          (0, "scheduler.get_next_batch_to_run"), (0, "scheduler.run_batch"), (1, "cycle"), (2, "draft"),
          (2, "verify"), (2, "draft_extend"), (0, "scheduler.process_batch_result"), (1, "mark:accept"),
          (1, "mark:accept_histogram")]
    assert _iteration_outline(rec, 5 * len(it)) == it * 5 and len(rec.events) == 5 * len(it)
    cycles = [decode_payload(p)["cycle_index"] for _, n, p in rec.events if n == "cycle"]
    accepts = [decode_payload(p)["cycle_index"] for p in _marks(rec, "accept")]
    assert cycles == accepts == [0, 1, 2, 3, 4]
    assert not any(n == "host_overhead" for _, n, _ in rec.events)
    # the hooks' ranges: scheduler.* in the spectrace.host domain (ranges.host), the phases in spectrace's
    assert set(rec.host_names) == {pl.range_name(f) for f in (*pl.SCHEDULER_FUNCTIONS, "run_batch")}
    assert len(rec.host_names) == 5 * 5
    sc = out["scheduler"]
    assert (sc["ranges"], sc["overlap"], sc["first_cycle"], sc["busy_function"]) == ("hooks", False, 1,
                                                                                     "spectrace_busy_python")
    assert all(len(v) == 4 for v in sc["measured_us"].values()) and sc["drain_us"] == []


def test_scheduler_overlap_processes_the_previous_result(torch, monkeypatch):
    out, rec = run([*SCHED, "--overlap"], monkeypatch)
    seq = []  # (what, cycle index) in order: cycles launched, results processed
    for _, n, p in rec.events:
        if n == "cycle":
            seq.append(("launch", decode_payload(p)["cycle_index"]))
        elif n == "mark:accept":
            seq.append(("result", decode_payload(p)["cycle_index"]))
    # warm-up cycle 0's result is drained before the measured loop; then each result one iteration late
    assert seq == [("launch", 0), ("result", 0), ("launch", 1), ("launch", 2), ("result", 1), ("launch", 3),
                   ("result", 2), ("launch", 4), ("result", 3), ("result", 4)]
    sc = out["scheduler"]
    assert sc["overlap"] is True and len(sc["drain_us"]) == 1 and len(sc["measured_us"]["process_batch_result"]) == 4
    # the first measured iteration has no earlier result to process (the warm-up's was drained): None there
    assert sc["measured_us"]["process_batch_result"][0] is None
    assert all(x >= 0 for x in sc["measured_us"]["process_batch_result"][1:])


def test_scheduler_ranges_in_sglang_domain_or_none(torch, monkeypatch):
    """--scheduler-ranges sglang: the scheduler.* ranges go to the default NVTX domain (as SGLang's own), the phase
    ranges and marks to spectrace's; none: no scheduler ranges at all."""
    default = Recorder()
    monkeypatch.setattr(pl, "DefaultDomainRanges", lambda: default)
    out, rec = run([*SCHED, "--scheduler-ranges", "sglang"], monkeypatch)
    assert {n for _, n, _ in default.events} == {pl.range_name(f) for f in (*pl.SCHEDULER_FUNCTIONS, "run_batch")}
    assert not any(n.startswith("scheduler.") for _, n, _ in rec.events) and rec.host_names == []
    assert [n for d, n, _ in rec.events][:4] == ["cycle", "draft", "verify", "draft_extend"]
    assert out["scheduler"]["ranges"] == "sglang" and default.depth == 0
    out, rec = run([*SCHED, "--scheduler-ranges", "none"], monkeypatch, Recorder())
    assert not any(n.startswith("scheduler.") for _, n, _ in rec.events) and _marks(rec, "accept")


def test_scheduler_time_extras_and_busy_function(torch, monkeypatch):
    """Each function spins its µs; --extra adds in the cycles its rule picks (periodic, random, level shift); the
    busy Python function runs inside process_batch_result; the record's measured µs cover what was asked."""
    busy = []
    real = pl.spectrace_busy_python
    monkeypatch.setattr(pl, "spectrace_busy_python", lambda s: (busy.append(s), real(s))[1])
    args = [*SCHED[:-2], "--scheduler-us", "recv_requests=100,get_next_batch_to_run=300", "--cycles", "8",
            "--busy-us", "400", "--extra", "get_next_batch_to_run:2000:every=4",
            "--extra", "process_batch_result:1000:p=0.5", "--extra", "recv_requests:700:from=6", "--seed", "3"]
    out, rec = run(args, monkeypatch)
    sc = out["scheduler"]
    assert sc["us"] == {"recv_requests": 100, "process_input_requests": 60, "get_next_batch_to_run": 300,
                        "process_batch_result": 200}
    ex = out["extras"]
    assert [(e["piece"], e["us"], e["rule"]) for e in ex] == [
        ("get_next_batch_to_run", 2000, "every=4"), ("process_batch_result", 1000, "p=0.5"),
        ("recv_requests", 700, "from=6")]
    want = pl.extra_cycles([pl.parse_extra(a) for a in args[args.index("--extra") + 1::2] if ":" in a], 9, 3)
    assert [e["cycles"] for e in ex] == want and ex[0]["cycles"] == [4, 8] and ex[2]["cycles"] == [6, 7, 8]
    assert all(e["measured_us_mean"] >= e["us"] for e in ex if e["cycles"])
    meas = sc["measured_us"]  # per measured iteration k: cycle k + 1
    for k in range(8):
        i = k + 1
        assert meas["get_next_batch_to_run"][k] >= 300 + (2000 if i in ex[0]["cycles"] else 0)
        assert meas["recv_requests"][k] >= 100 + (700 if i >= 6 else 0)
        assert meas["process_batch_result"][k] >= 200 + 400 + (1000 if i in ex[1]["cycles"] else 0)
    assert busy == [0.0004] * 9  # warm-up iteration and 8 measured, each inside process_batch_result
    assert sc["busy_us"] == 400 and sc["busy_in"] == "process_batch_result"


def test_extra_outside_the_scheduler(torch, monkeypatch):
    """host_overhead and between extras in the classic loop: spun inside host_overhead / before the cycle's push."""
    out, rec = run([*TINY, "--extra", "host_overhead:3000:every=2", "--extra", "between:2000:from=3"], monkeypatch)
    ex = {e["piece"]: e for e in out["extras"]}
    assert ex["host_overhead"]["cycles"] == [2, 4] and ex["between"]["cycles"] == [3, 4]
    assert ex["host_overhead"]["measured_us_mean"] >= 3000 and ex["between"]["measured_us_mean"] >= 2000


@pytest.mark.parametrize(("argv", "says"), [
    (["--scheduler", "--host-us", "10"], "--host-us is host_overhead's time"),
    (["--overlap"], "need --scheduler"),
    (["--busy-us", "5"], "need --scheduler"),
    (["--extra", "get_next_batch_to_run:5:every=2"], "is an emulated scheduler function"),
    (["--scheduler", "--extra", "host_overhead:5:every=2"], "no host_overhead range with --scheduler"),
    (["--adaptive", "1:2", "--schedule", "1:3"], "cannot be combined with --schedule"),
    (["--adaptive", "1:2", "--baseline"], "cannot be combined"),
    (["--accept-profile", "0.5", "--accept-rate", "0.5"], "give one"),
    (["--scheduler", "--baseline"], "cannot be combined with --baseline"),
    (["--adaptive", "1:x"], "argument --adaptive: segment"),
    (["--extra", "between:1:sometimes"], "argument --extra:"),
    (["--accept-profile", "2"], "argument --accept-profile:"),
    (["--scheduler-us", "run_batch=3"], "argument --scheduler-us:"),
])
def test_refused_in_one_line(argv, says, capsys):
    with pytest.raises(SystemExit) as e:
        workload.main(["--device", "cpu", *argv])
    assert e.value.code == 2
    err = [ln for ln in capsys.readouterr().err.splitlines() if "error:" in ln]
    assert len(err) == 1 and says in err[0], err


def test_argv_round_trip_and_manifest():
    p = workload.build_parser()
    a = p.parse_args(["--adaptive", "1:4,8:3:20,64:0", "--accept-profile", "0.9,0.6", "--scheduler", "--overlap",
                      "--scheduler-ranges", "sglang", "--busy-us", "300", "--scheduler-us", "recv_requests=10",
                      "--extra", "get_next_batch_to_run:500:every=8", "--extra", "between:50:p=0.25",
                      "--zero-step-draft-extend", "skip", "--cycles", "30"])
    assert p.parse_args(workload.to_argv(a)) == a
    cmd = ["python", "-m", "nvtx_hooks.capture.workload", *workload.to_argv(a)]
    cfg = manifest.speculative_config(cmd)
    assert cfg["steps"] is None and cfg["batch"] is None and cfg["cycles"] == 80
    assert cfg["adaptive"] == [[1, 4, 30], [8, 3, 20], [64, 0, 30]] and cfg["schedule"] == [[1, 30], [8, 20], [64, 30]]
    assert cfg["accept_profile"] == [0.9, 0.6] and cfg["zero_step_draft_extend"] == "skip"
    assert cfg["scheduler"] == {"ranges": "sglang", "overlap": True, "busy_us": 300,
                                "us": {**pl.DEFAULT_SCHEDULER_US, "recv_requests": 10}}
    assert cfg["extra"] == ["get_next_batch_to_run:500:every=8", "between:50:p=0.25"]


def test_two_ranks_agree_on_random_extras_and_adaptive_steps(torch):
    """Over gloo: both ranks run the same segments and inject the same seeded random extras (TP ranks run the
    same batches)."""
    cmd = ["python", "-m", "nvtx_hooks.capture.workload", *SCHED, "--nproc", "2", "--adaptive", "1:1:3,2:0:3",
           "--overlap", "--extra", "get_next_batch_to_run:200:p=0.5", "--seed", "11"]
    import sys

    cmd[0] = sys.executable
    recs = run_ranks(cmd)
    assert [r["rank"] for r in recs] == [0, 1]
    assert recs[0]["extras"][0]["cycles"] == recs[1]["extras"][0]["cycles"] == pl.extra_cycles(
        [pl.parse_extra("get_next_batch_to_run:200:p=0.5")], 7, 11)[0]
    for r in recs:
        assert [(s["batch"], s["steps"]) for s in r["segments"]] == [(1, 1), (2, 0)]
        assert r["accept_histograms"] == recs[0]["accept_histograms"]
