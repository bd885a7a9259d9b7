"""Read-only access to an nsys SQLite export: open checks and columnar queries.

The file is never written, and nothing is created beside it. What is read is what SQLite itself
would return: a file with committed changes still in its ``-wal`` is read with them (SQLite's
no-lock VFS, exclusive locking mode: the WAL index lives in memory, no ``-shm`` is created); any
other file is opened with ``immutable=1``. A file another process is writing (a hot ``-journal``,
a write lock, or another connection on its WAL) is refused in one line. Queries go through ADBC
(Arrow, no Python objects per row); a query whose column types change mid-stream (ADBC infers types
from the first rows) falls back to the standard library's sqlite3. Strings that are not valid UTF-8
are decoded with replacement characters and counted (:attr:`Reader.lossy`).
"""

from __future__ import annotations

import os
import sqlite3
import struct
import sys
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

import polars as pl

from ..model import InputError

if TYPE_CHECKING:
    from polars._typing import PolarsDataType

__all__ = ["BATCH_ROWS", "SQLITE_MAX_PATH", "sidecar", "check_file", "Reader"]

# compressed files people pass by mistake (the bundled captures are .sqlite.xz): magic bytes → the tool
_COMPRESSED = ((b"\xfd7zXZ\x00", "xz"), (b"\x1f\x8b", "gzip"), (b"\x28\xb5\x2f\xfd", "zstd"), (b"BZh", "bzip2"))
_SQLITE_MAGIC = b"SQLite format 3\x00"
_JOURNAL_MAGIC = bytes.fromhex("d9d505f920a163d7")
# ADBC's SQLite driver returns 1024-row batches by default; 64 Ki rows read the same columns ~2.5x faster.
BATCH_ROWS = 262144
# SQLite's POSIX lock bytes (os_unix.c): the PENDING byte, then RESERVED, then 510 SHARED bytes; in the
# ``-shm`` file the WAL locks start at byte 120 and every connection holds a read lock on byte 128 (DMS).
_PENDING_BYTE, _LOCK_BYTES = 0x40000000, 512
_SHM_LOCKS, _SHM_DMS = 120, 128


def sidecar(p: Path, suffix: str) -> Path:
    """``<file>-wal``, ``<file>-journal``, ``<file>-shm``: where SQLite keeps them for ``p``."""
    return p.with_name(p.name + suffix)


def _file_state(path: str | os.PathLike) -> list[list]:
    """``[name, size, mtime_ns]`` of the file and of its ``-wal`` if there is one: what the data depend on."""
    p = Path(path)
    out = []
    for f in (p, sidecar(p, "-wal")):
        try:
            st = f.stat()
        except FileNotFoundError:
            continue
        out.append([f.name, st.st_size, st.st_mtime_ns])
    return out


def _size(p: Path) -> int:
    try:
        return p.stat().st_size
    except OSError:
        return 0


def _held_lock(path: Path, start: int, length: int, probe: str) -> bool:
    """Whether another process holds a POSIX lock on ``[start, start + length)`` that conflicts with a
    ``probe`` ("read" or "write") lock: F_GETLK asks without taking anything."""
    try:
        import fcntl
    except ImportError:  # not POSIX: no probe
        return False
    kind = fcntl.F_RDLCK if probe == "read" else fcntl.F_WRLCK
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return False
    try:
        got = fcntl.fcntl(fd, fcntl.F_GETLK, struct.pack("hhqqi4x", kind, 0, start, length, 0))
    except OSError:
        return False
    finally:
        os.close(fd)
    return struct.unpack("hhqqi4x", got)[0] != fcntl.F_UNLCK


def _open_mode(p: Path, shown: Path | None = None) -> str:
    """``"wal"`` when committed changes wait in the ``-wal``, else ``"immutable"``; refuses a file being written.

    ``p``: the resolved path (where SQLite looks for the sidecars); ``shown``: the path as the user gave it.
    """
    journal = sidecar(p, "-journal")
    shown = shown or p
    if _size(journal) >= len(_JOURNAL_MAGIC):
        try:
            with journal.open("rb") as f:
                hot = f.read(len(_JOURNAL_MAGIC)) == _JOURNAL_MAGIC
        except OSError:
            hot = True
        if hot:
            raise InputError(
                f"{shown}: {journal.name} beside it holds an unfinished write (another process is writing the file, or "
                "a write was interrupted); let the writer finish, or open the file once with sqlite3 to roll it "
                "back, then try again", "LIVE_WRITER")
    if _held_lock(p, _PENDING_BYTE, _LOCK_BYTES, "read"):
        raise InputError(f"{shown}: another process is writing it; try again when it has finished", "LIVE_WRITER")
    if _size(sidecar(p, "-wal")) == 0:
        return "immutable"
    shm = sidecar(p, "-shm")
    if shm.exists() and _held_lock(shm, _SHM_LOCKS, _SHM_DMS - _SHM_LOCKS + 1, "write"):
        raise InputError(
            f"{shown}: another process has it open in WAL mode ({shm.name} is locked); close that program, or "
            f"checkpoint it first: sqlite3 {shown} 'PRAGMA wal_checkpoint(TRUNCATE)'", "LIVE_WRITER")
    return "wal"


def check_file(path: str | os.PathLike) -> Path:
    """Fail with a one-line reason unless ``path`` is a complete SQLite file."""
    p = Path(path)
    try:
        st = p.stat()
    except FileNotFoundError:
        raise InputError(f"{p}: no such file", "NO_FILE") from None
    except OSError as e:
        raise InputError(f"{p}: cannot read it ({e.strerror})", "UNREADABLE") from None
    if p.is_dir():
        raise InputError(f"{p}: is a directory but not an nsys parquetdir/arrowdir export (none of its tables); give "
                         "the .sqlite file or the folder nsys exported", "NOT_SQLITE")
    if not p.is_file():
        raise InputError(f"{p}: not a regular file (a pipe or a device); save the export to a file first",
                         "NOT_SQLITE")
    size = st.st_size
    try:
        with p.open("rb") as f:
            head = f.read(100)
    except OSError as e:
        raise InputError(f"{p}: cannot read it ({e.strerror})", "UNREADABLE") from None
    if head[:16] != _SQLITE_MAGIC:
        hint = ""
        if p.suffix in (".nsys-rep", ".qdrep", ".qdstrm"):
            hint = f"; export it first: nsys export --type sqlite -o {p.with_suffix('.sqlite')} {p}"
        for magic, tool in _COMPRESSED:
            if head.startswith(magic):
                hint = f"; it is {tool}-compressed: decompress it first ({tool} -dk {p})"
        raise InputError(f"{p}: not a SQLite file{hint}", "NOT_SQLITE")
    if len(head) < 100:
        raise InputError(f"{p}: truncated SQLite file ({size} bytes); export it again", "TRUNCATED")
    page_size = int.from_bytes(head[16:18], "big")
    page_size = 65536 if page_size == 1 else page_size
    # A sane header: a power-of-two page size and the fixed payload fractions 64/32/32 (fileformat2.html).
    if page_size < 512 or page_size & (page_size - 1) or head[21:24] != b"\x40\x20\x20":
        raise InputError(f"{p}: corrupt SQLite header; copy or export it again", "CORRUPT")
    pages = int.from_bytes(head[28:32], "big")
    # The in-header page count is valid when the "version-valid-for" number matches the change counter.
    if head[92:96] == head[24:28] and pages and size < pages * page_size:
        raise InputError(
            f"{p}: truncated SQLite file ({size} of {pages * page_size} bytes); copy or export it again",
            "TRUNCATED",
        )
    return p


SQLITE_MAX_PATH = 512  # SQLite's unix VFS opens no file whose full path (with its NUL) is longer (MAX_PATHNAME)


class Reader:
    """A read-only connection that returns polars frames."""

    splittable = True  # a query may be cut into rowid ranges, each read on its own connection

    def __init__(self, path: str | os.PathLike):
        self.path = check_file(path)
        real = self.path.resolve()
        if len(os.fsencode(real)) >= SQLITE_MAX_PATH:
            raise InputError(f"{self.path}: its full path is {len(os.fsencode(real)):,} bytes, past the "
                             f"{SQLITE_MAX_PATH - 1} that SQLite opens (symbolic links resolved); move it to a shorter "
                             "path, or give it one with a hard link (ln FILE /tmp/run.sqlite)", "PATH_TOO_LONG")
        self.mode = _open_mode(real, self.path)
        self.state = _file_state(real)
        args = "mode=ro&immutable=1" if self.mode == "immutable" else "mode=ro&vfs=unix-none"
        self._uri = f"file:{quote(os.fsencode(real))}?{args}"  # bytes: any file name, UTF-8 or not
        self.lossy = 0  # strings that were not valid UTF-8 (decoded with U+FFFD)
        self._lock = threading.Lock()
        try:
            self._con = self._sqlite()
            self._con.execute("PRAGMA query_only = 1")
            rows = self._con.execute("SELECT name FROM sqlite_master WHERE type='table'").fetchall()
        except sqlite3.DatabaseError as e:
            raise InputError(f"{self.path}: corrupt or unreadable SQLite file ({e})", "CORRUPT") from None
        self.tables: set[str] = {r[0] for r in rows}
        # Column lists are read up front, on this thread: loaders run on worker threads.
        try:
            self._cols: dict[str, list[str]] = {
                t: [c[1] for c in self._con.execute(f"PRAGMA table_info('{t}')")] for t in self.tables
            }
        except sqlite3.DatabaseError as e:
            raise InputError(f"{self.path}: corrupt or unreadable SQLite file ({e})", "CORRUPT") from None

    def _sqlite(self) -> sqlite3.Connection:
        """A standard-library connection (strings decoded lossily, counted)."""
        con = sqlite3.connect(self._uri, uri=True, check_same_thread=False)
        con.text_factory = self._text
        if self.mode == "wal":
            if sys.version_info >= (3, 12):  # con.setconfig is new in 3.12: never try to checkpoint on close
                con.setconfig(sqlite3.SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE, True)
            con.execute("PRAGMA locking_mode = EXCLUSIVE")  # the WAL index in memory: no -shm file
        return con

    def _adbc(self) -> Any:  # an ADBC DB-API connection (adbc_driver_sqlite.dbapi)
        import adbc_driver_sqlite.dbapi as adbc

        con = adbc.connect(self._uri)
        if self.mode == "wal":
            cur = con.cursor()
            cur.execute("PRAGMA locking_mode = EXCLUSIVE")
            cur.fetchall()
            cur.close()
        return con

    def _text(self, b: bytes) -> str:
        try:
            return b.decode()
        except UnicodeDecodeError:
            with self._lock:
                self.lossy += 1
            return b.decode(errors="replace")

    def _arrow(self, data: Any) -> pl.DataFrame:  # a pyarrow Table or RecordBatch (pyarrow has no type information)
        """An Arrow table or batch as a polars frame; string columns that are not valid UTF-8 are decoded lossily
        (polars would panic on them)."""
        import pyarrow as pa

        for i, f in enumerate(data.schema):
            if not (pa.types.is_string(f.type) or pa.types.is_large_string(f.type)):
                continue
            col = data.column(i)
            try:
                col.validate(full=True)
            except pa.ArrowInvalid:
                raw = col.cast(pa.large_binary() if pa.types.is_large_string(f.type) else pa.binary())
                fixed = pa.array([None if b is None else self._text(b) for b in raw.to_pylist()], f.type)
                data = data.set_column(i, f, fixed) if isinstance(data, pa.Table) else pa.RecordBatch.from_arrays(
                    [fixed if j == i else data.column(j) for j in range(data.num_columns)], schema=data.schema)
        out = pl.from_arrow(data)
        assert isinstance(out, pl.DataFrame)  # (a Series only from an Arrow array, never from a table or batch)
        return out

    def close(self) -> None:
        self._con.close()

    def _failed(self, e: BaseException) -> InputError:
        """The error of a failed read: the file changed while it was read (rewritten in place: what SQLite read
        is half old, half new), else a corrupt file."""
        try:
            self.check_unchanged()
        except InputError as changed:
            return changed
        except OSError:  # (removed meanwhile)
            return InputError(f"{self.path}: the file changed while it was read (removed); try again when it is "
                              "complete", "CHANGED")
        return InputError(f"{self.path}: corrupt SQLite file ({e})", "CORRUPT")

    def check_unchanged(self) -> None:
        """Fail if the file (or its ``-wal``) changed since it was opened: what was read may be half old, half new."""
        if _file_state(self.path.resolve()) != self.state:
            raise InputError(f"{self.path}: the file changed while it was read; try again when it is complete",
                             "CHANGED")

    def columns(self, table: str) -> list[str]:
        """Column names of ``table`` (empty when the table is absent)."""
        return self._cols.get(table, [])

    def has(self, table: str, *cols: str) -> bool:
        have = self.columns(table)
        return bool(have) and all(c in have for c in cols)

    def rows(self, sql: str, params: tuple = ()) -> list[tuple]:
        """Small queries as Python tuples."""
        try:
            return self._con.execute(sql, params).fetchall()
        except sqlite3.DatabaseError as e:
            raise self._failed(e) from None

    def frame(self, sql: str, schema: Mapping[str, PolarsDataType] | None = None) -> pl.DataFrame:
        """A query as a polars frame, read column-wise through ADBC when possible.

        Each call opens its own connection, so several frames can be read in parallel threads.
        """
        df = None
        try:
            con = self._adbc()
            try:
                cur = con.cursor()
                _batch_rows(cur)
                cur.execute(sql)
                df = self._arrow(cur.fetch_arrow_table())
                cur.close()
            finally:
                con.close()
        except ImportError:
            df = None
        except Exception as e:  # type drift in ADBC's inference, or corruption
            if "malformed" in str(e) or "not a database" in str(e):
                raise self._failed(e) from None
            df = None
        if df is None:
            try:
                con = self._sqlite()
                try:
                    cur = con.execute(sql)
                    names = [d[0] for d in cur.description]
                    data = cur.fetchall()
                finally:
                    con.close()
            except sqlite3.DatabaseError as e:
                raise self._failed(e) from None
            df = pl.DataFrame(data, schema=names, orient="row", infer_schema_length=None)
        if schema:
            df = df.with_columns([pl.col(c).cast(t) for c, t in schema.items() if c in df.columns])
        return df

    def batches(self, sql: str, rows: int = BATCH_ROWS) -> Iterator[pl.DataFrame]:
        """A query as an iterator of polars frames of about ``rows`` rows (bounded memory).

        Through ADBC record batches; if ADBC cannot (not installed, or a column's type changes
        mid-stream), through the standard library's sqlite3 in chunks of ``rows``.
        """
        try:
            import adbc_driver_sqlite.dbapi  # noqa: F401
            adbc = True
        except ImportError:
            adbc = False
        if adbc:
            done = 0
            con = self._adbc()
            try:
                cur = con.cursor()
                _batch_rows(cur, rows)
                cur.execute(sql)
                for b in cur.fetch_record_batch():
                    df = self._arrow(b)
                    done += df.height
                    yield df
                cur.close()
                return
            except Exception as e:
                if "malformed" in str(e) or "not a database" in str(e):
                    raise self._failed(e) from None
                skip = done  # type drift: continue after the rows already delivered
            finally:
                con.close()
        else:
            skip = 0
        try:
            con = self._sqlite()
            try:
                cur = con.execute(sql)
                names = [d[0] for d in cur.description]
                while skip > 0:
                    skip -= len(cur.fetchmany(min(skip, rows)))
                while data := cur.fetchmany(rows):
                    yield pl.DataFrame(data, schema=names, orient="row", infer_schema_length=None)
            finally:
                con.close()
        except sqlite3.DatabaseError as e:
            raise self._failed(e) from None

    def max_rowid(self, table: str) -> int:
        """About how many rows ``table`` has (its largest rowid: O(log n), no scan); 0 if absent."""
        if table not in self.tables:
            return 0
        row = self.rows(f"SELECT MAX(rowid) FROM {table}")
        return int(row[0][0] or 0) if row else 0


def _batch_rows(cur: Any, rows: int = BATCH_ROWS) -> None:
    try:
        cur.adbc_statement.set_options(**{"adbc.sqlite.query.batch_rows": str(rows)})
    except Exception:  # an older driver without the option: its default batches
        pass
