"""An opened store (:class:`Store`): its metadata in memory, its frames read from disk one process at a time, each
file checked against its CRC-32 as it is read; and :class:`CacheError`, what a store that cannot be read raises.

A store built by copying (a SQLite export) reads a process's rows from its own parquet files; a columnar store (a
parquetdir/arrowdir export) cuts them from the export's files (the cut pushed into polars' scans), the same rows in
the same order as a copy, and can read several processes' rows with one scan of each table
(:meth:`Store.read_together`). The analysis (:mod:`analyze.compute.pipeline`, through :mod:`analyze.read.source`)
reads one process at a time from here; notebooks re-open a large trace in well under a second (:meth:`Store.scan`
is lazy)."""

from __future__ import annotations

import json
import os
import threading
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import polars as pl
from polars.exceptions import PanicException

from ...model import InputError, Trace
from ..export import API_SCHEMA, OPS_SCHEMA, api_query, bad_op, op_queries, open_reader
from .errors import one_line
from .layout import file_crc

__all__ = ["CacheError", "Store", "lazy_post"]


class CacheError(InputError):
    """A cache folder that cannot be read or does not verify. ``store``: the kept cache it happened in (the
    analysis rebuilds that once), None for a temporary store or a cache that was just built."""

    def __init__(self, message: str, code: str = "CACHE", store: Store | None = None):
        super().__init__(message, code)
        self.store = store

    def __reduce__(self):
        return (type(self), (str(self), self.code))


class Store:
    """An opened cache: metadata in memory, frames on disk. ``kept``: a cache (rebuilt when it cannot be read),
    not a temporary store. ``report``: the report's path as the caller gave it (the trace's ``path``; default: the
    absolute path the cache was built from). ``meta``: its meta.json, when already read (and verified)."""

    def __init__(self, root: Path, kept: bool = True, report: str | os.PathLike | None = None,
                 meta: dict | None = None):
        self.root, self.kept, self.report = root, kept, report
        self.meta: dict[str, Any] = {}
        self._reader: Any = None  # a columnar export's reader (a DirReader), opened on first use
        self._lock = threading.Lock()
        # (kind, pid) -> the processes whose rows one scan reads; rows read for a process that has not asked yet
        self._together: dict[tuple[str, int], tuple[int, ...]] = {}
        self._ahead: dict[tuple[str, int, tuple[str, ...] | None], Future[pl.DataFrame]] = {}
        self._handed: dict[tuple[str, int], pl.DataFrame] = {}  # rows its build read: each read once (hand)
        if meta is None:
            meta = self.reading(lambda: json.loads((root / "meta.json").read_text()))
        self.meta = meta

    def reading(self, fn):
        """``fn()``; any failure to read the cache's files becomes a :class:`CacheError` naming the folder."""
        try:
            return fn()
        except (Exception, PanicException) as e:
            if isinstance(e, InputError):
                raise
            raise CacheError(f"{self.root}: cannot read the cache ({one_line(e)})",
                             store=self if self.kept else None) from None

    def check(self, rel: str) -> None:
        """The file ``rel`` against its size and CRC-32 in meta.json (a :class:`CacheError` if it differs)."""
        want = self.meta.get("files", {}).get(rel)
        if want is not None and self.reading(lambda: file_crc(self.root / rel)) != (want[1], want[3]):
            raise CacheError(f"{self.root}: {rel} does not match its checksum", store=self if self.kept else None)

    def files(self, kind: str, pid: int) -> list[Path]:
        """The parquet files of ``kind`` (ops, api) of one process, in read order."""
        listed = self.meta.get("files")
        if listed is None:  # a folder opened without verification (tests, old notebooks)
            return sorted((self.root / kind / str(pid)).glob("*.parquet"))
        pre = f"{kind}/{pid}/"
        return [self.root / k for k in sorted(listed) if k.startswith(pre)]

    @property
    def api_first(self) -> dict[int, int]:
        """pid → start of its first CUDA API call (processes with GPU operations): the store keeps only some calls."""
        return {int(k): v for k, v in self.meta.get("api_first", {}).items()}

    @property
    def pids(self) -> list[int]:
        """Processes with GPU operations or API calls, ascending."""
        return sorted({int(p) for p in (*self.meta["ops_rows"], *self.meta["api_rows"])})

    def scan(self, kind: str, pids: list[int] | None = None) -> pl.LazyFrame:
        """``ops`` or ``api`` rows of some processes (all by default), lazily; or a small frame by name."""
        if kind not in ("ops", "api"):
            return pl.scan_parquet(self.root / f"{kind}.parquet")
        if self.meta.get("columnar"):
            return self._columnar_scan(kind, pids if pids is not None else self.pids)
        have = self.meta[f"{kind}_rows"]
        files = [f for p in (pids if pids is not None else self.pids) if str(p) in have for f in self.files(kind, p)]
        if not files:
            return pl.LazyFrame(schema=OPS_SCHEMA if kind == "ops" else API_SCHEMA)
        return pl.scan_parquet(files)

    def op_keys(self) -> pl.DataFrame:
        """Every distinct ``(name_id, label)`` of the GPU operations (written by the build)."""
        self.check("op_keys.parquet")
        return self.reading(lambda: pl.read_parquet(self.root / "op_keys.parquet"))

    def head(self, ops: pl.DataFrame | None = None, api: pl.DataFrame | None = None) -> Trace:
        """A :class:`~analyze.model.Trace` with the small frames, and the given (or no) ops and API calls."""
        for name in ("ranges", "marks", "names", "devices", "diagnostics"):
            self.check(f"{name}.parquet")
        return self.reading(lambda: self._head(ops, api))

    def _head(self, ops, api) -> Trace:
        m = self.meta
        e = m["export"]
        return Trace(
            path=str(Path(self.report)) if self.report is not None else m["report"],
            nsys_version=e.get("EXPORT_PRODUCT_VERSION", "unknown"),
            schema_version=e.get("EXPORT_SCHEMA_VERSION", "unknown"),
            export_meta=e,
            capture_meta=m["capture"],
            duration_ns=m["duration"],
            ranges=pl.read_parquet(self.root / "ranges.parquet"),
            marks=pl.read_parquet(self.root / "marks.parquet"),
            api=api if api is not None else self.scan("api", []).collect(),
            ops=ops if ops is not None else self.scan("ops", []).collect(),
            names=pl.read_parquet(self.root / "names.parquet"),
            devices=pl.read_parquet(self.root / "devices.parquet"),
            nsys_diagnostics=pl.read_parquet(self.root / "diagnostics.parquet"),
            tables=set(m["tables"]),
            dropped_ops=m["dropped_ops"],
            utc_epoch_ns=m["utc"],
            read_warnings=m.get("read_warnings", {}),
            api_first=self.api_first,
        )

    def hand(self, rows: dict[tuple[str, int], pl.DataFrame]) -> None:
        """Rows of some processes (``(kind, pid)``: all of its rows, as :meth:`read` returns them) that the store's
        build read anyway: the first :meth:`read` of each takes them instead of reading the export again."""
        with self._lock:
            self._handed.update(rows)

    def read_together(self, kind: str, groups: list[tuple[int, ...]]) -> None:
        """Processes whose ``kind`` rows (ops, api) are read at once, group by group (a columnar store; a store
        with its own copy of the rows reads one process's files anyway): the first :meth:`read` of one process of
        a group reads the rows of all of them with one scan of each export table, and keeps the others' rows until
        they are read (once each). A table's pages are then decompressed and decoded once for the group, not once
        for each process. No groups: each process read on its own again (and any rows kept are dropped)."""
        with self._lock:
            self._together = {k: g for k, g in self._together.items() if k[0] != kind}
            if self.meta.get("columnar"):
                self._together.update({(kind, p): g for g in groups if len(g) > 1 for p in g})
            self._ahead = {k: f for k, f in self._ahead.items() if k[0] != kind}

    def read_in_order(self, pids: list[int], workers: int) -> None:
        """Say that the processes' rows will be read in the order ``pids``, ``workers`` at a time (the pipeline's
        threads), or no more (``workers`` 0): the reads are grouped (:meth:`read_together`) where that costs
        little memory. The API calls of every process are read by one scan when they are no more rows than the ops
        that the workers hold at once (the largest processes'): a kept-calls filter leaves few of them (at 10 M
        kernels, 8 processes: 0.6 CPU-s for one scan against 1.4 for eight). Ops are read a process at a time: a
        group's rows would have to be split again, which costs about what the scans it saves do (1.48 CPU-s
        against 1.59 in pairs), and the group's rows would wait in memory."""
        api = self.meta.get("api_rows", {})
        ops = sorted(self.meta.get("ops_rows", {}).values(), reverse=True)
        with self._lock:
            if not workers:  # the reads are over: rows handed by the build and not read are dropped
                self._handed = {}
            to_read = tuple(p for p in pids if ("api", p) not in self._handed)  # the others' are in memory
        small = sum(api.get(str(p), 0) for p in to_read) <= sum(ops[:workers])
        self.read_together("ops", [])
        self.read_together("api", [to_read] if workers > 1 and small else [])

    def read(self, kind: str, pid: int, columns: tuple[str, ...] | None = None) -> pl.DataFrame:
        """All ``ops`` or ``api`` rows of one process (only ``columns``, if given), each file checked against its
        CRC-32 as it is read (a :class:`CacheError` if a file cannot be read or does not match)."""
        if self.meta.get("columnar"):
            return self._columnar_rows_of(kind, pid, columns)
        for f in self.files(kind, pid):  # each file's CRC (from the page cache), then read by polars
            self.check(f.relative_to(self.root).as_posix())
        lf = self.scan(kind, [pid])
        return self.reading(lambda: (lf if columns is None else lf.select(columns)).collect())

    def _columnar_rows_of(self, kind: str, pid: int, columns: tuple[str, ...] | None) -> pl.DataFrame:
        """:meth:`_columnar_rows` of one process, with the other processes of its group (:meth:`read_together`): read
        by the first of them to ask, handed to the others; or the rows the build handed over (:meth:`hand`)."""
        with self._lock:
            handed = self._handed.pop((kind, pid), None)
        if handed is not None:
            return handed if columns is None else handed.select(columns)
        group = self._together.get((kind, pid))
        if group is None:
            return self._columnar_rows(kind, [pid], columns)[pid]
        with self._lock:
            ahead = self._ahead.pop((kind, pid, columns), None)
            if ahead is None:  # the first of its group to ask: it reads for the others too
                others = {p: Future[pl.DataFrame]() for p in group if p != pid}
                self._ahead.update({(kind, p, columns): f for p, f in others.items()})
        if ahead is not None:
            return ahead.result()
        try:
            frames = self._columnar_rows(kind, [pid, *others], columns)
        except BaseException as e:  # the others get the error too (each raises it in its own thread)
            for f in others.values():
                f.set_exception(e)
            raise
        for p, f in others.items():
            f.set_result(frames[p])
        return frames[pid]

    def _columnar_rows(self, kind: str, pids: list[int],
                  columns: tuple[str, ...] | None = None) -> dict[int, pl.DataFrame]:
        """Some processes' ``ops`` or ``api`` rows (only ``columns``, if given) read from a columnar export
        (:func:`analyze.read.store.columnar_build.build_columnar`) with one scan of each table, by process: the rows
        and their order as a store built by copying them would give: ops of each table in row order, the bad ones
        left out; the kept API calls in row order, then the other calls that launched an op no kept call accounts
        for."""
        have = [p for p in pids if str(p) in self.meta[f"{kind}_rows"]]
        if not have:
            return {p: _no_rows(kind) if columns is None else _no_rows(kind).select(columns) for p in pids}
        r = self._export_reader()
        one: int | list[int] = have[0] if len(have) == 1 else have
        if kind == "ops":
            # One plan: the bad ops dropped and the unread columns pruned inside each table's scan, the tables
            # collected together (in order), not materialised whole and then filtered.
            bad = bad_op(self.meta["duration"])
            lf = pl.concat([lazy_post(post, r.process_rows(q, "globalPid", one)).filter(~bad)
                            for _, q, post in op_queries(r)])
            wide = columns if columns is None or "pid" in columns else (*columns, "pid")
            df = (lf if wide is None else lf.select(wide)).collect()
            out = _by_pid(df, pids, columns)
        else:
            api_q = api_query(r)
            if api_q is None:
                return {p: _no_rows(kind) if columns is None else _no_rows(kind).select(columns) for p in pids}
            q, post = api_q
            kept = pl.col("name_id").is_in(pl.Series(self.meta["kept_ids"], dtype=pl.Int64).implode())
            out = _by_pid(post(r.process_rows(q, "globalTid", one).filter(kept).collect()), pids, None)
            lost = self.reading(lambda: pl.read_parquet(self.root / "lost.parquet"))
            for p in have:
                mine = lost.filter(pl.col("pid") == p)
                if mine.height:
                    calls = r.process_rows(q, "globalTid", p)
                    rest = post(calls.filter(~kept.fill_null(False)).collect())
                    out[p] = pl.concat([out[p], rest.join(mine, on=["pid", "corr"], how="semi",
                                                          nulls_equal=True, maintain_order="left")])
            if columns is not None:
                out = {p: df.select(columns) for p, df in out.items()}
        r.check_unchanged()
        return out

    def _export_reader(self):
        """The columnar export's reader, opened once (and checked against the key the store was verified with)."""
        with self._lock:
            if self._reader is None:
                r = self.reading(lambda: open_reader(self.meta["report"]))
                if [f[:3] for f in self.meta["key"]["files"]] != getattr(r, "state", None):  # changed since verified
                    raise InputError(f"{self.report or self.meta['report']}: the export changed while it was read; "
                                     "try again", "CHANGED")
                self._reader = r
        return self._reader

    def _columnar_scan(self, kind: str, pids: list[int]) -> pl.LazyFrame:
        """Some processes' rows of a columnar export, lazily (a filter on time is pushed into the export's scans):
        the rows of :meth:`_columnar_rows`, by process in ``pids``' order."""
        r = self._export_reader()
        which = pl.col("pid").is_in(pl.Series(pids, dtype=pl.Int64).implode())
        if kind == "ops":
            parts = [lazy_post(post, r._lazy(q)) for _, q, post in op_queries(r)]
            lf = pl.concat(parts) if parts else _no_rows(kind).lazy()
            lf = lf.filter(which & ~bad_op(self.meta["duration"]))
        else:
            api_q = api_query(r)
            if api_q is None:
                return _no_rows(kind).lazy()
            calls = lazy_post(api_q[1], r._lazy(api_q[0])).filter(which)
            kept = pl.col("name_id").is_in(pl.Series(self.meta["kept_ids"], dtype=pl.Int64).implode())
            lost = pl.scan_parquet(self.root / "lost.parquet")
            lf = pl.concat([calls.filter(kept), calls.filter(~kept.fill_null(False)).join(
                lost, on=["pid", "corr"], how="semi", nulls_equal=True, maintain_order="left")])
        order = pl.col("pid").replace_strict(pids, list(range(len(pids))), default=None, return_dtype=pl.Int64)
        return lf.sort(order, maintain_order=True)  # stable: each process's rows in their own order

    def trace(self) -> Trace:
        """The whole trace in memory, as :func:`analyze.read.export.load` returns it (ops grouped by process)."""
        return self.head(ops=self.reading(lambda: self.scan("ops").collect()),
                         api=self.reading(lambda: self.scan("api").collect()))


def _by_pid(df: pl.DataFrame, pids: list[int], columns: tuple[str, ...] | None) -> dict[int, pl.DataFrame]:
    """The rows of ``df`` of each process in ``pids``, in their order (only ``columns``, if given)."""
    cols = list(df.columns if columns is None else columns)
    if len(pids) == 1:
        return {pids[0]: df.select(cols)}
    parts = df.partition_by("pid", as_dict=True, maintain_order=True)  # one pass (k filters would make k)
    return {p: parts[(p,)].select(cols) if (p,) in parts else df.head(0).select(cols) for p in pids}


def _no_rows(kind: str) -> pl.DataFrame:
    """No ``ops`` (or ``api``) rows, with their columns."""
    schema: Any = OPS_SCHEMA if kind == "ops" else API_SCHEMA  # (OPS_SCHEMA's Enum makes it dict[str, object])
    return pl.DataFrame(schema=schema)


def lazy_post(post, lf: pl.LazyFrame) -> pl.LazyFrame:
    """``post`` (a query's row function, :func:`analyze.read.export.op_queries`) applied to its lazy rows. (It reads
    their schema, never ``.columns``: a PerformanceWarning silenced with ``warnings.catch_warnings`` leaked to stderr
    when two worker threads read at once, that context manager not being thread-safe.)"""
    return post(lf)
