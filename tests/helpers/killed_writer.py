"""SQLite files as a writer that was killed (or still holds them) leaves them, for the tests that read such a file
or write beside one. Each recipe runs the writer on a copy in ``scratch`` (a folder of the test's own) and puts
what it left beside ``db``: the file is then exactly what SQLite would show a reader after such a crash."""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path


def hot_journal(db: Path, scratch: Path, *statements: str, cache_size: int = 1) -> None:
    """``db`` as a writer killed in the middle of one transaction of ``statements`` leaves it: the changed pages
    it spilled (a cache of ``cache_size`` pages) already written into the file, and its hot ``-journal``."""
    twin = scratch / db.name
    shutil.copy(db, twin)
    con = sqlite3.connect(twin, isolation_level=None)
    con.execute(f"PRAGMA cache_size={cache_size}")
    con.execute("BEGIN")
    for s in statements:
        con.execute(s)
    shutil.copy(twin, db)
    shutil.copy(twin.with_name(twin.name + "-journal"), db.with_name(db.name + "-journal"))
    con.execute("ROLLBACK")
    con.close()


def wal_frames(db: Path, scratch: Path, *statements: str) -> None:
    """``db`` (in WAL mode) as a writer that committed ``statements`` and still holds it open (or was killed)
    leaves it: the commit only in frames of its ``-wal``, never checkpointed; the file itself unchanged."""
    twin = scratch / db.name
    shutil.copy(db, twin)
    con = sqlite3.connect(twin)
    con.execute("PRAGMA wal_autocheckpoint=0")
    for s in statements:
        con.execute(s)
    con.commit()
    shutil.copy(twin.with_name(twin.name + "-wal"), db.with_name(db.name + "-wal"))
    con.close()


# Two thousand 1 kB rows in a new table: more changed pages than a small cache holds, so the transaction's pages
# spill into the file, those changed before these statements with them (page 1, a table emptied before): without
# its journal the file then reads as the half-done change.
SPILL = ("CREATE TABLE big (x)",
         "INSERT INTO big SELECT randomblob(1000) FROM (WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL "
         "SELECT i + 1 FROM c WHERE i < 2000) SELECT i FROM c)")
