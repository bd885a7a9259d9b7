"""The store of a SQLite export, its rows copied (:func:`build_by_copy`): one pass over the export writes the frames
:func:`analyze.read.export.load` would build, already normalised, as parquet split by process (uncompressed).

The op and API tables are cut into pieces (a table, or a rowid range of a large one, :data:`PIECE_ROWS`), numbered
in read order and read by 2–4 threads through ADBC record batches, largest first; StringIds and the NVTX ranges and
small tables are read meanwhile on two more threads. Memory stays bounded: batches are buffered per process and
flushed every ~2 M rows (:data:`FLUSH_ROWS`). Of the API calls it keeps those :data:`analyze.model.KEPT_API` finds by
name and the usual launchers, chosen in the SQL (the calls that launch nothing are most of a large API table and
never cross into Python); then (:func:`_rest_of_api`) each process's first call of all (its capture window opens
there: ``meta.json``'s ``api_first``), the calls without a thread id (counted) and every call that launched a GPU
operation no kept call accounts for (found by the (pid, correlation id) keys taken while the ops are read,
:mod:`.call_keys`). A build that fails or is interrupted stops its threads within one batch."""

from __future__ import annotations

import dataclasses
import os
import threading
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import polars as pl

from ..export import (
    API_SCHEMA,
    BAD_API,
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
from ..protocols import ExportReader, ShowProgress, no_progress
from .call_keys import OP_KEYS_SCHEMA, call_keys, kept_api_ids, op_keys, unmatched_op_keys, unmatched_ops
from .errors import write_in_cache
from .fingerprint import fingerprint
from .layout import write_meta

__all__ = ["FLUSH_ROWS", "PIECE_ROWS", "EARLY_ROWS", "build_by_copy"]


FLUSH_ROWS = 2_000_000
PIECE_ROWS = 2_000_000  # a large table is read in row ranges of this size, by _READ_THREADS threads
_READ_THREADS = max(2, min(4, os.cpu_count() or 2))
_KEPT_IDS = "/*kept API name ids*/"  # in the API pieces' SQL until StringIds is read
EARLY_ROWS = 1_000_000  # early calls kept from the API pieces at most (more: their own pass, see _rest_of_api)


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
            write_in_cache(d, lambda q: q.mkdir(parents=True, exist_ok=True))
            df = pl.concat(parts)
            write_in_cache(d / f"{self.piece:05d}-{self.part:05d}.parquet",
                           lambda q, df=df: df.write_parquet(q, compression="uncompressed", statistics=False))
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
    """The ops' (pid, correlation id) keys, packed (:func:`call_keys`)."""
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
    """The store of a SQLite export (:func:`build_by_copy`): its op and API tables cut into pieces (a table, or a row
    range of a large one), numbered in read order, read by ``_READ_THREADS`` threads into per-process parquet files,
    with StringIds and the NVTX ranges and small tables read meanwhile on two more threads; then the API calls the
    pieces left out (:func:`_rest_of_api`), the names and ``meta.json``."""

    def __init__(self, r: ExportReader, report: str | os.PathLike, dest: Path, m: dict,
                 progress: ShowProgress | None):
        self.r, self.report, self.dest, self.m = r, report, dest, m
        self.ops_q, self.api_q = op_queries(r), api_query(r)
        total = sum(r.max_rowid(t) for t, _, _ in self.ops_q) + (r.max_rowid(RUNTIME) if self.api_q else 0)
        self.bar = (progress or no_progress)(total, f"spectrace: reading {Path(report).name}")
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
        write_in_cache(dest / "ops", Path.mkdir)
        write_in_cache(dest / "api", Path.mkdir)
        threads = [threading.Thread(target=self._run_catching, args=(f,))
                   for f in (self._read_names, self._read_ranges, *[self._read_pieces] * _READ_THREADS)]
        try:
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        except BaseException:  # Ctrl-C: no thread may write into the folder once it is removed
            self.stop.set()
            _join_threads(threads)
            raise
        finally:
            self.bar.close()
        if self.errors:
            raise self.errors[0]
        api_first = (_rest_of_api(r, dest, self.api_q, self.kept_ids, self.counts["api"], g, len(self.pieces),
                                  self.bound if g.early_rows <= EARLY_ROWS else None) if self.api_q else {})
        ids = pl.concat(g.ids) if g.ids else pl.Series("name_id", [], pl.Int64)
        write_in_cache(dest / "names.parquet", _names(self.strings, ids).write_parquet)
        keys = pl.concat(g.op_keys).unique() if g.op_keys else pl.DataFrame(schema=OP_KEYS_SCHEMA)
        write_in_cache(dest / "op_keys.parquet", keys.write_parquet)
        r.check_unchanged()
        self.notes.update(api_without_pid=g.api_without_pid, lossy_strings=r.lossy, **self.m["read_warnings"])
        m = self.m
        meta = {
            "key": fingerprint(self.report, check=False),  # its reader opened it: checked
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
        }
        write_meta(dest, meta)
        return dest

    def _run_catching(self, fn: Callable[[], None]) -> None:
        try:
            fn()
        except BaseException as e:  # re-raised on the calling thread
            self.errors.append(e)

    def _read_names(self) -> None:
        """StringIds, beside the pieces (the API pieces wait for the kept ids)."""
        self.strings = _strings(self.r)
        self.kept_id_list = kept_api_ids(self.strings)
        self.kept_ids = ",".join(str(i) for i in self.kept_id_list.to_list())
        self.kept_known.set()

    def _read_ranges(self) -> None:
        """NVTX ranges and the small tables, beside the pieces (their own connections)."""
        r, dest = self.r, self.dest
        ranges, _domains, marks = _ranges(r, self.m["duration"], self.notes)
        for name, df in (("ranges", ranges), ("marks", marks), ("devices", _devices(r)),
                         ("diagnostics", _nsys_diagnostics(r))):
            write_in_cache(dest / f"{name}.parquet", df.write_parquet)

    def _stopped(self) -> bool:
        return bool(self.errors) or self.stop.is_set()

    def _read_pieces(self) -> None:
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
                    q = q.replace(f"nameId IN ({_KEPT_IDS})",
                                  f"(nameId IN ({_KEPT_IDS}) OR {_early_calls_sql(self.bound)})")
                q = q.replace(_KEPT_IDS, self.kept_ids)
            if not self._read_piece(i, kind, q, post, n):
                return

    def _read_piece(self, i: int, kind: str, q: str, post: _Post, n: int) -> bool:
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
            keys = op_keys(df) if kind == "ops" else None
            calls = call_keys(df)
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


def _written_rows(root: Path, cols: list[str]) -> pl.DataFrame:
    files = sorted(root.rglob("*.parquet"))
    return pl.scan_parquet(files).select(cols).collect() if files else pl.DataFrame(schema={c: pl.Int64 for c in cols})


def _early_bound(ops_first: dict[int, int]) -> int | None:
    """The start before which a call may be some process's first activity: the latest of the processes' first
    GPU operations (None without any). With a process's first kept call too it is :func:`_rest_of_api`'s bound; taken
    from the rows read so far (earliest starts only come down as more are read), it is at or above that bound for
    every process already seen."""
    return max(ops_first.values(), default=None)


def _early_calls_sql(bound: int | None) -> str:
    """SQL: the calls that may be a process's first (before ``bound``), and those without a thread."""
    return "(globalTid IS NULL" + (f" OR start < {bound})" if bound is not None else ")")


def _rest_of_api(r: ExportReader, dest: Path, api_q: tuple[str, _Post], kept: str, counts: dict[int, int],
                 gathered: _Gathered, piece: int, read_before: int | None = None) -> dict[int, int]:
    """What the analysis needs of the API calls the pieces left out (read with the API pieces or in passes of their
    own):

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
    early = _early_calls_sql(read_before if have else bound)

    def read(q: tuple[str, int]) -> pl.DataFrame:
        parts = [api_q[1](b) for b in r.batches(q[0])]
        return pl.concat(parts) if parts else pl.DataFrame(schema=API_SCHEMA)

    with ThreadPoolExecutor(_READ_THREADS) as ex:
        # the early calls: read with the API pieces (kept in their order), or now (the cheap test on start first)
        # while the GPU operations are checked for their calls
        parts = [df for i in sorted(gathered.early) for df in gathered.early[i]] if have else []
        done = [] if have else [ex.submit(read, q) for q in _pieces(r, RUNTIME, api_q[0], f"{early} AND {rest_of}")]
        if gathered.calls_unpacked:
            lost = unmatched_ops(_written_rows(dest / "ops", ["pid", "corr"]),
                                 _written_rows(dest / "api", ["pid", "corr"]))
        else:
            lost = unmatched_op_keys(gathered.ops_calls, gathered.api_calls)
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


def _join_threads(threads: list[threading.Thread]) -> None:
    """Wait for every thread, through further Ctrl-C presses (they stop within one batch)."""
    for t in threads:
        while t.is_alive():
            try:
                t.join()
            except KeyboardInterrupt:
                pass


def build_by_copy(r: ExportReader, report: str | os.PathLike, dest: Path, m: dict,
                  progress: ShowProgress | None = None) -> Path:
    """The store of the SQLite export ``r`` (``report``; ``m``: :func:`analyze.read.export.read_meta`) in ``dest``
    (made, marked): its rows copied, ``meta.json`` last. ``progress``: a meter of the rows read."""
    return _RowBuild(r, report, dest, m, progress).run()
