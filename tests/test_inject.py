"""bench/inject.py: periodic-straggler TP2 shapes built from real 2×H200 captures (tests/data/h200_tp2).

Everything is measured here from the written SQLite (sqlite3 + polars), independently of the tool's own
bookkeeping; the tool's return values are only compared against it.
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

from bench.inject import InjectError, inject, main
from nvtx_hooks.phases import base_name, decode_payload
from tests.helpers.paths import tp2

ROOT = Path(__file__).resolve().parents[1]
GRAPH = "CUPTI_ACTIVITY_KIND_GRAPH_TRACE"
GPU = ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET", GRAPH)
US = 1000
D = 500 * US


# --- reading the captures -------------------------------------------------------------------------------

def q(path: Path, sql: str) -> pl.DataFrame:
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        cur = con.execute(sql)
        cols = [c[0] for c in cur.description]
        return pl.DataFrame(cur.fetchall(), schema=cols, orient="row", infer_schema_length=None)
    finally:
        con.close()


def tables(path: Path) -> set[str]:
    return set(q(path, "SELECT name FROM sqlite_master WHERE type='table'")["name"])


def ops(path: Path) -> pl.DataFrame:
    """Every GPU op: table, rowid, pid, device, stream, correlation id, start, end, name."""
    have, parts = tables(path), []
    for i, t in enumerate(GPU):
        if t not in have:
            continue
        kernel = t.endswith("KERNEL")
        name = "s.value" if kernel else "'graph'" if t.endswith("TRACE") else "''"
        join = "LEFT JOIN StringIds s ON s.id = k.demangledName" if kernel else ""
        parts.append(q(path, f'SELECT {i} AS t, k.rowid AS rid, (k.globalPid >> 24) & 16777215 AS pid, '
                             f'k.deviceId AS dev, k.streamId AS stream, k.correlationId AS corr, k.start, '
                             f'k."end", {name} AS name FROM {t} k {join}'))
    comm = pl.col("name").str.contains(r"\bnccl|AllReduce|all_reduce|cross_device_reduce")
    return pl.concat(parts).with_columns(comm=comm | (pl.col("t") == GPU.index(GRAPH)))


def api(path: Path) -> pl.DataFrame:
    return q(path, 'SELECT rowid AS rid, (globalTid >> 24) & 16777215 AS pid, correlationId AS corr, '
                   'start AS a0, "end" AS a1 FROM CUPTI_ACTIVITY_KIND_RUNTIME')


def ranges(path: Path) -> pl.DataFrame:
    """NVTX push/pop ranges with their phase name and payload cycle index."""
    r = q(path, 'SELECT n.rowid AS rid, n.globalTid AS tid, (n.globalTid >> 24) & 16777215 AS pid, n.start, '
                'n."end", COALESCE(s.value, n.text) AS text, '
                'COALESCE(n.uint64Value, n.int64Value) AS payload '
                'FROM NVTX_EVENTS n LEFT JOIN StringIds s ON s.id = n.textId '
                'WHERE n.eventType = 59 AND n."end" IS NOT NULL')
    return r.with_columns(
        base=pl.col("text").map_elements(base_name, return_dtype=pl.String),
        cyc=pl.col("payload").map_elements(lambda v: (decode_payload(v) or {}).get("cycle_index"),
                                           return_dtype=pl.Int64))


def ranks(path: Path) -> list[int]:
    return ops(path).group_by("pid").agg(pl.col("dev").min()).sort("dev", "pid")["pid"].to_list()


def phase_ops(path: Path) -> pl.DataFrame:
    """GPU ops with the phase and cycle (key: payload index, else order among cycles with GPU work) that
    launched them, and the cycle's range."""
    r = ranges(path)
    cyc = r.filter(pl.col("base") == "cycle").select("tid", "pid", c_rid="rid", c_start="start", c_end="end",
                                                     pay="cyc").sort("c_start")
    ph = (r.filter(pl.col("base").is_in(["draft", "verify", "draft_extend", "host_overhead"])).sort("start")
          .join_asof(cyc.drop("pid"), left_on="start", right_on="c_start", by="tid", check_sortedness=False)
          .filter(pl.col("start") <= pl.col("c_end")))
    a = (api(path).sort("a0")
         .join_asof(ph.select("pid", "c_rid", "c_start", "c_end", "pay", phase="base", p_start="start",
                              p_end="end"),
                    left_on="a0", right_on="p_start", by="pid", check_sortedness=False)
         .filter(pl.col("a0") <= pl.col("p_end")))
    o = ops(path).join(a.drop("rid"), on=["pid", "corr"])
    order = (o.select("pid", "c_rid", "c_start").unique().sort("c_start")
             .with_columns(order=pl.int_range(pl.len()).over("pid")))
    return (o.join(order.drop("c_start"), on=["pid", "c_rid"])
            .with_columns(key=pl.coalesce(pl.col("pay").cast(pl.Int64), pl.col("order").cast(pl.Int64))))


def cycles(path: Path) -> pl.DataFrame:
    """Per (pid, cycle key): the cycle range, the previous cycle's end, and the phase's first GPU op start."""
    o = phase_ops(path)
    c = (o.group_by("pid", "key").agg(pl.col("c_start").first(), pl.col("c_end").first())
         .sort("pid", "key").with_columns(prev_end=pl.col("c_end").shift(1).over("pid")))
    first = o.group_by("pid", "key", "phase").agg(first=pl.col("start").min())
    return c.join(first.pivot("phase", index=["pid", "key"], values="first"), on=["pid", "key"])


def first_collective(path: Path, phase: str) -> pl.DataFrame:
    """Per (pid, key): the first communication op launched in ``phase`` (its table, rowid, start, end)."""
    o = phase_ops(path).filter(pl.col("comm") & (pl.col("phase") == phase))
    return o.sort("start").group_by("pid", "key").agg(pl.col("t", "rid", "start", "end").first())


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def span(path: Path) -> int:
    """First to last event of the ranks (GPU ops and NVTX ranges)."""
    o = ops(path)
    r = ranges(path).filter(pl.col("pid").is_in(o["pid"].unique().implode()))
    return max(o["end"].max(), r["end"].max()) - min(o["start"].min(), r["start"].min())


# --- the invariants ---------------------------------------------------------------------------------------

def check_invariants(src: Path, dst: Path) -> None:
    s_ops, d_ops = ops(src), ops(dst)
    assert s_ops.height == d_ops.height
    o = s_ops.join(d_ops.select("t", "rid", s2="start", e2="end"), on=["t", "rid"])
    # every GPU op still starts at or after the start of the API call that launched it
    a = api(src).join(api(dst).select("rid", a2="a0"), on="rid")
    launched = o.join(a.select("pid", "corr", "a0", "a2"), on=["pid", "corr"])
    assert launched.height > 1000
    assert launched.filter(pl.col("start") >= pl.col("a0")).height == launched.height  # true of the source
    assert launched.filter(pl.col("s2") < pl.col("a2")).is_empty()
    # per (pid, stream): the same start order; ops that did not overlap still do not
    prev = {f"p_{c}": pl.col(c).shift(1).over("pid", "stream") for c in ("start", "end", "s2", "e2")}
    s = o.sort("pid", "stream", "start", "end", "t", "rid").with_columns(**prev)
    assert s.filter((pl.col("start") > pl.col("p_start")) & (pl.col("s2") < pl.col("p_s2"))).is_empty()
    assert s.filter((pl.col("start") >= pl.col("p_end")) & (pl.col("s2") < pl.col("p_e2"))).is_empty()
    assert o.filter(pl.col("e2") < pl.col("s2")).is_empty()
    # NVTX ranges: start <= end, and every containment / disjointness per thread kept
    rs = ranges(src).select("rid", "tid", "start", "end")
    r = rs.join(ranges(dst).select("rid", s2="start", e2="end"), on="rid")
    assert r.filter(pl.col("e2") < pl.col("s2")).is_empty()
    pairs = r.join(r, on="tid", suffix="_b").filter(pl.col("rid") != pl.col("rid_b"))
    inside = pairs.filter((pl.col("start") <= pl.col("start_b")) & (pl.col("end_b") <= pl.col("end")))
    assert inside.height > 500
    assert inside.filter((pl.col("s2_b") < pl.col("s2")) | (pl.col("e2_b") > pl.col("e2"))).is_empty()
    before = pairs.filter(pl.col("end") <= pl.col("start_b"))
    assert before.filter(pl.col("e2") > pl.col("s2_b")).is_empty()
    # collectives that ended together (closest end on the other rank, within 10 µs) still do, within 2 µs
    c = o.filter(pl.col("comm"))
    pids = ranks(src)
    a0 = c.filter(pl.col("pid") == pids[0]).select("t", "rid", "end", "e2").sort("end")
    a1 = c.filter(pl.col("pid") == pids[1]).select(rid_b="rid", end_b="end", e2_b="e2").sort("end_b")
    m = (a0.join_asof(a1, left_on="end", right_on="end_b", strategy="nearest")
         .filter((pl.col("end") - pl.col("end_b")).abs() <= 10 * US))
    assert m.height > 100
    worse = (pl.col("e2") - pl.col("e2_b")).abs() - (pl.col("end") - pl.col("end_b")).abs()
    assert m.select(worse.max()).item() <= 2 * US
    # nothing past the session's end
    dur = q(dst, "SELECT duration FROM ANALYSIS_DETAILS")["duration"][0]
    assert max(d_ops["end"].max(), ranges(dst)["end"].max(), api(dst)["a1"].max()) <= dur


# --- tp2_s3_node: rank 1 late before draft every 4th cycle ------------------------------------------------

@pytest.fixture(scope="module")
def node(tmp_path_factory):
    d = tmp_path_factory.mktemp("node")
    src = tp2("tp2_s3_node", d)
    before = sha(src)
    dst = d / "straggler.sqlite"
    recs = inject(src, dst, ["1:draft:4:0:500"])
    return src, dst, recs, before


def test_node_invariants_and_source_untouched(node):
    src, dst, recs, before = node
    assert sha(src) == before
    check_invariants(src, dst)
    assert not [p for p in dst.parent.iterdir() if p.name.endswith(".tmp")]


def test_node_records(node):
    src, dst, recs, _ = node
    pid1 = ranks(src)[1]
    keys = sorted(cycles(src).filter(pl.col("pid") == pid1)["key"].to_list())
    assert keys == list(range(65))
    assert [r["cycle"] for r in recs] == [k for k in keys if k % 4 == 0]
    assert {(r["rank"], r["pid"], r["phase"], r["key_source"], r["delay_ns"]) for r in recs} == {
        (1, pid1, "draft", "payload", D)}
    assert [r["t0_ns"] for r in recs] == sorted(r["t0_ns"] for r in recs)
    # the GPU was idle before draft (host_overhead synchronised it): the draft graph starts exactly D later
    assert all(r["gpu_delay_ns"] == D for r in recs)
    assert all(0 <= r["wait_added_ns"] <= r["final_shift_ns"] <= D - r["host_caught_up_ns"] for r in recs)
    # rank 1's host stays D late: its GPU kept up with it, so it had nothing to catch up at its syncs
    assert all(r["host_caught_up_ns"] <= 2 * US for r in recs)
    assert all(o["rank"] == 0 and o["end_ns"] - o["old_end_ns"] == r["wait_added_ns"]
               for r in recs for o in r["others"])
    # the draft range opens D after t0
    rng = ranges(dst).select("pid", "start")
    for r in recs:
        assert rng.filter((pl.col("pid") == pid1) & (pl.col("start") == r["t0_ns"] + D)).height >= 1


def test_node_draft_starts_d_later(node):
    """Rank 1's draft GPU work starts D later after its previous cycle's end in the delayed cycles only."""
    src, dst, _, _ = node
    pid1 = ranks(src)[1]
    gap = (pl.col("draft") - pl.col("prev_end")).alias("gap")
    s = cycles(src).filter(pl.col("pid") == pid1).select("key", gap)
    d = cycles(dst).filter(pl.col("pid") == pid1).select("key", gap)
    j = s.join(d, on="key", suffix="_dst").drop_nulls().with_columns(moved=pl.col("gap_dst") - pl.col("gap"))
    late, other = j.filter(pl.col("key") % 4 == 0), j.filter(pl.col("key") % 4 != 0)
    assert late.height == 16 and other.height == 48
    assert late["moved"].min() >= D - 2 * US and late["moved"].max() <= D + 2 * US
    assert other["moved"].abs().max() <= 2 * US


def test_node_rank0_waits_in_first_draft_allreduce(node):
    src, dst, recs, _ = node
    pid0 = ranks(src)[0]
    dur = (pl.col("end") - pl.col("start")).alias("dur")
    s = first_collective(src, "draft").filter(pl.col("pid") == pid0).select("key", "t", "rid", dur)
    d = first_collective(dst, "draft").filter(pl.col("pid") == pid0).select("key", "t", "rid", dur)
    j = s.join(d, on=["key", "t", "rid"], suffix="_dst").with_columns(added=pl.col("dur_dst") - pl.col("dur"))
    assert j.height == 65
    late, other = j.filter(pl.col("key") % 4 == 0), j.filter(pl.col("key") % 4 != 0)
    # ≈ D longer than in the undelayed cycles
    longer = late["dur_dst"].median() - other["dur_dst"].median()
    assert abs(longer - D) <= 0.05 * D, longer
    assert late["added"].median() >= D - 5 * US
    # never more than D; less only where rank 0 itself had arrived late (then it waited less)
    assert late["added"].max() <= D + US and late["added"].min() >= 0
    assert other["added"].abs().median() <= US
    # the tool reports the same kernels and waits
    got = {(o["table"], o["rowid"]): o["wait_added_ns"] for r in recs for o in r["others"]}
    tabs = {i: t for i, t in enumerate(GPU)}
    for row in late.iter_rows(named=True):
        assert got[(tabs[row["t"]], row["rid"])] == row["added"]


def test_node_span_grows_by_the_delays(node):
    src, dst, recs, _ = node
    assert abs(span(dst) - span(src) - len(recs) * D) <= 0.01 * len(recs) * D
    grow = q(dst, "SELECT duration, stopTime - startTime AS st FROM ANALYSIS_DETAILS").row(0)
    old = q(src, "SELECT duration FROM ANALYSIS_DETAILS")["duration"][0]
    assert grow[0] == grow[1] and abs(grow[0] - old - len(recs) * D) <= 0.01 * len(recs) * D


def test_node_analyze_loads_same_cycles(node):
    from analyze import analyze

    src, dst, _, _ = node

    def n_cycles(path):
        i = analyze(str(path), store=False, cache=False).instances
        return i.filter(pl.col("range").map_elements(base_name, return_dtype=pl.String) == "cycle").group_by(
            "rank").len().sort("rank").rows()

    assert n_cycles(dst) == n_cycles(src) == [(0, 65), (1, 65)]


def test_node_verify_behind_a_busy_gpu(tmp_path):
    """verify is launched while draft still runs: its graph was queued, so it starts less than D later."""
    src = tp2("tp2_s3_node", tmp_path)
    dst = tmp_path / "verify.sqlite"
    recs = inject(src, dst, ["1:verify:8:3:200"])
    check_invariants(src, dst)
    assert [r["cycle"] for r in recs] == list(range(3, 65, 8))
    pid1 = ranks(src)[1]
    s = cycles(src).filter(pl.col("pid") == pid1).select("key", "verify")
    d = cycles(dst).filter(pl.col("pid") == pid1).select("key", "verify", "c_start")
    s = s.join(cycles(src).filter(pl.col("pid") == pid1).select("key", "c_start"), on="key")
    into = pl.col("verify") - pl.col("c_start")  # how far into its cycle verify's GPU work started
    moved = s.join(d, on="key", suffix="_dst").select(
        "key", moved=(pl.col("verify_dst") - pl.col("c_start_dst")) - into)
    got = {r["cycle"]: r["gpu_delay_ns"] for r in recs}
    for key, m in moved.filter(pl.col("key").is_in(list(got))).iter_rows():
        assert m == got[key] and 0 <= m < 200 * US


def test_node_sleep_hidden_behind_a_busy_gpu(tmp_path):
    """Late before host_overhead, whose sync waited ~1.3 ms for the GPU: the host catches up in that sync and
    (almost) nothing moves on the GPU of either rank."""
    src = tp2("tp2_s3_node", tmp_path)
    dst = tmp_path / "host.sqlite"
    recs = inject(src, dst, ["1:host_overhead:4:2:500"])
    check_invariants(src, dst)
    assert len(recs) == 16
    caught = sorted(r["host_caught_up_ns"] for r in recs)
    assert caught[len(caught) // 2] >= 450 * US  # median: most of the sleep was hidden
    assert all(r["host_caught_up_ns"] == D - r["final_shift_ns"] or r["final_shift_ns"] == 0 for r in recs)
    # the next cycle starts on both ranks as late as the GPU had become, i.e. far less than D later
    pid0, pid1 = ranks(src)
    gpu_late = {r["cycle"] + 1: r["final_shift_ns"] for r in recs}
    moved = {}
    for pid in (pid0, pid1):
        c = cycles(src).filter(pl.col("pid") == pid).select("key", "draft").join(
            cycles(dst).filter(pl.col("pid") == pid).select("key", d2="draft"), on="key")
        moved[pid] = dict(c.select("key", pl.col("d2") - pl.col("draft")).iter_rows())
    shift = 0
    for key in range(65):
        shift += gpu_late.get(key, 0)
        assert abs(moved[pid1][key] - shift) <= 2 * US and abs(moved[pid0][key] - shift) <= 2 * US
    assert shift < 0.2 * len(recs) * D


# --- tp2_rank0_window: two specs, no payload (cycle order), ragged windows ---------------------------------

@pytest.fixture(scope="module")
def window(tmp_path_factory):
    d = tmp_path_factory.mktemp("window")
    src = tp2("tp2_rank0_window", d)
    dst = d / "two.sqlite"
    recs = inject(src, dst, ["1:draft:4:0:500", "0:draft:3:1:300"])
    return src, dst, recs


def test_window_two_specs(window):
    src, dst, recs = window
    check_invariants(src, dst)
    pids = ranks(src)
    c = cycles(src)
    n0 = c.filter(pl.col("pid") == pids[0]).height
    n1 = c.filter(pl.col("pid") == pids[1]).height
    assert (n0, n1) == (60, 60)
    by = {rk: [r for r in recs if r["rank"] == rk] for rk in (0, 1)}
    assert [r["cycle"] for r in by[1]] == [k for k in range(n1) if k % 4 == 0]
    assert [r["cycle"] for r in by[0]] == [k for k in range(n0) if k % 3 == 1]
    assert {r["key_source"] for r in recs} == {"order"}
    assert [r["t0_ns"] for r in recs] == sorted(r["t0_ns"] for r in recs)
    assert {r["delay_ns"] for r in by[1]} == {D} and {r["delay_ns"] for r in by[0]} == {300 * US}
    # each rank's draft GPU work moved by its own delay in its delayed cycles, not in the others
    gap = (pl.col("draft") - pl.col("prev_end")).alias("gap")
    for rk, (every, off, delay) in {0: (3, 1, 300 * US), 1: (4, 0, D)}.items():
        s = cycles(src).filter(pl.col("pid") == pids[rk]).select("key", gap)
        d = cycles(dst).filter(pl.col("pid") == pids[rk]).select("key", gap)
        j = (s.join(d, on="key", suffix="_dst").drop_nulls()
             .with_columns(moved=pl.col("gap_dst") - pl.col("gap")))
        late = j.filter(pl.col("key") % every == off)
        assert late.height >= 14 and (late["moved"] - delay).abs().max() <= 2 * US
    # the other rank waited: the wait added is what the tool says, on the kernels it names
    d_ops = ops(dst).select("t", "rid", "end")
    tabs = {t: i for i, t in enumerate(GPU)}
    for r in recs:
        for o in r["others"]:
            end = d_ops.filter((pl.col("t") == tabs[o["table"]]) & (pl.col("rid") == o["rowid"]))["end"][0]
            assert end >= o["end_ns"]  # later injections may move it further


def test_window_analyze_loads_same_cycles(window):
    from analyze import analyze

    src, dst, _ = window

    def n_cycles(path):
        i = analyze(str(path), store=False, cache=False).instances
        return i.filter(pl.col("range").map_elements(base_name, return_dtype=pl.String) == "cycle").height

    assert n_cycles(dst) == n_cycles(src) > 0


# --- tp2_s3_graph: graph-level trace, the graph replay is the waiting op ----------------------------------

def test_graph_level(tmp_path):
    src = tp2("tp2_s3_graph", tmp_path)
    dst = tmp_path / "graph.sqlite"
    recs = inject(src, dst, ["1:draft:4:0:500"])
    check_invariants(src, dst)
    assert len(recs) == 17 and all(r["collective"]["name"] == "CUDA graph replay" for r in recs)
    pid0, pid1 = ranks(src)
    gap = (pl.col("draft") - pl.col("prev_end")).alias("gap")
    s = cycles(src).filter(pl.col("pid") == pid1).select("key", gap)
    d = cycles(dst).filter(pl.col("pid") == pid1).select("key", gap)
    late = s.join(d, on="key", suffix="_dst").drop_nulls().filter(pl.col("key") % 4 == 0)
    assert ((late["gap_dst"] - late["gap"]) - D).abs().max() <= 2 * US
    # rank 0's draft graph replay is the op that waits
    g = phase_ops(src).filter((pl.col("t") == GPU.index(GRAPH)) & (pl.col("phase") == "draft")
                              & (pl.col("pid") == pid0))
    g2 = ops(dst).filter(pl.col("t") == GPU.index(GRAPH)).select("rid", s2="start", e2="end")
    g = g.join(g2, on="rid").with_columns(
        added=(pl.col("e2") - pl.col("s2")) - (pl.col("end") - pl.col("start")))
    late, other = g.filter(pl.col("key") % 4 == 0), g.filter(pl.col("key") % 4 != 0)
    assert abs(late["added"].median() - D) <= 0.05 * D and other["added"].abs().median() <= US


# --- bad input ----------------------------------------------------------------------------------------------

def one_line_error(capsys, argv: list[str]) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("bench.inject: error: "), err
    return err


def test_bad_input(window, tmp_path, capsys):
    src, out = str(window[0]), str(tmp_path / "o.sqlite")
    ok = ["--delay", "1:draft:4:0:500"]
    assert "source" in one_line_error(capsys, [src, src, *ok])
    assert "no such file" in one_line_error(capsys, [str(tmp_path / "nope.sqlite"), out, *ok])
    for bad in ("1:draft:4:0", "x:draft:4:0:500", "1:draft:0:0:500", "1:draft:4:4:500", "1:draft:4:0:-5",
                "1::4:0:500", "1:draft:4:0:abc"):
        assert "--delay" in one_line_error(capsys, [src, out, "--delay", bad])
    assert "rank 2" in one_line_error(capsys, [src, out, "--delay", "2:draft:4:0:500"])
    assert "'decode'" in one_line_error(capsys, [src, out, "--delay", "1:decode:4:0:5"])
    assert "no --delay" in one_line_error(capsys, [src, out])
    not_db = tmp_path / "text.sqlite"
    not_db.write_text("hello\n" * 100)
    assert "SQLite" in one_line_error(capsys, [str(not_db), out, *ok])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["text.sqlite"]  # nothing written, no temporary left
    exists = tmp_path / "exists.sqlite"
    exists.write_bytes(b"x")
    assert "--force" in one_line_error(capsys, [src, str(exists), *ok])
    assert exists.read_bytes() == b"x"
    with pytest.raises(InjectError):
        inject(src, tmp_path / "o.sqlite", [])


def test_cli_writes_json(window, tmp_path):
    src = window[0]
    dst, js = tmp_path / "cli.sqlite", tmp_path / "cli.json"
    cli = [sys.executable, "-m", "bench.inject", str(src), str(dst), "--delay", "1:draft:4:0:500"]
    run = {"cwd": ROOT, "capture_output": True, "text": True, "timeout": 120,
           "env": {**os.environ, "PYTHONPATH": str(ROOT)}}
    p = subprocess.run([*cli, "--delay", "0:draft:3:1:300", "--json", str(js)], **run)
    assert p.returncode == 0, p.stderr
    doc = json.loads(js.read_text())
    assert doc["injections"] == json.loads(json.dumps(window[2]))
    assert sha(dst) == sha(window[1])  # deterministic
    p = subprocess.run(cli, **run)
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and "exists" in p.stderr
