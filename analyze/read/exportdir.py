"""Read an ``nsys export --type parquetdir`` / ``arrowdir`` directory like a SQLite export.

``parquetdir`` writes ``<out>_pqtdir/<TABLE>.parquet``, ``arrowdir`` ``<out>_arwdir/<TABLE>.arrow``
(Arrow IPC); column names equal the SQLite ones. Types differ: ids such as ``globalTid``,
``globalPid``, ``domainId``, ``streamId``, the name ids and ``graphNodeId`` are UInt64 there, Int64
in SQLite (system rows have negative ids, e.g. ``0xFE00…``). Every unsigned 64-bit column is
reinterpreted bit for bit as Int64 (what SQLite stores) and every narrower integer widened to
Int64, so frames, joins and pids are identical to the SQLite path. The tables are polars lazy
scans; the loader's SQL runs on them through polars' SQL context. SQLite's implicit ``rowid``
(used as the NVTX range id) is the 1-based row number of the file, which is the SQLite row order
for exports that keep it (nsys 2025.6 notes that row order is no longer guaranteed).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import polars as pl

from nvtx_hooks.capture.files import TABLE_SUFFIXES, table_files

from ..model import InputError

if TYPE_CHECKING:
    from polars._typing import PolarsDataType  # a dtype class (pl.Int64) or instance (pl.List(pl.Int64))

__all__ = ["is_export_dir", "DirReader"]

_PID_UNIT = 1 << 24  # globalTid/globalPid: <hw:8><vm:8><pid:24><tid:24> (analyze.read.export.pid_of)
_KNOWN = ("StringIds", "NVTX_EVENTS", "CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_RUNTIME")


def _state(files: dict[str, Path]) -> list:
    try:
        return [[f.name, f.stat().st_size, f.stat().st_mtime_ns] for f in files.values()]
    except OSError:
        return []


def is_export_dir(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a directory of nsys tables as parquet or Arrow files."""
    p = Path(path)
    return p.is_dir() and any(t in table_files(p) for t in _KNOWN)


def _scan(f: Path) -> pl.LazyFrame:
    if f.suffix == ".parquet":
        return pl.scan_parquet(f)
    try:
        lf = pl.scan_ipc(f)
        lf.collect_schema()
        lf.head(1).collect()
        return lf
    except Exception:  # an IPC *stream* (what arrowdir and arrow write), not an IPC file
        return pl.read_ipc_stream(f).lazy()


def _as_signed(c: str, t: PolarsDataType) -> pl.Expr | None:
    """Column ``c`` of type ``t`` as SQLite stores it: UInt64 reinterpreted as Int64 (two's complement), other
    ints widened; None when it needs nothing."""
    if t == pl.UInt64:
        return pl.col(c).reinterpret(signed=True)
    if t.is_integer() and t != pl.Int64:
        return pl.col(c).cast(pl.Int64)
    return None


def _signed(lf: pl.LazyFrame) -> pl.LazyFrame:
    """UInt64 columns reinterpreted as Int64 (two's complement, as SQLite stores them); other ints widened."""
    fix = [e for c, t in lf.collect_schema().items() if (e := _as_signed(c, t)) is not None]
    return lf.with_columns(fix) if fix else lf


class DirReader:
    """The :class:`analyze.read.sqlite.Reader` interface over a directory of table files."""

    splittable = False  # queries run as polars scans: read whole (see analyze.read.store.copy_build._pieces)

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.lossy = 0  # parquet and Arrow strings are valid UTF-8 by construction
        files = table_files(self.path)
        stems = sorted(f.stem for f in self.path.iterdir() if f.suffix in TABLE_SUFFIXES and f.is_file())
        twice = sorted({t for t in stems if stems.count(t) > 1})
        if twice:  # which one is the table? (a second export into the same folder, a copy)
            names = ", ".join(sorted(f.name for f in self.path.iterdir() if f.stem == twice[0]))
            raise InputError(f"{self.path}: two files for one table ({names}"
                             f"{f'; {len(twice) - 1} more tables too' if len(twice) > 1 else ''}): which one is the "
                             "export is not known; keep one per table (or export again into a new folder)",
                             "AMBIGUOUS_TABLE")
        self.state = _state(files)
        try:
            self._raw = {t: _scan(f) for t, f in files.items()}
            self._lf = {t: _signed(lf) for t, lf in self._raw.items()}
            self._cols = {t: list(lf.collect_schema().names()) for t, lf in self._lf.items()}
        except Exception as e:
            raise InputError(f"{self.path}: unreadable table file ({e})", "CORRUPT") from None
        self._plain = dict(self._lf)  # without the row number: what a per-process cut starts from
        # SQLite's implicit rowid: the 1-based row number.
        self._lf = {t: lf.with_row_index("rowid", offset=1).with_columns(pl.col("rowid").cast(pl.Int64))
                    for t, lf in self._lf.items()}
        self.tables: set[str] = set(self._lf)

    def close(self) -> None:
        pass

    def check_unchanged(self) -> None:
        """Fail if a table file changed since the directory was opened."""
        if _state(table_files(self.path)) != self.state:
            raise InputError(f"{self.path}: the export changed while it was read; try again", "CHANGED")

    def columns(self, table: str) -> list[str]:
        return self._cols.get(table, [])

    def has(self, table: str, *cols: str) -> bool:
        have = self.columns(table)
        return bool(have) and all(c in have for c in cols)

    def _lazy(self, sql: str) -> pl.LazyFrame:
        ctx = pl.SQLContext(self._lf, eager=False)
        try:
            return ctx.execute(sql)
        except Exception as e:
            raise InputError(f"{self.path}: cannot read the export tables ({e})", "CORRUPT") from None

    def process_rows(self, sql: str, column: str, pid: int | Sequence[int]) -> pl.LazyFrame:
        """``sql`` over the tables cut to one process's rows (or several processes'): those whose ``column``
        (``globalPid`` or ``globalTid``) holds ``pid`` (one of ``pid``), the cut made on the file's own column, so
        that polars decodes the other columns of those rows only. Tables without ``column`` are whole; no ``rowid``
        (the cut renumbers rows)."""
        of = (pl.col(column) // _PID_UNIT) % _PID_UNIT
        cut = of == pid if isinstance(pid, int) else pl.any_horizontal([of == p for p in pid])
        lfs = {t: _signed(self._raw[t].filter(cut)) if column in self._cols[t] else lf
               for t, lf in self._plain.items()}
        try:
            return pl.SQLContext(lfs, eager=False).execute(sql)
        except Exception as e:
            raise InputError(f"{self.path}: cannot read the export tables ({e})", "CORRUPT") from None

    def column(self, table: str, column: str) -> pl.Expr:
        """``column`` of ``table``'s file as the queries see it (Int64, as in SQLite), for :meth:`rows_where`."""
        t = self._raw[table].collect_schema()[column]
        e = _as_signed(column, t)
        return pl.col(column) if e is None else e

    def rows_where(self, sql: str, table: str, where: pl.Expr) -> pl.LazyFrame:
        """``sql`` over the tables, ``table`` cut first to the rows where ``where`` holds: an expression of the
        file's own columns (:meth:`column` gives them as the queries see them), so that polars skips the row groups
        whose statistics exclude it (a time bound) and decodes the other columns of the rows it keeps only. No
        ``rowid`` (the cut renumbers rows)."""
        lfs = {t: _signed(self._raw[t].filter(where)) if t == table else lf for t, lf in self._plain.items()}
        try:
            return pl.SQLContext(lfs, eager=False).execute(sql)
        except Exception as e:
            raise InputError(f"{self.path}: cannot read the export tables ({e})", "CORRUPT") from None

    def rows(self, sql: str, params: tuple = ()) -> list[tuple]:
        return self._lazy(sql).collect().rows()

    def frame(self, sql: str, schema: Mapping[str, PolarsDataType] | None = None) -> pl.DataFrame:
        df = self._lazy(sql).collect()
        if schema:
            df = df.with_columns([pl.col(c).cast(t) for c, t in schema.items() if c in df.columns])
        return df

    def batches(self, sql: str, rows: int = 1 << 20):
        """The query in slices of ``rows`` rows (each slice a separate scan, predicates pushed down)."""
        lf = self._lazy(sql)
        off = 0
        while True:
            df = lf.slice(off, rows).collect()
            if df.height == 0:
                return
            yield df
            off += df.height
            if df.height < rows:
                return

    def max_rowid(self, table: str) -> int:
        lf = self._lf.get(table)
        return int(lf.select(pl.len()).collect().item()) if lf is not None else 0
