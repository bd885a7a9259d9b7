"""Rows an export repeats, each counted once: a process's CUDA API calls given twice (an export appended to) or
recorded twice (CPU backtraces), and GPU operations that repeat another's (counted, said by ``DUPLICATE_OPS``)."""

from __future__ import annotations

import polars as pl

__all__ = ["api_calls_once", "duplicate_ops"]


def api_calls_once(api: pl.DataFrame) -> tuple[pl.DataFrame, int, int]:
    """One process's CUDA API calls each kept once, with how many rows repeated another exactly (an export appended
    to: ``DUPLICATE_ROWS``) and how many were a call's outer twin (``API_TWINS``). With CPU backtraces
    (``--cudabacktrace``, ``spectrace trace --cpu-sampling``) nsys 2025.3 writes a runtime call as an outer row
    (``cudaGraphLaunch``) around an inner one (``cudaGraphLaunch_v10000``) of the same thread and correlation id:
    the inner one is kept (the name and time a capture without backtraces records; the outer adds the backtrace's
    own cost). CUPTI gives every call its own correlation id: cheap when none repeats (one pass over the ids)."""
    corr = pl.col("corr")
    if api.height == 0 or not api.select((corr.is_duplicated() & corr.is_not_null()).any()).item():
        return api, 0, 0
    once = api.unique(keep="first", maintain_order=True)
    twin = corr.is_not_null() & (pl.col("start") < pl.col("start").max().over("gtid", "corr"))
    kept = once.filter(~twin)
    return kept, api.height - once.height, once.height - kept.height


def duplicate_ops(ops: pl.DataFrame) -> int:
    """Rows of one process's ops (sorted by start) that repeat another's correlation id, start and end. Cheap:
    only rows sharing a start with a neighbour are compared."""
    same = pl.col("start") == pl.col("start").shift()
    cand = ops.filter((same | same.shift(-1)).fill_null(False))
    if cand.height == 0:
        return 0
    return cand.height - cand.select("corr", "start", "end").unique().height
