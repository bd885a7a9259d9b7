"""A cache of parsed frames: an nsys export's frames as parquet, split by process, beside the report.

One pass over the export (SQLite through ADBC record batches, or a parquetdir/arrowdir through
polars scans) writes the frames :func:`analyze.read.export.load` would build, already normalised, as::

    <report>.spectrace/            (or $SPECTRACE_CACHE_DIR / ~/.cache/spectrace/<hash>/ if the
      meta.json                     report's directory is not writable; the report is never touched)
      ranges.parquet marks.parquet names.parquet devices.parquet diagnostics.parquet
      op_keys.parquet              every distinct (name_id, label) of the GPU operations
      ops/<pid>/<part>.parquet     GPU operations of one process, parts in read order
      api/<pid>/<part>.parquet     CUDA API calls of one process: the ones the analysis needs (below)

A parquetdir/arrowdir export is already columnar: its store (``meta.json`` ``columnar``) has no ``ops/`` or
``api/``, only the small frames, ``op_keys.parquet`` and ``lost.parquet`` (:func:`_build_columnar`); a process's rows
are cut from the export's own files when read (:meth:`Store.read`), the same rows in the same order as a copy.

API calls: those matching :data:`analyze.model.KEPT_API` (chosen in the SQL: the calls that launch nothing are
most of a large API table and never cross into Python), plus every call that launched a GPU operation no kept call
accounts for (:func:`_rest_of_api`: the operations' (pid, correlation id) keys are taken while they are read, the
missing launchers in one more pass); ``meta.json``'s ``api_first`` has each process's first call of all (its
capture window opens there; the early calls come with the API pieces, or in a pass of their own).

Memory stays bounded while building: batches are buffered per process and flushed to parquet
every ~2 M rows. ``meta.json`` records the key (:func:`fingerprint`) — spectrace's cache format version,
the report's absolute resolved path, and of each of its files (the table files of a directory; a SQLite file's
``-wal`` too) the size, mtime, inode, ctime and a hash of 8 blocks of its content (its first and last 64 KiB:
SQLite's header with its change counter and page count, the first and last pages; a parquet file's footer) —
a build id, and every parquet file with its row count, size, a CRC-32 of its last 64 KiB (the parquet
footer) and one of the whole file, and a digest of itself; it is written last. A cache is used only when
all of that still holds: on every open, the key (a stat and 8 reads per report file) and each file's size,
footer row count and tail CRC (a stat and one 64 KiB read per file); as a process's rows are read, each
file's whole CRC. Otherwise it is rebuilt once, and a cache that fails again is a one-line error naming
its folder. The report's path in the analysis is the one the caller gave (its manifest is found from it),
never one stored in the cache.

Safety: the directory is built under a temporary name (``.<name>.tmp-*``) and renamed into place,
so a half-written cache is never used; a build that fails or is interrupted stops its reader
threads and removes its folder, and one left by a process that died is removed by the next build. A
``SPECTRACE_CACHE`` marker file says a folder is a spectrace cache: nothing else is ever replaced
or removed. If the report changes while the cache is built, the new cache is thrown away. Installing,
replacing and removing a cache happen under a lock on its folder (``flock``, nothing created), and a cache
is replaced or removed only while it is the very build (its id) that was found stale or unreadable: two
processes never remove each other's work. A cache that cannot be written (permissions, a full disk, a
file-size limit, a stale cache of another user, no valid place for it, a place inside the input) raises
:class:`CacheWriteError`: the analysis goes on without it (:func:`analyze.read.source.open_source`).

The analysis (:mod:`analyze.compute.pipeline`, through :mod:`analyze.read.source`) reads one process at a
time from here; notebooks re-open a large trace from here in well under a second (:meth:`Store.scan` is lazy).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import mmap
import os
import re
import shutil
import socket
import stat
import sys
import tempfile
import threading
import time
import uuid
import zlib
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import polars as pl
from polars.exceptions import PanicException

from ..model import KEPT_API, InputError, Trace
from .cachekey import MARKER as MARKER  # (re-exported: st.MARKER, st.SUFFIX, ... as before they moved)
from .cachekey import SUFFIX as SUFFIX
from .cachekey import CacheWriteError as CacheWriteError
from .cachekey import cache_dir_for as cache_dir_for
from .cachekey import file_keys, utf8
from .export import (
    API_SCHEMA,
    BAD_API,
    OPS_SCHEMA,
    RUNTIME,
    _devices,
    _names,
    _nsys_diagnostics,
    _ranges,
    _strings,
    api_query,
    bad_op,
    op_queries,
    open_reader,
    read_meta,
)
from .exportdir import DirReader
from .kineto import is_trace
from .protocols import ExportReader

__all__ = ["COLUMNAR", "FLUSH_ROWS", "PIECE_ROWS", "EARLY_ROWS", "TAIL", "CacheError", "fingerprint", "Progress", "problem", "is_cache", "Store",
           "build", "remove_tree", "discard", "existing_store", "open_store", "temporary_store"]

COLUMNAR = True  # a parquetdir/arrowdir export's store keeps no copy of its rows (_build_columnar)
_CACHE_VERSION = 11  # 2: ranges have ``range_id`` and ``range``; 3: marks.parquet; 4: marker, files listed, checks;
# 5: only the API calls the analysis needs, and each process's first call (``api_first``); 6: op_keys.parquet;
# 7: ops carry their CUDA graph's id (``graph``); 8: the key has each file's inode, ctime and content hash, the
# report's path is absolute, a build id; 9: the session's end from nsys's own diagnostic (unclosed ranges);
# 10: a columnar export's store reads its rows from the export (``columnar``, lost.parquet); 11: read_warnings
# count kernel launches in an export without a kernel table
FLUSH_ROWS = 2_000_000
PIECE_ROWS = 2_000_000  # a large table is read in row ranges of this size, by _READ_THREADS threads
_READ_THREADS = max(2, min(4, os.cpu_count() or 2))
_KEPT_IDS = "/*kept API name ids*/"  # in the API pieces' SQL until StringIds is read
EARLY_ROWS = 1_000_000  # early calls kept from the API pieces at most (more: their own pass, see _rest_of_api)
TAIL = 65536  # bytes of each file's end in its checksum: the parquet footer (row counts, offsets) and more
_STALE_S = 24 * 3600  # a build folder this old, or left by a dead process on this host, is removed
# Rows a columnar build read anyway, by build folder, for the store opened on it (:func:`_take_rows`)
_BUILT_ROWS: dict[Path, dict[tuple[str, int], pl.DataFrame]] = {}
_BUILT_ROWS_LOCK = threading.Lock()


class CacheError(InputError):
    """A cache folder that cannot be read or does not verify. ``store``: the kept cache it happened in (the
    analysis rebuilds that once), None for a temporary store or a cache that was just built."""

    def __init__(self, message: str, code: str = "CACHE", store: Store | None = None):
        super().__init__(message, code)
        self.store = store

    def __reduce__(self):
        return (type(self), (str(self), self.code))


def fingerprint(report: str | os.PathLike) -> dict:
    """What the cache is keyed by: the format version, the report's absolute resolved path, and of each of its
    files ``[name, size, mtime, inode, ctime, content]`` (:func:`analyze.read.cachekey.file_keys`)."""
    return {"cache_version": _CACHE_VERSION, **file_keys(report, check=not is_trace(report))}



class Progress:
    """A one-line progress bar on stderr (only when stderr is a terminal and not quiet)."""

    def __init__(self, total: int, label: str, enabled: bool | None = None):
        self.total, self.label, self.done = max(total, 1), label, 0
        self.enabled = (sys.stderr.isatty() if enabled is None else enabled)
        self._lock, self._last, self._t0 = threading.Lock(), 0.0, time.perf_counter()

    def add(self, n: int) -> None:
        if not self.enabled:
            return
        with self._lock:
            self.done += n
            now = time.perf_counter()
            if now - self._last >= 0.2:
                self._last = now
                frac = min(self.done / self.total, 1.0)
                bar = "#" * int(30 * frac)
                sys.stderr.write(f"\r{self.label} [{bar:<30}] {frac:4.0%} {self.done:,} rows "
                                 f"{now - self._t0:,.1f} s")
                sys.stderr.flush()

    def close(self) -> None:
        if self.enabled:
            sys.stderr.write("\r" + " " * 79 + "\r")
            sys.stderr.flush()


class _Spill:
    """Per-process buffers of one piece of one frame kind, flushed to ``<root>/<pid>/<piece>-<part>.parquet``.

    File names sort in read order (pieces are numbered in the order of the tables and row ranges
    they read), so a process's rows come back in the order a single pass would have read them.
    """

    def __init__(self, root: Path, piece: int, counts: dict[int, int], lock: threading.Lock):
        self.root, self.piece, self.rows, self.part = root, piece, 0, 0
        self.buf: dict[int, list[pl.DataFrame]] = {}
        self.counts, self.lock = counts, lock

    def add(self, df: pl.DataFrame) -> None:
        for (pid,), part in df.partition_by("pid", as_dict=True, maintain_order=True).items():
            self.buf.setdefault(pid, []).append(part)
        self.rows += df.height
        if self.rows >= FLUSH_ROWS:
            self.flush()

    def flush(self) -> None:
        for pid, parts in self.buf.items():
            d = self.root / str(pid)
            _write(d, lambda q: q.mkdir(parents=True, exist_ok=True))
            df = pl.concat(parts)
            _write(d / f"{self.piece:05d}-{self.part:05d}.parquet",
                   lambda q, df=df: df.write_parquet(q, compression="uncompressed", statistics=False))
            with self.lock:
                self.counts[pid] = self.counts.get(pid, 0) + df.height
        self.buf, self.rows, self.part = {}, 0, self.part + 1


def _write(path: Path, fn) -> None:
    """``fn(path)``: a write into a store; any failure (an OSError, or polars' error for one) is a
    :class:`CacheWriteError` with the reason (``File too large``, ``No space left on device``, ...)."""
    try:
        fn(path)
    except (Exception, PanicException) as e:
        if isinstance(e, InputError):
            raise
        why = _reason(e)
        raise CacheWriteError(f"{path}: cannot write it ({why})", "CACHE_WRITE", reason=why) from None


def _reason(e: BaseException) -> str:
    """An OS error's reason (also inside polars' messages: ``(os error 28)``), else the message on one line."""
    if isinstance(e, OSError) and e.strerror:
        return e.strerror
    m = re.search(r"\(os error (\d+)\)", str(e))
    return os.strerror(int(m.group(1))) if m else _one_line(e)


def _pieces(r, table: str, query: str, where: str | None = None) -> list[tuple[str, int]]:
    """``query`` (its rows that meet ``where``) over ``table`` cut into row ranges that can be read in parallel
    (SQLite only), each with its number of rows (at most; from the rowids)."""
    n = r.max_rowid(table)
    cond = f" WHERE ({where})" if where else ""
    if not r.splittable or n <= PIECE_ROWS:
        return [(query + cond, n)]
    more = " AND" if where else " WHERE"
    return [(f"{query}{cond}{more} rowid > {lo} AND rowid <= {lo + PIECE_ROWS}", min(PIECE_ROWS, n - lo))
            for lo in range(0, n, PIECE_ROWS)]


def _crc(f: Path) -> tuple[int, int]:
    """Size and CRC-32 of a whole file (mapped, not copied: ~4 GB/s, the GIL released)."""
    with f.open("rb") as h:
        size = os.fstat(h.fileno()).st_size
        if size == 0:
            return 0, 0
        with mmap.mmap(h.fileno(), 0, access=mmap.ACCESS_READ) as m:
            return size, zlib.crc32(m)


def _inventory(root: Path, full: bool = False) -> dict[str, list]:
    """Every parquet file under ``root``: ``relative path -> [rows, bytes, CRC-32 of its last 64 KiB, CRC-32 of
    the whole file]`` (the last one only when ``full``, else None: the first three are what an open checks)."""
    import pyarrow.parquet as pq

    out = {}
    for f in sorted(root.rglob("*.parquet")):
        with f.open("rb") as h:
            size = os.fstat(h.fileno()).st_size
            h.seek(max(0, size - TAIL))
            tail = zlib.crc32(h.read(TAIL))
        whole = _crc(f)[1] if full else None
        out[f.relative_to(root).as_posix()] = [pq.read_metadata(f).num_rows, size, tail, whole]
    return out


def _digest(meta: dict) -> str:
    return hashlib.sha256(json.dumps({k: v for k, v in meta.items() if k != "check"}, sort_keys=True).encode()
                          ).hexdigest()


def problem(root: Path, key: dict | None = None) -> str | None:
    """Why the cache at ``root`` cannot be used for ``key`` (None: it can). ``"stale"``: built for another
    report, file state or format (rebuilt as usual); anything else: damaged."""
    return _problem(root, key)[0]


def _problem(root: Path, key: dict | None) -> tuple[str | None, dict]:
    """:func:`problem`, and the cache's meta.json (empty when it cannot be read)."""
    try:
        meta = json.loads((root / "meta.json").read_text())
    except FileNotFoundError:
        return "no meta.json", {}
    except (OSError, ValueError) as e:
        return f"meta.json unreadable ({e})", {}
    if not isinstance(meta, dict):
        return "stale", {}
    return _check(root, key, meta), meta


def _check(root: Path, key: dict | None, meta: dict) -> str | None:
    if key is not None and meta.get("key") != key:
        return "stale"
    if meta.get("check") != _digest(meta):
        return "meta.json does not match its digest (edited?)"
    if not all(isinstance(v, list) and len(v) == 4 for v in meta.get("files", {}).values()):
        return "stale"  # files listed in another layout
    try:
        if not (root / MARKER).is_file():
            return f"no {MARKER} marker"
        have = _inventory(root)
    except Exception as e:  # OSError, or a file pyarrow cannot parse
        return f"a file cannot be read ({_one_line(e)})"
    listed = {k: v[:3] for k, v in meta.get("files", {}).items()}
    have = {k: v[:3] for k, v in have.items()}
    if have != listed:
        diff = sorted(set(have) ^ set(listed)) or sorted(k for k in have if have[k] != listed[k])
        what = "missing" if diff[0] in listed and diff[0] not in have else "unlisted" if diff[0] not in listed \
            else "changed"
        return f"{diff[0]} {what}"
    for kind in ("ops", "api") if not meta.get("columnar") else ():
        rows: dict[str, int] = {}
        for rel, (n, _, _) in listed.items():
            if rel.startswith(kind + "/"):
                pid = rel.split("/")[1]
                rows[pid] = rows.get(pid, 0) + n
        if rows != {k: v for k, v in meta.get(f"{kind}_rows", {}).items() if v}:
            return f"{kind} row counts do not match the files"
    return None


def is_cache(root: Path) -> bool:
    """Whether ``root`` is a folder spectrace made (its marker; or meta.json of an older format)."""
    if root.is_symlink() or not root.is_dir():
        return False
    if (root / MARKER).is_file():
        return True
    try:
        return isinstance(json.loads((root / "meta.json").read_text())["key"]["cache_version"], int)
    except (OSError, ValueError, KeyError, TypeError):
        return False


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split()) or type(e).__name__


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
            raise CacheError(f"{self.root}: cannot read the cache ({_one_line(e)})",
                             store=self if self.kept else None) from None

    def check(self, rel: str) -> None:
        """The file ``rel`` against its size and CRC-32 in meta.json (a :class:`CacheError` if it differs)."""
        want = self.meta.get("files", {}).get(rel)
        if want is not None and self.reading(lambda: _crc(self.root / rel)) != (want[1], want[3]):
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
        """A :class:`Trace` with the small frames, and the given (or no) ops and API calls."""
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
            return self._columnar_of(kind, pid, columns)
        for f in self.files(kind, pid):  # each file's CRC (from the page cache), then read by polars
            self.check(f.relative_to(self.root).as_posix())
        lf = self.scan(kind, [pid])
        return self.reading(lambda: (lf if columns is None else lf.select(columns)).collect())

    def _columnar_of(self, kind: str, pid: int, columns: tuple[str, ...] | None) -> pl.DataFrame:
        """:meth:`_columnar` of one process, with the other processes of its group (:meth:`read_together`): read
        by the first of them to ask, handed to the others; or the rows the build handed over (:meth:`hand`)."""
        with self._lock:
            handed = self._handed.pop((kind, pid), None)
        if handed is not None:
            return handed if columns is None else handed.select(columns)
        group = self._together.get((kind, pid))
        if group is None:
            return self._columnar(kind, [pid], columns)[pid]
        with self._lock:
            ahead = self._ahead.pop((kind, pid, columns), None)
            if ahead is None:  # the first of its group to ask: it reads for the others too
                others = {p: Future[pl.DataFrame]() for p in group if p != pid}
                self._ahead.update({(kind, p, columns): f for p, f in others.items()})
        if ahead is not None:
            return ahead.result()
        try:
            frames = self._columnar(kind, [pid, *others], columns)
        except BaseException as e:  # the others get the error too (each raises it in its own thread)
            for f in others.values():
                f.set_exception(e)
            raise
        for p, f in others.items():
            f.set_result(frames[p])
        return frames[pid]

    def _columnar(self, kind: str, pids: list[int],
                  columns: tuple[str, ...] | None = None) -> dict[int, pl.DataFrame]:
        """Some processes' ``ops`` or ``api`` rows (only ``columns``, if given) read from a columnar export
        (:func:`_build_columnar`) with one scan of each table, by process: the rows and their order as a store
        built by copying them would give: ops of each table in row order, the bad ones left out; the kept API
        calls in row order, then the other calls that launched an op no kept call accounts for."""
        have = [p for p in pids if str(p) in self.meta[f"{kind}_rows"]]
        if not have:
            return {p: _no_rows(kind) if columns is None else _no_rows(kind).select(columns) for p in pids}
        r = self._export()
        one: int | list[int] = have[0] if len(have) == 1 else have
        if kind == "ops":
            # One plan: the bad ops dropped and the unread columns pruned inside each table's scan, the tables
            # collected together (in order), not materialised whole and then filtered.
            bad = bad_op(self.meta["duration"])
            lf = pl.concat([_lazy_post(post, r.process_rows(q, "globalPid", one)).filter(~bad)
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

    def _export(self):
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
        the rows of :meth:`_columnar`, by process in ``pids``' order."""
        r = self._export()
        which = pl.col("pid").is_in(pl.Series(pids, dtype=pl.Int64).implode())
        if kind == "ops":
            parts = [_lazy_post(post, r._lazy(q)) for _, q, post in op_queries(r)]
            lf = pl.concat(parts) if parts else _no_rows(kind).lazy()
            lf = lf.filter(which & ~bad_op(self.meta["duration"]))
        else:
            api_q = api_query(r)
            if api_q is None:
                return _no_rows(kind).lazy()
            calls = _lazy_post(api_q[1], r._lazy(api_q[0])).filter(which)
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


def _mark(dest: Path) -> None:
    """The marker: this folder is a spectrace cache, being built by this process (host, pid) until renamed."""
    owner = {"spectrace_cache": _CACHE_VERSION, "host": socket.gethostname(), "pid": os.getpid()}
    _write(dest / MARKER, lambda q: q.write_text(json.dumps(owner) + "\n"))


def build(report: str | os.PathLike, dest: Path, progress: bool | None = None) -> Path:
    """Parse ``report`` into a new cache directory ``dest`` (must not exist; removed by the caller on failure).
    A write that fails is a :class:`CacheWriteError`; a read that fails, the reader's one-line error."""
    if not utf8(str(dest)):
        why = "not a UTF-8 path: polars writes only those"
        raise CacheWriteError(f"{ascii(os.fsencode(dest))[2:-1]}: cannot write it ({why})", reason=why)
    r = open_reader(report)
    try:
        m = read_meta(r)
        _write(dest, lambda q: q.mkdir(parents=True))
        _mark(dest)
        if COLUMNAR and isinstance(r, DirReader):  # a parquetdir/arrowdir: its rows stay where they are
            return _build_columnar(r, report, dest, m)
        return _RowBuild(r, report, dest, m, progress).run()
    finally:
        r.close()


@dataclasses.dataclass
class _Gathered:
    """What the pieces of a :class:`_RowBuild` gather beside the rows they copy (added to under its lock)."""

    dropped: int = 0
    """GPU operations dropped (:func:`analyze.read.export.bad_op`)."""
    api_without_pid: int = 0
    """API calls without a thread id (dropped: no process to attribute them to)."""
    ids: list[pl.Series] = dataclasses.field(default_factory=list)
    """The name ids of the rows kept (their names go to ``names.parquet``)."""
    op_keys: list[pl.DataFrame] = dataclasses.field(default_factory=list)
    """Each batch's distinct ``(name_id, label)`` of the GPU operations."""
    ops_calls: list[pl.Series] = dataclasses.field(default_factory=list)
    """The ops' (pid, correlation id) keys, packed (:func:`_call_keys`)."""
    api_calls: list[pl.Series] = dataclasses.field(default_factory=list)
    """The kept API calls' keys, packed."""
    calls_unpacked: bool = False
    """Some keys did not pack: :func:`_rest_of_api` compares the written files instead."""
    early: dict[int, list[pl.DataFrame]] = dataclasses.field(default_factory=dict)
    """The early calls the API pieces read (not stored), by piece, while there are at most ``EARLY_ROWS``."""
    early_rows: int = 0
    """How many early calls the API pieces read."""
    ops_first: dict[int, int] = dataclasses.field(default_factory=dict)
    """Earliest start of a GPU operation per process."""
    api_first: dict[int, int] = dataclasses.field(default_factory=dict)
    """Earliest start of a kept API call per process."""


_Post = Callable[[pl.DataFrame], pl.DataFrame]  # turns a batch of a query's rows into frame rows


class _RowBuild:
    """The store of a SQLite export (:func:`build`): its op and API tables cut into pieces (a table, or a row range
    of a large one), numbered in read order, read by ``_READ_THREADS`` threads into per-process parquet files, with
    StringIds and the NVTX ranges and small tables read meanwhile on two more threads; then the API calls the
    pieces left out (:func:`_rest_of_api`), the names and ``meta.json``."""

    def __init__(self, r: ExportReader, report: str | os.PathLike, dest: Path, m: dict, progress: bool | None):
        self.r, self.report, self.dest, self.m = r, report, dest, m
        self.ops_q, self.api_q = op_queries(r), api_query(r)
        total = sum(r.max_rowid(t) for t, _, _ in self.ops_q) + (r.max_rowid(RUNTIME) if self.api_q else 0)
        self.bar = Progress(total, f"spectrace: reading {Path(report).name}", progress)
        pieces: list[tuple[str, str, _Post, int]] = [
            ("ops", q, post, n) for t, query, post in self.ops_q for q, n in _pieces(r, t, query)]
        if self.api_q:  # the calls the analysis needs by name, and the usual launchers (the rest: _rest_of_api);
            # their ids (from StringIds) are filled in when the threads reach them, read meanwhile on another thread
            post = self.api_q[1]
            pieces += [("api", q, post, n) for q, n in _pieces(r, RUNTIME, self.api_q[0], f"nameId IN ({_KEPT_IDS})")]
        self.pieces = pieces
        # Largest pieces first, so that the threads end together (files keep their read-order numbers); the API
        # pieces last: SQLite passes over their rows but returns a fifth of them, they cost far less a row.
        self.todo = iter(sorted(enumerate(pieces), key=lambda ip: (ip[1][0] == "api", -ip[1][3])))
        # StringIds and the kept ids (once known: kept_known), as a Series and as an SQL list
        self.strings = pl.DataFrame(schema={"name_id": pl.Int64, "name": pl.String})
        self.kept_id_list = pl.Series("name_id", [], pl.Int64)
        self.kept_ids = ""
        self.kept_known = threading.Event()
        # the start before which the API pieces also read the early calls (_early_bound): fixed when the first API
        # piece starts, for all of them (None: no GPU operation read)
        self.bound: int | None = None
        self.bound_fixed = False
        self.counts: dict[str, dict[int, int]] = {"ops": {}, "api": {}}  # rows written per process
        self.gathered = _Gathered()
        self.notes: dict[str, int] = {}
        self.lock = threading.Lock()
        self.errors: list[BaseException] = []
        self.stop = threading.Event()  # set when the build is abandoned: the threads stop after their batch
        self.bad_ops = bad_op(m["duration"])

    def run(self) -> Path:
        """Read everything, write ``meta.json`` last; the first error of any thread is raised here."""
        dest, r, g = self.dest, self.r, self.gathered
        _write(dest / "ops", Path.mkdir)
        _write(dest / "api", Path.mkdir)
        threads = [threading.Thread(target=self._guard, args=(f,))
                   for f in (self._read_names, self._read_ranges, *[self._work] * _READ_THREADS)]
        try:
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        except BaseException:  # Ctrl-C: no thread may write into the folder once it is removed
            self.stop.set()
            _join(threads)
            raise
        finally:
            self.bar.close()
        if self.errors:
            raise self.errors[0]
        api_first = (_rest_of_api(r, dest, self.api_q, self.kept_ids, self.counts["api"], g, len(self.pieces),
                                  self.bound if g.early_rows <= EARLY_ROWS else None) if self.api_q else {})
        ids = pl.concat(g.ids) if g.ids else pl.Series("name_id", [], pl.Int64)
        _write(dest / "names.parquet", _names(self.strings, ids).write_parquet)
        keys = pl.concat(g.op_keys).unique() if g.op_keys else pl.DataFrame(schema=_OP_KEYS)
        _write(dest / "op_keys.parquet", keys.write_parquet)
        r.check_unchanged()
        self.notes.update(api_without_pid=g.api_without_pid, lossy_strings=r.lossy, **self.m["read_warnings"])
        m = self.m
        meta = {
            "key": fingerprint(self.report),
            "report": str(Path(self.report).resolve()),
            "build": uuid.uuid4().hex,
            "export": m["export"],
            "capture": m["capture"],
            "duration": m["duration"],
            "utc": m["utc"],
            "tables": sorted(r.tables),
            "dropped_ops": g.dropped,
            "ops_rows": {str(k): v for k, v in sorted(self.counts["ops"].items())},
            "api_rows": {str(k): v for k, v in sorted(self.counts["api"].items())},
            "api_first": {str(k): v for k, v in sorted(api_first.items())},
            "read_warnings": {k: v for k, v in sorted(self.notes.items()) if v},
            "files": _inventory(dest, full=True),
        }
        meta["check"] = _digest(meta)
        _write(dest / "meta.json", lambda q: q.write_text(json.dumps(meta, indent=1)))
        return dest

    def _guard(self, fn: Callable[[], None]) -> None:
        try:
            fn()
        except BaseException as e:  # re-raised on the calling thread
            self.errors.append(e)

    def _read_names(self) -> None:
        """StringIds, beside the pieces (the API pieces wait for the kept ids)."""
        self.strings = _strings(self.r)
        self.kept_id_list = _kept_ids(self.strings)
        self.kept_ids = ",".join(str(i) for i in self.kept_id_list.to_list())
        self.kept_known.set()

    def _read_ranges(self) -> None:
        """NVTX ranges and the small tables, beside the pieces (their own connections)."""
        r, dest = self.r, self.dest
        ranges, _domains, marks = _ranges(r, self.m["duration"], self.notes)
        for name, df in (("ranges", ranges), ("marks", marks), ("devices", _devices(r)),
                         ("diagnostics", _nsys_diagnostics(r))):
            _write(dest / f"{name}.parquet", df.write_parquet)

    def _stopped(self) -> bool:
        return bool(self.errors) or self.stop.is_set()

    def _work(self) -> None:
        """One reader thread: the next piece until none is left (or the build stops)."""
        while not self._stopped():
            with self.lock:
                item = next(self.todo, None)
            if item is None:
                return
            i, (kind, q, post, n) = item
            if _KEPT_IDS in q:
                while not self.kept_known.wait(0.05):
                    if self._stopped():
                        return
                with self.lock:
                    if not self.bound_fixed:  # fixed when the first API piece starts, for all of them
                        self.bound, self.bound_fixed = _early_bound(self.gathered.ops_first), True
                if self.bound is not None:  # and the early calls (_rest_of_api), in the same pass
                    q = q.replace(f"nameId IN ({_KEPT_IDS})", f"(nameId IN ({_KEPT_IDS}) OR {_early(self.bound)})")
                q = q.replace(_KEPT_IDS, self.kept_ids)
            if not self._piece(i, kind, q, post, n):
                return

    def _piece(self, i: int, kind: str, q: str, post: _Post, n: int) -> bool:
        """Read piece ``i`` into its spill files; False when the build stopped meanwhile."""
        g = self.gathered
        spill, seen = _Spill(self.dest / kind, i, self.counts[kind], self.lock), 0
        for b in self.r.batches(q):
            if self._stopped():
                return False
            df = post(b)
            if kind == "api" and self.bound is not None:  # the early calls apart: not stored
                is_kept = pl.col("name_id").is_in(self.kept_id_list.implode())
                early = df.filter(~is_kept.fill_null(False))
                with self.lock:
                    g.early_rows += early.height
                    if g.early_rows <= EARLY_ROWS:
                        g.early.setdefault(i, []).append(early)
                df = df.filter(is_kept.fill_null(False))
            bad_rows = self.bad_ops if kind == "ops" else BAD_API
            bad = df.select(bad_rows.sum()).item() or 0
            if bad:
                df = df.filter(~bad_rows)
            ids = df["name_id"].unique().drop_nulls()
            keys = _op_keys(df) if kind == "ops" else None
            calls = _call_keys(df)
            first = df.group_by("pid").agg(pl.col("start").min()).iter_rows()
            with self.lock:
                if kind == "ops":
                    g.dropped += int(bad)
                else:
                    g.api_without_pid += int(bad)
                g.ids.append(ids)
                if keys is not None:
                    g.op_keys.append(keys)
                if calls is None:
                    g.calls_unpacked = True
                else:
                    (g.ops_calls if kind == "ops" else g.api_calls).append(calls)
                seen_first = g.ops_first if kind == "ops" else g.api_first
                for p, t in first:
                    if t is not None and (p not in seen_first or t < seen_first[p]):
                        seen_first[p] = t
            spill.add(df)
            self.bar.add(b.height)
            seen += b.height
        spill.flush()
        self.bar.add(max(n - seen, 0))  # rows a filter left out were read all the same
        return True


def _build_columnar(r: DirReader, report: str | os.PathLike, dest: Path, m: dict) -> Path:
    """The store of a columnar export (parquetdir/arrowdir): the small frames and what the rows' reads need, but
    no copy of the rows: :meth:`Store.read` cuts a process's rows from the export's files (the cut pushed into
    polars' scans: :meth:`analyze.read.exportdir.DirReader.process_rows`). One pass over the columns the counts need
    gives what :func:`build` gathers while it copies: rows and first start per process, the dropped ops, the ops'
    distinct names and labels, and (``lost.parquet``) the (pid, correlation id) of ops that no kept API call
    launched, whose launchers the reads add; each process's first call as :func:`_rest_of_api` finds it. The NVTX
    ranges and small tables are read meanwhile on another thread."""
    notes: dict[str, int] = dict(m["read_warnings"])

    def small() -> pl.DataFrame:
        ranges, _domains, marks = _ranges(r, m["duration"], notes)
        for name, df in (("ranges", ranges), ("marks", marks), ("devices", _devices(r)),
                         ("diagnostics", _nsys_diagnostics(r))):
            _write(dest / f"{name}.parquet", df.write_parquet)
        return _strings(r)

    with ThreadPoolExecutor(1) as ex:
        strings_f = ex.submit(small)
        counts = _columnar_counts(r, m["duration"], strings_f, notes)
        strings = strings_f.result()
    _write(dest / "lost.parquet", counts.lost.write_parquet)
    _write(dest / "names.parquet", _names(strings, counts.ids).write_parquet)
    _write(dest / "op_keys.parquet", counts.op_keys.write_parquet)
    r.check_unchanged()
    notes.update(lossy_strings=r.lossy)
    meta = {
        "key": fingerprint(report),
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
        "files": _inventory(dest, full=True),
    }
    meta["check"] = _digest(meta)
    _write(dest / "meta.json", lambda q: q.write_text(json.dumps(meta, indent=1)))
    with _BUILT_ROWS_LOCK:  # for the store opened on this build (_take_rows)
        _BUILT_ROWS[dest] = counts.handed
    return dest


def _take_rows(dest: Path) -> dict[tuple[str, int], pl.DataFrame]:
    """The rows the build into ``dest`` read anyway (:meth:`Store.hand`), once; none when it kept none."""
    with _BUILT_ROWS_LOCK:
        return _BUILT_ROWS.pop(dest, {})


@dataclasses.dataclass
class _ColumnarCounts:
    """What :func:`_build_columnar` keeps of a columnar export's rows (:func:`_columnar_counts`)."""

    dropped: int
    """GPU operations dropped (:func:`analyze.read.export.bad_op`)."""
    ops_rows: dict[int, int]
    """GPU operations per process."""
    api_rows: dict[int, int]
    """API calls a read of the process returns: the kept ones and the launchers of the lost ops."""
    api_first: dict[int, int]
    """Each process's first call (as :func:`_rest_of_api` finds it)."""
    kept_ids: list[int]
    """The name ids of the kept API calls."""
    lost: pl.DataFrame
    """``pid, corr`` of the ops no kept call launched but another call did (its launcher is read with the kept)."""
    ids: pl.Series
    """The name ids of the rows kept (their names go to ``names.parquet``)."""
    op_keys: pl.DataFrame
    """Every distinct ``(name_id, label)`` of the GPU operations."""
    handed: dict[tuple[str, int], pl.DataFrame]
    """``("api", pid)``: the API calls a read of the process returns, read here anyway (:meth:`Store.hand`)."""


def _columnar_counts(r: DirReader, duration: int | None, strings_f: Future[pl.DataFrame],
                     notes: dict[str, int]) -> _ColumnarCounts:
    """What :func:`_build_columnar` keeps of the rows (see there), from narrow reads of the op and API tables."""
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
        keys.append(_op_keys(df))
        ids.append(keys[-1]["name_id"].drop_nulls())  # (their names: _names makes them unique)
        if _packs(df):  # (pid, corr) as one integer: a semi-join is a hash of one column
            packed.append(df.select(key=_KEY))
        else:
            loose.append(df.select("pid", "corr"))
        del df
    kept_ids = _kept_ids(strings_f.result())
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
        # the ops no kept call launched (_unmatched), their (pid, corr) once each
        if _packs(kept):
            have = kept.select(key=_KEY)["key"].implode()
            missing = [df.filter(~pl.col("key").is_in(have)) for df in packed]
            missing = [df.select(pid=pl.col("key") // (1 << 32), corr=pl.col("key") % (1 << 32)) for df in missing]
        else:
            loose += [df.select(pid=pl.col("key") // (1 << 32), corr=pl.col("key") % (1 << 32)) for df in packed]
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
                           op_keys=pl.concat(keys).unique() if keys else pl.DataFrame(schema=_OP_KEYS))


_KEY = pl.col("pid") * (1 << 32) + pl.col("corr")


def _packs(rows: pl.DataFrame) -> bool:
    """Whether every (pid, corr) packs into one integer (:func:`_call_keys`): no null, ids in range."""
    p, c = pl.col("pid"), pl.col("corr")
    fits = (p.is_not_null() & c.is_not_null() & (p >= 0) & (p < 1 << 31) & (c >= 0) & (c < 1 << 32)).fill_null(False)
    return bool(rows.select(fits.all()).item())


def _lazy_post(post, lf: pl.LazyFrame) -> pl.LazyFrame:
    """``post`` (a query's row function, :func:`analyze.read.export.op_queries`) applied to its lazy rows. (It reads
    their schema, never ``.columns``: a PerformanceWarning silenced with ``warnings.catch_warnings`` leaked to stderr
    when two worker threads read at once, that context manager not being thread-safe.)"""
    return post(lf)


def _narrow(post, lf: pl.LazyFrame, columns: list[str]) -> pl.DataFrame:
    """``post`` applied to a query's lazy rows, and only ``columns`` of them read (polars prunes the others)."""
    return _lazy_post(post, lf).select(columns).collect()


_OP_KEYS = {"name_id": pl.Int64, "label": pl.String}


def _op_keys(ops: pl.DataFrame) -> pl.DataFrame:
    """The distinct ``(name_id, label)`` of some GPU operations: by name id alone when they have no label (kernels)."""
    if ops["label"].null_count() == ops.height:
        return ops.select(pl.col("name_id").unique(), label=pl.lit(None, pl.String))
    return ops.select(list(_OP_KEYS)).unique()


def _kept_ids(strings: pl.DataFrame) -> pl.Series:
    """The StringIds ids of the API calls the store keeps (:data:`analyze.model.KEPT_API`), and -1 (so that their
    SQL list is never empty)."""
    ids = strings.filter(pl.col("name").str.contains(KEPT_API))["name_id"].drop_nulls().unique().sort()
    return pl.Series("name_id", [-1, *ids.to_list()], pl.Int64)


def _scan_files(root: Path, cols: list[str]) -> pl.DataFrame:
    files = sorted(root.rglob("*.parquet"))
    return pl.scan_parquet(files).select(cols).collect() if files else pl.DataFrame(schema={c: pl.Int64 for c in cols})


def _unmatched(ops: pl.DataFrame, api: pl.DataFrame) -> pl.DataFrame:
    """``pid, corr`` of the GPU operations that no call in ``api`` has (once each)."""
    have, want = _call_keys(api), _call_keys(ops)
    if have is not None and want is not None:
        return _unmatched_keys([want], [have])
    return ops.select("pid", "corr").join(api.select("pid", "corr"), on=["pid", "corr"], how="anti",
                                          nulls_equal=True).unique()


def _call_keys(rows: pl.DataFrame) -> pl.Series | None:
    """The distinct (pid, correlation id) of some ops or API calls, each as one integer (pid * 2^32 + corr), or None
    when they do not pack (a null, or out of range: CUPTI correlation ids are 32-bit, pids 24-bit)."""
    p, c = rows["pid"], rows["corr"]
    if p.null_count() or c.null_count():
        return None
    if rows.height and (_int(p.min()) < 0 or _int(p.max()) >= 1 << 31 or _int(c.min()) < 0
                        or _int(c.max()) >= 1 << 32):
        return None
    return rows.select((pl.col("pid") * (1 << 32) + pl.col("corr")).unique().alias("key"))["key"]


def _int(value: object) -> int:
    """A column's min or max read out of polars (typed as any literal): an int, checked (the read layer cannot
    import :mod:`analyze.compute.scalars`)."""
    if isinstance(value, int):
        return value
    raise TypeError(f"expected an integer, got {value!r}")


def _unmatched_keys(ops: list[pl.Series], api: list[pl.Series]) -> pl.DataFrame:
    """:func:`_unmatched` from the keys (:func:`_call_keys`) the build took of each batch of ops and of API calls."""
    have = pl.concat(api) if api else pl.Series("key", [], pl.Int64)
    key = pl.col("key")
    lost = (pl.concat(ops).to_frame("key") if ops else pl.DataFrame(schema={"key": pl.Int64})).filter(
        ~key.is_in(have.implode())).unique()
    return lost.select(pid=key // (1 << 32), corr=key % (1 << 32))


def _early_bound(ops_first: dict[int, int]) -> int | None:
    """The start before which a call may be some process's first activity: the latest of the processes' first
    GPU operations (None without any). With a process's first kept call too it is :func:`_rest_of_api`'s bound; taken
    from the rows read so far (earliest starts only come down as more are read), it is at or above that bound for
    every process already seen."""
    return max(ops_first.values(), default=None)


def _early(bound: int | None) -> str:
    """SQL: the calls that may be a process's first (before ``bound``), and those without a thread."""
    return "(globalTid IS NULL" + (f" OR start < {bound})" if bound is not None else ")")


def _rest_of_api(r: ExportReader, dest: Path, api_q: tuple[str, _Post], kept: str, counts: dict[int, int],
                 gathered: _Gathered, piece: int, read_before: int | None = None) -> dict[int, int]:
    """What the analysis needs of the API calls the pieces left out (read with the API pieces or in passes of their own):

    - Each process's first call (its capture window starts there, :func:`analyze.compute.windows.rank_window`):
      only the calls before the first kept call or GPU operation of every process can be earlier.
    - Calls without a thread id (counted, as the pieces count theirs).
    - A call that launched a GPU operation whose (pid, correlation id) no kept call has: written as one more
      piece, so every launching call is in the store (CUPTI gives each call its own correlation id).

    ``gathered``: what the pieces found, among it their earliest start per process, of ops and of kept calls
    (``ops_first``, ``api_first``). ``read_before``: the API pieces also read the early calls before this start
    (:func:`_early_bound`; in ``gathered.early`` by piece):
    when it is not below the bound, no pass for them. Returns pid → start of its first call, for every process with
    GPU operations and calls (exact where it is before the process's first GPU operation).
    """
    ops_first, api_first = gathered.ops_first, gathered.api_first
    bound = max((min(t, api_first.get(p, t)) for p, t in ops_first.items()), default=None)
    rest_of = f"(nameId IS NULL OR nameId NOT IN ({kept}))"
    have = read_before is not None and bound is not None and bound <= read_before
    early = _early(read_before if have else bound)

    def read(q: tuple[str, int]) -> pl.DataFrame:
        parts = [api_q[1](b) for b in r.batches(q[0])]
        return pl.concat(parts) if parts else pl.DataFrame(schema=API_SCHEMA)

    with ThreadPoolExecutor(_READ_THREADS) as ex:
        # the early calls: read with the API pieces (kept in their order), or now (the cheap test on start first)
        # while the GPU operations are checked for their calls
        parts = [df for i in sorted(gathered.early) for df in gathered.early[i]] if have else []
        done = [] if have else [ex.submit(read, q) for q in _pieces(r, RUNTIME, api_q[0], f"{early} AND {rest_of}")]
        if gathered.calls_unpacked:
            lost = _unmatched(_scan_files(dest / "ops", ["pid", "corr"]), _scan_files(dest / "api", ["pid", "corr"]))
        else:
            lost = _unmatched_keys(gathered.ops_calls, gathered.api_calls)
        parts += [f.result() for f in done]
        rest = pl.concat(parts) if parts else pl.DataFrame(schema=API_SCHEMA)
        corrs = lost["corr"].drop_nulls().unique().sort()
        conds = []
        if corrs.len() > 4096:  # a range, cut to the exact ids below
            conds.append(f"correlationId BETWEEN {corrs[0]} AND {corrs[-1]}")
        elif corrs.len():
            conds.append(f"correlationId IN ({','.join(str(c) for c in corrs.to_list())})")
        if lost["corr"].null_count():
            conds.append("correlationId IS NULL")
        if conds:  # the launchers of those operations, among the calls not read yet
            where = f"({' OR '.join(conds)}) AND NOT COALESCE({early}, 0) AND {rest_of}"
            rest = pl.concat([rest, *ex.map(read, _pieces(r, RUNTIME, api_q[0], where))])
    gathered.api_without_pid += rest.filter(BAD_API).height
    rest = rest.filter(~BAD_API)
    early_first = dict(rest.group_by("pid").agg(pl.col("start").min()).iter_rows())
    out = {}
    for p in ops_first:
        starts = [t for t in (api_first.get(p), early_first.get(p)) if t is not None]
        if starts:
            out[p] = min(starts)
    found = rest.join(lost, on=["pid", "corr"], how="semi", nulls_equal=True)
    if found.height:
        spill = _Spill(dest / "api", piece, counts, threading.Lock())
        spill.add(found)
        spill.flush()
        gathered.ids.append(found["name_id"].unique().drop_nulls())
    return out


def _join(threads: list[threading.Thread]) -> None:
    """Wait for every thread, through further Ctrl-C presses (they stop within one batch)."""
    for t in threads:
        while t.is_alive():
            try:
                t.join()
            except KeyboardInterrupt:
                pass


def remove_tree(path: Path) -> None:
    """Remove a folder of ours (a build, a cache), even if Ctrl-C is pressed again meanwhile; its read-only
    folders are made writable first (a cache made read-only is still ours to replace)."""
    while True:
        try:
            _unlock_tree(path)
            shutil.rmtree(path, ignore_errors=True)
            return
        except KeyboardInterrupt:
            continue


def _unlock_tree(path: Path) -> None:
    """Every folder of a tree given read, write and search permission for its owner (where that is us): what
    removing its entries needs. Symbolic links are never followed."""
    def fix(d) -> None:
        with contextlib.suppress(OSError):
            mode = os.lstat(d).st_mode
            if stat.S_ISDIR(mode) and mode & 0o700 != 0o700:
                os.chmod(d, stat.S_IMODE(mode) | 0o700)

    fix(path)
    for top, dirs, _files in os.walk(path):  # top-down: each folder is fixed before it is listed
        for d in dirs:
            fix(os.path.join(top, d))


def _removable(root: Path) -> bool:
    """Whether this process can remove the folder ``root``: rename it within its parent, and empty each of its
    folders (they are ours, or we may write them); a cache of another user is not."""
    me = os.geteuid()

    def ours(d) -> bool:
        try:
            return os.lstat(d).st_uid == me or os.access(d, os.R_OK | os.W_OK | os.X_OK)
        except OSError:
            return False

    if not os.access(root.parent, os.W_OK | os.X_OK) or not ours(root):
        return False
    return all(ours(os.path.join(top, d)) for top, dirs, _files in os.walk(root) for d in dirs)


@contextlib.contextmanager
def _locked(folder: Path):
    """An exclusive lock, between spectrace processes, on installing, replacing and removing the caches of
    ``folder``: ``flock`` on the folder itself (nothing is created; where locks are not supported, none)."""
    try:
        import fcntl

        fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except (ImportError, OSError):
        yield
        return
    try:
        with contextlib.suppress(OSError):
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def _build_id(root: Path) -> str | None:
    """The build id in a cache's meta.json (None: none, or unreadable)."""
    try:
        meta = json.loads((root / "meta.json").read_text())
        return meta.get("build") if isinstance(meta, dict) else None
    except (OSError, ValueError):
        return None


def discard(root: Path, build: str | None) -> None:
    """Remove the cache at ``root`` if it is still build ``build`` (one that cannot be read): a cache another
    process installed meanwhile is left alone."""
    old = None
    with _locked(root.parent):
        if build is not None and is_cache(root) and _build_id(root) == build:
            old = root.with_name(f".{root.name}.old-{uuid.uuid4().hex[:12]}")
            try:
                os.replace(root, old)
            except OSError:
                return
    if old is not None:
        remove_tree(old)


def _alive(host: str, pid: int) -> bool:
    if host != socket.gethostname():
        return True  # cannot tell: only its age makes it stale
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        pass
    return True


def _remove_stale(root: Path) -> None:
    """Remove build folders of ``root`` (``.<name>.tmp-*``, ``.<name>.old-*``) that no live process owns."""
    try:
        found = [*root.parent.glob(f".{root.name}.tmp-*"), *root.parent.glob(f".{root.name}.old-*")]
    except OSError:
        return
    for d in found:
        try:
            if d.is_symlink() or not d.is_dir():
                continue
            age = time.time() - d.stat().st_mtime
            owner = json.loads((d / MARKER).read_text()) if (d / MARKER).is_file() else None
        except (OSError, ValueError):
            continue
        if owner is None:  # made, not yet marked (or never): only when empty and old
            if age > _STALE_S and not any(d.iterdir()):
                d.rmdir()
            continue
        if ".old-" in d.name or age > _STALE_S or not _alive(owner.get("host", ""), int(owner.get("pid", 0))):
            remove_tree(d)


def _write_error(reason, where: Path) -> CacheWriteError:
    return CacheWriteError(f"{where}: cannot write the cache ({reason}); set SPECTRACE_CACHE_DIR to a writable "
                           "folder to keep one", "CACHE_WRITE", reason=str(reason))


def _outside_input(root: Path, report: Path) -> None:
    """A cache is never written inside its input (a parquetdir/arrowdir export is a folder): a CacheWriteError."""
    rp = report.resolve()
    if rp.is_dir():
        rr = root.resolve()
        if rr == rp or rp in rr.parents:
            raise CacheWriteError(f"{root}: inside the input {report}; spectrace never writes into an input: set "
                                  "SPECTRACE_CACHE_DIR to a folder outside it to keep a cache", "CACHE_WRITE")


def _found(root: Path, key: dict, broken: str | None, report) -> Store | None:
    """The cache at ``root`` when it verifies for ``key`` and is not build ``broken``; else None."""
    try:
        why, meta = _problem(root, key)
    except OSError:
        return None
    if why is None and (broken is None or meta.get("build") != broken):
        return Store(root, report=report, meta=meta)
    return None


def existing_store(report: str | os.PathLike, cache_dir: Path | None = None) -> Store | None:
    """The report's cache if one is there and verifies for the report; None otherwise: nothing is built or
    written, and a cache path that cannot be looked up (a name too long, no valid place) is no cache."""
    p = Path(report)
    try:
        if not p.exists():
            return None
        root = cache_dir or cache_dir_for(p)
        if not root.is_dir():
            return None
    except (OSError, CacheWriteError):
        return None
    return _found(root, fingerprint(p), None, report)


def open_store(report: str | os.PathLike, progress: bool | None = None, cache_dir: Path | None = None,
               broken: str | None = None) -> Store:
    """The cache of ``report``: reused when it verifies (:func:`problem`), else (re)built atomically, once.

    ``broken``: the build id of a cache whose files could not be read: that build is replaced, but a cache
    another process installed since is used. A folder in the way that is not a spectrace cache is never touched:
    a one-line error. A cache that cannot be written there (or not replaced: another user's) is a
    :class:`CacheWriteError`, with nothing left behind.
    """
    p = Path(report)
    key = fingerprint(p)
    root = cache_dir or cache_dir_for(p)
    _outside_input(root, p)
    found = _found(root, key, broken, report)
    if found is not None:
        return found
    if (root.exists() or root.is_symlink()) and not is_cache(root):
        raise InputError(f"{root}: is in the way of the cache and is not a spectrace cache; spectrace will not "
                         "replace it: move it, or set SPECTRACE_CACHE_DIR", "CACHE_IN_THE_WAY")
    try:
        root.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise _write_error(e.strerror or e, root.parent) from None
    _remove_stale(root)
    tmp = root.with_name(f".{root.name}.tmp-{uuid.uuid4().hex[:12]}")
    old = None
    try:  # whatever happens (errors, Ctrl-C, another process installing first), tmp and old do not outlive this
        try:
            build(p, tmp, progress)
        except CacheWriteError as e:
            raise _write_error(e.reason, root) from None
        built = _take_rows(tmp)
        if fingerprint(p) != key:  # the report changed while we read it: do not keep what we read
            raise InputError(f"{p}: the report changed while it was read; try again", "CHANGED")
        mine = _build_id(tmp)
        try:
            with _locked(root.parent):
                found = _found(root, key, broken, report)
                if found is not None:  # another process installed a good one meanwhile: ours is not needed
                    return found
                if root.exists() or root.is_symlink():
                    if not is_cache(root):
                        raise InputError(f"{root}: is in the way of the cache and is not a spectrace cache",
                                         "CACHE_IN_THE_WAY")
                    if not _removable(root):
                        raise CacheWriteError(f"{root}: cannot replace the cache there (its folders are another "
                                              "user's, or read-only)", "CACHE_WRITE")
                    old = root.with_name(f".{root.name}.old-{uuid.uuid4().hex[:12]}")
                    os.replace(root, old)
                os.replace(tmp, root)
        except OSError as e:
            raise _write_error(e.strerror or e, root) from None
    finally:
        _take_rows(tmp)  # rows a failed build read go with it
        if tmp.exists():
            remove_tree(tmp)
        if old is not None:
            remove_tree(old)
    found = _found(root, key, None, report)
    if found is None:  # not kept: a cache that does not verify is never used
        why = problem(root, key)
        discard(root, mine)
        raise CacheError(f"{root}: the cache does not verify right after it was built ({why}), so it was removed; "
                         "check the disk, or set SPECTRACE_CACHE_DIR to another place", "CACHE_BROKEN")
    if found.meta.get("build") == mine:  # the rows our build read are this cache's
        found.hand(built)
    return found


def temporary_store(report: str | os.PathLike, progress: bool | None = None) -> tuple[Store, Path]:
    """A store in a temporary directory (the caller removes it; removed here if the build fails or is interrupted):
    streaming without keeping a cache. One that cannot be written: a :class:`CacheWriteError` (code TMP_WRITE)."""
    try:
        tmp = Path(tempfile.mkdtemp(prefix="spectrace-"))
    except OSError as e:
        raise CacheWriteError(f"{tempfile.gettempdir()}: cannot create a temporary folder ({e.strerror}); set "
                              "TMPDIR to a writable folder", "TMP_WRITE", reason=e.strerror) from None
    try:
        try:
            build(report, tmp / "c", progress)
        except CacheWriteError as e:
            raise CacheWriteError(f"{tmp}: cannot write a temporary store ({e.reason}); set TMPDIR to a writable "
                                  "folder, or pass --no-store", "TMP_WRITE", reason=e.reason) from None
        s = Store(tmp / "c", kept=False, report=report)
        s.hand(_take_rows(tmp / "c"))
        return s, tmp
    except BaseException:
        _take_rows(tmp / "c")
        remove_tree(tmp)
        raise
