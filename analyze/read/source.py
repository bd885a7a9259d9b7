"""An export as a *source* of processes: the small frames at once, each process's rows on demand.

The analysis (:mod:`analyze.compute.pipeline`) runs one body per process over a source, so where the
rows live is the source's business:

- :class:`MemorySource`: a :class:`~analyze.model.Trace` read into memory (:func:`analyze.read.export.load`),
  its GPU operations and API calls split by process once;
- :class:`StoreSource`: the parquet store (:mod:`analyze.read.store`): one process's files at a time (of a
  parquetdir/arrowdir export, its rows cut from the export's own files), the cache beside the report or a
  temporary store removed when the source closes.

:func:`open_source` picks one by size (GPU-operation + API rows, from the export's rowids) and by
whether a valid cache is already there. A cache that cannot be written is skipped with a warning
(``CACHE_NOT_WRITTEN``, in the source's ``notes``): a temporary store instead, or memory when that cannot
be written either. :class:`OpsWindow` re-reads GPU operations of a time window
from the store or the export later (timeline figures), so a result never has to keep every op.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import polars as pl

from ..model import Diagnostic, Trace
from .export import OPS_SCHEMA, export_rows, load, ops_between
from .protocols import ProcessSource, ShowProgress
from .store.errors import CacheWriteError
from .store.folders import remove_tree
from .store.install import existing_store, open_store, temporary_store
from .store.reader import Store

# Exports with fewer GPU-operation + API rows than this are analysed from memory; larger ones (and any
# export with a valid cache) through the parquet store. Chosen by measurement (BENCHMARKS.md, issue 11).
_STORE_ROWS = 4_000_000


class MemorySource:
    """A trace in memory, split by process."""

    def __init__(self, trace: Trace):
        self.head = dataclasses.replace(trace, ops=trace.ops.head(0), api=trace.api.head(0))
        self.path = trace.path
        self.notes: list[Diagnostic] = []  # about where the rows live (a cache that could not be written)
        self._ops = trace.ops.partition_by("pid", as_dict=True, maintain_order=True)
        self._api = trace.api.partition_by("pid", as_dict=True, maintain_order=True)
        self.ops_rows = {int(k[0]): v.height for k, v in self._ops.items()}
        self.pids = sorted({int(k[0]) for k in (*self._ops, *self._api)})
        self.store_root: Path | None = None
        if trace.api_first is not None:
            self._first = dict(trace.api_first)
        else:
            self._first = {int(k[0]): _whole(v["start"].min()) for k, v in self._api.items() if v.height}

    def ops(self, pid: int, columns: tuple[str, ...] | None = None) -> pl.DataFrame:
        """One process's GPU operations (only ``columns``, if given)."""
        df = self._ops.get((pid,), self.head.ops)
        return df if columns is None else df.select(columns)

    def api(self, pid: int) -> pl.DataFrame:
        return self._api.get((pid,), self.head.api)

    def api_first(self, pid: int) -> int | None:
        """The start of the process's first CUDA API call (None: it made none)."""
        return self._first.get(pid)

    def op_keys(self) -> pl.DataFrame:
        """Every distinct ``(name_id, label)`` of the GPU operations."""
        parts = [df.select("name_id", "label").unique() for df in self._ops.values()]
        return pl.concat(parts).unique() if parts else self.head.ops.select("name_id", "label")

    def close(self) -> None:
        self._ops, self._api = {}, {}


def _whole(value: object) -> int:
    """A start read out of polars (typed as any literal): an int, checked (the read layer cannot import
    :mod:`analyze.compute.scalars`)."""
    if isinstance(value, int):
        return value
    raise TypeError(f"expected an integer, got {value!r}")


class StoreSource:
    """The parquet store of an export; ``temporary``: a folder to remove on :meth:`close` (also if opening fails).

    Reads that fail raise :class:`analyze.read.store.reader.CacheError` (the analysis rebuilds a kept cache once).
    """

    def __init__(self, store: Store, temporary: Path | None = None):
        self.store, self._tmp = store, temporary
        try:
            self.head = store.head()
        except BaseException:
            self.close()
            raise
        self.path = self.head.path
        self.notes: list[Diagnostic] = []
        self.ops_rows = {int(k): v for k, v in store.meta["ops_rows"].items()}
        self.pids = store.pids
        self.store_root = None if temporary else store.root
        self._first = store.api_first

    def read_in_order(self, pids: list[int], workers: int) -> None:
        """The order in which the processes' rows will be read, ``workers`` at a time
        (:meth:`analyze.read.store.reader.Store.read_in_order`); ``workers`` 0: that is over."""
        self.store.read_in_order(pids, workers)

    def ops(self, pid: int, columns: tuple[str, ...] | None = None) -> pl.DataFrame:
        return self.store.read("ops", pid, columns)

    def api(self, pid: int) -> pl.DataFrame:
        return self.store.read("api", pid)

    def api_first(self, pid: int) -> int | None:
        return self._first.get(pid)

    def op_keys(self) -> pl.DataFrame:
        return self.store.op_keys()

    def close(self) -> None:
        if self._tmp is not None:
            remove_tree(self._tmp)
            self._tmp = None


def open_source(report: str | os.PathLike | Trace | Store, store: bool | None = None, cache: bool | None = None,
                progress: ShowProgress | None = None) -> ProcessSource:
    """The source for ``report`` (a path, a loaded :class:`Trace`, or an opened store).

    ``store``: True = through the parquet store, False = in memory, None = by size (:data:`_STORE_ROWS`).
    ``cache``: True = through the cache (built on first use, kept); False = never read or write one (a
    store is then temporary); None = use a valid cache if there is one, and keep the store when one is built.
    ``progress``: a meter of a store's build (None: none shown).
    """
    if isinstance(report, Trace):
        return MemorySource(report)
    if isinstance(report, Store):
        return StoreSource(report)
    if cache is not False and store is not False:
        found = existing_store(report)
        if found is not None:
            return StoreSource(found)
    if store is None:
        store = cache is True or export_rows(report) >= _STORE_ROWS
    if not store:
        return MemorySource(load(report))
    if cache is False:
        s, tmp = temporary_store(report, progress)
        return StoreSource(s, temporary=tmp)
    try:
        kept = open_store(report, progress=progress)
    except CacheWriteError as e:
        source = _without_cache(report, progress)
        source.notes.append(Diagnostic("warning", "CACHE_NOT_WRITTEN", f"{e}; analysed without a cache"))
        return source
    return StoreSource(kept)


def _without_cache(report: str | os.PathLike, progress: ShowProgress | None) -> ProcessSource:
    """A temporary store, or memory when that cannot be written either (the same disk full, a file-size limit)."""
    try:
        s, tmp = temporary_store(report, progress)
    except CacheWriteError:
        return MemorySource(load(report))
    return StoreSource(s, temporary=tmp)


@dataclasses.dataclass
class OpsWindow:
    """GPU operations of a time window, re-read when asked: ``rank, start, end, kind, comm``.

    From the store when it is still there, else from the export itself (its SQL cut to the window).
    Small and picklable: the report path, the store folder, ranks by pid and the communication kinds.
    """

    report: str
    store_root: str | None
    rank_of: pl.DataFrame  # pid, rank
    kinds: pl.DataFrame  # name_id, label, comm (see analyze.compute.pipeline.op_kinds)
    rank_offset: int = 0

    def __call__(self, t0: int, t1: int) -> pl.DataFrame:
        sel = (pl.col("end") > t0) & (pl.col("start") < t1)
        if self.store_root and (Path(self.store_root) / "meta.json").exists():
            ops = Store(Path(self.store_root)).scan("ops").filter(sel).collect()
        elif os.path.exists(self.report):
            ops = ops_between(self.report, t0, t1)
        else:
            ops = pl.DataFrame(schema=OPS_SCHEMA)
        ops = ops.join(self.kinds.select("name_id", "label", "comm"), on=["name_id", "label"], how="left",
                       nulls_equal=True)
        return (ops.join(self.rank_of, on="pid", how="inner")
                .select(pl.col("rank") + self.rank_offset, "start", "end", "kind", "comm").sort("start", "rank", "end"))


@dataclasses.dataclass
class ManyWindows:
    """The windows of several reports, ranks numbered across them."""

    parts: list[OpsWindow]

    def __call__(self, t0: int, t1: int) -> pl.DataFrame:
        return pl.concat([w(t0, t1) for w in self.parts])


__all__ = ["MemorySource", "StoreSource", "OpsWindow", "ManyWindows", "open_source"]
