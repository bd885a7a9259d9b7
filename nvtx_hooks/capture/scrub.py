"""Remove the launch environment and the system process list from an nsys SQLite export.

nsys stores the profiled command's whole environment (``META_DATA_CAPTURE``
``*ENVIRONMENT*`` rows; NUL-separated ``KEY=VALUE`` blobs in ``StringIds`` and
``TARGET_INFO_SYSTEM_ENV``), every process on the machine (``PROCESSES``) and the
captured stdout/stderr with their file paths (``ProcessStreams``). :func:`scrub`
writes a new file without them; the input is opened read-only and never modified.
String ids keep their numbers (blanked, not deleted) so every reference stays valid.
"""

from __future__ import annotations

import argparse
import re
import sqlite3
import sys
from pathlib import Path

from .files import OutputError, new_file

__all__ = ["profiled_pids", "scrub", "find_strings", "run", "add_arguments"]

_BLANK = ""
_ENV_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
# Tables whose pid columns name the profiled processes.
# (ThreadNames is not one of them: it names the threads of every process on the machine.)
_TID_TABLES = ("NVTX_EVENTS", "CUPTI_ACTIVITY_KIND_RUNTIME", "OSRT_API")
_PID_TABLES = ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET",
               "CUPTI_ACTIVITY_KIND_GRAPH_TRACE", "DIAGNOSTIC_EVENT")


def _tables(con: sqlite3.Connection) -> set[str]:
    return {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}


def _columns(con: sqlite3.Connection, table: str) -> list[tuple[str, str]]:
    return [(r[1], (r[2] or "").upper()) for r in con.execute(f'PRAGMA table_info("{table}")')]


def profiled_pids(con: sqlite3.Connection) -> set[int]:
    """Pids that have events in the export (NVTX, CUDA API, kernels, threads)."""
    tabs, pids = _tables(con), set()
    for t in _TID_TABLES:
        if t in tabs and "globalTid" in {c for c, _ in _columns(con, t)}:
            pids |= {r[0] for r in con.execute(
                f'SELECT DISTINCT (globalTid >> 24) & 16777215 FROM "{t}" WHERE globalTid IS NOT NULL')}
    for t in _PID_TABLES:
        if t in tabs and "globalPid" in {c for c, _ in _columns(con, t)}:
            pids |= {r[0] for r in con.execute(
                f'SELECT DISTINCT (globalPid >> 24) & 16777215 FROM "{t}" WHERE globalPid IS NOT NULL')}
    if "TARGET_INFO_CUDA_DEVICE" in tabs:
        pids |= {r[0] for r in con.execute("SELECT DISTINCT pid FROM TARGET_INFO_CUDA_DEVICE")}
    if "TARGET_INFO_CUDA_CONTEXT_INFO" in tabs:
        pids |= {r[0] for r in con.execute("SELECT DISTINCT processId FROM TARGET_INFO_CUDA_CONTEXT_INFO")}
    pids.discard(0)
    pids.discard(None)
    return pids


_NOT_IDS = {"start", "end", "timestamp", "globalTid", "globalPid", "endGlobalTid", "correlationId", "duration"}


def _string_columns(con: sqlite3.Connection) -> dict[str, list[str]]:
    """Columns that nsys's DDL marks ``-- REFERENCES StringIds``, per table (empty if unmarked)."""
    out: dict[str, list[str]] = {}
    for t, sql in con.execute("SELECT name, sql FROM sqlite_master WHERE type='table' AND sql IS NOT NULL"):
        cols = [ln.split()[0] for ln in sql.splitlines() if "REFERENCES StringIds" in ln and ln.split()]
        if cols and t != "StringIds":
            out[t] = cols
    return out


def _referenced_ids(con: sqlite3.Connection) -> set[int]:
    """The string ids some row still uses.

    Where the DDL marks its string columns (nsys 2023.4+ comments ``REFERENCES StringIds``), exactly
    those columns; otherwise every integer column (a superset). A string id no row mentions (the
    thread names of processes that were dropped) can be blanked.
    """
    used: set[int] = set()
    marked = _string_columns(con)
    for t in _tables(con):
        if t == "StringIds":
            continue
        cols = marked.get(t) if marked else [c for c, typ in _columns(con, t) if "INT" in typ and c not in _NOT_IDS]
        for col in cols or []:
            used |= {r[0] for r in con.execute(f'SELECT DISTINCT "{col}" FROM "{t}"') if r[0] is not None}
    return used


def _env_pairs(values: list[str]) -> set[str]:
    """``KEY=VALUE`` items in environment strings (NUL- or newline-separated)."""
    out = set()
    for v in values:
        for item in re.split(r"[\x00\n]", v or ""):
            if _ENV_KEY.match(item) and len(item) > 3:
                out.add(item)
    return out


def _is_env_blob(v: str) -> bool:
    parts = [p for p in re.split(r"\x00", v) if p]
    return len(parts) >= 2 and sum(bool(_ENV_KEY.match(p)) for p in parts) >= max(2, len(parts) // 2)


def scrub(src: str | Path, dst: str | Path, *, force: bool = False) -> dict:
    """Write a scrubbed copy of export ``src`` to ``dst``; returns counts of what was removed.

    ``dst`` is a new file (:func:`nvtx_hooks.capture.files.new_file`: written under a temporary name and renamed
    into place when complete, never the input by any name, a regular file); an existing one is replaced only
    with ``force`` (else FileExistsError); ValueError when it may not be written."""
    src, dst = Path(src), Path(dst)
    if not src.is_file():
        raise FileNotFoundError(src)
    try:
        with new_file(dst, option="the output", what="the scrubbed copy", inputs=[src], replace=force) as tmp:
            return _scrub(src, tmp)
    except OutputError as e:
        if e.code == "EXISTS":
            raise FileExistsError(dst) from None
        raise ValueError(f"scrub writes a new file: {e}") from None


def _scrub(src: Path, dst: Path) -> dict:
    inp = sqlite3.connect(f"file:{src}?mode=ro", uri=True)
    out = sqlite3.connect(dst)
    inp.backup(out)
    inp.close()
    con = out
    con.text_factory = lambda b: b.decode("utf-8", "replace")
    tabs = _tables(con)
    stats: dict[str, int] = {}
    env_values: list[str] = []

    if "META_DATA_CAPTURE" in tabs:
        env_values += [r[0] for r in con.execute(
            "SELECT value FROM META_DATA_CAPTURE WHERE name LIKE '%ENVIRONMENT%'")]
        stats["meta_env_rows"] = con.execute(
            "DELETE FROM META_DATA_CAPTURE WHERE name LIKE '%ENVIRONMENT%'").rowcount
        stats["meta_workdir_rows"] = con.execute(
            "UPDATE META_DATA_CAPTURE SET value = ? WHERE name LIKE '%WORKING_DIR'", (_BLANK,)).rowcount
    if "TARGET_INFO_SYSTEM_ENV" in tabs:
        cond = "name LIKE '%Environment%' OR instr(CAST(value AS BLOB), X'00') > 0"
        env_values += [r[0] for r in con.execute(f"SELECT value FROM TARGET_INFO_SYSTEM_ENV WHERE {cond}")]
        stats["system_env_rows"] = con.execute(f"DELETE FROM TARGET_INFO_SYSTEM_ENV WHERE {cond}").rowcount
    stream_ids: set[int] = set()
    if "ProcessStreams" in tabs:
        for f, c in con.execute("SELECT filenameId, contentId FROM ProcessStreams"):
            stream_ids |= {f, c}
        stats["process_stream_rows"] = con.execute("DELETE FROM ProcessStreams").rowcount
    if "StringIds" in tabs:
        blobs = [(i, v) for i, v in con.execute(
            "SELECT id, value FROM StringIds WHERE instr(CAST(value AS BLOB), X'00') > 0")]
        env_ids = {i for i, v in blobs if _is_env_blob(v)}
        env_values += [v for i, v in blobs if i in env_ids]
        pairs = _env_pairs(env_values)
        for i, v in con.execute("SELECT id, value FROM StringIds"):
            if i in env_ids or i in stream_ids:
                continue
            if v and ("\x00" in v or _ENV_KEY.match(v)) and any(p in v for p in pairs):
                env_ids.add(i)
        ids = sorted(env_ids | stream_ids)
        con.executemany("UPDATE StringIds SET value = ? WHERE id = ?", [(_BLANK, i) for i in ids])
        stats["string_ids_blanked"] = len(ids)
    if "PROCESSES" in tabs:
        keep = profiled_pids(con)
        rows = [r[0] for r in con.execute("SELECT pid FROM PROCESSES")]
        drop = [p for p in rows if p not in keep]
        con.executemany("DELETE FROM PROCESSES WHERE pid = ?", [(p,) for p in drop])
        stats["processes_dropped"] = len(drop)
        stats["processes_kept"] = len(rows) - len(drop)
        if "ThreadNames" in tabs:
            names = [(g, n) for g, n in con.execute("SELECT globalTid, nameId FROM ThreadNames")]
            kept = lambda g: g is not None and ((g >> 24) & 0xFFFFFF) in keep  # noqa: E731
            gone = [(g,) for g, _ in names if not kept(g)]
            con.executemany("DELETE FROM ThreadNames WHERE globalTid = ?", gone)
            stats["thread_names_dropped"] = len(gone)
            if "StringIds" in tabs:  # the other processes' thread names
                others = {n for g, n in names if not kept(g)} - {n for g, n in names if kept(g)}
                con.executemany("UPDATE StringIds SET value = ? WHERE id = ?", [(_BLANK, i) for i in others])
    if "StringIds" in tabs:
        used = _referenced_ids(con)
        orphans = [(_BLANK, i) for (i,) in con.execute("SELECT id FROM StringIds WHERE value != ''")
                   if i not in used]
        con.executemany("UPDATE StringIds SET value = ? WHERE id = ?", orphans)
        stats["orphan_strings_blanked"] = len(orphans)
    con.commit()
    con.execute("VACUUM")
    con.close()
    return stats


def find_strings(path: str | Path, needles: list[str]) -> dict[str, list[str]]:
    """Where each needle still occurs: ``{needle: ["TABLE.column", ...]}`` over every text column."""
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    hits: dict[str, list[str]] = {}
    for t in sorted(_tables(con)):
        for col, typ in _columns(con, t):
            if typ not in ("TEXT", "BLOB", ""):
                continue
            for n in needles:
                q = f'SELECT 1 FROM "{t}" WHERE instr(CAST("{col}" AS BLOB), CAST(? AS BLOB)) > 0 LIMIT 1'
                if con.execute(q, (n,)).fetchone():
                    hits.setdefault(n, []).append(f"{t}.{col}")
    con.close()
    return hits


def run(a: argparse.Namespace) -> int:
    """``spectrace scrub``: write the scrubbed copy, print its counts; exit 1 if a ``--check`` text is left."""
    from . import CaptureError

    try:
        stats = scrub(a.input, a.output, force=a.force)
    except FileExistsError as e:
        raise CaptureError(f"{e} exists: pass --force to overwrite") from e
    except (FileNotFoundError, ValueError, sqlite3.DatabaseError) as e:
        raise CaptureError(f"cannot scrub {a.input}: {e}") from e
    print(" ".join(f"{k}={v}" for k, v in stats.items()))
    left = find_strings(a.output, a.check or [])
    for n, where in left.items():
        print(f"still present: {n!r} in {', '.join(where)}", file=sys.stderr)
    return 1 if left else 0


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of ``spectrace scrub``."""
    p.add_argument("input", help="nsys SQLite export (read only)")
    p.add_argument("-o", "--output", required=True, help="scrubbed copy to write")
    p.add_argument("-f", "--force", action="store_true", help="overwrite OUTPUT")
    p.add_argument("--check", action="append", metavar="TEXT",
                   help="fail (exit 1) if TEXT is still anywhere in the output")
