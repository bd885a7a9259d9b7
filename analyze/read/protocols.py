"""What the analysis asks of a reader of an export and of a source of processes (:class:`typing.Protocol`).

- :class:`ExportReader`: SQL over one nsys export, answered as polars frames. Two implementations:
  :class:`analyze.read.sqlite.Reader` (a SQLite export) and :class:`analyze.read.exportdir.DirReader` (a
  ``parquetdir``/``arrowdir`` folder); :func:`analyze.read.export.open_reader` picks one.
- :class:`ProcessSource`: one export's small frames at once and each process's rows on demand, what
  :func:`analyze.compute.pipeline.process` runs over. Two implementations: :class:`analyze.read.source.MemorySource`
  and :class:`analyze.read.source.StoreSource`; :func:`analyze.read.source.open_source` picks one.

- :class:`ProgressMeter`: where a long step (the store's build, the processes' analysis) reports how far it has
  come; ``progress`` there is a :data:`ShowProgress` that opens one (the terminal's bar lives in
  :mod:`analyze.output.progress`: the layers below report to it without importing it).

They are ``runtime_checkable``: ``isinstance`` checks that every member is there (not their types: mypy
does). The third interface of this kind, a reader of the GPU operations of a time window (``Result.window``), is
:class:`analyze.model.WindowReader`: the model holds it, and the model imports nothing of this package.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import polars as pl

from ..model import Diagnostic, Trace

if TYPE_CHECKING:
    from polars._typing import PolarsDataType  # a dtype class (pl.Int64) or instance (pl.List(pl.Int64))


@runtime_checkable
class ExportReader(Protocol):
    """A read-only view of one nsys export's tables, queried in SQL (the export's table and column names)."""

    path: Path
    tables: set[str]
    """The tables the export has."""
    lossy: int
    """Strings that were not valid UTF-8 (decoded with U+FFFD): a count for a diagnostic."""
    splittable: bool
    """Whether a query may be cut into rowid ranges, each read on its own (SQLite: yes; scans: read whole)."""

    def close(self) -> None: ...

    def check_unchanged(self) -> None:
        """Raise :class:`~analyze.model.InputError` (``CHANGED``) if the export changed since it was opened."""
        ...

    def columns(self, table: str) -> list[str]:
        """Column names of ``table`` (empty when the table is absent)."""
        ...

    def has(self, table: str, *cols: str) -> bool:
        """Whether ``table`` exists with every one of ``cols``."""
        ...

    def rows(self, sql: str, params: tuple = ()) -> list[tuple]:
        """A small query as Python tuples."""
        ...

    def frame(self, sql: str, schema: Mapping[str, PolarsDataType] | None = None) -> pl.DataFrame:
        """A query as one frame, the columns named in ``schema`` cast to their type."""
        ...

    def batches(self, sql: str, rows: int = ...) -> Iterator[pl.DataFrame]:
        """A query as frames of about ``rows`` rows each (bounded memory)."""
        ...

    def max_rowid(self, table: str) -> int:
        """About how many rows ``table`` has (0 when absent), without a scan where the format allows."""
        ...


@runtime_checkable
class ProcessSource(Protocol):
    """An export as a source of processes: the small frames at once (``head``), each process's rows on demand."""

    head: Trace
    """The export without its GPU operations and API calls (empty frames of their schema)."""
    path: str
    """The report as the caller named it."""
    notes: list[Diagnostic]
    """Diagnostics about where the rows live (a cache that could not be written)."""
    ops_rows: dict[int, int]
    """GPU operations per process id."""
    pids: list[int]
    """Every process with GPU operations or API calls, in ascending order."""
    store_root: Path | None
    """The kept parquet store the rows come from (None: memory, or a temporary store)."""

    def ops(self, pid: int, columns: tuple[str, ...] | None = None) -> pl.DataFrame:
        """One process's GPU operations (only ``columns``, if given)."""
        ...

    def api(self, pid: int) -> pl.DataFrame:
        """One process's CUDA API calls."""
        ...

    def api_first(self, pid: int) -> int | None:
        """The start of the process's first CUDA API call (None: it made none)."""
        ...

    def op_keys(self) -> pl.DataFrame:
        """Every distinct ``(name_id, label)`` of the GPU operations."""
        ...

    def close(self) -> None:
        """Release what the source holds (a temporary store is removed)."""
        ...


@runtime_checkable
class ProgressMeter(Protocol):
    """How far a long step has come (rows done out of its total), shown as it goes. The read and compute layers only
    report to one; the terminal's bar (:class:`analyze.output.progress.Bar`) is one, chosen by the CLI and the API."""

    def add(self, n: int) -> None:
        """``n`` more rows done."""
        ...

    def close(self) -> None:
        """The step is over (the bar is cleared)."""
        ...


ShowProgress = Callable[[int, str], ProgressMeter]
"""Opens a meter for a step of ``total`` rows named ``label``: what ``progress`` is where the store is built and the
processes are analysed (None there: no meter; :func:`analyze.output.progress.terminal_bar` makes the terminal's)."""


class _Silent:
    def add(self, n: int) -> None:
        pass

    def close(self) -> None:
        pass


def no_progress(total: int, label: str) -> ProgressMeter:
    """A meter that shows nothing (where no ``progress`` was given)."""
    return _Silent()


__all__ = ["ExportReader", "ProcessSource", "ProgressMeter", "ShowProgress", "no_progress"]
