"""Write a SQLite export's tables as an nsys-style ``parquetdir``/``arrowdir`` (for tests and benchmarks).

Dev tool, not shipped in the wheel: ``analyze.read.exportdir`` reads such directories.
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

import polars as pl

from analyze.model import InputError
from analyze.read.sqlite import Reader

# The columns nsys 2024.2 types as UInt64 in parquet exports (docs/nsys-sqlite.md §3, §9).
UINT64_COLS = {"globalTid", "globalPid", "endGlobalTid", "domainId", "rangeId", "streamId", "contextId", "nameId",
               "demangledName", "shortName", "mangledName", "textId", "graphNodeId", "graphId"}


def write_export_dir(sqlite: str | os.PathLike, out: str | os.PathLike, fmt: str = "parquet") -> Path:
    """Write a SQLite export's tables as an nsys-style ``parquetdir`` (or ``arrowdir``) with nsys' typing.

    For tests and benchmarks where no nsys is at hand: ids as UInt64 (negative ones keep their bits),
    ``StringIds.id`` as Int32, everything else as SQLite gave it.
    """
    r = Reader(sqlite)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    try:
        for t in sorted(r.tables):
            cols = r.columns(t)
            if not cols:
                continue
            sel = ", ".join(f'"{c}"' for c in cols)
            try:
                df = r.frame(f"SELECT {sel} FROM {t}")
            except (InputError, sqlite3.DatabaseError):
                continue
            fix = [pl.col(c).cast(pl.Int64).reinterpret(signed=False) for c in df.columns
                   if c in UINT64_COLS and df[c].dtype.is_integer()]
            if t == "StringIds":
                fix.append(pl.col("id").cast(pl.Int32))
            df = df.with_columns(fix)
            if fmt == "parquet":
                df.write_parquet(out / f"{t}.parquet")
            else:
                with open(out / f"{t}.arrow", "wb") as f:
                    df.write_ipc_stream(f)
    finally:
        r.close()
    return out
