"""A cache of parsed frames: an nsys export's frames as parquet, split by process, beside the report.

One pass over the export (SQLite through ADBC record batches, or a parquetdir/arrowdir through
polars scans) writes the frames :func:`analyze.read.export.load` would build, already normalised, as::

    <report>.spectrace/            (or $SPECTRACE_CACHE_DIR / ~/.cache/spectrace/<hash>/ if the
      meta.json                     report's directory is not writable; the report is never touched)
      ranges.parquet marks.parquet names.parquet devices.parquet diagnostics.parquet
      op_keys.parquet              every distinct (name_id, label) of the GPU operations
      ops/<pid>/<part>.parquet     GPU operations of one process, parts in read order
      api/<pid>/<part>.parquet     CUDA API calls of one process: the ones the analysis needs (below)

API calls: those matching :data:`analyze.model.KEPT_API` (chosen in the SQL: the calls that launch nothing are
most of a large API table and never cross into Python), plus every call that launched a GPU operation no kept call
accounts for (:func:`_rest_of_api`: the operations' (pid, correlation id) keys are taken while they are read, the
missing launchers in one more pass); ``meta.json``'s ``api_first`` has each process's first call of all (its
capture window opens there; the early calls come with the API pieces, or in a pass of their own).

Memory stays bounded while building: batches are buffered per process and flushed to parquet
every ~2 M rows. ``meta.json`` records the key — spectrace's cache format version and the
report's resolved path, size and mtime (per file for a directory; the ``-wal`` too) — and every
parquet file with its row count, size, a CRC-32 of its last 64 KiB (the parquet footer) and one of
the whole file, and a digest of itself; it is written last. A cache is used only when all of that
still holds: on every open, each file's size, footer row count and tail CRC (a stat and one 64 KiB
read per file); as a process's rows are read, each file's whole CRC. Otherwise it is rebuilt once,
and a cache that fails again is a one-line error naming its folder.

Safety: the directory is built under a temporary name (``.<name>.tmp-*``) and renamed into place,
so a half-written cache is never used; a build that fails or is interrupted stops its reader
threads and removes its folder, and one left by a process that died is removed by the next build. A
``SPECTRACE_CACHE`` marker file says a folder is a spectrace cache: nothing else is ever replaced
or removed. If the report changes while the cache is built, the new cache is thrown away.

The analysis (:mod:`analyze.compute.pipeline`, through :mod:`analyze.read.source`) reads one process at a
time from here; notebooks re-open a large trace from here in well under a second (:meth:`Store.scan` is lazy).
"""

from __future__ import annotations

import hashlib
import json
import mmap
import os
import shutil
import socket
import sys
import tempfile
import threading
import time
import uuid
import zlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import polars as pl
from polars.exceptions import PanicException

from ..model import KEPT_API, InputError, Trace
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
from .sqlite import check_file, file_state

CACHE_VERSION = 7  # 2: ranges have ``range_id`` and ``range``; 3: marks.parquet; 4: marker, files listed, checks;
# 5: only the API calls the analysis needs, and each process's first call (``api_first``); 6: op_keys.parquet;
# 7: ops carry their CUDA graph's id (``graph``)
FLUSH_ROWS = 2_000_000
PIECE_ROWS = 2_000_000  # a large table is read in row ranges of this size, by READ_THREADS threads
READ_THREADS = max(2, min(4, os.cpu_count() or 2))
KEPT_IDS = "/*kept API name ids*/"  # in the API pieces' SQL until StringIds is read
EARLY_ROWS = 1_000_000  # early calls kept from the API pieces at most (more: their own pass, see _rest_of_api)
SUFFIX = ".spectrace"
MARKER = "SPECTRACE_CACHE"  # in every cache folder (and every folder a build writes): it is ours to replace
TAIL = 65536  # bytes of each file's end in its checksum: the parquet footer (row counts, offsets) and more
STALE_S = 24 * 3600  # a build folder this old, or left by a dead process on this host, is removed


class CacheError(InputError):
    """A cache folder that cannot be read or does not verify. ``store``: the kept cache it happened in (the
    analysis rebuilds that once), None for a temporary store or a cache that was just built."""

    def __init__(self, message: str, code: str = "CACHE", store: Store | None = None):
        super().__init__(message, code)
        self.store = store

    def __reduce__(self):
        return (type(self), (str(self), self.code))


def fingerprint(report: str | os.PathLike) -> dict:
    """What the cache is keyed by: format version, resolved path, and size + mtime of every file (a SQLite
    file's ``-wal`` included)."""
    if not Path(report).is_dir():
        check_file(report)  # one line for a missing, unreadable, non-regular or non-SQLite file
    p = Path(report).resolve()
    try:
        if p.is_dir():
            files = [[f.name, f.stat().st_size, f.stat().st_mtime_ns] for f in sorted(p.iterdir()) if f.is_file()]
        else:
            files = file_state(p)
    except OSError as e:
        raise InputError(f"{report}: cannot read it ({e.strerror})", "UNREADABLE") from None
    if not files:
        raise InputError(f"{report}: no such file", "NO_FILE")
    return {"cache_version": CACHE_VERSION, "path": str(p), "files": files}


def cache_dir_for(report: str | os.PathLike) -> Path:
    """``<report>.spectrace`` beside the report if its directory is writable, else in the user cache dir
    (``$SPECTRACE_CACHE_DIR``, else ``$XDG_CACHE_HOME/spectrace`` or ``~/.cache/spectrace``; empty or relative
    variables are ignored, as the XDG spec says)."""
    p = Path(report).resolve()
    env = os.environ.get("SPECTRACE_CACHE_DIR") or None
    if not env and _writable(p.parent) and _utf8(p):  # polars reads and writes only UTF-8 paths
        return p.parent / (p.name + SUFFIX)
    xdg = os.environ.get("XDG_CACHE_HOME") or ""
    base = Path(env) if env else (Path(xdg) if os.path.isabs(xdg) else Path.home() / ".cache") / "spectrace"
    name = os.fsencode(p.name).decode(errors="replace")
    return base / (hashlib.sha1(os.fsencode(p)).hexdigest()[:16] + "_" + name + SUFFIX)


def _utf8(p: Path) -> bool:
    try:
        str(p).encode()
        return True
    except UnicodeEncodeError:
        return False


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
            df.write_parquet(d / f"{self.piece:05d}-{self.part:05d}.parquet", compression="uncompressed", statistics=False)
            with self.lock:
                self.counts[pid] = self.counts.get(pid, 0) + df.height
        self.buf, self.rows, self.part = {}, 0, self.part + 1


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


def inventory(root: Path, full: bool = False) -> dict[str, list]:
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
    try:
        meta = json.loads((root / "meta.json").read_text())
    except FileNotFoundError:
        return "no meta.json"
    except (OSError, ValueError) as e:
        return f"meta.json unreadable ({e})"
    if not isinstance(meta, dict) or (key is not None and meta.get("key") != key):
        return "stale"
    if meta.get("check") != _digest(meta):
        return "meta.json does not match its digest (edited?)"
    if not all(isinstance(v, list) and len(v) == 4 for v in meta.get("files", {}).values()):
        return "stale"  # files listed in another layout
    if not (root / MARKER).is_file():
        return f"no {MARKER} marker"
    try:
        have = inventory(root)
    except Exception as e:  # OSError, or a file pyarrow cannot parse
        return f"a file cannot be read ({_one_line(e)})"
    listed = {k: v[:3] for k, v in meta.get("files", {}).items()}
    have = {k: v[:3] for k, v in have.items()}
    if have != listed:
        diff = sorted(set(have) ^ set(listed)) or sorted(k for k in have if have[k] != listed[k])
        what = "missing" if diff[0] in listed and diff[0] not in have else "unlisted" if diff[0] not in listed \
            else "changed"
        return f"{diff[0]} {what}"
    for kind in ("ops", "api"):
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
    not a temporary store."""

    def __init__(self, root: Path, kept: bool = True):
        self.root, self.kept = root, kept
        self.meta = self.reading(lambda: json.loads((root / "meta.json").read_text()))

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
            read_warnings=m.get("read_warnings", {}),
            api_first=self.api_first,
        )

    def read(self, kind: str, pid: int, columns: tuple[str, ...] | None = None) -> pl.DataFrame:
        """All ``ops`` or ``api`` rows of one process (only ``columns``, if given), each file checked against its
        CRC-32 as it is read (a :class:`CacheError` if a file cannot be read or does not match)."""
        for f in self.files(kind, pid):  # each file's CRC (from the page cache), then read by polars
            self.check(f.relative_to(self.root).as_posix())
        lf = self.scan(kind, [pid])
        return self.reading(lambda: (lf if columns is None else lf.select(columns)).collect())

    def trace(self) -> Trace:
        """The whole trace in memory, as :func:`analyze.read.export.load` returns it (ops grouped by process)."""
        return self.head(ops=self.reading(lambda: self.scan("ops").collect()),
                         api=self.reading(lambda: self.scan("api").collect()))


def _mark(dest: Path) -> None:
    """The marker: this folder is a spectrace cache, being built by this process (host, pid) until renamed."""
    owner = {"spectrace_cache": CACHE_VERSION, "host": socket.gethostname(), "pid": os.getpid()}
    (dest / MARKER).write_text(json.dumps(owner) + "\n")


def build(report: str | os.PathLike, dest: Path, progress: bool | None = None) -> Path:
    """Parse ``report`` into a new cache directory ``dest`` (must not exist; removed by the caller on failure)."""
    r = open_reader(report)
    try:
        m = read_meta(r)
        dest.mkdir(parents=True)
        _mark(dest)
        ops_q, api_q = op_queries(r), api_query(r)
        total = sum(r.max_rowid(t) for t, _, _ in ops_q) + (r.max_rowid("CUPTI_ACTIVITY_KIND_RUNTIME") if api_q else 0)
        bar = Progress(total, f"spectrace: reading {Path(report).name}", progress)
        # Pieces (a table, or a row range of a large one), numbered in read order; the threads take the next one.
        pieces = [("ops", q, post, n) for t, query, post in ops_q for q, n in _pieces(r, t, query)]
        if api_q:  # the calls the analysis needs by name, and the usual launchers (the rest: _rest_of_api); their
            # ids (from StringIds) are filled in when the threads reach them, read meanwhile on this thread
            pieces += [("api", q, api_q[1], n) for q, n in _pieces(r, RUNTIME, api_q[0], f"nameId IN ({KEPT_IDS})")]
        kept = {}  # "strings": StringIds; "ids": the kept ids as an SQL list, once known; "bound": see _early_bound
        kept_known = threading.Event()
        counts: dict[str, dict[int, int]] = {"ops": {}, "api": {}}
        lock = threading.Lock()
        stats = {"dropped": 0, "ids": [], "op_keys": [], "api_without_pid": 0, "ops_calls": [], "api_calls": [],
                 "calls_unpacked": False, "early": {}, "early_rows": 0}
        firsts: dict[str, dict[int, int]] = {"ops": {}, "api": {}}  # earliest start per process
        notes: dict[str, int] = {}
        # Largest pieces first, so that the threads end together (files keep their read-order numbers); the API
        # pieces last: SQLite passes over their rows but returns a fifth of them, they cost far less a row.
        todo = iter(sorted(enumerate(pieces), key=lambda ip: (ip[1][0] == "api", -ip[1][3])))
        errors: list[BaseException] = []
        stop = threading.Event()  # set when the build is abandoned: the threads stop after their batch
        bad_ops = bad_op(m["duration"])

        def work() -> None:
            while not errors and not stop.is_set():
                with lock:
                    i, (kind, q, post, n) = next(todo, (None, (None, None, None, None)))
                if i is None:
                    return
                if KEPT_IDS in q:
                    while not kept_known.wait(0.05):
                        if errors or stop.is_set():
                            return
                    with lock:
                        if "bound" not in kept:  # fixed when the first API piece starts, for all of them
                            kept["bound"] = _early_bound(firsts["ops"])
                    if kept["bound"] is not None:  # and the early calls (_rest_of_api), in the same pass
                        q = q.replace(f"nameId IN ({KEPT_IDS})", f"(nameId IN ({KEPT_IDS}) OR {_early(kept['bound'])})")
                    q = q.replace(KEPT_IDS, kept["ids"])
                spill, seen = _Spill(dest / kind, i, counts[kind], lock), 0
                for b in r.batches(q):
                    if errors or stop.is_set():
                        return
                    df = post(b)
                    if kind == "api" and kept.get("bound") is not None:  # the early calls apart: not stored
                        is_kept = pl.col("name_id").is_in(kept["id_list"].implode())
                        early = df.filter(~is_kept.fill_null(False))
                        with lock:
                            stats["early_rows"] += early.height
                            if stats["early_rows"] <= EARLY_ROWS:
                                stats["early"].setdefault(i, []).append(early)
                        df = df.filter(is_kept.fill_null(False))
                    bad = df.select((bad_ops if kind == "ops" else BAD_API).sum()).item() or 0
                    if bad:
                        df = df.filter(~(bad_ops if kind == "ops" else BAD_API))
                    ids = df["name_id"].unique().drop_nulls()
                    keys = _op_keys(df) if kind == "ops" else None
                    calls = _call_keys(df)
                    first = df.group_by("pid").agg(pl.col("start").min()).iter_rows()
                    with lock:
                        stats["dropped" if kind == "ops" else "api_without_pid"] += int(bad)
                        stats["ids"].append(ids)
                        if keys is not None:
                            stats["op_keys"].append(keys)
                        if calls is None:
                            stats["calls_unpacked"] = True
                        else:
                            stats[f"{kind}_calls"].append(calls)
                        seen_first = firsts[kind]
                        for p, t in first:
                            if t is not None and (p not in seen_first or t < seen_first[p]):
                                seen_first[p] = t
                    spill.add(df)
                    bar.add(b.height)
                    seen += b.height
                spill.flush()
                bar.add(max(n - seen, 0))  # rows a filter left out were read all the same


        def read_names() -> None:  # StringIds, beside the pieces (the API pieces wait for the kept ids)
            kept["strings"] = _strings(r)
            kept["id_list"] = _kept_ids(kept["strings"])
            kept["ids"] = ",".join(str(i) for i in kept["id_list"].to_list())
            kept_known.set()

        def read_ranges() -> None:  # NVTX ranges and the small tables, beside the pieces (their own connections)
            ranges, _domains, marks = _ranges(r, m["duration"], notes)
            ranges.write_parquet(dest / "ranges.parquet")
            marks.write_parquet(dest / "marks.parquet")
            _devices(r).write_parquet(dest / "devices.parquet")
            _nsys_diagnostics(r).write_parquet(dest / "diagnostics.parquet")

        def guard(fn) -> None:
            try:
                fn()
            except BaseException as e:  # re-raised on the calling thread
                errors.append(e)

        (dest / "ops").mkdir()
        (dest / "api").mkdir()
        threads = [threading.Thread(target=guard, args=(f,)) for f in (read_names, read_ranges, *[work] * READ_THREADS)]
        try:
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        except BaseException:  # Ctrl-C: no thread may write into the folder once it is removed
            stop.set()
            _join(threads)
            raise
        finally:
            bar.close()
        if errors:
            raise errors[0]
        api_first = (_rest_of_api(r, dest, api_q, kept["ids"], counts["api"], stats, len(pieces), firsts,
                                  kept.get("bound") if stats["early_rows"] <= EARLY_ROWS else None) if api_q else {})
        ids = pl.concat(stats["ids"]) if stats["ids"] else pl.Series("name_id", [], pl.Int64)
        _names(kept["strings"], ids).write_parquet(dest / "names.parquet")
        keys = pl.concat(stats["op_keys"]).unique() if stats["op_keys"] else pl.DataFrame(schema=OP_KEYS)
        keys.write_parquet(dest / "op_keys.parquet")
        r.check_unchanged()
        notes.update(api_without_pid=stats["api_without_pid"], lossy_strings=r.lossy)
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
            "api_first": {str(k): v for k, v in sorted(api_first.items())},
            "read_warnings": {k: v for k, v in sorted(notes.items()) if v},
            "files": inventory(dest, full=True),
        }
        meta["check"] = _digest(meta)
        (dest / "meta.json").write_text(json.dumps(meta, indent=1))
        return dest
    finally:
        r.close()


OP_KEYS = {"name_id": pl.Int64, "label": pl.String}


def _op_keys(ops: pl.DataFrame) -> pl.DataFrame:
    """The distinct ``(name_id, label)`` of some GPU operations: by name id alone when they have no label (kernels)."""
    if ops["label"].null_count() == ops.height:
        return ops.select(pl.col("name_id").unique(), label=pl.lit(None, pl.String))
    return ops.select(list(OP_KEYS)).unique()


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
    if rows.height and (p.min() < 0 or p.max() >= 1 << 31 or c.min() < 0 or c.max() >= 1 << 32):
        return None
    return rows.select((pl.col("pid") * (1 << 32) + pl.col("corr")).unique().alias("key"))["key"]


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


def _rest_of_api(r, dest: Path, api_q, kept: str, counts: dict[int, int], stats: dict, piece: int,
                 firsts: dict[str, dict[int, int]], read_before: int | None = None) -> dict[int, int]:
    """What the analysis needs of the API calls the pieces left out (read with the API pieces or in passes of their own):

    - Each process's first call (its capture window starts there, :func:`analyze.compute.windows.rank_window`):
      only the calls before the first kept call or GPU operation of every process can be earlier.
    - Calls without a thread id (counted, as the pieces count theirs).
    - A call that launched a GPU operation whose (pid, correlation id) no kept call has: written as one more
      piece, so every launching call is in the store (CUPTI gives each call its own correlation id).

    ``firsts``: the pieces' earliest start per process, of ``ops`` and of kept ``api`` calls. ``read_before``: the
    API pieces also read the early calls before this start (:func:`_early_bound`; in ``stats["early"]`` by piece):
    when it is not below the bound, no pass for them. Returns pid → start of its first call, for every process with
    GPU operations and calls (exact where it is before the process's first GPU operation).
    """
    ops_first, api_first = firsts["ops"], firsts["api"]
    bound = max((min(t, api_first.get(p, t)) for p, t in ops_first.items()), default=None)
    rest_of = f"(nameId IS NULL OR nameId NOT IN ({kept}))"
    have = read_before is not None and bound is not None and bound <= read_before
    early = _early(read_before if have else bound)

    def read(q: tuple[str, int]) -> pl.DataFrame:
        parts = [api_q[1](b) for b in r.batches(q[0])]
        return pl.concat(parts) if parts else pl.DataFrame(schema=API_SCHEMA)

    with ThreadPoolExecutor(READ_THREADS) as ex:
        # the early calls: read with the API pieces (kept in their order), or now (the cheap test on start first)
        # while the GPU operations are checked for their calls
        parts = [df for i in sorted(stats["early"]) for df in stats["early"][i]] if have else []
        done = [] if have else [ex.submit(read, q) for q in _pieces(r, RUNTIME, api_q[0], f"{early} AND {rest_of}")]
        if stats["calls_unpacked"]:
            lost = _unmatched(_scan_files(dest / "ops", ["pid", "corr"]), _scan_files(dest / "api", ["pid", "corr"]))
        else:
            lost = _unmatched_keys(stats["ops_calls"], stats["api_calls"])
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
    stats["api_without_pid"] += rest.filter(BAD_API).height
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
        stats["ids"].append(found["name_id"].unique().drop_nulls())
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
    """Remove a folder this process made, even if Ctrl-C is pressed again meanwhile."""
    while True:
        try:
            shutil.rmtree(path, ignore_errors=True)
            return
        except KeyboardInterrupt:
            continue


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


def remove_stale(root: Path) -> None:
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
            if age > STALE_S and not any(d.iterdir()):
                d.rmdir()
            continue
        if ".old-" in d.name or age > STALE_S or not _alive(owner.get("host", ""), int(owner.get("pid", 0))):
            shutil.rmtree(d, ignore_errors=True)


def _write_error(e: OSError, where: Path) -> InputError:
    return InputError(f"{where}: cannot write the cache ({e.strerror or e}); set SPECTRACE_CACHE_DIR to a "
                      "writable folder, or pass --no-cache", "CACHE_WRITE")


def existing_store(report: str | os.PathLike, cache_dir: Path | None = None) -> Store | None:
    """The report's cache if one is there and verifies for the report; None otherwise (nothing built)."""
    p = Path(report)
    if not p.exists():
        return None
    root = cache_dir or cache_dir_for(p)
    return Store(root) if root.is_dir() and problem(root, fingerprint(p)) is None else None


def open_store(report: str | os.PathLike, progress: bool | None = None, cache_dir: Path | None = None,
               rebuild: bool = False) -> Store:
    """The cache of ``report``: reused when it verifies (:func:`problem`), else (re)built atomically, once.

    ``rebuild``: build it again even if it verifies (its files could not be read). A folder in the way that is
    not a spectrace cache is never touched: a one-line error.
    """
    p = Path(report)
    key = fingerprint(p)
    root = cache_dir or cache_dir_for(p)
    present = root.exists() or root.is_symlink()
    if present and not rebuild and problem(root, key) is None:
        return Store(root)
    if present and not is_cache(root):
        raise InputError(f"{root}: is in the way of the cache and is not a spectrace cache; spectrace will not "
                         "replace it: move it, or set SPECTRACE_CACHE_DIR", "CACHE_IN_THE_WAY")
    try:
        root.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise _write_error(e, root.parent) from None
    remove_stale(root)
    tmp = root.with_name(f".{root.name}.tmp-{uuid.uuid4().hex[:12]}")
    try:  # whatever happens (errors, Ctrl-C, another process installing first), tmp does not outlive this
        try:
            build(p, tmp, progress)
        except OSError as e:
            if e.filename and str(e.filename).startswith(str(tmp)):
                raise _write_error(e, root) from None
            raise
        if fingerprint(p) != key:  # the report changed while we read it: do not keep what we read
            raise InputError(f"{p}: the report changed while it was read; try again", "CHANGED")
        if root.exists() or root.is_symlink():
            if not rebuild and problem(root, key) is None:  # another process installed a good one meanwhile
                return Store(root)
            if not is_cache(root):
                raise InputError(f"{root}: is in the way of the cache and is not a spectrace cache", "CACHE_IN_THE_WAY")
            old = root.with_name(f".{root.name}.old-{uuid.uuid4().hex[:12]}")
            os.replace(root, old)
            remove_tree(old)
        try:
            os.replace(tmp, root)
        except OSError:  # another process installed it first: theirs is as good
            if problem(root, key) is not None:
                raise
    finally:
        if tmp.exists():
            remove_tree(tmp)
    why = problem(root, key)
    if why is not None:  # not kept: a cache that does not verify is never used
        remove_tree(root)
        raise CacheError(f"{root}: the cache does not verify right after it was built ({why}), so it was removed; "
                         "check the disk, or set SPECTRACE_CACHE_DIR to another place", "CACHE_BROKEN")
    return Store(root)


def temporary_store(report: str | os.PathLike, progress: bool | None = None) -> tuple[Store, Path]:
    """A store in a temporary directory (the caller removes it; removed here if the build fails or is interrupted):
    streaming without keeping a cache."""
    try:
        tmp = Path(tempfile.mkdtemp(prefix="spectrace-"))
    except OSError as e:
        raise InputError(f"{tempfile.gettempdir()}: cannot create a temporary folder ({e.strerror}); set TMPDIR to "
                         "a writable folder", "TMP_WRITE") from None
    try:
        build(report, tmp / "c", progress)
        return Store(tmp / "c", kept=False), tmp
    except BaseException:
        remove_tree(tmp)
        raise
