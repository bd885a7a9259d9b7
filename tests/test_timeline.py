"""``spectrace timeline``: the annotated trace-event file, read back as the format defines it (tests/helpers/
trace_events.py: slices must nest on their thread, as Perfetto requires; async begin/end pairs; counters).

- A hand-computed synthetic trace: one rank, three cycles; the split of each phase into compute / comm / idle,
  the seams, SGLang's ``scheduler.*`` ranges and an NVTX start/end range on the host thread, a synchronising CUDA
  call, and a phase whose GPU work overlaps the next one (it cannot nest: an async track).
- Real TP2 captures (tests/data/h200_tp2), one with a straggler every 4th cycle built from a real capture by
  bench/inject.py: a host and a GPU track per rank; per rank and phase the slices' count equals the instances
  ``analyze`` counts and their summed durations its span, compute, comm and idle (±0.1 %); the annotations list
  the same classes and findings as ``analyze``, on the cycles they name; the cycle-period counter is each
  cycle's period; ``--cycles`` windows, the bound, and the output rules (never over an input, ``--force``).
"""

from __future__ import annotations

import gzip
import json
from collections import Counter, defaultdict

import polars as pl
import pytest

from analyze import analyze, timeline
from analyze.cli import main
from analyze.output import timeline as tl
from bench.inject import inject
from nvtx_hooks.phases import encode_payload
from tests.helpers import trace_events as te
from tests.helpers.paths import tp2
from tests.helpers.synth import Synth

NCCL = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<(unsigned long)4096>)"


# ---- a hand-computed trace ----------------------------------------------------------------------------------


def _synthetic(path):
    """One rank (pid 100, GPU 0), cycles i = 0, 1, 2 at B = 10 000 (i + 1) ns:

    - host: ``scheduler.run_batch`` [B − 50, B + 9200] (default domain) around ``cycle`` [B, B + 9000], which holds
      draft [B + 100, B + 1000] and verify [B + 1000, B + 2000]; ``scheduler.process_batch_result`` [B + 9300,
      B + 9400]; a start/end range ``scheduler.window`` [B + 500, B + 9500] (it crosses the cycle's end: not nested);
      ``cudaStreamSynchronize`` [B + 3100, B + 3900] on the same thread.
    - GPU: draft's gemm [B + 1000, B + 1400] and all-reduce [B + 1500, B + 1800] → span 800 = compute 400 + comm 300
      + idle 100; verify's gemm [B + 2000, B + 3000] → span 1000, all compute; the seam draft → verify 200.
      Cycle 1's draft also runs a kernel on another stream [B + 1700, B + 2300]: its span 1300 = compute 900 +
      comm 300 + idle 100, and it overlaps verify (verify goes to the async overlap track).
    """
    s = Synth(path, duration=100_000)
    pid, dev, corr = 100, 0, 0
    s.device(dev)
    s.domain(pid, pid, "spectrace", 1)
    for i in range(3):
        b = 10_000 * (i + 1)
        s.range(pid, pid, "scheduler.run_batch", b - 50, b + 9200)
        s.range(pid, pid, "cycle", b, b + 9000, domain_id=1, payload=encode_payload(4, i, 2))
        s.range(pid, pid, "draft", b + 100, b + 1000, domain_id=1, payload=encode_payload(4, i))
        s.range(pid, pid, "verify", b + 1000, b + 2000, domain_id=1, payload=encode_payload(4, i))
        s.range(pid, pid, "scheduler.process_batch_result", b + 9300, b + 9400)
        s.range(pid, pid, "scheduler.window", b + 500, b + 9500, event_type=60)
        draft = [(b + 1000, b + 1400, "gemm"), (b + 1500, b + 1800, NCCL)]
        if i == 1:
            draft.append((b + 1700, b + 2300, "gemm_side", 9))
        for api, ops in ((b + 200, draft), (b + 1100, [(b + 2000, b + 3000, "gemm")])):
            corr += 1
            s.launch(pid, pid, "cudaLaunchKernel_v7000", (api, api + 50), corr, ops, device=dev)
        corr += 1
        s.api(pid, pid, "cudaStreamSynchronize_v3020", b + 3100, b + 3900, corr)
    return s.save()


@pytest.fixture(scope="module")
def synth(tmp_path_factory):
    path = _synthetic(tmp_path_factory.mktemp("tl") / "synth.sqlite")
    res = analyze(path)
    return res, te.read(tl.build(res).text)


def _by(tr: te.Trace, cat: str) -> list[te.Slice]:
    return [s for s in tr.slices if s.cat == cat]


def test_synthetic_split_is_hand_computed(synth):
    _, tr = synth
    draft = sorted((s for s in _by(tr, "gpu") if s.name == "draft"), key=lambda s: s.start)
    assert [(s.start, s.end - s.start) for s in draft] == [(11_000, 800), (21_000, 1300), (31_000, 800)]
    parts = defaultdict(int)
    for s in _by(tr, "split"):
        if s.parent.name == "draft":
            parts[(s.parent.start, s.name)] += s.end - s.start
    assert parts == {(11_000, "compute"): 400, (11_000, "comm"): 300, (11_000, "idle"): 100,
                     (21_000, "compute"): 900, (21_000, "comm"): 300, (21_000, "idle"): 100,
                     (31_000, "compute"): 400, (31_000, "comm"): 300, (31_000, "idle"): 100}
    # the idle interval is where it is: between the gemm and the all-reduce
    assert [(s.start, s.end) for s in _by(tr, "split") if s.name == "idle" and s.parent.start == 11_000] == \
        [(11_400, 11_500)]
    cycles = sorted((s for s in _by(tr, "gpu") if s.name.startswith("cycle")), key=lambda s: s.start)
    assert [(s.name, s.start, s.end) for s in cycles] == [("cycle 0", 11_000, 13_000), ("cycle 1", 21_000, 23_000),
                                                          ("cycle 2", 31_000, 33_000)]
    assert all(s.parent is c for c in cycles for s in _by(tr, "gpu") if s.name == "draft" and c.start <= s.start < c.end)


def test_synthetic_seams_and_overlap(synth):
    _, tr = synth
    seams = sorted(_by(tr, "seam"), key=lambda s: s.start)
    inside = [(s.start, s.end) for s in seams if s.name.startswith("seam draft→verify")]
    assert inside == [(11_800, 12_000), (31_800, 32_000)]  # cycle 1's draft overlaps its verify: no seam
    between = [(s.start, s.end) for s in seams if s.name.startswith("between cycles")]
    assert between == [(13_000, 21_000), (23_000, 31_000)]
    assert all(" · " in s.name and s.name.endswith("-bound") for s in seams)  # named by their cause
    # cycle 1's verify [22 000, 23 000] overlaps its draft's side kernel [21 700, 22 300]: an async slice with
    # its split under it, never an X slice that would not nest
    over = [s for s in tr.async_slices if s.cat == "gpu overlapping"]
    assert ("verify", 22_000, 23_000) in [(s.name, s.start, s.end) for s in over]
    assert not [s for s in _by(tr, "gpu") if s.name == "verify" and s.start == 22_000]
    assert sum(s.end - s.start for s in over if s.name == "compute") == 1000


def test_synthetic_host_thread(synth):
    _, tr = synth
    host = [s for s in tr.slices if s.pid == 1 and tr.threads[(1, s.tid)].startswith("host thread")]
    names = Counter(s.name for s in host)
    assert names["scheduler.run_batch"] == 3 and names["scheduler.process_batch_result"] == 3
    assert names["cycle"] == 3 and names["draft"] == 3 and names["verify"] == 3
    sync = [s for s in host if s.name.startswith("cudaStreamSynchronize")]
    assert [(s.start, s.end) for s in sync] == [(13_100, 13_900), (23_100, 23_900), (33_100, 33_900)]
    cyc = next(s for s in host if s.name == "cycle" and s.start == 10_000)
    assert cyc.parent.name == "scheduler.run_batch"  # the scheduler's range holds the cycle on the host thread
    # the start/end range crosses the cycle's end: async, not an X slice
    assert [(s.start, s.end) for s in tr.async_slices if s.name == "scheduler.window"] == \
        [(10_500, 19_500), (20_500, 29_500), (30_500, 39_500)]
    assert [c["args"]["period"] for c in tr.counters if c["name"] == "cycle period µs"] == [10.0, 10.0]


# ---- real TP2 captures --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tp2_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("tp2tl")


@pytest.fixture(scope="module")
def every4(tp2_dir):
    """tp2_s3_node with rank 1 late 500 µs before draft every 4th cycle (bench/inject.py)."""
    path = tp2_dir / "every4.sqlite"
    inject(tp2("tp2_s3_node", tp2_dir), path, ["1:draft:4:0:500"])
    res = analyze(path)
    doc = timeline(path)  # the default: NAME.trace.json beside it
    assert doc.path == (tp2_dir / "every4.trace.json").resolve()
    return path, res, doc, te.read(doc.path)


def _phase_sums(res, tr: te.Trace) -> tuple[dict, dict]:
    """Per (rank, phase): slices counted and summed (span, compute, comm, idle) from the file, and the same from
    ``analyze``'s whole-run phases (every instance it counts: the timeline shows every cycle)."""
    got: dict = defaultdict(int)
    for s in tr.slices:
        if s.cat == "gpu" and s.args.get("cycle") is None and s.args.get("left_out") is None:
            got[(s.pid - 1, s.name, "span")] += s.end - s.start
            got[(s.pid - 1, s.name, "n")] += 1
        elif s.cat == "split" and s.parent.args.get("left_out") is None:
            got[(s.pid - 1, s.parent.name, s.name)] += s.end - s.start
    want = {}
    for r in res.phases.iter_rows(named=True):
        want |= {(r["rank"], r["phase"], "n"): r["instances"], (r["rank"], r["phase"], "span"): r["span_ns"],
                 (r["rank"], r["phase"], "compute"): r["compute_ns"], (r["rank"], r["phase"], "comm"): r["comm_ns"],
                 (r["rank"], r["phase"], "idle"): r["idle_ns"]}
    return got, want


@pytest.mark.parametrize("name", ["every4", "tp2_straggler", "tp2_v2"])
def test_tp2_tracks_counts_and_sums_equal_analyze(name, tp2_dir, every4):
    if name == "every4":
        _, res, _, tr = every4
    else:
        res = analyze(tp2(name, tp2_dir))
        tr = te.read(tl.build(res).text)
    ranks = sorted(res.ranks["rank"].to_list())
    assert len(ranks) == 2
    for r in ranks:
        threads = [n for (p, _), n in tr.threads.items() if p == r + 1]
        assert any(n.startswith("GPU") for n in threads) and any(n.startswith("host thread") for n in threads)
        assert tr.processes[r + 1].startswith(f"rank {r} ")
    got, want = _phase_sums(res, tr)
    assert want and {k for k in want if k[2] == "n"}
    for k, v in want.items():
        if k[2] == "n":
            assert got[k] == v, k
        else:
            assert got[k] == pytest.approx(v, rel=1e-3, abs=1), k


def test_tp2_annotations_are_analyzes(every4):
    _, res, doc, tr = every4
    found = res.steady.findings
    classes = res.steady.cycle_classes
    ann = tr.meta["annotations"]
    assert [a["track"].split(": ", 1)[1] for a in ann["classes"]] == [c.label for c in classes]
    assert [a["track"].split(": ", 1)[1].split(" · ")[0] for a in ann["findings"]] == [f.code for f in found]
    names = [tr.threads[(0, t)] for t in sorted(t for p, t in tr.threads if p == 0)]
    assert len(names) == len(classes) + res.steady.straggler.height + len(found)
    # the straggler finding (every 4th cycle, rank 1, draft) is on the cycles of its class, args as analyze says
    (f,) = [f for f in found if f.code == "STRAGGLER_RANK"]
    i = found.index(f) + 1
    tid = next(t for (p, t), n in tr.threads.items() if p == 0 and n.startswith(f"finding {i}:"))
    on = [s for s in tr.slices if s.pid == 0 and s.tid == tid]
    every = next(c for c in classes if c.kind == "every")
    cyc = res.steady.cycles
    want = sorted(cyc.filter((pl.col("cycle_class") == every.id) & pl.col("slow") & pl.col("steady"))["key"]
                  .unique().to_list())
    assert sorted(s.args["cycle"] for s in on) == want and len(want) == every.affected
    assert {s.args["code"] for s in on} == {"STRAGGLER_RANK"}
    assert on[0].args["impact_us_per_cycle"] == round(f.impact_ns / 1e3, 1) and on[0].args["rank"] == 1
    assert on[0].args["evidence"] == f.evidence
    # each annotated cycle's slice covers that cycle's GPU period on every rank
    c = cyc.filter(pl.col("key").is_in(want))
    for s in on:
        mine = c.filter(pl.col("key") == s.args["cycle"])
        assert s.end == mine["i_last"].max()
        assert s.start >= (mine["i_last"] - mine["period_ns"]).min()


def test_tp2_cycle_period_counter(every4):
    _, res, _, tr = every4
    cyc = res.steady.cycles.filter(pl.col("period_ns").is_not_null())
    got = sorted((c["pid"] - 1, te.ns(c["ts"]), te.ns(c["args"]["period"])) for c in tr.counters
                 if c["name"] == "cycle period µs")
    want = sorted(cyc.select("rank", "i_last", "period_ns").rows())
    assert got == want


def test_cycles_window_class_and_bound(every4, tp2_dir):
    path, res, _, _ = every4
    t = tl.build(res, "10:20")
    assert t.keys == list(range(10, 20)) and t.cut is None
    tr = te.read(t.text)
    shown = {s.args["cycle"] for s in tr.slices if s.cat == "gpu" and s.args.get("cycle") is not None}
    assert shown == set(range(10, 20))
    every = next(c for c in res.steady.cycle_classes if c.kind == "every")
    t = tl.build(res, "class:1")
    want = [k for k in range(res.steady.cycles["key"].max() + 1) if k % 4 == 0 and k > 0 and k in every.keys]
    assert set(want) <= set(t.keys) and {k - 1 for k in want} <= set(t.keys)
    seg = tl.build(res, "segment:0")
    assert seg.keys == sorted(res.steady.cycles["key"].unique().to_list())
    # the bound: whole cycles from the first steady one, said in the file and under the bound
    small = tl.build(res, None, max_events=4000)
    assert small.cut and "bounded to 4,000 events" in small.cut and small.events <= 4000
    assert small.meta["cut"] == small.cut and len(small.keys) < len(seg.keys)
    assert small.keys == list(range(small.keys[0], small.keys[0] + len(small.keys)))
    with pytest.raises(Exception, match="class:N"):
        tl.build(res, "nonsense")


def test_cli_writes_new_files_only(every4, tp2_dir, capsys):
    path, _, _, _ = every4
    out = tp2_dir / "cli.trace.json.gz"
    assert main(["timeline", str(path), "-o", str(out), "--cycles", "0:8", "-q"]) == 0
    doc = json.loads(gzip.decompress(out.read_bytes()))
    assert doc["otherData"]["cycles_shown"] == 8 and doc["traceEvents"]
    assert main(["timeline", str(path), "-o", str(out), "-q"]) == 2
    assert "exists; pass --force" in capsys.readouterr().err
    assert main(["timeline", str(path), "-o", str(out), "-q", "--force", "--max-events", "3000"]) == 0
    assert "bounded" not in capsys.readouterr().err  # -q: no note
    assert main(["timeline", str(path), "-o", str(path)]) == 2
    assert "never writes to its input" in capsys.readouterr().err
    assert main(["timeline", str(path), "-o", str(tp2_dir / "x.json"), "--cycles", "class:9"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "class(es)" in err


def test_gpu_metrics_counters_are_the_exports_samples():
    """With nsys GPU metrics (tp1_gpumetrics_graph): one counter event per sample time in the window, on the rank's
    process, its SMs-active value the export's (SQL on GPU_METRICS, independent of the reader)."""
    import sqlite3

    from nvtx_hooks.capture import samples

    path = samples.path("tp1_gpumetrics_graph")
    tr = te.read(tl.build(analyze(path)).text)
    ev = [c for c in tr.counters if c["name"] == "GPU metrics % of peak"]
    assert ev and {c["pid"] for c in ev} == {1}
    assert all(0 <= v <= 100 for c in ev for v in c["args"].values())
    ts = sorted(te.ns(c["ts"]) for c in ev)
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    sm = dict(con.execute(
        "SELECT g.timestamp, g.value FROM GPU_METRICS g JOIN TARGET_INFO_GPU_METRICS m "
        "ON g.typeId = m.typeId AND g.metricId = m.metricId WHERE m.metricName LIKE 'SMs Active%' "
        "AND g.timestamp BETWEEN ? AND ?", (ts[0], ts[-1])).fetchall())
    con.close()
    assert sorted(sm) == ts
    by_ts = {te.ns(c["ts"]): c["args"]["sm_active"] for c in ev}
    assert all(by_ts[t] == pytest.approx(v) for t, v in sm.items())
