"""A cache of parsed frames: an nsys export's frames as parquet, split by process, beside the report.

One pass over the export (SQLite through ADBC record batches, or a parquetdir/arrowdir through
polars scans) writes the frames :func:`analyze.read.export.load` would build, already normalised, as::

    <report>.spectrace/            (or $SPECTRACE_CACHE_DIR / ~/.cache/spectrace/<hash>/ if the
      meta.json                     report's directory is not writable; the report is never touched)
      ranges.parquet marks.parquet names.parquet devices.parquet diagnostics.parquet
      ops/<pid>/<part>.parquet     GPU operations of one process, parts in read order
      api/<pid>/<part>.parquet     CUDA API calls of one process

Memory stays bounded while building: batches are buffered per process and flushed to parquet
every ~2 M rows. ``meta.json`` records the key — spectrace's cache format version and the
report's resolved path, size and mtime (per file for a directory) — and is written last; the
directory is built under a temporary name and renamed into place, so a half-written cache is never
used, and a cache whose key differs is rebuilt. If the report changes while the cache is built,
the new cache is thrown away.

The analysis (:mod:`analyze.compute.pipeline`, through :mod:`analyze.read.source`) reads one process at a
time from here; notebooks re-open a large trace from here in well under a second (:meth:`Store.scan` is lazy).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

import polars as pl

from ..model import InputError, Trace
from .export import (
    API_SCHEMA,
    BAD_OP,
    OPS_SCHEMA,
    _devices,
    _names,
    _nsys_diagnostics,
    _ranges,
    _strings,
    api_query,
    op_queries,
    open_reader,
    read_meta,
)

CACHE_VERSION = 3  # 2: ranges have ``range_id`` and ``range`` (were row_id, text); 3: marks.parquet
FLUSH_ROWS = 2_000_000
PIECE_ROWS = 2_000_000  # a large table is read in row ranges of this size, by READ_THREADS threads
READ_THREADS = max(2, min(4, os.cpu_count() or 2))
SUFFIX = ".spectrace"


def fingerprint(report: str | os.PathLike) -> dict:
    """What the cache is keyed by: format version, resolved path, and size + mtime of every file."""
    p = Path(report).resolve()
    files = sorted(f for f in p.iterdir() if f.is_file()) if p.is_dir() else [p]
    return {
        "cache_version": CACHE_VERSION,
        "path": str(p),
        "files": [[f.name, f.stat().st_size, f.stat().st_mtime_ns] for f in files],
    }


def cache_dir_for(report: str | os.PathLike) -> Path:
    """``<report>.spectrace`` beside the report if its directory is writable, else in the user cache dir."""
    p = Path(report).resolve()
    env = os.environ.get("SPECTRACE_CACHE_DIR")
    if not env and _writable(p.parent):
        return p.parent / (p.name + SUFFIX)
    base = Path(env) if env else Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "spectrace"
    return base / (hashlib.sha1(str(p).encode()).hexdigest()[:16] + "_" + p.name + SUFFIX)


def _writable(d: Path) -> bool:
    """Writable, and not marked read-only: root passes ``os.access`` on an ``r-x`` directory, we do not write there."""
    try:
        return os.access(d, os.W_OK) and bool(d.stat().st_mode & 0o222)
    except OSError:
        return False


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
        self.root, self.piece, self.buf, self.rows, self.part = root, piece, {}, 0, 0
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
            d.mkdir(parents=True, exist_ok=True)
            df = pl.concat(parts)
            df.write_parquet(d / f"{self.piece:05d}-{self.part:05d}.parquet", compression="lz4", statistics=False)
            with self.lock:
                self.counts[pid] = self.counts.get(pid, 0) + df.height
        self.buf, self.rows, self.part = {}, 0, self.part + 1


def _pieces(r, table: str, query: str) -> list[str]:
    """``query`` over ``table`` cut into row ranges that can be read in parallel (SQLite only)."""
    n = r.max_rowid(table)
    if not r.splittable or n <= PIECE_ROWS:
        return [query]
    return [f"{query} WHERE rowid > {lo} AND rowid <= {lo + PIECE_ROWS}" for lo in range(0, n, PIECE_ROWS)]


class Store:
    """An opened cache: metadata in memory, frames on disk."""

    def __init__(self, root: Path):
        self.root = root
        self.meta = json.loads((root / "meta.json").read_text())

    @property
    def pids(self) -> list[int]:
        """Processes with GPU operations or API calls, ascending."""
        return sorted({int(p) for p in (*self.meta["ops_rows"], *self.meta["api_rows"])})

    def scan(self, kind: str, pids: list[int] | None = None) -> pl.LazyFrame:
        """``ops`` or ``api`` rows of some processes (all by default), lazily; or a small frame by name."""
        if kind not in ("ops", "api"):
            return pl.scan_parquet(self.root / f"{kind}.parquet")
        have = self.meta[f"{kind}_rows"]
        files = [f for p in (pids if pids is not None else self.pids) if str(p) in have
                 for f in sorted((self.root / kind / str(p)).glob("*.parquet"))]
        if not files:
            return pl.LazyFrame(schema=OPS_SCHEMA if kind == "ops" else API_SCHEMA)
        return pl.scan_parquet(files)

    def head(self, ops: pl.DataFrame | None = None, api: pl.DataFrame | None = None) -> Trace:
        """A :class:`Trace` with the small frames, and the given (or no) ops and API calls."""
        m = self.meta
        e = m["export"]
        return Trace(
            path=m["report"],
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
        )

    def trace(self) -> Trace:
        """The whole trace in memory, as :func:`analyze.read.export.load` returns it (ops grouped by process)."""
        return self.head(ops=self.scan("ops").collect(), api=self.scan("api").collect())


def build(report: str | os.PathLike, dest: Path, progress: bool | None = None) -> Path:
    """Parse ``report`` into a new cache directory ``dest`` (must not exist)."""
    r = open_reader(report)
    try:
        m = read_meta(r)
        dest.mkdir(parents=True)
        strings = _strings(r)
        _devices(r).write_parquet(dest / "devices.parquet")
        _nsys_diagnostics(r).write_parquet(dest / "diagnostics.parquet")
        ops_q, api_q = op_queries(r), api_query(r)
        total = sum(r.max_rowid(t) for t, _, _ in ops_q) + (r.max_rowid("CUPTI_ACTIVITY_KIND_RUNTIME") if api_q else 0)
        bar = Progress(total, f"spectrace: reading {Path(report).name}", progress)
        # Pieces (a table, or a row range of a large one) in read order; the threads take the next one.
        pieces = [("ops", q, post) for t, query, post in ops_q for q in _pieces(r, t, query)]
        if api_q:
            pieces += [("api", q, api_q[1]) for q in _pieces(r, "CUPTI_ACTIVITY_KIND_RUNTIME", api_q[0])]
        counts: dict[str, dict[int, int]] = {"ops": {}, "api": {}}
        lock = threading.Lock()
        stats = {"dropped": 0, "ids": []}
        todo = iter(enumerate(pieces))
        errors: list[BaseException] = []

        def work() -> None:
            while not errors:
                with lock:
                    i, (kind, q, post) = next(todo, (None, (None, None, None)))
                if i is None:
                    return
                spill = _Spill(dest / kind, i, counts[kind], lock)
                for b in r.batches(q):
                    df = post(b)
                    bad = (df.select(BAD_OP.sum()).item() or 0) if kind == "ops" else 0
                    if bad:
                        df = df.filter(~BAD_OP)
                    ids = df["name_id"].unique().drop_nulls()
                    with lock:
                        stats["dropped"] += int(bad)
                        stats["ids"].append(ids)
                    spill.add(df)
                    bar.add(b.height)
                spill.flush()

        def read_ranges() -> None:  # NVTX ranges, beside the pieces (its own connection)
            ranges, _domains, marks = _ranges(r, m["duration"])
            ranges.write_parquet(dest / "ranges.parquet")
            marks.write_parquet(dest / "marks.parquet")

        def guard(fn) -> None:
            try:
                fn()
            except BaseException as e:  # re-raised on the calling thread
                errors.append(e)

        (dest / "ops").mkdir()
        (dest / "api").mkdir()
        threads = [threading.Thread(target=guard, args=(f,)) for f in (read_ranges, *[work] * READ_THREADS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        bar.close()
        if errors:
            raise errors[0]
        ids = pl.concat(stats["ids"]) if stats["ids"] else pl.Series("name_id", [], pl.Int64)
        _names(strings, ids).write_parquet(dest / "names.parquet")
        meta = {
            "key": fingerprint(report),
            "report": str(r.path),
            "export": m["export"],
            "capture": m["capture"],
            "duration": m["duration"],
            "utc": m["utc"],
            "tables": sorted(r.tables),
            "dropped_ops": stats["dropped"],
            "ops_rows": {str(k): v for k, v in sorted(counts["ops"].items())},
            "api_rows": {str(k): v for k, v in sorted(counts["api"].items())},
        }
        (dest / "meta.json").write_text(json.dumps(meta, indent=1))
        return dest
    finally:
        r.close()


def _valid(root: Path, key: dict) -> bool:
    try:
        return json.loads((root / "meta.json").read_text())["key"] == key
    except (OSError, ValueError, KeyError):
        return False


def existing_store(report: str | os.PathLike, cache_dir: Path | None = None) -> Store | None:
    """The report's cache if one is there and its key matches the report; None otherwise (nothing built)."""
    p = Path(report)
    if not p.exists():
        return None
    root = cache_dir or cache_dir_for(p)
    return Store(root) if _valid(root, fingerprint(p)) else None


def open_store(report: str | os.PathLike, progress: bool | None = None, cache_dir: Path | None = None) -> Store:
    """The cache of ``report``: reused when its key matches, else (re)built atomically."""
    p = Path(report)
    if not p.exists():
        raise InputError(f"{p}: no such file", "NO_FILE")
    key = fingerprint(p)
    root = cache_dir or cache_dir_for(p)
    if _valid(root, key):
        return Store(root)
    root.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{root.name}.tmp-", dir=root.parent))
    try:
        build(p, tmp / "c", progress)
        if fingerprint(p) != key:  # the report changed while we read it: do not keep what we read
            raise InputError(f"{p}: the report changed while it was read; try again", "CHANGED")
        if root.exists():
            old = root.with_name(f".{root.name}.old-{os.getpid()}")
            os.replace(root, old)
            shutil.rmtree(old, ignore_errors=True)
        try:
            os.replace(tmp / "c", root)
        except OSError:  # another process installed it first: theirs is as good
            if not _valid(root, key):
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return Store(root)


def temporary_store(report: str | os.PathLike, progress: bool | None = None) -> tuple[Store, Path]:
    """A store in a temporary directory (the caller removes it): streaming without keeping a cache."""
    tmp = Path(tempfile.mkdtemp(prefix="spectrace-"))
    build(report, tmp / "c", progress)
    return Store(tmp / "c"), tmp
