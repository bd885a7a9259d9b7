"""Read an nsys export (SQLite, or a parquetdir/arrowdir) into the frames of a :class:`~analyze.model.Trace`,
feature-detecting its schema. The queries are shared by :func:`load` (everything in memory) and the
parquet store (:mod:`analyze.read.store`, read in batches).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

import polars as pl

from nvtx_hooks.capture import python_frames

from ..model import MARKS_SCHEMA, OP_KIND, InputError, Trace
from .protocols import ExportReader
from .sqlite import Reader

if TYPE_CHECKING:
    from polars._typing import PolarsDataType

__all__ = ["python_samples", "pid_of", "RUNTIME", "API_SCHEMA", "OPS_SCHEMA", "BAD_API", "api_query", "op_queries", "bad_op",
           "read_meta", "open_reader", "load", "export_rows", "ops_between", "SAMPLES_SCHEMA", "cpu_samples"]

_KERNEL = "CUPTI_ACTIVITY_KIND_KERNEL"
_MEMCPY = "CUPTI_ACTIVITY_KIND_MEMCPY"
_MEMSET = "CUPTI_ACTIVITY_KIND_MEMSET"
_GRAPH_TRACE = "CUPTI_ACTIVITY_KIND_GRAPH_TRACE"
RUNTIME = "CUPTI_ACTIVITY_KIND_RUNTIME"
_NVTX = "NVTX_EVENTS"

_RANGE_TYPES = (59, 60, 70, 71)  # push/pop, start/end, and their NVTXT imports
_MARK = 34  # an instantaneous event ("end" is NULL)
_DOMAIN_CREATE = 75

_KNOWN_SCHEMA_MAJOR = 3
_MEMCPY_KINDS = {1: "HtoD", 2: "DtoH", 3: "HtoA", 4: "AtoH", 5: "AtoA", 6: "AtoD", 7: "DtoA", 8: "DtoD",
                9: "HtoH", 10: "PtoP", 11: "Unknown"}
_P24 = 1 << 24


def pid_of(col: str) -> pl.Expr:
    """Process id inside a globalTid/globalPid (``<hw:8><vm:8><pid:24><tid:24>``)."""
    return ((pl.col(col) // _P24) % _P24).cast(pl.Int64)


def _meta(r: ExportReader) -> tuple[dict[str, str], dict[str, str]]:
    export: dict[str, str] = {}
    for t in ("META_DATA_EXPORT", "EXPORT_META_DATA"):
        if r.has(t, "name", "value"):
            export = {k: v for k, v in r.rows(f"SELECT name, value FROM {t}")}
            break
    capture: dict[str, str] = {}
    if r.has("META_DATA_CAPTURE", "name", "value"):
        for k, v in r.rows("SELECT name, value FROM META_DATA_CAPTURE WHERE name NOT LIKE '%ENVIRONMENT%'"):
            capture.setdefault(k, v)
    return export, capture


def _check_schema(path: str, r: ExportReader, export: dict[str, str]) -> None:
    if "StringIds" not in r.tables and not export:
        raise InputError(
            f"{path}: SQLite, but not an nsys export (no StringIds or META_DATA_EXPORT table)", "NOT_NSYS"
        )
    if "StringIds" not in r.tables and (r.has(_NVTX, "textId") or r.has(_KERNEL, "demangledName")
                                        or r.has(_KERNEL, "shortName")):
        raise InputError(f"{path}: no StringIds table, which its NVTX ranges and kernels name their strings in; "
                         "export it again with every table", "NO_STRINGS")
    ver = export.get("EXPORT_SCHEMA_VERSION", "")
    m = re.match(r"(\d+)\.", ver)
    if m and int(m.group(1)) > _KNOWN_SCHEMA_MAJOR:
        raise InputError(
            f"{path}: nsys export schema {ver} is newer than spectrace knows (major {_KNOWN_SCHEMA_MAJOR}); "
            "upgrade spectrace or export with an older nsys",
            "UNKNOWN_SCHEMA",
        )


def _ranges(r: ExportReader, duration: int | None, notes: dict[str, int] | None = None
            ) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame]:
    """NVTX ranges, domains and marks (frames ``ranges`` and ``marks`` of a Trace). ``notes`` gets the counts
    of odd ranges: ``missing_strings`` (a ``textId`` StringIds lacks: name ''), ``long_ranges`` (longer than
    the session: end = session end) and ``reversed_ranges`` (end before start: left out). Where a range ends is
    judged on the capture's own clock (:func:`_session_end`), whatever its origin."""
    cols = r.columns(_NVTX)
    empty = pl.DataFrame(
        schema={"range_id": pl.Int64, "pid": pl.Int64, "gtid": pl.Int64, "start": pl.Int64, "end": pl.Int64,
                "event_type": pl.Int64, "domain": pl.String, "range": pl.String, "color": pl.Int64,
                "uint64": pl.Int64, "int64": pl.Int64, "unclosed": pl.Boolean, "cross_thread": pl.Boolean}
    )
    if not cols:
        return (empty, pl.DataFrame(schema={"pid": pl.Int64, "domain_id": pl.Int64, "domain": pl.String}),
                pl.DataFrame(schema=MARKS_SCHEMA))
    strings = "textId" in cols and r.has("StringIds", "id", "value")
    text = "COALESCE(n.text, s.value, '')" if strings else "COALESCE(n.text, '')"
    join = "LEFT JOIN StringIds s ON s.id = n.textId" if strings else ""
    missing = ("n.text IS NULL AND n.textId IS NOT NULL" + (" AND s.value IS NULL" if strings else "")
               if "textId" in cols else "0")

    def opt(c: str, alias: str) -> str:
        return f"n.{c} AS {alias}" if c in cols else f"NULL AS {alias}"

    types = ",".join(str(t) for t in (*_RANGE_TYPES, _MARK, _DOMAIN_CREATE))
    raw = r.frame(
        f"""SELECT n.rowid AS range_id, n.start AS start, n."end" AS "end", n.eventType AS event_type,
                   n.globalTid AS gtid, {opt('endGlobalTid', 'end_gtid')}, {opt('domainId', 'domain_id')},
                   {text} AS "range", {opt('color', 'color')}, {opt('uint64Value', 'uint64')},
                   {opt('int64Value', 'int64')}, CAST(({missing}) AS INTEGER) AS missing_text
            FROM {_NVTX} n {join} WHERE n.eventType IN ({types})""",
        schema={"range_id": pl.Int64, "start": pl.Int64, "end": pl.Int64, "event_type": pl.Int64,
                "gtid": pl.Int64, "end_gtid": pl.Int64, "domain_id": pl.Int64, "range": pl.String,
                "color": pl.Int64, "uint64": pl.Int64, "int64": pl.Int64, "missing_text": pl.Int64},
    ).with_columns(pid=pid_of("gtid"), domain_id=pl.col("domain_id").fill_null(0))
    domains = (
        raw.filter(pl.col("event_type") == _DOMAIN_CREATE)
        .select("pid", "domain_id", domain=pl.col("range"))
        .unique(["pid", "domain_id"], keep="last")
    )
    # Exports sliced to a window may lack the domain-create rows: fall back to the id alone.
    by_id = domains.group_by("domain_id").agg(pl.col("domain").first().alias("domain_any"))
    rng = (
        raw.filter(pl.col("event_type") != _DOMAIN_CREATE)
        .join(domains, on=["pid", "domain_id"], how="left", maintain_order="left")
        .join(by_id, on="domain_id", how="left", maintain_order="left")
        .with_columns(
            domain=pl.when(pl.col("domain_id") == 0)
            .then(pl.lit(""))
            .otherwise(pl.coalesce("domain", "domain_any", pl.format("domain{}", pl.col("domain_id"))))
        )
    )
    is_mark = pl.col("event_type") == _MARK
    marks = rng.filter(is_mark).select("pid", "gtid", "domain", "uint64", "int64", time="start", mark="range")
    marks = marks.select(list(MARKS_SCHEMA))
    rng = rng.filter(~is_mark)
    end_cap = _session_end(r, duration, rng.select(pl.col("start").max()).item())
    # Without a known session end, a range nsys never saw closed (null end) ends with the capture's last event.
    fill = end_cap if end_cap is not None else max((v for v in (rng["end"].max(), rng["start"].max())
                                                    if v is not None), default=None)
    long = (pl.col("end") - pl.col("start") > duration) if duration else pl.lit(False)
    rng = rng.with_columns(
        unclosed=pl.col("end").is_null() | (((pl.col("end") >= end_cap) & ~long) if end_cap is not None else False),
        end=pl.when(long).then(pl.lit(fill)).otherwise(pl.col("end").fill_null(fill)),
        cross_thread=pl.col("end_gtid").is_not_null() & (pl.col("end_gtid") != pl.col("gtid")),
        _long=long.fill_null(False),
    )
    reversed_ = pl.col("end") < pl.col("start")
    if notes is not None:
        odd = rng.select(missing_strings=(pl.col("missing_text") != 0).sum(), long_ranges=pl.col("_long").sum(),
                         reversed_ranges=reversed_.sum()).row(0, named=True)
        for k, v in odd.items():
            notes[k] = notes.get(k, 0) + int(v or 0)
    rng = rng.filter(~reversed_.fill_null(False)).select(empty.columns)
    return rng.cast(empty.schema), domains, marks.cast(MARKS_SCHEMA)


_STARTED, _STOPPED = "Profiling has started.", "Profiling has stopped."  # nsys's DIAGNOSTIC_EVENT texts


def _session_end(r: ExportReader, duration: int | None, last_start: int | None = None) -> int | None:
    """When the capture session ended, on the capture's own clock (the end nsys gives a range it never saw
    closed): the time of nsys's "Profiling has stopped." diagnostic; else its "Profiling has started." plus
    ``ANALYSIS_DETAILS.duration`` (a length, not a time); else ``duration`` itself, nsys's clock starting with
    the session, unless a range starts after it (``last_start``: the clock has another origin); else None."""
    if r.has("DIAGNOSTIC_EVENT", "timestamp", "text"):  # a few dozen rows
        kind = "timestampType" if "timestampType" in r.columns("DIAGNOSTIC_EVENT") else "1"
        d = r.frame(f"SELECT timestamp AS t, text, {kind} AS kind FROM DIAGNOSTIC_EVENT")
        d = d.filter(pl.col("kind").cast(pl.Int64, strict=False) == 1).select(  # the capture's clock, not the host's
            pl.col("t").cast(pl.Int64, strict=False), text=pl.col("text").cast(pl.String, strict=False))
        stopped, started = (d.filter(pl.col("text") == t).select(pl.col("t").min()).item()
                            for t in (_STOPPED, _STARTED))
        if stopped is not None:
            return int(stopped)
        if started is not None and duration is not None:
            return int(started) + duration
    if duration is not None and (last_start is None or last_start <= duration):
        return duration
    return None


API_SCHEMA = pl.Schema({"pid": pl.Int64, "gtid": pl.Int64, "corr": pl.Int64, "start": pl.Int64, "end": pl.Int64,
                        "name_id": pl.Int64})


def api_query(r: ExportReader) -> tuple[str, Callable[[pl.DataFrame], pl.DataFrame]] | None:
    """The CUDA API query and the function that turns its rows (all, or a batch) into ``api`` rows."""
    if not r.has(RUNTIME, "correlationId", "globalTid"):
        return None

    def post(df: pl.DataFrame) -> pl.DataFrame:
        df = df.cast({"gtid": pl.Int64, "corr": pl.Int64, "start": pl.Int64, "end": pl.Int64, "name_id": pl.Int64})
        return df.with_columns(pid=pid_of("gtid")).select(list(API_SCHEMA))

    return (f"""SELECT globalTid AS gtid, correlationId AS corr, start, "end", nameId AS name_id
            FROM {RUNTIME}""", post)


BAD_API = pl.col("pid").is_null()  # no thread id: no process to attribute the call to


def _api(r: ExportReader) -> pl.DataFrame:
    q = api_query(r)
    if q is None:
        return pl.DataFrame(schema=API_SCHEMA)
    return q[1](r.frame(q[0]))


_OPS_DTYPES: dict[str, PolarsDataType] = {
    "pid": pl.Int64, "device": pl.Int64, "stream": pl.Int64, "corr": pl.Int64, "start": pl.Int64, "end": pl.Int64,
    "kind": OP_KIND, "name_id": pl.Int64, "label": pl.String, "in_graph": pl.Boolean, "graph": pl.Int32}
OPS_SCHEMA = pl.Schema(_OPS_DTYPES)
_GRAPH_BITS = 512  # ``device`` packs deviceId (< 256) * 2 + node flag, then + 512 * (graph + 1)
# The graph an op belongs to: a node's graphNodeId carries its graph's id in its upper 32 bits (nsys 2025.3:
# the graph exec id; the graph-level rows' graphExecId), 0 when the op is not in a graph.
_GRAPH_SQL = f" + {_GRAPH_BITS} * COALESCE(CAST(graphNodeId / 4294967296 AS BIGINT) + 1, 0)"


def _finish_ops(df: pl.DataFrame) -> pl.DataFrame:
    # ``device`` came as deviceId * 2 + (graphNodeId IS NOT NULL) + 512 * (graph id + 1): one column out of SQLite
    # instead of three (at 10 M kernels a column costs ~0.5 CPU-s to read)
    v = pl.col("device")
    graph: pl.Expr = pl.when(v >= _GRAPH_BITS).then(v // _GRAPH_BITS - 1)
    if "graph" in df.collect_schema().names():  # a graph-level row: its graph exec id (also of a LazyFrame's rows:
        # its schema, no PerformanceWarning)
        graph = pl.coalesce("graph", graph)
    return (df.with_columns(pid=pid_of("gpid"), in_graph=(v % 2) == 1, graph=graph, device=(v % _GRAPH_BITS) // 2)
            .select(list(OPS_SCHEMA)).cast(OPS_SCHEMA))


def op_queries(r: ExportReader) -> list[tuple[str, str, Callable[[pl.DataFrame], pl.DataFrame]]]:
    """Per GPU activity table present: ``(table, query, post)``; ``post`` turns its rows (all, or a batch) into ops."""
    out = []

    def common(table: str) -> str:
        node = f" + (graphNodeId IS NOT NULL){_GRAPH_SQL}" if "graphNodeId" in r.columns(table) else ""
        return (f'SELECT start, "end", deviceId * 2{node} AS device, streamId AS stream, correlationId AS corr, '
                f"globalPid AS gpid FROM {table}")

    if r.has(_KERNEL, "start", "end", "correlationId", "globalPid"):
        name = "demangledName" if "demangledName" in r.columns(_KERNEL) else "shortName"
        q = common(_KERNEL).replace(" FROM", f", {name} AS name_id FROM")
        out.append((_KERNEL, q, lambda df: _finish_ops(
            df.with_columns(kind=pl.lit("kernel", OP_KIND), label=pl.lit(None, pl.String)))))
    if r.has(_MEMCPY, "start", "end", "correlationId", "globalPid"):
        q = common(_MEMCPY).replace(" FROM", ", copyKind AS copy_kind FROM")

        def memcpy(df: pl.DataFrame) -> pl.DataFrame:
            kinds = pl.col("copy_kind").cast(pl.Int64).replace_strict(_MEMCPY_KINDS, default="?",
                                                                      return_dtype=pl.String)
            return _finish_ops(df.with_columns(kind=pl.lit("memcpy", OP_KIND), name_id=pl.lit(None, pl.Int64),
                                               label=pl.format("[CUDA memcpy {}]", kinds)).drop("copy_kind"))

        out.append((_MEMCPY, q, memcpy))
    if r.has(_MEMSET, "start", "end", "correlationId", "globalPid"):
        q = common(_MEMSET)
        out.append((_MEMSET, q, lambda df: _finish_ops(
            df.with_columns(kind=pl.lit("memset", OP_KIND), name_id=pl.lit(None, pl.Int64),
                            label=pl.lit("[CUDA memset]")))))
    if r.has(_GRAPH_TRACE, "start", "end", "correlationId", "globalPid"):
        cols = r.columns(_GRAPH_TRACE)
        gid = "graphId" if "graphId" in cols else "NULL"
        exe = "graphExecId" if "graphExecId" in cols else gid
        q = common(_GRAPH_TRACE).replace(" FROM", f", {gid} AS graph_id, {exe} AS graph FROM")
        out.append((_GRAPH_TRACE, q, lambda df: _finish_ops(
            df.with_columns(kind=pl.lit("graph", OP_KIND), name_id=pl.lit(None, pl.Int64),
                            label=pl.format("[CUDA graph {}]", pl.col("graph_id")),
                            device=pl.col("device") % _GRAPH_BITS // 2 * 2)  # a whole graph: no node
            .drop("graph_id"))))
    return out


def _ops(r: ExportReader) -> pl.DataFrame:
    parts = [post(r.frame(q)) for _, q, post in op_queries(r)]
    if not parts:
        return pl.DataFrame(schema=OPS_SCHEMA)
    return pl.concat(parts, how="vertical")


_BAD_OP = ((pl.col("start") <= 0) | (pl.col("end") < pl.col("start")) | pl.col("start").is_null()
          | pl.col("end").is_null() | pl.col("pid").is_null())


def bad_op(duration: int | None) -> pl.Expr:
    """GPU operations that are dropped: :data:`_BAD_OP` (invalid times, no process id), or longer than the session."""
    return _BAD_OP | (pl.col("end") - pl.col("start") > duration) if duration else _BAD_OP


def _strings(r: ExportReader) -> pl.DataFrame:
    if "StringIds" not in r.tables:
        return pl.DataFrame(schema={"name_id": pl.Int64, "name": pl.String})
    return r.frame("SELECT id AS name_id, value AS name FROM StringIds",
                   schema={"name_id": pl.Int64, "name": pl.String})


def _names(strings: pl.DataFrame, ids: pl.Series) -> pl.DataFrame:
    """StringIds rows for the given ids only (kernel and API names)."""
    return strings.join(pl.DataFrame({"name_id": ids.unique().drop_nulls()}).cast(pl.Int64), on="name_id",
                        how="semi")


def _devices(r: ExportReader) -> pl.DataFrame:
    if r.has("TARGET_INFO_GPU", "id", "name"):
        return r.frame("SELECT DISTINCT id AS device, name AS device_name FROM TARGET_INFO_GPU",
                       schema={"device": pl.Int64, "device_name": pl.String}).unique("device")
    return pl.DataFrame(schema={"device": pl.Int64, "device_name": pl.String})


def _nsys_diagnostics(r: ExportReader) -> pl.DataFrame:
    schema = pl.Schema({"timestamp": pl.Int64, "severity": pl.Int64, "text": pl.String, "pid": pl.Int64})
    if not r.has("DIAGNOSTIC_EVENT", "text"):
        return pl.DataFrame(schema=schema)
    df = r.frame("SELECT timestamp, severity, text, globalPid AS gpid FROM DIAGNOSTIC_EVENT")
    return df.with_columns(pid=pid_of("gpid")).select(list(schema)).cast(schema)


# The columns read of each table (a table present without one of them is not an export spectrace can read:
# every nsys from 2022.4 to 2026.x writes them all, ../shared/docs/nsys-sqlite.md); a tuple: any one of them.
_REQUIRED: dict[str, tuple[str | tuple[str, ...], ...]] = {
    _NVTX: ("start", "end", "eventType", "globalTid"),
    _KERNEL: ("start", "end", "deviceId", "streamId", "correlationId", "globalPid", ("demangledName", "shortName")),
    _MEMCPY: ("start", "end", "deviceId", "streamId", "correlationId", "globalPid", "copyKind"),
    _MEMSET: ("start", "end", "deviceId", "streamId", "correlationId", "globalPid"),
    _GRAPH_TRACE: ("start", "end", "deviceId", "streamId", "correlationId", "globalPid"),
    RUNTIME: ("start", "end", "correlationId", "globalTid", "nameId"),
    "StringIds": ("id", "value"),
}


def _check_columns(path: str, r: ExportReader) -> None:
    """InputError naming the table and the column when a table spectrace reads lacks one (an export from a tool
    or an nsys version that does not write it), instead of a failed query called a corrupt file."""
    for table, need in _REQUIRED.items():
        if table not in r.tables:
            continue
        have = set(r.columns(table))
        missing = [c if isinstance(c, str) else " or ".join(c) for c in need
                   if not (c in have if isinstance(c, str) else have & set(c))]
        if missing:
            raise InputError(f"{path}: {table} has no column {', '.join(missing)} (every nsys from 2022.4 to 2026.x "
                             "writes it: this export was made or changed by another tool); export it again with "
                             "`nsys export --type sqlite`", "MISSING_COLUMN")


def _check_string_ids(path: str, r: ExportReader) -> None:
    """InputError when StringIds holds an id more than once (an export appended to, or two merged): every name
    join would multiply rows and a name would be either string. Free when ``id`` is SQLite's INTEGER PRIMARY KEY
    (nsys's own DDL): it cannot repeat."""
    if not r.has("StringIds", "id"):
        return
    if isinstance(r, Reader) and any(row[1] == "id" and row[5] == 1 and str(row[2]).upper() == "INTEGER"
                                     for row in r.rows("PRAGMA table_info(StringIds)")):
        return
    n, distinct = r.rows("SELECT COUNT(*), COUNT(DISTINCT id) FROM StringIds")[0]
    if n and distinct is not None and n > distinct:
        raise InputError(f"{path}: StringIds holds {n - distinct:,} ids more than once (an export appended to, or "
                         "two merged?): each name would be ambiguous; export it again with `nsys export --type "
                         "sqlite`", "DUPLICATE_IDS")


def read_meta(r: ExportReader) -> dict:
    """Export and capture metadata, session duration and start (small queries); checks the schema and the
    columns read."""
    export, capture = _meta(r)
    _check_schema(str(r.path), r, export)
    _check_columns(str(r.path), r)
    _check_string_ids(str(r.path), r)
    duration = None
    if r.has("ANALYSIS_DETAILS", "duration"):
        row = r.rows("SELECT MAX(duration) FROM ANALYSIS_DETAILS")
        duration = row[0][0] if row else None
    utc = None
    if r.has("TARGET_INFO_SESSION_START_TIME", "utcEpochNs"):
        row = r.rows("SELECT MIN(utcEpochNs) FROM TARGET_INFO_SESSION_START_TIME")
        utc = row[0][0] if row else None
    return {"export": export, "capture": capture, "duration": duration, "utc": utc,
            "read_warnings": {"kernels_not_exported": _kernels_not_exported(r)}}


def _kernels_not_exported(r: ExportReader) -> int:
    """Kernel launch calls in an export without a kernel table (those kernels are in no number), else 0. An export
    of CUDA graphs traced as a whole has no kernel table either when every kernel ran in a graph: no launch call."""
    if r.has(_KERNEL) or not r.has(RUNTIME, "nameId") or not r.has("StringIds", "id", "value"):
        return 0
    row = r.rows(f"SELECT COUNT(*) FROM {RUNTIME} rt JOIN StringIds s ON s.id = rt.nameId "
                 "WHERE s.value LIKE 'cudaLaunchKernel%' OR s.value LIKE 'cuLaunchKernel%'")
    return int(row[0][0] or 0) if row else 0


def open_reader(path: str | os.PathLike) -> ExportReader:
    """A reader for an nsys export: a SQLite file, or a ``parquetdir``/``arrowdir`` directory; or for a torch
    profiler trace (a ``.json``/``.json.gz`` file or a folder of them: :mod:`analyze.read.kineto`, read as the
    parquetdir export it is converted to)."""
    if os.path.isdir(path):
        from .exportdir import DirReader, is_export_dir

        if is_export_dir(path):
            return DirReader(path)
    from .kineto import KinetoReader, is_trace

    if is_trace(path):
        return KinetoReader(path)
    return Reader(path)


def load(path: str | os.PathLike) -> Trace:
    """Read an nsys export (read-only) into a :class:`Trace`, everything in memory; bad input raises InputError.

    ``path`` is a SQLite export or a ``parquetdir``/``arrowdir`` directory. (The parquet store,
    :func:`analyze.read.store.open_store`, gives the same frames one process at a time.)
    """
    r = open_reader(path)
    try:
        m = read_meta(r)
        export, capture, duration, utc = m["export"], m["capture"], m["duration"], m["utc"]
        # The big tables are read in parallel: each read has its own connection.
        notes: dict[str, int] = {}
        with ThreadPoolExecutor(max_workers=max(2, min(4, os.cpu_count() or 2))) as ex:
            f_ops, f_api = ex.submit(_ops, r), ex.submit(_api, r)
            f_rng, f_str = ex.submit(_ranges, r, duration, notes), ex.submit(_strings, r)
            ops, api, (ranges, _domains, marks), strings = (f_ops.result(), f_api.result(), f_rng.result(),
                                                            f_str.result())
        bad = bad_op(duration)
        dropped = int(ops.select(bad.sum()).item() or 0)
        ops = ops.filter(~bad)
        notes["api_without_pid"] = int(api.select(BAD_API.sum()).item() or 0)
        api = api.filter(~BAD_API)
        names = _names(strings, pl.concat([ops["name_id"], api["name_id"]]))
        devices, diagnostics = _devices(r), _nsys_diagnostics(r)
        notes["lossy_strings"] = r.lossy
        notes.update(m["read_warnings"])
        r.check_unchanged()
        return Trace(
            path=str(r.path),
            nsys_version=export.get("EXPORT_PRODUCT_VERSION", "unknown"),
            schema_version=export.get("EXPORT_SCHEMA_VERSION", "unknown"),
            export_meta=export,
            capture_meta=capture,
            duration_ns=duration,
            ranges=ranges,
            marks=marks,
            api=api,
            ops=ops,
            names=names,
            devices=devices,
            nsys_diagnostics=diagnostics,
            tables=set(r.tables),
            dropped_ops=dropped,
            utc_epoch_ns=utc,
            read_warnings={k: v for k, v in notes.items() if v},
        )
    finally:
        r.close()


def export_rows(path: str | os.PathLike) -> int:
    """About how many GPU-operation and CUDA API rows the export holds (largest rowids: no scan)."""
    r = open_reader(path)
    try:
        n = sum(r.max_rowid(t) for t, _, _ in op_queries(r))
        return n + (r.max_rowid(RUNTIME) if api_query(r) else 0)
    finally:
        r.close()


def ops_between(path: str | os.PathLike, t0: int, t1: int) -> pl.DataFrame:
    """The export's GPU operations overlapping ``[t0, t1)`` (the ``ops`` frame of :func:`load`, cut in SQL)."""
    r = open_reader(path)
    try:
        parts = [post(r.frame(f'{q} WHERE start < {int(t1)} AND "end" > {int(t0)}')) for _, q, post in op_queries(r)]
    finally:
        r.close()
    return pl.concat(parts) if parts else pl.DataFrame(schema=OPS_SCHEMA)


_FRAMES_DEEP = 12  # call-chain frames read per CPU sample, leaf first: the top resolved one is within them
SAMPLES_SCHEMA = pl.Schema({"gtid": pl.Int64, "time": pl.Int64, "frame": pl.String})


def cpu_samples(path: str | os.PathLike, gtids: list[int]) -> pl.DataFrame | None:
    """The CPU IP samples of threads ``gtids`` (nsys ``--sample``: ``COMPOSITE_EVENTS`` and their call chains in
    ``SAMPLING_CALLCHAINS``), each with its top native frame: the frame nearest the leaf whose symbol nsys resolved,
    as ``symbol (module file name)``; null when none of the first frames resolved. None when the export has no
    samples (or is not SQLite or an export folder with those tables)."""
    r = open_reader(path)
    try:
        if not (r.has("COMPOSITE_EVENTS", "id", "start", "globalTid")
                and r.has("SAMPLING_CALLCHAINS", "id", "symbol", "module", "stackDepth")):
            return None
        ids = ",".join(str(int(g)) for g in gtids) or "NULL"
        ev = r.frame(f"SELECT id, start AS time, globalTid AS gtid FROM COMPOSITE_EVENTS WHERE globalTid IN ({ids})",
                     {"id": pl.Int64, "time": pl.Int64, "gtid": pl.Int64})
        if ev.height == 0:
            return pl.DataFrame(schema=SAMPLES_SCHEMA)
        unresolved = "c.unresolved" if r.has("SAMPLING_CALLCHAINS", "unresolved") else "0"
        ch = r.frame(f"SELECT c.id, c.stackDepth AS depth, c.symbol, c.module, {unresolved} AS unresolved "
                     f"FROM SAMPLING_CALLCHAINS c WHERE c.stackDepth < {_FRAMES_DEEP}",
                     {"id": pl.Int64, "depth": pl.Int64, "symbol": pl.Int64, "module": pl.Int64,
                      "unresolved": pl.Int64})
        strings = _strings(r)
    finally:
        r.close()
    ch = (ch.join(ev.select("id"), on="id", how="semi")
          .join(strings.select(symbol="name_id", _sym="name"), on="symbol", how="left")
          .join(strings.select(module="name_id", _mod="name"), on="module", how="left")
          .filter((pl.col("unresolved").fill_null(0) == 0) & pl.col("_sym").is_not_null()
                  & ~pl.col("_sym").str.contains(r"^(0x[0-9a-fA-F]+|\[.*\]|Unknown)$"))
          .sort("id", "depth").unique("id", keep="first")
          .select("id", frame=pl.format("{} ({})", "_sym", pl.col("_mod").str.split("/").list.last())))
    return ev.join(ch, on="id", how="left").select(list(SAMPLES_SCHEMA)).cast(SAMPLES_SCHEMA)  # type: ignore[arg-type]


_UNESCAPE = {"&lt;": "<", "&gt;": ">", "&quot;": '"', "&#39;": "'", "&amp;": "&"}  # nsys writes the names HTML-escaped


def python_samples(path: str | os.PathLike, gtids: list[int]) -> pl.DataFrame | None:
    """The Python samples of threads ``gtids`` (nsys ``--python-sampling=true``, exported ``--include-blobs=true``:
    NVTX events whose binary payload is a Python stack, :mod:`nvtx_hooks.capture.python_frames`), each with its
    innermost frame as ``function (file name:line)``. None when the export has none (no Python sampling, or the
    payloads were not exported: ``--include-blobs``)."""
    pf = python_frames
    r = open_reader(path)
    try:
        if not (r.has("NVTX_EVENTS", "start", "globalTid", "domainId", "binaryData")
                and r.has("NVTX_PAYLOAD_SCHEMAS", "domainId", "name")):
            return None
        ids = ",".join(str(int(g)) for g in gtids) or "NULL"
        ev = r.frame(f"""SELECT start AS time, globalTid AS gtid, binaryData AS data FROM NVTX_EVENTS
                         WHERE binaryData IS NOT NULL AND globalTid IN ({ids}) AND domainId IN
                         (SELECT domainId FROM NVTX_PAYLOAD_SCHEMAS WHERE name = '{pf.SAMPLING}')""",
                     {"time": pl.Int64, "gtid": pl.Int64, "data": pl.Binary})
        strings = _strings(r) if ev.height else None
    finally:
        r.close()
    if strings is None:
        return None

    def u64(at: pl.Expr) -> pl.Expr:
        return pl.col("data").bin.slice(at, 8).bin.reinterpret(dtype=pl.UInt64, endianness="little").cast(pl.Int64)

    at = u64(pl.lit(pf.PAYLOAD_AT)) + pf.FRAMES_AT  # the innermost frame
    ok = pl.col("data").bin.size() >= at + pf.FRAME_BYTES
    top = ev.filter(pl.col("data").bin.size() >= pf.PAYLOAD_AT + 8).filter(ok).select(
        "gtid", "time", _f=u64(at), _file=u64(at + 8), _line=u64(at + 16))
    name = strings.with_columns(pl.col("name").str.replace_many(list(_UNESCAPE), list(_UNESCAPE.values())))
    top = (top.join(name.select(_f="name_id", _fn="name"), on="_f", how="left")
           .join(name.select(_file="name_id", _fl="name"), on="_file", how="left"))
    frame = pl.format("{} ({}:{})", "_fn", pl.col("_fl").str.split("/").list.last(), "_line")
    return top.select("gtid", "time", frame=pl.when(pl.col("_fn").is_not_null()).then(frame)).cast(SAMPLES_SCHEMA)
