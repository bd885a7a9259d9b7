"""A parquetdir/arrowdir export's store keeps no copy of its rows: each process's rows are cut from the export's
own files when read, and they (and everything the store keeps beside them) equal what a store built by copying the
rows holds, row for row and in the same order."""

from __future__ import annotations

import os
import sqlite3
from concurrent.futures import ThreadPoolExecutor

import polars as pl
import pytest
from test_scale import _same
from test_store_api import odd_calls

from analyze import analyze
from analyze.compute.pipeline import result_of as analyze_store
from analyze.read.store import build, open_store
from bench.export_dir import write_export_dir
from tests.helpers.paths import tp2

SMALL = ("ranges", "marks", "names", "devices", "diagnostics", "op_keys")


def both(d, tmp_path, monkeypatch):
    """The columnar store of export folder ``d`` and one built by copying its rows (as every store was built before the columnar one)."""
    cut = open_store(d, cache_dir=tmp_path / "cut")
    monkeypatch.setattr(build, "COLUMNAR", False)
    copied = open_store(d, cache_dir=tmp_path / "copied")
    monkeypatch.setattr(build, "COLUMNAR", True)
    return cut, copied


def same_store(cut, copied):
    assert cut.meta["columnar"] and "columnar" not in copied.meta
    assert not (cut.root / "ops").exists() and not (cut.root / "api").exists()  # no copy of the rows
    for k in ("ops_rows", "api_rows", "api_first", "dropped_ops", "read_warnings", "tables", "duration"):
        assert cut.meta[k] == copied.meta[k], k
    for name in SMALL:
        a, b = (pl.read_parquet(s.root / f"{name}.parquet") for s in (cut, copied))
        key = [c for c in a.columns if a[c].dtype != pl.Object]
        assert a.sort(key, nulls_last=True).equals(b.sort(key, nulls_last=True)), name
    # The build hands the store the API calls it read of each process whose calls are its kept ones alone (no
    # launcher of a lost op): what a read of the export returns; each read once, by the first read below.
    lost = set(pl.read_parquet(cut.root / "lost.parquet")["pid"].to_list())
    assert set(cut._handed) == {("api", p) for p in copied.pids if copied.meta["api_rows"].get(str(p)) and p not in lost}
    for (_, pid), rows in cut._handed.items():
        assert rows.equals(copied.read("api", pid)) and rows.equals(cut._columnar_rows("api", [pid])[pid]), pid
    for pid in copied.pids:
        for kind in ("ops", "api"):
            assert cut.read(kind, pid).equals(copied.read(kind, pid)), (kind, pid)  # the order too
        assert cut.read("ops", pid, ("start", "corr")).equals(copied.read("ops", pid, ("start", "corr")))
    assert not cut._handed  # every handed frame read once, then dropped
    together(cut, copied)
    for kind in ("ops", "api"):
        assert cut.scan(kind).collect().equals(copied.scan(kind).collect()), kind
        assert cut.scan(kind, copied.pids[::-1]).collect().equals(copied.scan(kind, copied.pids[::-1]).collect())
    ops = copied.scan("ops").collect()
    t0, t1 = ops["start"].quantile(0.3), ops["start"].quantile(0.6)  # a time window, as the report's figures cut
    cut_by = (pl.col("end") > t0) & (pl.col("start") < t1)
    got = cut.scan("ops").filter(cut_by).collect()
    assert got.equals(ops.filter(cut_by)) and 0 < got.height < ops.height


def together(cut, copied):
    """Processes read together (one scan for a group, as the pipeline's two workers do), from two threads at once and
    in any order: each gets its own rows, in their order, exactly once; a process without ops in a group is fine."""
    pids = copied.pids
    cols = ("pid", "start", "end", "corr", "kind")
    assert len(pids) > 1
    for size in (2, 3, len(pids)):
        for kind in ("ops", "api"):
            cut.read_together(kind, [tuple(pids[i:i + size]) for i in range(0, len(pids), size)])
        order = pids[::-1] if size == 3 else pids
        with ThreadPoolExecutor(2) as ex:
            got = list(ex.map(lambda pid: (cut.read("ops", pid, cols), cut.read("api", pid)), order))
        assert not cut._ahead, size  # every process's rows handed out: none kept
        for pid, (ops, api) in zip(order, got, strict=True):
            assert ops.equals(copied.read("ops", pid, cols)), (size, pid)
            assert api.equals(copied.read("api", pid)), (size, pid)
    cut.read_in_order(pids, 2)  # what the pipeline says: the API calls of these few processes in one scan
    assert {cut._together[("api", p)] for p in pids} == {tuple(pids)} and not any(k[0] == "ops" for k in cut._together)
    cut.read_in_order([], 0)
    assert not cut._together


@pytest.mark.parametrize("fmt", ["parquet", "arrow"])
def test_odd_calls_cut_from_the_export_equal_the_copy(tmp_path, monkeypatch, fmt):
    """Calls without a thread, a launcher no kept name covers, early calls, ranks that start late."""
    d = write_export_dir(odd_calls(tmp_path / "odd.sqlite"), tmp_path / f"odd_{fmt[:3]}dir", fmt)
    cut, copied = both(d, tmp_path, monkeypatch)
    same_store(cut, copied)
    api = cut.scan("api").collect()
    assert api.filter(pl.col("corr") == 5000).height == 1  # the odd launcher, found through its kernel
    assert pl.read_parquet(cut.root / "lost.parquet").height == 1
    _same(analyze(tmp_path / "odd.sqlite", store=False), analyze_store(cut))


def test_null_correlation_ids_do_not_pack_and_still_match(tmp_path, monkeypatch):
    """A kernel and a call without a correlation id: (pid, corr) does not pack into one integer; the anti-join
    matches null with null, as the copying build does."""
    p = odd_calls(tmp_path / "odd.sqlite")
    con = sqlite3.connect(p)
    con.execute("UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET correlationId = NULL WHERE rowid = 3")
    con.commit()
    con.close()
    d = write_export_dir(p, tmp_path / "odd_pqtdir")
    cut, copied = both(d, tmp_path, monkeypatch)
    same_store(cut, copied)


@pytest.mark.parametrize("name", ["tp2_rank0_window", "tp2_s3_node"])
def test_real_capture_cut_from_the_export_equals_the_copy(tmp_path, monkeypatch, name):
    d = write_export_dir(tp2(name, tmp_path), tmp_path / f"{name}_pqtdir")
    cut, copied = both(d, tmp_path, monkeypatch)
    same_store(cut, copied)
    _same(analyze_store(copied), analyze_store(cut))


def test_a_changed_export_is_not_read_through_an_old_store(tmp_path):
    """The store's key has each table file's size, mtime, inode, ctime and content hash: an export written again
    is a new store (and its rows are the new ones); a file changed while a store is open is a one-line error."""
    from analyze.model import InputError

    p = odd_calls(tmp_path / "odd.sqlite")
    d = write_export_dir(p, tmp_path / "odd_pqtdir")
    s = open_store(d, cache_dir=tmp_path / "c")
    before = s.read("ops", s.pids[0])
    k = d / "CUPTI_ACTIVITY_KIND_KERNEL.parquet"
    df = pl.read_parquet(k)
    df.with_columns(pl.col("end") + 1).write_parquet(k)
    os.utime(k, ns=(k.stat().st_atime_ns, k.stat().st_mtime_ns + 10**9))
    s2 = open_store(d, cache_dir=tmp_path / "c")
    assert s2.meta["build"] != s.meta["build"]
    assert s2.read("ops", s.pids[0])["end"].to_list() == [e + 1 for e in before["end"].to_list()]
    with pytest.raises(InputError):
        s.read("ops", s.pids[0])
    s3 = open_store(d, cache_dir=tmp_path / "c")  # verified, its rows not read yet
    df.write_parquet(k)
    with pytest.raises(InputError, match="changed"):
        s3.read("api", s3.pids[0])


def test_a_lazy_read_warns_nothing(tmp_path):
    """The row functions applied to lazy rows ask for their schema, not ``.columns``: no PerformanceWarning (one
    silenced by ``warnings.catch_warnings`` reached stderr when the pipeline's two threads read at once)."""
    import warnings

    from analyze.read.export import api_query, op_queries
    from analyze.read.exportdir import DirReader
    from analyze.read.store.reader import lazy_post

    r = DirReader(write_export_dir(tp2("tp2_s3_node", tmp_path), tmp_path / "pqtdir"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        plans = [lazy_post(post, r._lazy(q)) for _, q, post in op_queries(r)]
        plans.append(lazy_post(api_query(r)[1], r._lazy(api_query(r)[0])))
        assert all(lf.collect().height for lf in plans)
