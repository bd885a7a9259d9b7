"""The keys a build gathers beside the rows: which API calls a store keeps (:func:`kept_api_ids`: those the analysis
finds by name, :data:`analyze.model.KEPT_API`), each op's and call's (pid, correlation id) packed into one integer
(:data:`CALL_KEY`) to find the operations no kept call launched (:func:`unmatched_ops`: their launchers are added
to the store), and the ops' distinct ``(name_id, label)`` (:func:`op_keys`: ``op_keys.parquet``)."""

from __future__ import annotations

import polars as pl

from ...model import KEPT_API
from .. import packed_keys

__all__ = ["CALL_KEY", "call_keys", "unmatched_ops", "unmatched_op_keys", "OP_KEYS_SCHEMA", "op_keys", "kept_api_ids"]


CALL_KEY = packed_keys.fixed(("pid", "corr"), (1 << 31, 1 << 32))
"""A call's (pid, correlation id) as one integer, the same in every batch (CUPTI correlation ids are 32-bit, pids
24-bit): a semi-join is a hash of one column; :meth:`~analyze.read.packed_keys.Packing.holds` says whether a batch
packs (no null, ids in range)."""


def call_keys(rows: pl.DataFrame) -> pl.Series | None:
    """The distinct (pid, correlation id) of some ops or API calls, each as one integer (:data:`CALL_KEY`), or None
    when they do not pack (a null, or out of range)."""
    if not CALL_KEY.holds(rows):
        return None
    return rows.select(CALL_KEY.key("key").unique())["key"]


def unmatched_ops(ops: pl.DataFrame, api: pl.DataFrame) -> pl.DataFrame:
    """``pid, corr`` of the GPU operations that no call in ``api`` has (once each)."""
    have, want = call_keys(api), call_keys(ops)
    if have is not None and want is not None:
        return unmatched_op_keys([want], [have])
    return ops.select("pid", "corr").join(api.select("pid", "corr"), on=["pid", "corr"], how="anti",
                                          nulls_equal=True).unique()


def unmatched_op_keys(ops: list[pl.Series], api: list[pl.Series]) -> pl.DataFrame:
    """:func:`unmatched_ops` from the keys (:func:`call_keys`) the build took of each batch of ops and of API calls."""
    have = pl.concat(api) if api else pl.Series("key", [], pl.Int64)
    key = pl.col("key")
    lost = (pl.concat(ops).to_frame("key") if ops else pl.DataFrame(schema={"key": pl.Int64})).filter(
        ~key.is_in(have.implode())).unique()
    return lost.select(CALL_KEY.unpacked("key"))


OP_KEYS_SCHEMA = {"name_id": pl.Int64, "label": pl.String}


def op_keys(ops: pl.DataFrame) -> pl.DataFrame:
    """The distinct ``(name_id, label)`` of some GPU operations: by name id alone when they have no label (kernels)."""
    if ops["label"].null_count() == ops.height:
        return ops.select(pl.col("name_id").unique(), label=pl.lit(None, pl.String))
    return ops.select(list(OP_KEYS_SCHEMA)).unique()


def kept_api_ids(strings: pl.DataFrame) -> pl.Series:
    """The StringIds ids of the API calls the store keeps (:data:`analyze.model.KEPT_API`), and -1 (so that their
    SQL list is never empty)."""
    ids = strings.filter(pl.col("name").str.contains(KEPT_API))["name_id"].drop_nulls().unique().sort()
    return pl.Series("name_id", [-1, *ids.to_list()], pl.Int64)
