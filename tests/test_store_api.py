"""The parquet store keeps only the CUDA API calls the analysis needs, and analyses the same.

A large export's API table is mostly calls that launch nothing (cuGetProcAddress, cudaStreamIsCapturing,
cudaEventQuery, ...: 9 of 11 M rows of the bench trace). The store reads the calls the analysis finds by
name (:data:`analyze.model.KEPT_API`) and, in one more pass, what it needs of the rest: each process's
first call (where its capture window opens) and any call that launched a GPU operation after all.
"""

from __future__ import annotations

import sqlite3

import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_rank_windows import base, trace
from test_scale import _same

from analyze import analyze
from analyze.compute.pipeline import result_of as analyze_store
from analyze.model import KEPT_API, SYNC_API
from analyze.read.store import open_store
from tests.helpers.paths import PROBE, need, tp2
from tests.helpers.synth import Synth


def odd_calls(path):
    """tests/test_rank_windows.py's two ranks, rank 1 recording from cycle 3 (a cudaGetDevice call just before),
    plus: a kernel of rank 0 launched by a call whose name is no usual launcher (cuStreamWriteValue32), calls
    without a thread id or correlation id, and many calls that launch nothing."""
    p = trace(path, n=8, rank1_from=3)
    s = Synth.__new__(Synth)  # add to the saved export
    s.path, s.con = p, sqlite3.connect(p)
    s._strings = {v: i for i, v in s.con.execute("SELECT id, value FROM StringIds")}
    b = base(5)
    s.launch(100, 100, "cuStreamWriteValue32_v2", (b + 7000, b + 7010), 5000, [(b + 7100, b + 7200, "gemm")])
    for pid, first in ((100, 0), (200, 3)):  # calls that launch nothing, in every cycle a rank recorded
        for i in range(first, 8):
            s.api(pid, pid, "cudaStreamIsCapturing_v10000", base(i) + 300, base(i) + 310, 6000 + i)
    s.api(200, 200, "cudaStreamIsCapturing_v10000", base(4), base(4) + 5, 7000)
    s.con.execute("UPDATE CUPTI_ACTIVITY_KIND_RUNTIME SET globalTid = NULL WHERE correlationId = 6001 AND start = ?",
                  (base(1) + 300,))  # no thread (one of rank 0's)
    s.con.execute("UPDATE CUPTI_ACTIVITY_KIND_RUNTIME SET correlationId = NULL WHERE correlationId = 7000")
    s.save()
    return p


def test_store_keeps_the_needed_calls_and_analyses_the_same(tmp_path):
    p = odd_calls(tmp_path / "odd.sqlite")
    s = open_store(p, cache_dir=tmp_path / "c")
    api = s.scan("api").collect()
    names = dict(pl.read_parquet(s.root / "names.parquet").iter_rows())
    kept = {names[i] for i in api["name_id"].unique().to_list()}
    # launches by name, and the odd launcher found through its kernel; not the calls that launch nothing
    assert kept == {"cudaLaunchKernel_v7000", "cuStreamWriteValue32_v2"}
    assert api.filter(pl.col("corr") == 5000).height == 1
    # the early calls are not kept, but each process's first call is known: rank 1's opens its window
    assert s.api_first == {100: 5, 200: base(3) - 50}
    mem, sto = analyze(p, store=False), analyze_store(s)
    _same(mem, sto)
    assert sto.ranks.sort("rank")["window_start_ns"].to_list() == [5, base(3) - 50]
    assert sto.trace.read_warnings == mem.trace.read_warnings == {"api_without_pid": 1}
    # the kernel of the odd launcher is attributed to its range (verify of cycle 5 of rank 0), not unmatched
    assert not any(d.code == "UNMATCHED_OPS" for d in sto.diagnostics)
    # a store's Trace analysed in memory is the same again
    _same(mem, analyze(s.trace(), store=False))


def test_kept_calls_include_every_call_the_analysis_finds_by_name():
    names = ["cudaStreamSynchronize_v3020", "cuCtxSynchronize", "cudaMemcpy_v3020", "cuMemsetD32_v2",
             "cudaGraphLaunch_v10000", "cuGraphLaunch", "cudaLaunchKernel_v7000", "cuLaunchKernelEx",
             "cudaMemcpyAsync_v3020", "cudaMemsetAsync_v3020", "cuGetProcAddress_v2", "cudaEventQuery_v3020"]
    df = pl.DataFrame({"name": names}).with_columns(kept=pl.col("name").str.contains(KEPT_API),
                                                   sync=pl.col("name").str.contains(SYNC_API))
    assert df.filter(pl.col("sync") & ~pl.col("kept")).height == 0
    assert df.filter(~pl.col("kept"))["name"].to_list() == ["cuGetProcAddress_v2", "cudaEventQuery_v3020"]


@pytest.mark.parametrize("name", ["tp2_rank0_window", "tp2_workload_captureall"])
def test_store_equals_memory_on_ragged_and_lost_tails(tmp_path, name):
    """Real captures whose windows open late (rank 0's cudaProfilerStart) or lose a tail (66 GPU ops
    without their calls): the same analysis from the store, whose API table is a fraction of the export's."""
    p = tp2(name, tmp_path)
    s = open_store(p, cache_dir=tmp_path / "c")
    _same(analyze(p, store=False), analyze_store(s))
    con = sqlite3.connect(p)
    (calls,) = con.execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_RUNTIME").fetchone()
    assert sum(s.meta["api_rows"].values()) < calls / 2


def test_store_api_on_probe_in_row_ranges(tmp_path, monkeypatch):
    """The extra pass in row ranges, as a large export is read: the same store as in one pass."""
    from analyze.read.store import copy_build

    p = need(PROBE)
    whole = open_store(p, cache_dir=tmp_path / "whole")
    monkeypatch.setattr(copy_build, "PIECE_ROWS", 997)
    cut = open_store(p, cache_dir=tmp_path / "cut")
    assert cut.meta["api_rows"] == whole.meta["api_rows"] and cut.api_first == whole.api_first
    assert len(whole.api_first) == 2


@pytest.mark.parametrize("fmt", ["parquet", "arrow"])
def test_store_from_export_dir_equals_memory(tmp_path, fmt):
    """The API filter and the extra pass in polars' SQL over a parquetdir/arrowdir export: the same again."""
    from bench.export_dir import write_export_dir

    d = write_export_dir(odd_calls(tmp_path / "odd.sqlite"), tmp_path / f"odd_{fmt[:3]}dir", fmt)
    s = open_store(d, cache_dir=tmp_path / "c")
    assert s.api_first == {100: 5, 200: base(3) - 50}
    _same(analyze(str(d), store=False), analyze_store(s))
    _same(analyze(tmp_path / "odd.sqlite", store=False), analyze_store(s))


@pytest.mark.parametrize("name", ["probe", "tp2_rank0_window", "tp2_workload_captureall"])
def test_store_op_keys_are_the_ops_distinct_names_and_labels(tmp_path, monkeypatch, name):
    """The distinct (name id, label) of the GPU operations, kept by the build (in row ranges, as a large export is
    read), are those of the ops in the store: kernels by name id, copies and memsets by label."""
    from analyze.read.store import copy_build

    monkeypatch.setattr(copy_build, "PIECE_ROWS", 997)
    s = open_store(need(PROBE) if name == "probe" else tp2(name, tmp_path), cache_dir=tmp_path / "c")
    want = s.scan("ops").select("name_id", "label").unique().sort("name_id", "label", nulls_last=True).collect()
    got = s.op_keys().sort("name_id", "label", nulls_last=True)
    assert got.equals(want) and got.height > 5
    assert got.filter(pl.col("label").is_not_null()).height >= 1  # copies or memsets


def test_odd_launcher_found_from_the_build_keys(tmp_path, monkeypatch):
    """Every (pid, correlation id) packs: the ops without a kept call come from the keys the build took of each
    batch (no second read of the ops), and the odd launcher is found as before."""
    from analyze.read.store import copy_build

    p = odd_calls(tmp_path / "odd.sqlite")
    con = sqlite3.connect(p)
    con.execute("DELETE FROM CUPTI_ACTIVITY_KIND_RUNTIME WHERE correlationId IS NULL")  # the one that does not pack
    con.commit()
    con.close()

    def no_scan(*a):
        raise AssertionError("the ops were read again")

    monkeypatch.setattr(copy_build, "unmatched_ops", no_scan)
    monkeypatch.setattr(copy_build, "PIECE_ROWS", 7)  # many batches, each with its own keys
    s = open_store(p, cache_dir=tmp_path / "c")
    api = s.scan("api").collect()
    names = dict(pl.read_parquet(s.root / "names.parquet").iter_rows())
    assert {names[i] for i in api["name_id"].unique().to_list()} == {"cudaLaunchKernel_v7000", "cuStreamWriteValue32_v2"}
    _same(analyze(p, store=False), analyze_store(s))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 2**32 - 1)), max_size=30),
       st.lists(st.tuples(st.integers(0, 3), st.integers(0, 2**32 - 1)), max_size=30), st.integers(1, 5))
def test_unmatched_from_keys_is_the_anti_join(ops, api, cut):
    from analyze.read.store.call_keys import call_keys, unmatched_op_keys, unmatched_ops

    schema = {"pid": pl.Int64, "corr": pl.Int64}
    o = pl.DataFrame(ops + api[:cut], schema=schema, orient="row")  # some ops with their call
    a = pl.DataFrame(api, schema=schema, orient="row")
    want = o.join(a, on=["pid", "corr"], how="anti").unique().sort("pid", "corr")
    pieces = [o.slice(i, 4) for i in range(0, o.height, 4)]
    got = unmatched_op_keys([call_keys(x) for x in pieces], [call_keys(a)] if a.height else [])
    assert got.sort("pid", "corr").equals(want)
    assert unmatched_ops(o, a).sort("pid", "corr").equals(want)
    # a null correlation id does not pack: the anti-join, nulls matching nulls
    on = o.vstack(pl.DataFrame({"pid": [1], "corr": [None]}, schema=schema))
    assert call_keys(on) is None
    assert unmatched_ops(on, a).filter(pl.col("corr").is_null()).height == 1


@pytest.mark.parametrize("source", ["odd", "tp2_rank0_window", "tp2_workload_captureall"])
def test_early_calls_read_with_the_api_pieces_or_apart(tmp_path, monkeypatch, source):
    """The early calls (where a capture window may open) come with the API pieces when the bound they were read to
    covers the final one, from a pass of their own otherwise: the same store and analysis either way."""
    from analyze.read.store import copy_build

    p = odd_calls(tmp_path / "odd.sqlite") if source == "odd" else tp2(source, tmp_path)
    real = copy_build._early_bound
    built = {}
    for name, bound in (("apart", lambda firsts: None), ("low", lambda firsts: 0),
                        ("high", lambda firsts: 2**62), ("as read", real)):
        monkeypatch.setattr(copy_build, "_early_bound", bound)
        s = open_store(p, cache_dir=tmp_path / name.replace(" ", "_"))
        built[name] = (s, analyze_store(s), s.scan("api").collect().sort("pid", "start", "corr"))
    s0, res0, api0 = built["apart"]
    for name, (s, res, api) in built.items():
        assert api.equals(api0), name
        assert s.meta["read_warnings"] == s0.meta["read_warnings"], name
        _same(res0, res)
        # the first call may differ only where it is after the process's first GPU operation (no effect)
        first_op = s.scan("ops").group_by("pid").agg(pl.col("start").min()).collect()
        for pid, t in first_op.iter_rows():
            a, b = s.api_first.get(pid), s0.api_first.get(pid)
            assert a == b or min(a, t) == min(b, t) == t, (name, pid)


def test_too_many_early_calls_get_their_own_pass(tmp_path, monkeypatch):
    """The API pieces keep at most EARLY_ROWS early calls (a bound read too late would hold most of the API table):
    past that, the early calls are read in their own pass, and the store is the same."""
    from analyze.read.store import copy_build

    p = odd_calls(tmp_path / "odd.sqlite")
    monkeypatch.setattr(copy_build, "_early_bound", lambda firsts: 2**62)  # every call is early
    whole = open_store(p, cache_dir=tmp_path / "whole")
    monkeypatch.setattr(copy_build, "EARLY_ROWS", 3)
    passes = []
    rest = copy_build._rest_of_api
    monkeypatch.setattr(copy_build, "_rest_of_api", lambda *a: (passes.append(a[-1]), rest(*a))[1])
    capped = open_store(p, cache_dir=tmp_path / "capped")
    assert passes == [None]  # the early calls were not taken from the API pieces
    assert capped.scan("api").collect().sort("pid", "start", "corr").equals(
        whole.scan("api").collect().sort("pid", "start", "corr"))
    assert capped.api_first == {100: 5, 200: base(3) - 50}


# ---- the cache knows what it caches -------------------------------------------------------------------------


def test_key_hashes_a_few_blocks_of_each_file_and_sees_a_changed_page(tmp_path, monkeypatch):
    """The key's content hash reads 8 blocks whatever the file's size (no hash of a whole GB file), and changes
    with the header, the last page or a sampled block, not with the size and mtime alone."""
    import os

    from analyze.read.store import fingerprint as cache

    f = tmp_path / "r.sqlite"
    f.write_bytes(need(PROBE).read_bytes())
    reads = []
    pread = os.pread
    monkeypatch.setattr(cache.os, "pread", lambda fd, n, at: (reads.append(n), pread(fd, n, at))[1])
    key = cache._content_hash(f)
    assert len(reads) == cache.BLOCKS + 2 and sum(reads) <= 2 * cache.EDGE + cache.BLOCKS * cache.BLOCK
    monkeypatch.undo()
    size, mtime = f.stat().st_size, f.stat().st_mtime_ns
    for at in (24, size - 10, size * 3 // (cache.BLOCKS + 1) + 5):  # the change counter, the last page, a block
        data = bytearray(f.read_bytes())
        data[at] ^= 0xFF
        f.write_bytes(bytes(data))
        os.utime(f, ns=(mtime, mtime))
        assert f.stat().st_size == size and cache._content_hash(f) != key
        data[at] ^= 0xFF
        f.write_bytes(bytes(data))
        assert cache._content_hash(f) == key
    entry = cache.fingerprint(f)["files"][0]
    assert entry[:4] == ["r.sqlite", size, f.stat().st_mtime_ns, f.stat().st_ino]
    assert entry[4] == f.stat().st_ctime_ns and entry[5] == key


def test_a_rebuild_keeps_a_cache_another_process_installed(tmp_path, monkeypatch):
    """A rebuild replaces only the build that could not be read (its id): a good cache installed meanwhile by
    another process is used as it is, and is never discarded in the other's place."""
    from analyze.read.store import install, layout
    from analyze.read.store.fingerprint import fingerprint

    p = tmp_path / "r.sqlite"
    p.write_bytes(need(PROBE).read_bytes())
    first = open_store(p)
    x = first.meta["build"]
    second = open_store(p, broken=x)  # X could not be read: rebuilt
    y = second.meta["build"]
    assert y != x and second.root == first.root and str(p.resolve()) == second.meta["report"]

    def no_build(*a, **k):
        raise AssertionError("built again")

    monkeypatch.setattr(install, "build", no_build)
    assert open_store(p, broken=x).meta["build"] == y  # another process saw X broken too: it uses Y
    install.discard(first.root, x)  # discarding X (gone) leaves Y
    assert layout.problem(first.root, fingerprint(p)) is None
    install.discard(first.root, y)
    assert not first.root.exists() and [q.name for q in tmp_path.iterdir()] == ["r.sqlite"]


def test_the_trace_path_is_the_one_given(tmp_path, monkeypatch):
    """The cache keeps the report's absolute path; the analysis names the report as the caller gave it."""
    from analyze.read.store import existing_store
    from analyze.read.store.reader import Store

    p = tmp_path / "r.sqlite"
    p.write_bytes(need(PROBE).read_bytes())
    monkeypatch.chdir(tmp_path)
    s = open_store("r.sqlite")
    assert s.meta["report"] == str(p) and s.meta["key"]["path"] == str(p)
    assert s.head().path == "r.sqlite" and existing_store("./r.sqlite").head().path == "r.sqlite"
    assert analyze("r.sqlite", cache=True).trace.path == "r.sqlite"
    assert analyze("r.sqlite", store=False).trace.path == "r.sqlite"
    assert Store(s.root).head().path == str(p)  # opened by itself: the path it was built from
