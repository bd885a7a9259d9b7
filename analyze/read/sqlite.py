"""Read-only access to an nsys SQLite export: open checks and columnar queries.

The file is opened with ``mode=ro&immutable=1`` and never written. Queries go
through ADBC (Arrow, no Python objects per row); a query whose column types
change mid-stream (ADBC infers types from the first rows) falls back to the
standard library's sqlite3.
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path
from urllib.parse import quote

import polars as pl

from ..model import InputError

SQLITE_MAGIC = b"SQLite format 3\x00"
# ADBC's SQLite driver returns 1024-row batches by default; 64 Ki rows read the same columns ~2.5x faster.
BATCH_ROWS = 65536


def check_file(path: str | os.PathLike) -> Path:
    """Fail with a one-line reason unless ``path`` is a complete SQLite file."""
    p = Path(path)
    if not p.exists():
        raise InputError(f"{p}: no such file", "NO_FILE")
    if p.is_dir():
        raise InputError(f"{p}: is a directory; give the .sqlite file exported by nsys", "NOT_SQLITE")
    size = p.stat().st_size
    with p.open("rb") as f:
        head = f.read(100)
    if head[:16] != SQLITE_MAGIC:
        hint = ""
        if p.suffix in (".nsys-rep", ".qdrep", ".qdstrm"):
            hint = f"; export it first: nsys export --type sqlite -o {p.with_suffix('.sqlite')} {p}"
        raise InputError(f"{p}: not a SQLite file{hint}", "NOT_SQLITE")
    if len(head) < 100:
        raise InputError(f"{p}: truncated SQLite file ({size} bytes); export it again", "TRUNCATED")
    page_size = int.from_bytes(head[16:18], "big")
    page_size = 65536 if page_size == 1 else page_size
    pages = int.from_bytes(head[28:32], "big")
    # The in-header page count is valid when the "version-valid-for" number matches the change counter.
    if head[92:96] == head[24:28] and pages and size < pages * page_size:
        raise InputError(
            f"{p}: truncated SQLite file ({size} of {pages * page_size} bytes); copy or export it again",
            "TRUNCATED",
        )
    return p


class Reader:
    """A read-only connection that returns polars frames."""

    splittable = True  # a query may be cut into rowid ranges, each read on its own connection

    def __init__(self, path: str | os.PathLike):
        self.path = check_file(path)
        uri = f"file:{quote(str(self.path.resolve()))}?mode=ro&immutable=1"
        self._uri = uri
        try:
            self._con = sqlite3.connect(uri, uri=True)
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

    def close(self) -> None:
        self._con.close()

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
            raise InputError(f"{self.path}: corrupt SQLite file ({e})", "CORRUPT") from None

    def frame(self, sql: str, schema: dict[str, pl.DataType] | None = None) -> pl.DataFrame:
        """A query as a polars frame, read column-wise through ADBC when possible.

        Each call opens its own connection, so several frames can be read in parallel threads.
        """
        df = None
        try:
            import adbc_driver_sqlite.dbapi as adbc

            con = adbc.connect(self._uri)
            try:
                cur = con.cursor()
                _batch_rows(cur)
                cur.execute(sql)
                df = pl.from_arrow(cur.fetch_arrow_table())
                cur.close()
            finally:
                con.close()
        except ImportError:
            df = None
        except Exception as e:  # type drift in ADBC's inference, or corruption
            if "malformed" in str(e) or "not a database" in str(e):
                raise InputError(f"{self.path}: corrupt SQLite file ({e})", "CORRUPT") from None
            df = None
        if df is None:
            try:
                con = sqlite3.connect(self._uri, uri=True)
                try:
                    cur = con.execute(sql)
                    names = [d[0] for d in cur.description]
                    data = cur.fetchall()
                finally:
                    con.close()
            except sqlite3.DatabaseError as e:
                raise InputError(f"{self.path}: corrupt SQLite file ({e})", "CORRUPT") from None
            df = pl.DataFrame(data, schema=names, orient="row", infer_schema_length=None)
        if schema:
            df = df.with_columns([pl.col(c).cast(t) for c, t in schema.items() if c in df.columns])
        return df

    def batches(self, sql: str, rows: int = BATCH_ROWS):
        """A query as an iterator of polars frames of about ``rows`` rows (bounded memory).

        Through ADBC record batches; if ADBC cannot (not installed, or a column's type changes
        mid-stream), through the standard library's sqlite3 in chunks of ``rows``.
        """
        try:
            import adbc_driver_sqlite.dbapi as adbc
        except ImportError:
            adbc = None
        if adbc is not None:
            done = 0
            con = adbc.connect(self._uri)
            try:
                cur = con.cursor()
                _batch_rows(cur, rows)
                cur.execute(sql)
                for b in cur.fetch_record_batch():
                    df = pl.from_arrow(b)
                    done += df.height
                    yield df
                cur.close()
                return
            except Exception as e:
                if "malformed" in str(e) or "not a database" in str(e):
                    raise InputError(f"{self.path}: corrupt SQLite file ({e})", "CORRUPT") from None
                skip = done  # type drift: continue after the rows already delivered
            finally:
                con.close()
        else:
            skip = 0
        try:
            con = sqlite3.connect(self._uri, uri=True)
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
            raise InputError(f"{self.path}: corrupt SQLite file ({e})", "CORRUPT") from None

    def max_rowid(self, table: str) -> int:
        """About how many rows ``table`` has (its largest rowid: O(log n), no scan); 0 if absent."""
        if table not in self.tables:
            return 0
        row = self.rows(f"SELECT MAX(rowid) FROM {table}")
        return int(row[0][0] or 0) if row else 0


def _batch_rows(cur, rows: int = BATCH_ROWS) -> None:
    try:
        cur.adbc_statement.set_options(**{"adbc.sqlite.query.batch_rows": str(rows)})
    except Exception:  # an older driver without the option: its default batches
        pass
