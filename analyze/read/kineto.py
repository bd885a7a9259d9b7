"""Read a PyTorch profiler trace (Kineto / Chrome trace-event JSON) as an nsys ``parquetdir`` export.

A torch profiler trace (``torch.profiler`` / SGLang's ``/start_profile``: one ``.json`` or ``.json.gz`` per rank, a
folder of them, or SGLang's merged file) is converted, in one streaming pass (:mod:`ijson`'s C parser: the whole
file is never in memory, the rows go to parquet every :data:`FLUSH_ROWS`), into the tables an nsys parquetdir export
has, with nsys's table and column names; :class:`KinetoReader` then reads them as
:class:`analyze.read.exportdir.DirReader` reads such an export, so every query, the store and every verb work on it
unchanged. The tables are a cache (:func:`tables_dir_for`: ``<trace>.tables.spectrace`` beside the trace, or in the
user cache folder), keyed by the trace's files as the store is (:func:`analyze.read.store.fingerprint.file_keys`), built under
a temporary name and renamed into place, reused while the trace is unchanged.

What maps to what (docs/torch-profiler.md has the whole table):

- ``kernel`` / ``gpu_memcpy`` / ``gpu_memset`` events → ``CUPTI_ACTIVITY_KIND_KERNEL`` / ``MEMCPY`` / ``MEMSET``
  (``args.device``, ``args.stream``, ``args.correlation``; a kernel's ``args["graph id"]``, when Kineto gives it,
  → ``graphNodeId``); ``cuda_runtime`` / ``cuda_driver`` events → ``CUPTI_ACTIVITY_KIND_RUNTIME`` (the launching
  calls, with the same correlation ids). A GPU operation belongs to the process whose call has its correlation id.
- ``user_annotation`` events (``record_function``) → ``NVTX_EVENTS`` ranges (no domain). spectrace's own names
  (:func:`nvtx_hooks.phases.parse_annotation`: ``spectrace:verify``, payload and all) → ranges of the ``spectrace``
  domain. A process without them: SGLang's native spans (0.5.23: ``draft``, ``draft_extend``, ``step[VERIFY bs=N]``,
  ``step[EXTEND bs=N toks=T]``, ``step[DECODE bs=N]``) → the phases, and the cycles inferred from their sequence
  (:func:`native_phases`).
- Ranks: each file is a process (SGLang's merged file: each ``[TPnn]`` pid label); the rank from
  ``distributedInfo.rank``, the label or the file name (``-TP-{rank}``) is recorded in ``META_DATA_CAPTURE``.
- Clocks: ``baseTimeNanoseconds + ts`` is Unix time in every file (Kineto's base is a Unix time), so the files of
  one input share one clock; times are written relative to the earliest event, whose Unix time is
  ``TARGET_INFO_SESSION_START_TIME.utcEpochNs`` (several inputs are aligned from there, as nsys reports are).
- What a torch trace lacks (GPU metrics, CUDA graph nodes, NVTX domains and payloads of SGLang's native spans) is
  said once, in ``META_DATA_EXPORT`` ``SPECTRACE_INPUT_NOTE`` (the analysis' ``TORCH_PROFILER_TRACE`` note).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import tempfile
import uuid
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import polars as pl

from nvtx_hooks import phases as ph
from nvtx_hooks.capture import chrome_trace
from nvtx_hooks.capture.files import table_files

from ..model import InputError
from .exportdir import DirReader
from .store.errors import CacheWriteError
from .store.fingerprint import file_keys
from .store.layout import MARKER
from .store.location import SUFFIX, cache_dir_for

__all__ = ["FORMAT_VERSION", "FLUSH_ROWS", "TRACE_SUFFIXES", "is_trace", "trace_files", "tables_dir_for", "convert",
           "native_phases", "KinetoReader"]

FORMAT_VERSION = 1  # of the converted tables: a change rebuilds them
FLUSH_ROWS = 262_144  # rows of one table buffered in Python before they go to a parquet part
TRACE_SUFFIXES = (".json", ".json.gz")
_LABEL = re.compile(r"^\[([^\]]*)\] ?(.*)$")  # SGLang's merged file: "[TP01] 12345"
_RANK_IN_LABEL = re.compile(r"TP0*(\d+)")
_RANK_IN_NAME = re.compile(r"-TP-(\d+)")
_MEMCPY_KIND = {"HtoD": 1, "DtoH": 2, "HtoA": 3, "AtoH": 4, "AtoA": 5, "AtoD": 6, "DtoA": 7, "DtoD": 8, "HtoH": 9,
                "PtoP": 10}
_SPECTRACE_DOMAIN = 1  # NVTX domain id of the spectrace phases in the tables (0: no domain)
_PUSH_POP, _MARK, _DOMAIN_CREATE = 59, 34, 75  # nsys NVTX event types
_P24 = 1 << 24
_TABLES_INFIX = ".tables"

# Kineto event category → table kind (other categories: cpu_op, python_function, ac2g flows, ... are skipped)
_KERNEL, _MEMCPY, _MEMSET, _API, _ANNOTATION, _SPAN = range(6)
_KINDS = {"kernel": _KERNEL, "gpu_memcpy": _MEMCPY, "gpu_memset": _MEMSET, "cuda_runtime": _API,
          "cuda_driver": _API, "user_annotation": _ANNOTATION, "Trace": _SPAN}
_SCHEMAS: dict[int, dict[str, Any]] = {
    _KERNEL: {"src": pl.Int32, "start": pl.Int64, "dur": pl.Int64, "name_id": pl.Int64, "device": pl.Int64,
              "stream": pl.Int64, "corr": pl.Int64, "graph": pl.Int64},
    _MEMCPY: {"src": pl.Int32, "start": pl.Int64, "dur": pl.Int64, "name_id": pl.Int64, "device": pl.Int64,
              "stream": pl.Int64, "corr": pl.Int64, "bytes": pl.Int64},
    _MEMSET: {"src": pl.Int32, "start": pl.Int64, "dur": pl.Int64, "name_id": pl.Int64, "device": pl.Int64,
              "stream": pl.Int64, "corr": pl.Int64, "bytes": pl.Int64},
    _API: {"src": pl.Int32, "pid": pl.Int64, "tid": pl.Int64, "start": pl.Int64, "dur": pl.Int64,
           "name_id": pl.Int64, "corr": pl.Int64},
    _ANNOTATION: {"src": pl.Int32, "pid": pl.Int64, "tid": pl.Int64, "start": pl.Int64, "dur": pl.Int64,
                  "name_id": pl.Int64},
    _SPAN: {"src": pl.Int32, "start": pl.Int64, "dur": pl.Int64},
}
_PART = {_KERNEL: "kernel", _MEMCPY: "memcpy", _MEMSET: "memset", _API: "api", _ANNOTATION: "annotation",
         _SPAN: "span"}


# ---- what the input is ----------------------------------------------------------------------------------------


def _starts_json(path: Path, by_name: bool = True) -> bool:
    """Whether the file's text (gunzipped) starts, after white space, with ``{`` or ``[`` (``by_name``: or the file is
    named ``*.json(.gz)``: its reader then says what is wrong with it)."""
    try:
        with chrome_trace.opened(path) as f:
            head = f.read(chrome_trace.SNIFF)
    except (OSError, EOFError, zlib.error):
        head = b""
        with contextlib.suppress(OSError), path.open("rb") as f:
            head = f.read(2)
        return by_name and head == chrome_trace.GZIP and path.name.endswith(TRACE_SUFFIXES)  # a broken gzip named as a trace
    return head.lstrip()[:1] in (b"{", b"[") or (by_name and path.name.endswith(TRACE_SUFFIXES))


def trace_files(path: str | os.PathLike) -> list[Path]:
    """The trace files of an input: the file itself, or a folder's ``*.json`` / ``*.json.gz`` files (regular files,
    not hidden, by name; SGLang's ``merged-*`` file is left out when the per-rank files are there too)."""
    p = Path(path)
    if not p.is_dir():
        return [p]
    files = sorted(f for f in p.iterdir() if f.name.endswith(TRACE_SUFFIXES) and not f.name.startswith(".")
                   and f.is_file())
    ranks = [f for f in files if not f.name.startswith("merged-")]
    return ranks or files


def is_trace(path: str | os.PathLike) -> bool:
    """Whether ``path`` is for this reader: a file whose (gunzipped) text is JSON, or a folder of ``*.json(.gz)``
    files that is not an nsys parquetdir/arrowdir export. A JSON file that is not a trace is for it too (it says so
    in one line); anything else (SQLite, a gzip of something else) is left to the other readers."""
    p = Path(path)
    try:
        if p.is_dir():
            return not table_files(p) and any(_starts_json(f, by_name=False) for f in trace_files(p))
        return p.is_file() and _starts_json(p)
    except OSError:
        return False


def tables_dir_for(path: str | os.PathLike) -> Path:
    """Where the converted tables of ``path`` are kept: beside the store's cache (:func:`cache_dir_for`), named
    ``<trace>.tables.spectrace``."""
    store = cache_dir_for(path)
    return store.with_name(store.name[: -len(SUFFIX)] + _TABLES_INFIX + SUFFIX)


def _key(path: str | os.PathLike) -> dict:
    return {"kineto_tables": FORMAT_VERSION, **file_keys(path, check=False)}


# ---- one streaming pass over a file ---------------------------------------------------------------------------


@dataclass
class _File:
    """One trace file's metadata, gathered around its events."""

    path: Path
    meta: dict = field(default_factory=dict)
    base_ns: int = 0
    host: str | None = None


@dataclass
class _Source:
    """A process of the input: a file, or one rank label of SGLang's merged file."""

    file: int
    label: str | None
    rank: int | None


class _Parse:
    """The streaming pass: rows by table kind, buffered and flushed to parquet parts in ``work``."""

    def __init__(self, work: Path):
        self.work = work
        self.rows: dict[int, list[tuple]] = {k: [] for k in _SCHEMAS}
        self.parts: dict[int, list[Path]] = {k: [] for k in _SCHEMAS}
        self.names: dict[str, int] = {}
        self.files: list[_File] = []
        self.sources: list[_Source] = []
        self._src_of: dict[tuple[int, str | None], int] = {}
        self.tids: dict[object, int] = {}  # a thread id that is not an integer → a number of its own
        self.skipped = 0  # events of a known kind that could not be read (a missing time, a string for a number)

    # -- rows --

    def _flush(self, kind: int) -> None:
        """The buffered rows of ``kind`` as a parquet part: times in ns (µs × 1000, rounded), a value of the wrong
        type null (an event without a time is left out and counted)."""
        rows = self.rows[kind]
        if not rows:
            return
        raw = {c: (pl.Float64 if c in ("start", "dur") else t) for c, t in _SCHEMAS[kind].items()}
        df = pl.DataFrame(rows, schema=raw, orient="row", strict=False)
        ok = pl.col("start").is_not_null() & pl.col("start").is_finite()
        self.skipped += int(df.select((~ok).sum()).item())
        ns = [(pl.col(c).fill_null(0.0) * 1000).round().cast(pl.Int64) for c in ("start", "dur")]
        df = df.filter(ok).with_columns(ns)
        f = self.work / f"{_PART[kind]}-{len(self.parts[kind]):05d}.parquet"
        df.write_parquet(f, compression="uncompressed", statistics=False)
        self.parts[kind].append(f)
        self.rows[kind] = []

    def flush(self) -> None:
        for k in _SCHEMAS:
            self._flush(k)

    def _name(self, text: Any) -> int:
        s = text if isinstance(text, str) else str(text)
        i = self.names.get(s)
        if i is None:
            i = self.names[s] = len(self.names)
        return i

    def _source(self, file: int, label: str | None) -> int:
        key = (file, label)
        s = self._src_of.get(key)
        if s is None:
            m = _RANK_IN_LABEL.search(label or "")
            rank = int(m.group(1)) if m else None
            s = self._src_of[key] = len(self.sources)
            self.sources.append(_Source(file, label, rank))
        return s

    def _tid(self, tid: Any) -> int:
        if type(tid) is int and 0 <= tid < _P24:
            return tid
        t = self.tids.get(tid)
        if t is None:  # numbered from the top of the 24 bits down: never a real Linux thread id (< 2^22)
            t = self.tids[tid] = _P24 - 1 - len(self.tids)
        return t

    # -- events --

    def events(self, fi: int, events: Iterator[Any]) -> None:
        """Route the file's events into rows: as they come (times in µs as floats, numbers as given), the least
        Python work per event; :meth:`_flush` makes them columns."""
        kinds, rows, names = _KINDS, self.rows, self.names
        src_of: dict[Any, tuple[int, int | None]] = {}
        append = {k: rows[k].append for k in rows}
        name, tid_of = self._name, self._tid
        for e in events:
            if type(e) is not dict:
                continue
            kind = kinds.get(e.get("cat"))  # type: ignore[arg-type]  # (a None category: no kind)
            if kind is None or e.get("ph") != "X":
                continue
            try:
                pid = e["pid"]
                where = src_of.get(pid)
                if where is None:
                    where = src_of[pid] = self._where(fi, pid)
                src, num = where
                if kind == _SPAN:
                    append[kind]((src, e["ts"], e.get("dur")))
                    continue
                nm = e.get("name", "")
                nid = names.get(nm)
                if nid is None:
                    nid = name(nm)
                if kind <= _MEMSET:
                    a = e.get("args") or {}
                    append[kind]((src, e["ts"], e.get("dur"), nid, a.get("device", num),
                                  a.get("stream", e.get("tid")), a.get("correlation"),
                                  a.get("graph id") if kind == _KERNEL else a.get("bytes")))
                else:
                    tid = e.get("tid")
                    if type(tid) is not int:
                        tid = tid_of(tid)
                    if kind == _API:
                        append[kind]((src, num, tid, e["ts"], e.get("dur"), nid, (e.get("args") or {}).get("correlation")))
                    else:
                        append[kind]((src, num, tid, e["ts"], e.get("dur"), nid))
            except (KeyError, TypeError, ValueError, AttributeError):
                self.skipped += 1
                continue
            if len(rows[kind]) >= FLUSH_ROWS:
                self._flush(kind)
                append[kind] = rows[kind].append

    def _where(self, fi: int, pid: Any) -> tuple[int, int | None]:
        """The source and the number of an event's ``pid`` (an OS pid for the CPU, a device for the GPU)."""
        label, rest = None, pid
        if isinstance(pid, str):
            m = _LABEL.match(pid)
            if m:
                label, rest = m.group(1), m.group(2)
        src = self._source(fi, label)
        if isinstance(rest, int):
            return src, rest
        rest = str(rest).strip()
        return src, int(rest) if rest.lstrip("-").isdigit() else None

    def read_file(self, path: Path) -> None:
        """One file, streamed: its metadata (keys before and after the events) and its events."""
        fi = len(self.files)
        info = _File(path)
        self.files.append(info)
        try:
            meta = chrome_trace.read(path, lambda events: self.events(fi, events))
        except chrome_trace.TraceError as e:
            raise InputError(f"{path}: {e}", e.code) from None
        meta.pop("traceEvents", None)
        info.meta = meta
        base = meta.get("baseTimeNanoseconds")
        info.base_ns = int(base) if isinstance(base, int | float) else 0
        host = meta.get("host_name", meta.get("hostname"))
        info.host = host if isinstance(host, str) else None
        if not any(s.file == fi for s in self.sources):
            self._source(fi, None)  # a file without events is still a process of the input


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split())[:200] or type(e).__name__


# ---- SGLang's native spans → phases and cycles -----------------------------------------------------------------

_NATIVE = (  # (pattern of the span's name, kind): D draft, V verify, E draft_extend, X target prefill, S decode
    (r"^draft$", "D"), (r"^verify$", "V"), (r"^step\[VERIFY\b", "V"), (r"^draft_extend$", "E"),
    (r"^step\[EXTEND\b", "X"), (r"^step\[DECODE\b", "S"),
)
_GROUP = {"D": "cycle", "V": "cycle", "X": "prefill", "S": "decode_step"}


def native_phases(ann: pl.DataFrame) -> pl.DataFrame:
    """spectrace's phase ranges from SGLang's native spans (``ann``: ``pid, gtid, start, end, text`` of one or more
    processes' annotations): ``pid, gtid, start, end, text, payload``.

    Per thread, in time order, the top-level native spans (one inside another, e.g. ``step[DRAFT bs=N]`` inside
    ``draft_extend``, is not one) are cut into groups: a group starts at ``draft``, at a ``step[VERIFY]`` that no
    ``draft`` just preceded (a cycle without draft steps), at ``step[EXTEND]`` (a prefill) or at ``step[DECODE]`` (a
    decode step without speculation); the spans that follow belong to it. A cycle (``cycle``: from its first span's
    start to its last span's end) has ``draft``, ``verify`` and ``draft_extend``: SGLang's ``step[VERIFY]`` spans the
    target's forward only, so ``verify`` runs from the end of the cycle's ``draft`` (else its own start) to the start
    of its ``draft_extend`` (else its own end), as SGLang's verify prepares the tree before that forward and samples
    after it. A prefill (``prefill``) has ``prefill_target_extend`` (``step[EXTEND]``) and ``prefill_draft_extend``
    (the ``draft_extend`` after it). Spans before the first group start (the trace began inside a cycle) are left out.
    The payload (:func:`nvtx_hooks.phases.encode_payload`) of a cycle or decode step: the batch size of its
    ``bs=`` and its index, the ``forward_id=`` of its spans when every one has it (SGLang's detailed annotations,
    the same on every rank), else its number in the process counted from 1; of a prefill: its ``bs=`` and the index
    of the cycle before it (0: none), as the hooks give them. Accept lengths are unknown."""
    out_schema = pl.Schema({"pid": pl.Int64, "gtid": pl.Int64, "start": pl.Int64, "end": pl.Int64,
                            "text": pl.String, "payload": pl.Int64})
    kind = pl.lit(None, pl.String)
    for pattern, k in reversed(_NATIVE):
        kind = pl.when(pl.col("text").str.contains(pattern)).then(pl.lit(k)).otherwise(kind)
    m = ann.with_columns(kind=kind).filter(pl.col("kind").is_not_null()).sort("gtid", "start", pl.col("end"),
                                                                             descending=[False, False, True])
    if m.height == 0:
        return pl.DataFrame(schema=out_schema)
    thread = ["gtid"]
    m = (m.with_columns(_reach=pl.col("end").cum_max().shift(1).over(thread))
         .filter(pl.col("_reach").is_null() | (pl.col("start") >= pl.col("_reach")))  # top level only
         .with_columns(_prev=pl.col("kind").shift(1).over(thread)))
    opens = pl.col("kind").is_in(["D", "X", "S"]) | ((pl.col("kind") == "V") & (pl.col("_prev") != "D").fill_null(True))
    m = (m.with_columns(grp=opens.cast(pl.Int64).cum_sum().over(thread))
         .filter(pl.col("grp") > 0)
         .with_columns(bs=pl.col("text").str.extract(r"\bbs=(\d+)").cast(pl.Int64),
                       fid=pl.col("text").str.extract(r"\bforward_id=(\d+)").cast(pl.Int64),
                       gkind=pl.col("kind").first().over([*thread, "grp"])))
    g = (m.group_by([*thread, "grp"], maintain_order=True)
         .agg(pid=pl.col("pid").first(), gkind=pl.col("gkind").first(), start=pl.col("start").min(),
              end=pl.col("end").max(), bs=pl.col("bs").filter(pl.col("kind").is_in(["V", "X", "S"])).first(),
              fid=pl.col("fid").drop_nulls().first(),
              d_end=pl.col("end").filter(pl.col("kind") == "D").first(),
              e_start=pl.col("start").filter(pl.col("kind") == "E").first())
         .sort("pid", "start"))
    cyc = pl.col("gkind") != "X"
    g = g.with_columns(n=cyc.cast(pl.Int64).cum_sum().over("pid"),
                       fid_all=(cyc.not_() | pl.col("fid").is_not_null()).all().over("pid"))
    own = pl.when(cyc).then(pl.when(pl.col("fid_all")).then(pl.col("fid")).otherwise(pl.col("n")))
    g = g.with_columns(_own=own).with_columns(  # a prefill: the index of the cycle before it
        idx=pl.when(cyc).then("_own").otherwise(pl.col("_own").forward_fill().over("pid").fill_null(0)))
    payloads = [ph.encode_payload(b or 0, i or 0) for b, i in zip(g["bs"].to_list(), g["idx"].to_list())]
    groups = g.with_columns(payload=pl.Series(payloads, dtype=pl.Int64),
                            text=pl.col("gkind").replace_strict(_GROUP, return_dtype=pl.String))
    leaf_name = (pl.when(pl.col("kind") == "D").then(pl.lit(ph.DRAFT.name))
                 .when(pl.col("kind") == "V").then(pl.lit(ph.VERIFY.name))
                 .when(pl.col("kind") == "X").then(pl.lit(ph.PREFILL_TARGET.name))
                 .when((pl.col("kind") == "E") & (pl.col("gkind") == "X")).then(pl.lit(ph.PREFILL_DRAFT_EXTEND.name))
                 .when(pl.col("kind") == "E").then(pl.lit(ph.DRAFT_EXTEND.name)))
    leaves = (m.filter(pl.col("kind") != "S")
              .join(g.select(*thread, "grp", "d_end", "e_start"), on=[*thread, "grp"], how="left")
              .with_columns(text=leaf_name,
                            start=pl.when(pl.col("kind") == "V").then(pl.coalesce("d_end", "start")).otherwise("start"),
                            end=pl.when(pl.col("kind") == "V").then(pl.coalesce("e_start", "end")).otherwise("end"),
                            payload=pl.lit(None, pl.Int64)))
    cols = list(out_schema)
    return pl.concat([groups.select(cols), leaves.select(cols)]).cast(out_schema).sort("gtid", "start", "end",
                                                                                     descending=[False, False, True])


# ---- the tables -------------------------------------------------------------------------------------------------


def _scan(pz: _Parse, kind: int) -> pl.LazyFrame:
    parts = pz.parts[kind]
    return pl.scan_parquet(parts) if parts else pl.LazyFrame(schema=_SCHEMAS[kind])


def _sink(lf: pl.LazyFrame, dest: Path, table: str) -> None:
    lf.sink_parquet(dest / f"{table}.parquet", compression="lz4")


def _source_rank(pz: _Parse, s: _Source) -> int | None:
    """A source's rank: its label's (``[TP01]``), else its file's ``distributedInfo.rank`` (a file of one process),
    else the file name's ``-TP-{rank}``."""
    if s.rank is not None:
        return s.rank
    f = pz.files[s.file]
    alone = sum(t.file == s.file for t in pz.sources) == 1
    info = f.meta.get("distributedInfo")
    if alone and isinstance(info, dict) and isinstance(info.get("rank"), int):
        return int(info["rank"])
    m = _RANK_IN_NAME.search(f.path.name)
    return int(m.group(1)) if m and alone else None


def _processes(pz: _Parse, api: pl.LazyFrame, ann: pl.LazyFrame) -> pl.DataFrame:
    """``src, pid, final, main``: every (source, OS pid) with CPU events, the pid the tables give it (the OS pid
    when those are unique across the input and fit nsys's 24 bits, else 1, 2, ... in order) and whether it is
    the source's main process (most CUDA calls, else most annotations; its GPU operations fall to it when no call
    has their correlation id). A source with no CPU process gets one."""
    counts = pl.concat([
        api.filter(pl.col("pid").is_not_null()).group_by("src", "pid").agg(calls=pl.len(), marks=pl.lit(0, pl.UInt32)),
        ann.filter(pl.col("pid").is_not_null()).group_by("src", "pid").agg(calls=pl.lit(0, pl.UInt32), marks=pl.len()),
    ]).group_by("src", "pid").agg(pl.col("calls").sum(), pl.col("marks").sum()).collect()
    missing = [i for i in range(len(pz.sources)) if i not in set(counts["src"].to_list())]
    if missing:
        counts = pl.concat([counts, pl.DataFrame({"src": missing, "pid": [None] * len(missing), "calls": 0, "marks": 0},
                                                 schema=counts.schema)])
    counts = counts.sort("src", "calls", "marks", "pid", descending=[False, True, True, False])
    counts = counts.with_columns(main=pl.int_range(pl.len()).over("src") == 0)
    known = counts["pid"].drop_nulls()
    own = known.n_unique() == len(known) and bool(((known > 0) & (known < _P24 - len(counts))).all())
    if own:  # the OS pids; a source without CPU events gets a number above them
        top = int(known.max() or 0)  # type: ignore[arg-type]  # (an int, or None when empty)
        final = pl.coalesce(pl.col("pid"), top + pl.col("pid").is_null().cum_sum())
    else:
        final = pl.int_range(1, pl.len() + 1)
    return (counts.with_columns(final=final.cast(pl.Int64)).sort("src", "pid")
            .select("src", "pid", "final", "main"))


def _write_tables(pz: _Parse, dest: Path) -> dict:
    """The nsys tables of everything read, into ``dest``; returns what meta.json says of the input."""
    pz.flush()
    base = pl.Series([pz.files[s.file].base_ns for s in pz.sources], dtype=pl.Int64)
    at = pl.col("src").cast(pl.Int64).replace_strict(list(range(len(pz.sources))), base, return_dtype=pl.Int64)
    kinds = (_KERNEL, _MEMCPY, _MEMSET, _API, _ANNOTATION, _SPAN)
    lfs = {k: _scan(pz, k).with_columns(start=at + pl.col("start")).with_columns(end=pl.col("start") + pl.col("dur"))
           for k in kinds}
    bounds = pl.concat([lfs[k].select(lo=pl.col("start").min(), hi=pl.col("end").max()) for k in kinds]).collect()
    lo, hi = bounds["lo"].min(), bounds["hi"].max()
    if not isinstance(lo, int) or not isinstance(hi, int):
        raise InputError(f"{pz.files[0].path}: a torch profiler trace without events (no kernel, CUDA call or "
                         "annotation)", "NO_EVENTS")
    origin = lo - 1000  # every time > 0 (nsys drops a GPU operation at time 0), the session starting before
    procs = _processes(pz, lfs[_API], lfs[_ANNOTATION])
    pmap = procs.filter(pl.col("pid").is_not_null()).select("src", "pid", "final").lazy()
    main = procs.filter("main").select("src", main="final").lazy()
    rel = [pl.col("start") - origin, pl.col("end") - origin]

    def gtid(df: pl.LazyFrame) -> pl.LazyFrame:  # CPU rows: their process and thread
        return df.join(pmap, on=["src", "pid"], how="inner").with_columns(globalTid=_global_tid())

    # CUDA calls
    api = gtid(lfs[_API])
    _sink(api.select(*rel, "globalTid", correlationId="corr", nameId="name_id").sort("start"), dest,
          "CUPTI_ACTIVITY_KIND_RUNTIME")
    # GPU operations: the process whose call has their correlation id, else the source's main process
    calls = api.select("src", "corr", owner="final").filter(pl.col("corr").is_not_null()).unique(["src", "corr"],
                                                                                                  keep="first")
    graphs = False
    for kind, table in ((_KERNEL, "CUPTI_ACTIVITY_KIND_KERNEL"), (_MEMCPY, "CUPTI_ACTIVITY_KIND_MEMCPY"),
                        (_MEMSET, "CUPTI_ACTIVITY_KIND_MEMSET")):
        if not pz.parts[kind]:
            continue
        ops = (lfs[kind].join(calls, on=["src", "corr"], how="left").join(main, on="src", how="left")
               .with_columns(globalPid=pl.coalesce("owner", "main") * _P24))
        cols = [*rel, pl.col("device").alias("deviceId"), pl.col("stream").alias("streamId"),
                pl.col("corr").alias("correlationId"), "globalPid"]
        if kind == _KERNEL:
            graphs = lfs[kind].select(pl.col("graph").is_not_null().any()).collect().item()
            cols += [pl.col("name_id").alias("demangledName"), pl.col("name_id").alias("shortName")]
            if graphs:  # nsys: the graph's id in graphNodeId's upper 32 bits (analyze.read.export)
                cols.append((pl.col("graph") * (1 << 32)).alias("graphNodeId"))
        else:
            cols.append("bytes")
            if kind == _MEMCPY:
                cols.append(_copy_kind(pz.names).alias("copyKind"))
        _sink(ops.select(cols).sort("start"), dest, table)
    # names
    pl.DataFrame({"id": list(pz.names.values()), "value": list(pz.names)},
                 schema={"id": pl.Int64, "value": pl.String}).write_parquet(dest / "StringIds.parquet")
    # annotations → NVTX ranges
    ann = (gtid(lfs[_ANNOTATION]).select(pid="final", gtid="globalTid", start=rel[0], end=rel[1], name_id="name_id").collect())
    text = pl.DataFrame({"name_id": list(pz.names.values()), "text": list(pz.names)},
                        schema={"name_id": pl.Int64, "text": pl.String})
    ann = ann.join(text, on="name_id", how="left").drop("name_id")
    nvtx, how = _nvtx(ann)
    nvtx.write_parquet(dest / "NVTX_EVENTS.parquet")
    # the small tables
    session_end = hi - origin + 1000
    spans = lfs[_SPAN].select(lo=pl.col("start").min(), hi=pl.col("end").max()).collect()
    started = spans["lo"][0] - origin if spans["lo"][0] is not None else 1000
    pl.DataFrame({"timestamp": [started, session_end], "timestampType": [1, 1], "severity": [0, 0],
                  "text": ["Profiling has started.", "Profiling has stopped."], "globalPid": [None, None]},
                 schema={"timestamp": pl.Int64, "timestampType": pl.Int64, "severity": pl.Int64, "text": pl.String,
                         "globalPid": pl.Int64}).write_parquet(dest / "DIAGNOSTIC_EVENT.parquet")
    pl.DataFrame({"duration": [session_end]}, schema={"duration": pl.Int64}).write_parquet(
        dest / "ANALYSIS_DETAILS.parquet")
    pl.DataFrame({"utcEpochNs": [origin]}, schema={"utcEpochNs": pl.Int64}).write_parquet(
        dest / "TARGET_INFO_SESSION_START_TIME.parquet")
    gpus: dict[int, str] = {}
    for f in pz.files:
        for d in f.meta.get("deviceProperties") or []:
            if isinstance(d, dict) and isinstance(d.get("id"), int):
                gpus.setdefault(d["id"], str(d.get("name", "")))
    pl.DataFrame({"id": list(gpus), "name": list(gpus.values())}, schema={"id": pl.Int64, "name": pl.String}
                 ).write_parquet(dest / "TARGET_INFO_GPU.parquet")
    ops = sum(pl.scan_parquet(pz.parts[k]).select(pl.len()).collect().item() for k in (_KERNEL, _MEMCPY, _MEMSET)
              if pz.parts[k])
    note = _note(pz, ops, graphs, how)
    export = {"EXPORT_PRODUCT_VERSION": "none (a torch profiler trace)", "EXPORT_SCHEMA_VERSION": "kineto",
              "SPECTRACE_SOURCE": "torch-profiler", "SPECTRACE_INPUT_NOTE": note}
    pl.DataFrame({"name": list(export), "value": list(export.values())}).write_parquet(
        dest / "META_DATA_EXPORT.parquet")
    capture = {}
    for i, s in enumerate(pz.sources):
        rows = procs.filter((pl.col("src") == i) & pl.col("main"))
        who = rows["final"][0] if rows.height else None
        capture[f"TORCH_TRACE_FILE:{who}"] = pz.files[s.file].path.name
        rank = _source_rank(pz, s)
        if rank is not None:
            capture[f"TORCH_TRACE_RANK:{who}"] = str(rank)
    pl.DataFrame({"name": list(capture), "value": list(capture.values())},
                 schema={"name": pl.String, "value": pl.String}).write_parquet(dest / "META_DATA_CAPTURE.parquet")
    return {"files": [f.path.name for f in pz.files], "processes": procs.height, "gpu_operations": ops,
            "skipped_events": pz.skipped, "phases": how}


def _global_tid() -> pl.Expr:
    """nsys's globalTid of a process and thread (``<pid:24><tid:24>``)."""
    return pl.col("final") * _P24 + pl.col("tid")


def _copy_kind(names: dict[str, int]) -> pl.Expr:
    """nsys's ``copyKind`` of a memcpy from Kineto's name (``Memcpy HtoD (Pageable -> Device)``); 11: unknown."""
    ids, kinds = [], []
    for text, i in names.items():
        if text.startswith("Memcpy "):
            ids.append(i)
            kinds.append(_MEMCPY_KIND.get(text.split()[1], 11))
    return pl.col("name_id").replace_strict(ids, kinds, default=11, return_dtype=pl.Int64)


def _nvtx(ann: pl.DataFrame) -> tuple[pl.DataFrame, str]:
    """``NVTX_EVENTS`` rows of the annotations (``pid, gtid, start, end, text``): every annotation as a range without
    a domain; spectrace's own (``spectrace:<phase>``) as ranges (marks) of the spectrace domain instead; for a process
    without those, the phases of SGLang's native spans (:func:`native_phases`) added in the spectrace domain. Also
    says which of the two the phases came from."""
    schema = pl.Schema({"start": pl.Int64, "end": pl.Int64, "eventType": pl.Int64, "globalTid": pl.Int64,
                        "domainId": pl.Int64, "text": pl.String, "int64Value": pl.Int64})
    parsed = ann.with_columns(_phase=pl.col("text").str.extract(ph.ANNOTATION_RE, 1),
                              _payload=pl.col("text").str.extract(ph.ANNOTATION_RE, 2).str.to_integer(base=16))
    named = parsed.filter(pl.col("_phase").is_not_null())
    ours = named["pid"].unique()
    marks = [m.name for m in ph.MARKS]
    is_mark = pl.col("_phase").is_in(marks)
    spectrace = named.select(
        "start", end=pl.when(is_mark).then(None).otherwise("end"),
        eventType=pl.when(is_mark).then(_MARK).otherwise(_PUSH_POP), globalTid="gtid",
        domainId=pl.lit(_SPECTRACE_DOMAIN), text="_phase", int64Value="_payload")
    plain = parsed.filter(pl.col("_phase").is_null())
    native = native_phases(plain.filter(~pl.col("pid").is_in(ours.implode())))
    derived = native.select("start", "end", eventType=pl.lit(_PUSH_POP), globalTid="gtid",
                            domainId=pl.lit(_SPECTRACE_DOMAIN), text="text", int64Value="payload")
    raw = plain.select("start", "end", eventType=pl.lit(_PUSH_POP), globalTid="gtid", domainId=pl.lit(0),
                       text="text", int64Value=pl.lit(None, pl.Int64))
    with_domain = pl.concat([spectrace.select("globalTid"), derived.select("globalTid")])
    procs = with_domain.select((pl.col("globalTid") // _P24 * _P24).alias("globalTid")).unique()
    domains = procs.select(start=pl.lit(0, pl.Int64), end=pl.lit(None, pl.Int64), eventType=pl.lit(_DOMAIN_CREATE),
                           globalTid="globalTid", domainId=pl.lit(_SPECTRACE_DOMAIN), text=pl.lit(ph.DOMAIN),
                           int64Value=pl.lit(None, pl.Int64))
    out = pl.concat([f.cast(schema) for f in (domains, spectrace, derived, raw)]).sort(  # a parent before its child
        "start", "end", "globalTid", descending=[False, True, False], nulls_last=True)
    how = ("spectrace's record_function names" if named.height and not native.height
           else "SGLang's native spans" if native.height and not named.height
           else "spectrace's names and SGLang's native spans (processes without the names)" if named.height
           else "none")
    return out, how


def _note(pz: _Parse, ops: int, graphs: bool, how: str) -> str:
    """What this input cannot give, said once (the analysis' ``TORCH_PROFILER_TRACE`` note)."""
    bits = [f"a torch profiler trace ({len(pz.files)} file(s), {len(pz.sources)} process(es)); phases from {how}"]
    if how == "SGLang's native spans" or how.startswith("spectrace's names and"):
        bits.append("cycles inferred from the sequence of SGLang's spans (draft, step[VERIFY], draft_extend), "
                    "with no accept lengths (tokens per cycle unknown)")
    bits.append("no GPU metrics and no NVTX domains")
    if not graphs:
        bits.append("no CUDA graph node detail (a graph's kernels count as plain kernels of its cudaGraphLaunch; "
                    "segments only by the batch size of the phases)")
    if not ops:
        bits.append("no GPU events at all (profile with ProfilerActivity.CUDA)")
    if pz.skipped:
        bits.append(f"{pz.skipped} events that could not be read were left out")
    return "; ".join(bits)


# ---- the cache of tables, and the reader ------------------------------------------------------------------------


def convert(path: str | os.PathLike, dest: str | os.PathLike, key: dict | None = None) -> dict:
    """Convert the trace (a file, or a folder of them) into the nsys tables in the new folder ``dest`` (made here),
    with ``meta.json`` (its ``key``: :func:`_key` of ``path`` unless given) written last. Returns meta.json."""
    dest = Path(dest)
    dest.mkdir()
    (dest / MARKER).write_text(json.dumps({"spectrace_tables": FORMAT_VERSION}) + "\n")
    files = trace_files(path)
    if not files:
        raise InputError(f"{path}: a folder without torch profiler traces (*.json, *.json.gz)", "NO_FILE")
    work = dest / ".parts"
    work.mkdir()
    pz = _Parse(work)
    for f in files:
        pz.read_file(f)
    info = _write_tables(pz, dest)
    shutil.rmtree(work)
    meta = {"key": key if key is not None else _key(path), **info,
            "tables": {f.name: f.stat().st_size for f in sorted(dest.glob("*.parquet"))}}
    (dest / "meta.json").write_text(json.dumps(meta, indent=1))
    return meta


def _valid(root: Path, key: dict) -> bool:
    """Whether ``root`` holds the tables of the trace as ``key`` says it is now (every table file there, its size)."""
    try:
        meta = json.loads((root / "meta.json").read_text())
        return (isinstance(meta, dict) and meta.get("key") == key and (root / MARKER).is_file()
                and all((root / n).stat().st_size == size for n, size in meta["tables"].items()))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return False


def _write_error(e: BaseException, where: Path) -> CacheWriteError:
    why = e.strerror if isinstance(e, OSError) and e.strerror else _one_line(e)
    return CacheWriteError(f"{where}: cannot write the tables of the trace ({why})", "CACHE_WRITE", reason=why)


def _build(path: str | os.PathLike, key: dict, root: Path) -> Path:
    """The tables built beside ``root`` under a temporary name and renamed into place (a folder of ours in the way
    is replaced; anything else is not: a CacheWriteError, as for a folder that cannot be written)."""
    if Path(path).is_dir() and Path(path).resolve() in root.resolve().parents:
        raise CacheWriteError(f"{root}: inside the input {path}")
    tmp = root.with_name(f".{root.name}.tmp-{uuid.uuid4().hex[:12]}")
    try:
        try:
            root.parent.mkdir(parents=True, exist_ok=True)
            convert(path, tmp, key)
        except (OSError, pl.exceptions.PolarsError) as e:
            if isinstance(e, InputError):
                raise
            raise _write_error(e, root) from None
        if _valid(root, key):  # another process was quicker
            return root
        if root.exists() or root.is_symlink():
            if root.is_symlink() or not (root / MARKER).is_file():
                raise CacheWriteError(f"{root}: is in the way of the trace's tables and is not spectrace's")
            old = root.with_name(f".{root.name}.old-{uuid.uuid4().hex[:12]}")
            os.replace(root, old)
            shutil.rmtree(old, ignore_errors=True)
        try:
            os.replace(tmp, root)
        except OSError as e:
            raise _write_error(e, root) from None
        return root
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def _tables(path: str | os.PathLike, key: dict) -> tuple[Path, Path | None]:
    """The folder of the trace's tables, and the temporary folder to remove when done (None: a kept cache)."""
    try:
        root = tables_dir_for(path)
        if _valid(root, key):
            return root, None
        return _build(path, key, root), None
    except CacheWriteError:
        pass
    tmp = Path(tempfile.mkdtemp(prefix="spectrace-tables-"))
    try:
        convert(path, tmp / "t", key)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return tmp / "t", tmp


class KinetoReader(DirReader):
    """:class:`~analyze.read.exportdir.DirReader` over the tables of a torch profiler trace (converted on first use,
    :func:`_tables`); ``path`` is the trace as given, and a change of its files is what :meth:`check_unchanged`
    looks for."""

    def __init__(self, path: str | os.PathLike):
        key = _key(path)
        root, self._tmp = _tables(path, key)
        try:
            super().__init__(root)
        except BaseException:
            self.close()
            raise
        self.tables_dir = root
        self.path = Path(path)
        self.state = [f[:3] for f in key["files"]]

    def check_unchanged(self) -> None:
        """Fail if a file of the trace changed since it was opened."""
        try:
            now = [f[:3] for f in _key(self.path)["files"]]
        except InputError:
            now = []
        if now != self.state:
            raise InputError(f"{self.path}: the trace changed while it was read; try again", "CHANGED")

    def close(self) -> None:
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None


