"""The hooks' ranges as the analysis reads them: phase base names and the payload decoded.

A phase is known by its *base name* (:func:`nvtx_hooks.phases.base_name`: the name after the last ``.:/ ``
separator when it is one of the hooks' names, whatever the prefix: ``draft``, ``verify``, ``cycle``, ...); a
*cycle* is one ``cycle`` range (EAGLE) or one ``decode_step`` range (baseline) (:data:`CYCLE_NAMES`). The hooks'
payload (a range's or mark's ``uint64``/``int64``) carries the batch size, the cycle index, the accept length and
(version 2) the draft steps (:func:`decode_exprs`; the layout is :mod:`nvtx_hooks.phases`'s).
"""

from __future__ import annotations

import polars as pl

from nvtx_hooks import phases as ph
from nvtx_hooks.capture.bounds import BATCH_MAX, STEPS_MAX

__all__ = ["CYCLE_NAMES", "base_expr", "cycle_order", "decode_exprs", "decode_frame", "accept_beyond_bound",
           "accept_bound_text"]

CYCLE_NAMES = ("cycle", "decode_step")
_U = pl.UInt64


def base_expr(col: str = "range") -> pl.Expr:
    """``base_name`` as a polars expression (phase name after the last ``.:/ `` separator when known)."""
    # Worked out once per distinct name (a handful), then looked up: no regex per row.
    names = pl.col(col).unique(maintain_order=True)
    tail = names.str.extract(r"([^.:/ ]+)$", 1)
    base = pl.when(names.is_in(ph.NAMES)).then(names).when(tail.is_in(ph.NAMES)).then(tail).otherwise(names)
    return pl.col(col).replace_strict(names, base)


def cycle_order(col: str = "phase") -> pl.Expr:
    """Where a phase runs in a decode cycle (:data:`nvtx_hooks.phases.CYCLE_ORDER`, by base name); others 99."""
    return base_expr(col).replace_strict(list(ph.CYCLE_ORDER), list(range(len(ph.CYCLE_ORDER))), default=99,
                                         return_dtype=pl.Int64)


def decode_exprs(uint64: str = "uint64", int64: str = "int64") -> list[pl.Expr]:
    """``batch_size``, ``cycle_index``, ``accept_length`` and ``payload_steps`` (the draft steps the range ran with:
    version 2 on; 0 is a verify-only cycle) decoded from the payload columns (null if none), from every payload
    version :data:`nvtx_hooks.phases.PAYLOAD_LAYOUTS` defines (1 and 2; the fields sit where each
    version's layout puts them)."""
    v = pl.coalesce(pl.col(uint64).cast(_U, strict=False), pl.col(int64).cast(_U, strict=False))
    ver = v // (1 << ph.VERSION_SHIFT)

    def field(name: str) -> pl.Expr:
        expr: pl.Expr = pl.lit(None, pl.Int64)
        for version, layout in ph.PAYLOAD_LAYOUTS.items():
            if not any(f[0] == name for f in layout):
                continue  # (steps: version 2 on)
            _, shift, bits, offset = next(f for f in layout if f[0] == name)
            raw = (v // (1 << shift)) % (1 << bits)
            val = pl.when(raw > 0).then(raw.cast(pl.Int64) - offset) if offset else raw.cast(pl.Int64)
            expr = pl.when(ver == version).then(val).otherwise(expr)
        return expr

    return [field("batch_size").alias("batch_size"), field("cycle_index").alias("cycle_index"),
            field("accept_length").alias("accept_length"), field("steps").alias("payload_steps")]


def decode_frame(df: pl.DataFrame) -> pl.DataFrame:
    """``df`` with the decoded payload columns added (``uint64``/``int64`` columns may be absent)."""
    for c in ("uint64", "int64"):
        if c not in df.columns:
            df = df.with_columns(pl.lit(None, pl.Int64).alias(c))
    return df.with_columns(decode_exprs())


def accept_beyond_bound(steps: int | None) -> pl.Expr:
    """Payload accept lengths no cycle can have (true where so): more accepted draft tokens than every request of
    the batch accepting every draft token, ``batch_size × steps`` (``steps``: the run's, else
    :data:`~nvtx_hooks.capture.bounds.STEPS_MAX`; a batch unknown: :data:`~nvtx_hooks.capture.bounds.BATCH_MAX`).
    Such a value is left out (the cycle's tokens unknown) and said (PAYLOAD_ACCEPT_LENGTH)."""
    bound = pl.col("batch_size").fill_null(BATCH_MAX) * (steps if steps else STEPS_MAX)
    return pl.col("accept_length").is_not_null() & ((pl.col("accept_length") > bound) | (pl.col("accept_length") < 0))


def accept_bound_text(steps: int | None) -> str:
    return f"batch size × {steps} draft steps" if steps else f"batch size × {STEPS_MAX} (the steps' bound)"
