"""The store of a columnar export (parquetdir/arrowdir, :func:`build_columnar`): the small frames and what the rows'
reads need, but no copy of the rows: :meth:`analyze.read.store.reader.Store.read` cuts a process's rows from the
export's own files when read. One pass over the columns the counts need gives what a copying build gathers while it
copies; the API calls it reads anyway are handed to the store opened on this build (:func:`take_built_rows`)."""

from __future__ import annotations

import dataclasses
import os
import threading
import uuid
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import polars as pl

from ..export import (
    API_SCHEMA,
    RUNTIME,
    _devices,
    _names,
    _nsys_diagnostics,
    _ranges,
    _strings,
    api_query,
    bad_op,
    op_queries,
)
from ..exportdir import DirReader
from .call_keys import CALL_KEY, OP_KEYS_SCHEMA, kept_api_ids, op_keys
from .errors import write_in_cache
from .fingerprint import fingerprint
from .layout import write_meta
from .reader import lazy_post

__all__ = ["build_columnar", "take_built_rows"]


# Rows a columnar build read anyway, by build folder, for the store opened on it (:func:`take_built_rows`)
_BUILT_ROWS: dict[Path, dict[tuple[str, int], pl.DataFrame]] = {}
_BUILT_ROWS_LOCK = threading.Lock()


def build_columnar(r: DirReader, report: str | os.PathLike, dest: Path, m: dict) -> Path:
    """The store of a columnar export (parquetdir/arrowdir): the small frames and what the rows' reads need, but
    no copy of the rows: :meth:`analyze.read.store.reader.Store.read` cuts a process's rows from the export's files
    (the cut pushed into polars' scans: :meth:`analyze.read.exportdir.DirReader.process_rows`). One pass over the
    columns the counts need gives what :func:`analyze.read.store.copy_build.build_by_copy` gathers while it copies:
    rows and first start per process, the dropped ops, the ops' distinct names and labels, and (``lost.parquet``)
    the (pid, correlation id) of ops that no kept API call launched, whose launchers the reads add; each process's
    first call as a copying build finds it. The NVTX ranges and small tables are read meanwhile on another thread."""
    notes: dict[str, int] = dict(m["read_warnings"])

    def small() -> pl.DataFrame:
        ranges, _domains, marks = _ranges(r, m["duration"], notes)
        for name, df in (("ranges", ranges), ("marks", marks), ("devices", _devices(r)),
                         ("diagnostics", _nsys_diagnostics(r))):
            write_in_cache(dest / f"{name}.parquet", df.write_parquet)
        return _strings(r)

    with ThreadPoolExecutor(1) as ex:
        strings_f = ex.submit(small)
        counts = _columnar_counts(r, m["duration"], strings_f, notes)
        strings = strings_f.result()
    write_in_cache(dest / "lost.parquet", counts.lost.write_parquet)
    write_in_cache(dest / "names.parquet", _names(strings, counts.ids).write_parquet)
    write_in_cache(dest / "op_keys.parquet", counts.op_keys.write_parquet)
    r.check_unchanged()
    notes.update(lossy_strings=r.lossy)
    meta = {
        "key": fingerprint(report, check=False),  # its reader opened it: checked
        "report": str(Path(report).resolve()),
        "build": uuid.uuid4().hex,
        "columnar": True,
        "export": m["export"],
        "capture": m["capture"],
        "duration": m["duration"],
        "utc": m["utc"],
        "tables": sorted(r.tables),
        "dropped_ops": counts.dropped,
        "ops_rows": {str(k): v for k, v in sorted(counts.ops_rows.items())},
        "api_rows": {str(k): v for k, v in sorted(counts.api_rows.items())},
        "api_first": {str(k): v for k, v in sorted(counts.api_first.items())},
        "kept_ids": counts.kept_ids,
        "read_warnings": {k: v for k, v in sorted(notes.items()) if v},
    }
    write_meta(dest, meta)
    with _BUILT_ROWS_LOCK:  # for the store opened on this build (take_built_rows)
        _BUILT_ROWS[dest] = counts.handed
    return dest


def take_built_rows(dest: Path) -> dict[tuple[str, int], pl.DataFrame]:
    """The rows the build into ``dest`` read anyway (:meth:`analyze.read.store.reader.Store.hand`), once; none when
    it kept none."""
    with _BUILT_ROWS_LOCK:
        return _BUILT_ROWS.pop(dest, {})


@dataclasses.dataclass
class _ColumnarCounts:
    """What :func:`build_columnar` keeps of a columnar export's rows (:func:`_columnar_counts`)."""

    dropped: int
    """GPU operations dropped (:func:`analyze.read.export.bad_op`)."""
    ops_rows: dict[int, int]
    """GPU operations per process."""
    api_rows: dict[int, int]
    """API calls a read of the process returns: the kept ones and the launchers of the lost ops."""
    api_first: dict[int, int]
    """Each process's first call (as a copying build finds it)."""
    kept_ids: list[int]
    """The name ids of the kept API calls."""
    lost: pl.DataFrame
    """``pid, corr`` of the ops no kept call launched but another call did (its launcher is read with the kept)."""
    ids: pl.Series
    """The name ids of the rows kept (their names go to ``names.parquet``)."""
    op_keys: pl.DataFrame
    """Every distinct ``(name_id, label)`` of the GPU operations."""
    handed: dict[tuple[str, int], pl.DataFrame]
    """``("api", pid)``: the API calls a read of the process returns, read here anyway
    (:meth:`analyze.read.store.reader.Store.hand`)."""


def _columnar_counts(r: DirReader, duration: int | None, strings_f: Future[pl.DataFrame],
                     notes: dict[str, int]) -> _ColumnarCounts:
    """What :func:`build_columnar` keeps of the rows (see there), from narrow reads of the op and API tables."""
    bad = bad_op(duration)
    dropped, ids, keys, packed, loose = 0, [], [], [], []
    ops_rows: dict[int, int] = {}
    ops_first: dict[int, int] = {}
    for _, q, post in op_queries(r):
        df = _narrow(post, r._lazy(q), ["pid", "corr", "start", "end", "name_id", "label"])
        dropped += int(df.select(bad.sum()).item() or 0)
        df = df.filter(~bad)
        for p, n, t in df.group_by("pid").agg(pl.len(), pl.col("start").min()).iter_rows():
            ops_rows[p] = ops_rows.get(p, 0) + n
            ops_first[p] = t if p not in ops_first else min(ops_first[p], t)
        keys.append(op_keys(df))
        ids.append(keys[-1]["name_id"].drop_nulls())  # (their names: _names makes them unique)
        if CALL_KEY.holds(df):  # (pid, corr) as one integer: a semi-join is a hash of one column
            packed.append(df.select(CALL_KEY.key("key")))
        else:
            loose.append(df.select("pid", "corr"))
        del df
    kept_ids = kept_api_ids(strings_f.result())
    api_rows: dict[int, int] = {}
    api_first: dict[int, int] = {}
    lost = pl.DataFrame(schema={"pid": pl.Int64, "corr": pl.Int64})
    handed: dict[tuple[str, int], pl.DataFrame] = {}
    api_q = api_query(r)
    if api_q:
        # Every column of the kept calls (each process's are what its read returns: handed to the store), the cut
        # made in the scan of the file's own columns (the other calls' are not decoded), then the few other calls
        # _rest_of_api reads: the early ones (row groups after the bound skipped) and the launchers of lost ops.
        name_id, gtid = r.column(RUNTIME, "nameId"), r.column(RUNTIME, "globalTid")
        is_kept = name_id.is_in(kept_ids.implode()).fill_null(False)
        kept_rows = _narrow(api_q[1], r.rows_where(api_q[0], RUNTIME, gtid.is_not_null() & is_kept), list(API_SCHEMA))
        notes["api_without_pid"] = int(r.rows_where(f"SELECT globalTid FROM {RUNTIME}", RUNTIME,
                                                    gtid.is_null()).select(pl.len()).collect().item())
        kept = kept_rows.select("pid", "corr", "start", "name_id")
        ids.append(kept["name_id"].unique().drop_nulls())
        kept_first = dict(kept.group_by("pid").agg(pl.col("start").min()).iter_rows())
        # the ops no kept call launched (unmatched_ops), their (pid, corr) once each
        if CALL_KEY.holds(kept):
            have = kept.select(CALL_KEY.key("key"))["key"].implode()
            missing = [df.filter(~pl.col("key").is_in(have)).select(CALL_KEY.unpacked("key")) for df in packed]
        else:
            loose += [df.select(CALL_KEY.unpacked("key")) for df in packed]
            missing = []
        if loose:
            missing.append(pl.concat(loose).join(kept.select("pid", "corr"), on=["pid", "corr"], how="anti",
                                                 nulls_equal=True))
        lost = pl.concat(missing).unique() if missing else lost
        del packed, loose
        bound = max((min(t, kept_first.get(p, t)) for p, t in ops_first.items()), default=None)
        corr = r.column(RUNTIME, "correlationId")
        near = pl.lit(False)
        if lost.height:  # (a test of every row: only when some op's launcher is missing)
            near = corr.is_in(lost["corr"].drop_nulls().unique().implode())
        if lost["corr"].null_count():
            near = near | corr.is_null()
        if bound is not None:
            near = near | (r.column(RUNTIME, "start") < bound)
        # (a filter keeps the rows where it is true: no fill_null, which would hide the time bound from the skip)
        rest = _narrow(api_q[1], r.rows_where(api_q[0], RUNTIME, near & gtid.is_not_null() & ~is_kept),
                       ["pid", "corr", "start", "name_id"])
        found = rest.join(lost, on=["pid", "corr"], how="semi", nulls_equal=True)
        ids.append(found["name_id"].unique().drop_nulls())
        lost = found.select("pid", "corr").unique().sort("pid", "corr")
        for df in (kept, found):
            for p, n in df.group_by("pid").agg(pl.len()).iter_rows():
                api_rows[p] = api_rows.get(p, 0) + n
        early_first = dict(rest.group_by("pid").agg(pl.col("start").min()).iter_rows())
        for p in ops_first:
            starts = [t for t in (kept_first.get(p), early_first.get(p)) if t is not None]
            if starts:
                api_first[p] = min(starts)
        # A process's calls as Store.read returns them (in row order), where they are its kept calls alone: with
        # a launcher of a lost op, it reads them (the launchers go after the kept calls, in their row order).
        with_lost = set(lost["pid"].to_list())
        handed = {("api", p): df for (p,), df in kept_rows.partition_by("pid", as_dict=True, maintain_order=True).items()
                  if p not in with_lost}
        del kept_rows
    return _ColumnarCounts(dropped=dropped, ops_rows=ops_rows, api_rows=api_rows, api_first=api_first,
                           kept_ids=kept_ids.to_list(), lost=lost, handed=handed,
                           ids=pl.concat(ids) if ids else pl.Series("name_id", [], pl.Int64),
                           op_keys=pl.concat(keys).unique() if keys else pl.DataFrame(schema=OP_KEYS_SCHEMA))


def _narrow(post, lf: pl.LazyFrame, columns: list[str]) -> pl.DataFrame:
    """``post`` applied to a query's lazy rows, and only ``columns`` of them read (polars prunes the others)."""
    return lazy_post(post, lf).select(columns).collect()
