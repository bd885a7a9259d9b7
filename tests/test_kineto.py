"""Torch profiler traces (analyze/read/kineto.py): hand-made Kineto traces with known numbers, the file layouts
(.json and .json.gz, one file per rank, a folder, SGLang's merged file), SGLang's native spans against spectrace's
names, every verb, bad input; the CPU workload under torch.profiler for the CPU-side structure."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

from analyze import api
from analyze.model import InputError
from analyze.read import kineto
from analyze.read.export import load
from nvtx_hooks import phases as ph
from tests.helpers.kineto_synth import GPU_US, PERIOD, T0, merged_trace, rank_trace, write

ROOT = Path(__file__).resolve().parents[1]


def _per_rank(d: Path, names: str = "spectrace", suffix: str = ".trace.json.gz", **kw) -> Path:
    d.mkdir()
    for r in (0, 1):
        write(d / f"prof-TP-{r}{suffix}", rank_trace(r, names=names, **kw))
    return d


def _phase_us(res) -> dict[tuple[int, str], float]:
    """Per (rank, phase): GPU busy time per instance, µs (span = compute + comm + idle)."""
    p = res.phases.filter(pl.col("domain") == ph.DOMAIN)
    return {(r["rank"], r["phase"]): r["span_ns"] / r["instances"] / 1e3 for r in p.iter_rows(named=True)}


def test_annotation_round_trip():
    p = ph.encode_payload(7, 123, 9)
    assert ph.annotation("cycle", p) == f"spectrace:cycle #{p:#x}"
    assert ph.parse_annotation(ph.annotation("cycle", p)) == ("cycle", p)
    assert ph.parse_annotation("spectrace:draft") == ("draft", None)
    assert ph.parse_annotation("draft") is None and ph.parse_annotation("spectrace:cycle #12") is None


def test_per_phase_gpu_time_and_period_exact(tmp_path):
    res = api.analyze(_per_rank(tmp_path / "t"))
    assert res.ranks["pid"].to_list() == [4000, 4001] and res.ranks["device"].to_list() == [0, 1]
    assert res.ranks["device_name"].to_list() == ["NVIDIA H200"] * 2
    got = _phase_us(res)
    for r in (0, 1):
        for phase, us in GPU_US.items():
            assert got[(r, phase)] == pytest.approx(us, abs=1e-6), (r, phase)
    assert res.steady.tokens.period_p50_ns == PERIOD * 1000
    comm = res.phases.filter(pl.col("phase") == "draft")["comm_ns"].to_list()
    assert comm == [20 * 20_000, 20 * 20_000]  # the NCCL all-reduce, 20 µs in each of 20 cycles, per rank
    codes = [d.code for d in res.diagnostics]
    assert codes.count("TORCH_PROFILER_TRACE") == 1


def test_json_and_gz_and_merged_agree(tmp_path):
    a = api.analyze(_per_rank(tmp_path / "gz"))
    b = api.analyze(_per_rank(tmp_path / "plain", suffix=".trace.json"))
    m = write(tmp_path / "merged-x.trace.json.gz", merged_trace([rank_trace(0), rank_trace(1)]))
    c = api.analyze(m)
    for other in (b, c):
        assert _phase_us(other) == _phase_us(a)
        assert other.ranks.select("pid", "device").equals(a.ranks.select("pid", "device"))
    # the merged file keeps its keys after the events: device names and ranks come from there
    assert c.ranks["device_name"].to_list() == ["NVIDIA H200"] * 2
    cap = load(m).capture_meta
    assert cap["TORCH_TRACE_RANK:4000"] == "0" and cap["TORCH_TRACE_RANK:4001"] == "1"


def test_folder_prefers_rank_files_over_merged(tmp_path):
    d = _per_rank(tmp_path / "t")
    write(d / "merged-x.trace.json.gz", merged_trace([rank_trace(0), rank_trace(1)]))
    assert [f.name for f in kineto.trace_files(d)] == ["prof-TP-0.trace.json.gz", "prof-TP-1.trace.json.gz"]


def test_native_spans_give_the_same_phases(tmp_path):
    spec = api.analyze(write(tmp_path / "s.json.gz", rank_trace(0)))
    native = api.analyze(write(tmp_path / "n.json.gz", rank_trace(0, names="native")))
    assert _phase_us(native) == _phase_us(spec)
    assert native.steady.tokens.period_p50_ns == spec.steady.tokens.period_p50_ns == PERIOD * 1000
    rng = load(tmp_path / "n.json.gz").ranges.filter(pl.col("domain") == ph.DOMAIN)
    cyc = rng.filter(pl.col("range") == "cycle").sort("start")
    got = [ph.decode_payload(v) for v in cyc["int64"].to_list()]
    assert [g["batch_size"] for g in got] == [4] * 20 and [g["cycle_index"] for g in got] == list(range(1, 21))
    # verify runs from draft's end to draft_extend's start (step[VERIFY] is only the target's forward)
    v = rng.filter(pl.col("range") == "verify").sort("start").row(0, named=True)
    d = rng.filter(pl.col("range") == "draft").sort("start").row(0, named=True)
    e = rng.filter(pl.col("range") == "draft_extend").sort("start").row(0, named=True)
    assert (v["start"], v["end"]) == (d["end"], e["start"])


def _native(rows: list[tuple[str, int, int]]) -> list[tuple]:
    g = 5 << 24
    ann = pl.DataFrame({"pid": [5] * len(rows), "gtid": [g] * len(rows), "start": [r[1] for r in rows],
                        "end": [r[2] for r in rows], "text": [r[0] for r in rows]})
    out = kineto.native_phases(ann).sort("start", "end", descending=[False, True])
    return [(r["text"], r["start"], r["end"], _fields(ph.decode_payload(r["payload"])))
            for r in out.iter_rows(named=True)]


def _fields(d: dict | None) -> dict | None:
    """The payload's batch size, cycle index and accept length (whatever other fields it has)."""
    return None if d is None else {k: d[k] for k in ("batch_size", "cycle_index", "accept_length")}


def _p(bs: int, i: int) -> dict:
    return {"batch_size": bs, "cycle_index": i, "accept_length": None}


def test_native_phases_groups():
    rows = [("draft_extend", 0, 5),  # before the first group: the trace began inside a cycle
            ("draft", 10, 20), ("step[VERIFY bs=3 forward_id=41]", 22, 30), ("draft_extend", 31, 40),
            ("step[DRAFT bs=3]", 32, 39),  # inside draft_extend: not a span of its own
            ("step[VERIFY bs=3 forward_id=42]", 50, 60),  # no draft before it: a cycle of its own
            ("step[EXTEND bs=2 toks=256]", 70, 80), ("draft_extend", 81, 90)]
    want = [("cycle", 10, 40, _p(3, 41)), ("draft", 10, 20, None), ("verify", 20, 31, None),
            ("draft_extend", 31, 40, None), ("cycle", 50, 60, _p(3, 42)), ("verify", 50, 60, None),
            ("prefill", 70, 90, _p(2, 42)), ("prefill_target_extend", 70, 80, None),
            ("prefill_draft_extend", 81, 90, None)]
    assert _native(rows) == want  # every cycle has SGLang's forward_id: it is the index
    # a decode step without one: every cycle counted from 1 instead; the prefill has the index before it
    want = [(t, a, b, _p(p["batch_size"], {41: 1, 42: 2}[p["cycle_index"]]) if p else None) for t, a, b, p in want]
    assert _native([*rows, ("step[DECODE bs=8]", 100, 110)]) == [*want, ("decode_step", 100, 110, _p(8, 3))]


def test_every_verb_exits_0(tmp_path):
    d = _per_rank(tmp_path / "t")
    n = write(tmp_path / "n.json.gz", rank_trace(0, names="native"))
    for argv in (["analyze", str(d)], ["analyze", str(d), "--format", "json"], ["comm", str(d)],
                 ["compare", str(d), str(n)], ["whatif", str(d), "--steps-now", "3"],
                 ["report", str(n), "-o", str(tmp_path / "rep")]):
        p = subprocess.run([sys.executable, "-m", "analyze.cli", *argv], capture_output=True, text=True, cwd=ROOT)
        assert p.returncode == 0, (argv, p.stderr[-2000:])


def test_tables_cached_and_rebuilt_when_the_trace_changes(tmp_path):
    f = write(tmp_path / "t.json.gz", rank_trace(0, cycles=5))
    r = kineto.KinetoReader(f)
    root, meta = r.tables_dir, (r.tables_dir / "meta.json").stat().st_mtime_ns
    assert root == tmp_path / "t.json.gz.tables.spectrace" and r.path == f
    r.close()
    assert (kineto.KinetoReader(f).tables_dir / "meta.json").stat().st_mtime_ns == meta  # reused
    write(f, rank_trace(0, cycles=7))
    assert load(f).ranges.filter(pl.col("range") == "cycle").height == 7  # rebuilt
    with pytest.raises(InputError, match="changed"):
        r = kineto.KinetoReader(f)
        write(f, rank_trace(0, cycles=6))
        r.check_unchanged()


def test_unwritable_folder_converts_into_a_temporary_one(tmp_path, monkeypatch):
    f = write(tmp_path / "t.json", rank_trace(0, cycles=3))
    monkeypatch.setenv("SPECTRACE_CACHE_DIR", str(tmp_path / "nope" / "x"))
    (tmp_path / "nope").write_text("a file where a folder should be")
    r = kineto.KinetoReader(f)
    tmp = r._tmp
    assert tmp is not None and tmp.exists() and not (tmp_path / "t.json.tables.spectrace").exists()
    r.close()
    assert not tmp.exists()


def _cli(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "analyze.cli", *argv], capture_output=True, text=True, cwd=ROOT)


@pytest.mark.parametrize("make, says", [
    (lambda d: (d / "t.json.gz").write_bytes(gzip.compress(json.dumps(rank_trace(0)).encode())[:3000]),
     "truncated or corrupt gzip"),
    (lambda d: (d / "t.json").write_text("this is not JSON"), "not a complete JSON trace"),
    (lambda d: (d / "t.json").write_text('{"traceEvents": [{"ph": "X", "cat": "kernel", '), "not a complete JSON"),
    (lambda d: (d / "t.json").write_text('{"a": 1, "b": [1, 2]}'), "not a torch profiler trace"),
    (lambda d: (d / "t.json").write_text('{"traceEvents": []}'), "without events"),
])
def test_bad_input_one_line_exit_2(tmp_path, make, says):
    make(tmp_path)
    (f,) = [p for p in tmp_path.iterdir() if p.is_file()]
    p = _cli("analyze", str(f))
    assert p.returncode == 2, p.stderr
    assert p.stderr.count("\n") == 1 and says in p.stderr and "Traceback" not in p.stderr


def test_gzip_of_something_else_is_not_taken(tmp_path):
    f = tmp_path / "x.sqlite.gz"
    f.write_bytes(gzip.compress(b"SQLite format 3\x00" + b"\x00" * 200))
    assert not kineto.is_trace(f)


@pytest.fixture(scope="module")
def cpu_workload(tmp_path_factory):
    """The CPU workload under torch.profiler, spectrace's names and SGLang's beside them (a serving schedule)."""
    pytest.importorskip("torch")
    d = tmp_path_factory.mktemp("wl")
    argv = [sys.executable, "-m", "nvtx_hooks.capture.workload", "--device", "cpu", "--warmup", "1", "--layers", "1",
            "--hidden", "64", "--ffn", "128", "--host-us", "50", "--schedule", "1:3,2:3", "--prompt-len", "8"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for mode in ("also", "only"):
        p = subprocess.run([*argv, "--torch-profiler", str(d / mode), "--native-spans", mode], capture_output=True,
                           text=True, cwd=ROOT, env=env)
        assert p.returncode == 0, p.stderr[-2000:]
    return d


def test_cpu_workload_native_only_gives_the_spectrace_phases(cpu_workload):
    both = load(cpu_workload / "also").ranges
    only = load(cpu_workload / "only").ranges
    spec = both.filter(pl.col("domain") == ph.DOMAIN)
    nat = only.filter(pl.col("domain") == ph.DOMAIN)
    count = lambda r: dict(r.group_by("range").len().iter_rows())  # noqa: E731
    want = count(spec)
    assert want["cycle"] == 6 and want["prefill"] == 1 and want["host_overhead"] == 6
    assert count(nat) == {k: v for k, v in want.items() if k != "host_overhead"}
    # the payloads' batch sizes follow the schedule in both; the native cycles are counted 1.. as the hooks count
    bs = lambda r: [ph.decode_payload(v)["batch_size"] for v in r.filter(pl.col("range") == "cycle")  # noqa: E731
                    .sort("start")["int64"].to_list()]
    assert bs(spec) == bs(nat) == [1, 1, 1, 2, 2, 2]
    # in the trace with both, every native span sits inside spectrace's phase of the same name
    raw = both.filter(pl.col("domain") == "")
    for name in ("draft", "draft_extend"):
        s = spec.filter(pl.col("range") == name).sort("start")
        n = raw.filter(pl.col("range") == name).sort("start")
        n = n.filter(pl.col("start") < s["end"].max())  # (the prefill's draft_extend is prefill_draft_extend)
        inside = s.join_asof(n.select("start", start_n="start", end_n="end"), on="start", strategy="forward")
        assert inside["start_n"].null_count() == 0
        assert ((inside["start_n"] >= inside["start"]) & (inside["end_n"] <= inside["end"])).all()


def test_cpu_workload_scrub(cpu_workload, tmp_path):
    src = cpu_workload / "also" / "workload-TP-0.trace.json.gz"
    host = os.uname().nodename
    assert host.encode() in gzip.decompress(src.read_bytes())
    out = tmp_path / "s.trace.json.gz"
    p = subprocess.run([sys.executable, "-m", "analyze.cli", "scrub", str(src), "-o", str(out), "--check", host],
                       capture_output=True, text=True, cwd=ROOT)
    assert p.returncode == 0, p.stderr
    assert host.encode() not in gzip.decompress(out.read_bytes())
    a, b = load(src).ranges, load(out).ranges
    assert a.drop("range_id").equals(b.drop("range_id"))


def test_same_os_pid_in_two_files_two_processes(tmp_path):
    """Two containers' ranks, both pid 4000: each its own process (numbered 1, 2), with its own GPU work."""
    d = tmp_path / "t"
    d.mkdir()
    for r in (0, 1):
        t = rank_trace(r)
        t["traceEvents"] = [{**e, "pid": 4000} if e.get("pid") == 4001 else e for e in t["traceEvents"]]
        write(d / f"prof-TP-{r}.trace.json.gz", t)
    res = api.analyze(d)
    assert res.ranks.select("pid", "device").rows() == [(1, 0), (2, 1)]
    assert _phase_us(res)[(1, "verify")] == GPU_US["verify"]


def test_through_the_store_as_in_memory(tmp_path):
    """A large trace goes through the parquet store (columnar over the trace's tables): the same result."""
    from analyze.output import data

    d = _per_rank(tmp_path / "t")
    mem = data.to_json(api.analyze(d, store=False, cache=False))
    kept = api.analyze(d, store=True, cache=True)
    assert data.to_json(kept) == mem
    assert (tmp_path / "t.spectrace" / "meta.json").is_file() and (tmp_path / "t.tables.spectrace").is_dir()
    assert data.to_json(api.analyze(d, store=True, cache=True)) == mem  # the store and its result cache reused


def test_spectrace_marks_are_marks(tmp_path):
    """Zero-length `spectrace:accept_histogram #0x…` / `spectrace:accept #0x…` annotations (what the workload's and
    the hooks' marks become under the torch profiler) are NVTX marks of the spectrace domain with their payloads,
    as under nsys: not ranges, not phases."""
    tr = rank_trace(0, cycles=3)
    # cycle 3: a count of 200 needs 14-bit slots, 2 per mark: positions 0-1 and 8-9 (all-zero chunks not emitted)
    hist = {1: [0, 2, 1, 1], 2: [4], 3: [5, 0, 0, 0, 0, 0, 0, 0, 0, 200]}
    ext, n_chunks = 10_000, 0
    for i, counts in hist.items():
        at = T0 + (i - 1) * PERIOD + 590  # in the cycle's host_overhead range
        chunks = ph.encode_accept_histogram(i, counts)
        n_chunks += len(chunks)
        for kind, v in [*(("accept_histogram", c) for c in chunks), ("accept", ph.encode_payload(4, i, 3))]:
            tr["traceEvents"].append({"ph": "X", "cat": "user_annotation", "name": ph.annotation(kind, v),
                                      "pid": 4000, "tid": 4000, "ts": at, "dur": 0,
                                      "args": {"External id": ext, "Record function id": 0}})
            ext += 1
    res = api.analyze(write(tmp_path / "m.trace.json.gz", tr))
    marks = res.marks.filter(pl.col("domain") == ph.DOMAIN)
    h = marks.filter(pl.col("mark") == "accept_histogram")
    assert n_chunks == 4 and h.height == 4 and ph.accept_histograms(h["int64"].to_list()) == hist
    acc = marks.filter(pl.col("mark") == "accept").sort("time")
    assert [ph.decode_payload(v)["accept_length"] for v in acc["int64"].to_list()] == [3, 3, 3]
    assert "accept_histogram" not in res.phases["phase"].to_list() and "accept" not in res.ranges["range"].to_list()
    assert _phase_us(res) == _phase_us(api.analyze(write(tmp_path / "plain.trace.json.gz", rank_trace(0, cycles=3))))
