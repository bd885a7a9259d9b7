"""Remove the launch environment and the system process list from an nsys SQLite export (or, of a torch profiler
trace, what names the machine and its paths: :func:`nvtx_hooks.capture.torch_profile.scrub_trace`).

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

from . import python_frames
from .chrome_trace import TraceError
from .files import TABLE_SUFFIXES, OutputError, new_file, table_files
from .torch_profile import find_strings as find_trace_strings
from .torch_profile import is_torch_trace, scrub_trace

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
    return used | _python_frame_ids(con)


def _python_frame_ids(con: sqlite3.Connection) -> set[int]:
    """The function and file string ids of the Python stacks in NVTX binary payloads
    (:mod:`nvtx_hooks.capture.python_frames`): no column names them, so they would read as orphans."""
    tabs = set(_tables(con))
    if not {"NVTX_EVENTS", "NVTX_PAYLOAD_SCHEMAS"} <= tabs or "binaryData" not in dict(_columns(con, "NVTX_EVENTS")):
        return set()
    marks = ",".join("?" * len(python_frames.SCHEMAS))
    rows = con.execute(f"""SELECT e.binaryData FROM NVTX_EVENTS e WHERE e.binaryData IS NOT NULL AND e.domainId IN
                           (SELECT domainId FROM NVTX_PAYLOAD_SCHEMAS WHERE name IN ({marks}))""", python_frames.SCHEMAS)
    return {i for (blob,) in rows for f in python_frames.frames(blob) for i in f[:2]}


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
    with ``force`` (else FileExistsError); ValueError when it may not be written. A ``parquetdir``/``arrowdir``
    export (a folder of table files) is scrubbed the same way into a new folder (:func:`_scrub_folder`)."""
    src, dst = Path(src), Path(dst)
    if src.is_dir():
        if not table_files(src):
            raise FileNotFoundError("a folder with no nsys table files (.parquet, .arrow): not a parquetdir or "
                                    "arrowdir export")
        return _scrub_folder(src, dst, force)
    if not src.is_file():
        raise FileNotFoundError("no such file")
    torch_trace = is_torch_trace(src)  # a torch profiler trace (.json/.json.gz): torch_profile.scrub_trace
    try:
        with new_file(dst, option="the output", what="the scrubbed copy", inputs=[src], replace=force) as tmp:
            if torch_trace:  # gzip when the output's name says so (scrub_trace goes by the name it writes)
                out = tmp.with_name(tmp.name + ".gz") if Path(dst).name.endswith(".gz") else tmp
                try:
                    stats = scrub_trace(src, out)
                    out.replace(tmp)
                except TraceError as e:
                    raise ValueError(str(e)) from None
                finally:
                    if out != tmp:
                        out.unlink(missing_ok=True)
                return stats
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


# ---- parquetdir / arrowdir exports: the same removals, table by table with polars -----------------------------

_MARKER = "SPECTRACE_SCRUBBED"  # the scrubbed folder's list of the files it wrote (files.NewFolder)


def _is_stream(f: Path) -> bool:
    """Whether an Arrow table file is an IPC stream (what nsys's arrowdir writes, named ``.arrow``), not an IPC
    file (which begins with the magic ``ARROW1``)."""
    with open(f, "rb") as fh:
        return fh.read(6) != b"ARROW1"


def _scan(f: Path):
    import polars as pl

    if f.suffix == ".parquet":
        return pl.scan_parquet(f)
    if _is_stream(f):
        return pl.read_ipc_stream(f).lazy()
    return pl.scan_ipc(f)


def _encoded(df, f: Path) -> bytes:
    """``df`` as the bytes of a table file in the format of ``f`` (parquet, Arrow IPC file or stream)."""
    import io

    buf = io.BytesIO()
    if f.suffix == ".parquet":
        df.write_parquet(buf)
    elif _is_stream(f):
        df.write_ipc_stream(buf)
    else:
        df.write_ipc(buf)
    return buf.getvalue()


def _as_int64(col: str, dtype):
    """An integer column as SQLite stores it: an unsigned 64-bit one reinterpreted bit for bit (nsys's ids of
    system rows are above 2^63 there), a narrower one widened (as ``analyze.read.exportdir`` reads them)."""
    import polars as pl

    return pl.col(col).reinterpret(signed=True) if dtype == pl.UInt64 else pl.col(col).cast(pl.Int64)


def _pid_of(col: str, dtype):
    """The pid in bits 24..47 of a ``globalTid``/``globalPid`` column (its bits taken as unsigned)."""
    import polars as pl

    return ((_as_int64(col, dtype).reinterpret(signed=False) // (1 << 24)) % (1 << 24)).cast(pl.Int64)


def _folder_pids(tables: dict[str, Path]) -> set[int]:
    """:func:`profiled_pids` of a folder export."""

    pids: set[int] = set()
    wanted = [*((t, "globalTid", _pid_of) for t in _TID_TABLES), *((t, "globalPid", _pid_of) for t in _PID_TABLES),
              ("TARGET_INFO_CUDA_DEVICE", "pid", _as_int64), ("TARGET_INFO_CUDA_CONTEXT_INFO", "processId", _as_int64)]
    for t, col, pid in wanted:
        if t not in tables:
            continue
        lf = _scan(tables[t])  # (an Arrow stream is read here, once)
        sch = lf.collect_schema()
        if col in sch:
            pids |= set(lf.select(pid(col, sch[col]).alias("p")).drop_nulls().unique().collect()["p"].to_list())
    return pids - {0}


def _folder_used_ids(tables: dict[str, Path], changed: dict) -> set[int]:
    """:func:`_referenced_ids` of a folder export, its tables as changed so far (``changed``: frames by table):
    every integer column but times and thread ids (a superset: a folder has no DDL that marks the string
    columns)."""

    used: set[int] = set()
    for t, f in tables.items():
        if t == "StringIds":
            continue
        lf = changed[t].lazy() if t in changed else _scan(f)
        cols = [(c, d) for c, d in lf.collect_schema().items() if d.is_integer() and c not in _NOT_IDS]
        for c, d in cols:
            used |= set(lf.select(_as_int64(c, d)).drop_nulls().unique().collect().to_series().to_list())
    return used


def _scrub_folder(src: Path, dst: Path, force: bool) -> dict:
    """:func:`scrub` of a parquetdir/arrowdir export: the same rows removed and strings blanked as in a SQLite
    export, each table file that changes rewritten in its own format and the others copied byte for byte, into
    a new folder put in place whole (:class:`nvtx_hooks.capture.files.NewFolder`; an existing folder only with
    ``force``, and only one this function wrote)."""
    import polars as pl

    from .files import NewFolder, OutputError

    tables = table_files(src)
    changed: dict[str, pl.DataFrame] = {}
    stats: dict[str, int] = {}
    env_values: list[str] = []

    def frame(t: str) -> pl.DataFrame:
        if t not in changed:
            changed[t] = _scan(tables[t]).collect()
        return changed[t]

    if "META_DATA_CAPTURE" in tables:
        df = frame("META_DATA_CAPTURE")
        env = pl.col("name").str.to_uppercase().str.contains("ENVIRONMENT", literal=True)
        env_values += df.filter(env)["value"].drop_nulls().to_list()
        stats["meta_env_rows"] = int(df.select(env.sum()).item())
        df = df.filter(~env.fill_null(False))
        workdir = pl.col("name").str.to_uppercase().str.ends_with("WORKING_DIR").fill_null(False)
        stats["meta_workdir_rows"] = int(df.select(workdir.sum()).item())
        changed["META_DATA_CAPTURE"] = df.with_columns(pl.when(workdir).then(pl.lit(_BLANK)).otherwise("value")
                                                       .cast(df.schema["value"]).alias("value"))
    if "TARGET_INFO_SYSTEM_ENV" in tables:
        df = frame("TARGET_INFO_SYSTEM_ENV")
        cond = (pl.col("name").str.to_uppercase().str.contains("ENVIRONMENT", literal=True)
                | pl.col("value").cast(pl.String).str.contains("\x00", literal=True)).fill_null(False)
        env_values += df.filter(cond)["value"].cast(pl.String).drop_nulls().to_list()
        stats["system_env_rows"] = int(df.select(cond.sum()).item())
        changed["TARGET_INFO_SYSTEM_ENV"] = df.filter(~cond)
    stream_ids: set[int] = set()
    if "ProcessStreams" in tables:
        df = frame("ProcessStreams")
        stream_ids = {int(v) for c in ("filenameId", "contentId") for v in df.select(_as_int64(c, df.schema[c]))
                      .to_series().to_list()}
        stats["process_stream_rows"] = df.height
        changed["ProcessStreams"] = df.clear()
    blank: set[int] = set()
    if "StringIds" in tables:
        strings = frame("StringIds")
        ids, values = strings.select(_as_int64("id", strings.schema["id"])).to_series().to_list(), \
            strings["value"].to_list()
        env_ids = {i for i, v in zip(ids, values) if v and "\x00" in v and _is_env_blob(v)}
        env_values += [v for i, v in zip(ids, values) if i in env_ids]
        pairs = _env_pairs(env_values)
        for i, v in zip(ids, values):  # StringIds: thousands of rows (names), as the SQLite path reads them
            if i not in env_ids and i not in stream_ids and v and ("\x00" in v or _ENV_KEY.match(v)) \
                    and any(p in v for p in pairs):
                env_ids.add(i)
        blank = env_ids | stream_ids
        stats["string_ids_blanked"] = len(blank)
    if "PROCESSES" in tables:
        keep = _folder_pids(tables)
        df = frame("PROCESSES")
        kept = _as_int64("pid", df.schema["pid"]).is_in(sorted(keep))
        stats["processes_dropped"] = int(df.select((~kept).sum()).item())
        stats["processes_kept"] = df.height - stats["processes_dropped"]
        changed["PROCESSES"] = df.filter(kept)
        if "ThreadNames" in tables:
            names = frame("ThreadNames")
            names = names.with_columns(_kept=_pid_of("globalTid", names.schema["globalTid"]).is_in(sorted(keep))
                                       .fill_null(False))
            stats["thread_names_dropped"] = int((~names["_kept"]).sum())
            changed["ThreadNames"] = names.filter("_kept").drop("_kept")
            if "StringIds" in tables:  # the other processes' thread names
                nid = _as_int64("nameId", names.schema["nameId"])
                mine = set(names.filter("_kept").select(nid).to_series().to_list())
                blank |= set(names.filter(~pl.col("_kept")).select(nid).to_series().to_list()) - mine
    if "StringIds" in tables:
        strings = frame("StringIds")
        used = _folder_used_ids(tables, changed)
        sid = _as_int64("id", strings.schema["id"])
        gone = (pl.col("value") != _BLANK) & ~sid.is_in(sorted(used))
        stats["orphan_strings_blanked"] = int(strings.filter(~sid.is_in(sorted(blank))).select(gone.sum()).item())
        drop = sid.is_in(sorted(blank)) | gone
        changed["StringIds"] = strings.with_columns(
            pl.when(drop).then(pl.lit(_BLANK)).otherwise("value").cast(strings.schema["value"]).alias("value"))
    try:
        with NewFolder(dst, option="the output", marker=_MARKER, inputs=[src], force=force,
                       what="the scrubbed copy") as out:
            if out.state() not in ("new", "empty") and not force:  # as for a file: replaced only with force
                raise FileExistsError(dst)
            for t, f in tables.items():
                out.write(f.name, _encoded(changed[t], f) if t in changed else f.read_bytes())
            for f in sorted(src.iterdir()):  # anything else nsys wrote there (not a table): as it is
                if f.is_file() and f.suffix not in TABLE_SUFFIXES and f.name not in (_MARKER, ".owner"):
                    out.write(f.name, f.read_bytes())
    except OutputError as e:
        if "pass --force" in str(e):
            raise FileExistsError(dst) from None
        raise ValueError(f"scrub writes a new folder: {e}") from None
    return stats


def _find_strings_folder(path: Path, needles: list[str]) -> dict[str, list[str]]:
    """:func:`find_strings` of a folder export: every text and binary column of every table file."""
    import polars as pl

    hits: dict[str, list[str]] = {}
    for t, f in table_files(path).items():
        lf = _scan(f)
        found = [(pl.col(c).bin.contains(n.encode()) if d == pl.Binary
                  else pl.col(c).cast(pl.String).str.contains(n, literal=True)).any().alias(f"{c}\x00{n}")
                 for c, d in lf.collect_schema().items() if d in (pl.Binary, pl.String, pl.Categorical)
                 for n in dict.fromkeys(needles)]  # (a needle given twice: one column each)
        if not found:
            continue
        for key, hit in lf.select(found).collect().row(0, named=True).items():  # one pass over the table
            if hit:
                c, n = key.split("\x00", 1)
                hits.setdefault(n, []).append(f"{t}.{c}")
    return hits


def find_strings(path: str | Path, needles: list[str]) -> dict[str, list[str]]:
    """Where each needle still occurs: ``{needle: ["TABLE.column", ...]}`` over every text column (of a SQLite
    export, or of every table file of a parquetdir/arrowdir export)."""
    if Path(path).is_dir():
        return _find_strings_folder(Path(path), needles)
    if is_torch_trace(path):
        return find_trace_strings(path, needles)
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
    p.add_argument("input", help="nsys SQLite export, parquetdir/arrowdir folder, or torch profiler trace "
                                 "(.json/.json.gz) (read only)")
    p.add_argument("-o", "--output", required=True, help="scrubbed copy to write (a folder for a folder export)")
    p.add_argument("-f", "--force", action="store_true", help="overwrite OUTPUT")
    p.add_argument("--check", action="append", metavar="TEXT",
                   help="fail (exit 1) if TEXT is still anywhere in the output")
