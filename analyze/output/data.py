"""Results for machines: JSON, CSV and SQLite (sqlite-utils) renderings of a :class:`~analyze.model.Result`."""

from __future__ import annotations

import io
import json
from pathlib import Path

import polars as pl

from ..model import InputError, Result


def to_json(res: Result) -> str:
    """The analysis as JSON: :meth:`Result.to_dict` and ``tokens`` (tokens per cycle, tokens/s, acceptance)."""
    from ..compute.tokens import summary

    return json.dumps({**res.to_dict(), "tokens": summary(res).as_dict()}, indent=2, default=str) + "\n"


CSV_TABLES = ("phases", "ranges", "seams", "ranks", "coverage", "instances")


def frame(res: Result, name: str) -> pl.DataFrame:
    """One result table by name; ``phases``/``ranges``/``seams`` include all-ranks rows (rank null)."""
    if name == "phases":
        return pl.concat([res.phases, res.phases_all.drop("ranks")], how="diagonal_relaxed")
    if name == "ranges":
        return pl.concat([res.ranges, res.ranges_all.drop("ranks")], how="diagonal_relaxed")
    if name == "seams":
        return pl.concat([res.seams, res.seams_all.drop("ranks")], how="diagonal_relaxed")
    if name == "ranks":
        return res.ranks.with_columns(pl.col("devices").cast(pl.List(pl.String)).list.join(","))
    if name == "coverage":
        return res.coverage
    if name == "instances":
        return res.instances
    raise InputError(f"unknown table {name!r}; one of {', '.join(CSV_TABLES)}", "BAD_TABLE")


def to_csv(res: Result, name: str = "phases") -> str:
    buf = io.StringIO()
    frame(res, name).write_csv(buf)
    return buf.getvalue()


def to_db(res: Result, path: str | Path) -> None:
    """Write every result table into a SQLite database with sqlite-utils (tables replaced)."""
    import sqlite_utils

    p = Path(path)
    if p.exists() and p.resolve() == Path(res.trace.path).resolve():
        raise InputError(f"{p}: --db must not be the input report (spectrace never writes to it)", "DB_IS_INPUT")
    db = sqlite_utils.Database(p)
    for name in CSV_TABLES:
        db[name].drop(ignore=True)
        rows = frame(res, name).to_dicts()
        if rows:
            db[name].insert_all(rows, alter=True)
    db["diagnostics"].drop(ignore=True)
    if res.diagnostics:
        db["diagnostics"].insert_all([d.as_dict() for d in res.diagnostics])
    db["meta"].drop(ignore=True)
    meta = {k: v for k, v in res.to_dict().items() if isinstance(v, str | int | float) or v is None}
    db["meta"].insert_all([{"key": k, "value": str(v)} for k, v in meta.items()], pk="key")
    db.close()


def doc_json(doc: dict) -> str:
    """A JSON document (compare, whatif, comm) as indented text."""
    return json.dumps(doc, indent=2, default=str) + "\n"
