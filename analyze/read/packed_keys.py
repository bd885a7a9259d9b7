"""Packed keys: several integer columns as one Int64 that joins, groups and sorts as the columns do together.

A join, group-by or sort on one integer column hashes or compares one number a row; on several columns, one per
column (a string column: its bytes). Packing ids into one integer is much of how the analysis stays fast at
millions of rows (docs/speed.md), and a packed key is right only while every value fits. This module is the one
place that packs; the read layer (the store's (pid, correlation id) keys) and the compute layer use it alike.

- :func:`packing` measures the columns of some frames (each one's lowest and highest value, whether it has a null)
  and returns their :class:`Packing`, or None when a column is not an integer (nor a Categorical: its codes), or
  when the values do not fit in one Int64 key: the overflow check, made here once for every caller.
  :func:`bounded` packs columns whose bounds are known without a pass over the rows (checked the same way);
  :func:`fixed` is a layout given in advance (for keys made batch by batch and compared across batches), checked
  on each frame with :meth:`Packing.holds`.
- :class:`Packing` is the layout: :meth:`Packing.key` the key (an expression), :meth:`Packing.unpacked` the
  columns back from it.
- :func:`with_key`, :func:`join`, :func:`semi_join`, :func:`sort_by` and :func:`sort_key` are the operations on
  the packed key; each falls back to the plain polars operation on the columns when they do not pack, and the
  result is the same either way (``tests/test_packed_keys.py`` checks each against the plain operation on random
  frames: nulls, ties, strings, negative values and values too wide to pack).

The layout: column ``i``'s value ``v`` packs as ``v - low_i`` (a Categorical: its code; a string, in sorts: its
dense rank), and the key is ``sum(code_i * stride_i)`` where ``stride_i`` is the product of the widths of the
columns after ``i``: the key sorts as the columns do together, and it fits when the widths multiply to at most
:data:`KEYS`. Nulls (``nulls``): ``"unmatched"`` (joins, the default) makes the key null where any column is
null, so the row matches nothing, as a join on the columns does; ``"first"`` / ``"last"`` (sorts, group-bys) give
a column that has nulls one more code, before or after its values, so a null is a value of its own, as in polars'
``sort`` (nulls first by default) and ``group_by``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Literal

import polars as pl

__all__ = ["KEYS", "Nulls", "Packing", "packing", "bounded", "fixed", "with_key", "join", "semi_join", "sort_key",
           "sort_by"]

KEYS = 1 << 63
"""How many keys an Int64 holds from 0 (0 .. 2**63 - 1): a packing fits when its widths multiply to at most this.
(A test may set it to 0: then nothing packs, and every operation takes its plain path.)"""

Nulls = Literal["unmatched", "first", "last"]


@dataclasses.dataclass(frozen=True)
class _Part:
    """One column of a packing: how its values become codes ``0 .. width - 1``."""

    name: str
    code: Literal["int", "physical", "dense"]
    """The value itself (an integer column), a Categorical's code, or a string's dense rank (1 up; sorts only)."""
    low: int
    """The lowest value (code 0; code 1 when a null takes code 0)."""
    width: int
    """How many codes: highest - lowest + 1, and one more for null when the column has nulls and nulls are a value."""
    null_code: int | None
    """The code of a null (0: first, width - 1: last), or None: a null makes the key null."""

    @property
    def shift(self) -> int:
        """The value of code 0 (what a value's code is counted from)."""
        return self.low - (1 if self.null_code == 0 else 0)

    def expr(self) -> pl.Expr:
        """The codes of the column's values. (A cast of an Int64 column to Int64 costs nothing: polars drops it.)"""
        e = pl.col(self.name)
        if self.code == "physical":
            e = e.to_physical()
        elif self.code == "dense":
            e = e.rank("dense")
        e = e.cast(pl.Int64)
        if self.shift:
            e = e - self.shift
        if self.null_code is not None:
            e = e.fill_null(self.null_code)
        return e


@dataclasses.dataclass(frozen=True)
class Packing:
    """Integer columns packed into one Int64 that sorts as they do together (the module docstring has the layout).

    Made by :func:`packing` (measured on frames) or :func:`fixed` (given); a frame's values fit it when
    :meth:`holds` says so (a measured packing holds for the frames it was measured on)."""

    parts: tuple[_Part, ...]

    @property
    def columns(self) -> list[str]:
        return [p.name for p in self.parts]

    def key(self, name: str = "_key") -> pl.Expr:
        """The packed key of each row, an Int64 expression named ``name``."""
        key = self.parts[0].expr()
        for p in self.parts[1:]:
            key = key * p.width + p.expr()
        return key.alias(name)

    def unpacked(self, key: str | pl.Expr = "_key") -> list[pl.Expr]:
        """The integer columns back from their key (named as they were; a null code back to null)."""
        k = pl.col(key) if isinstance(key, str) else key
        out = []
        stride = 1
        for i, p in reversed(list(enumerate(self.parts))):
            if p.code != "int":
                raise ValueError(f"{p.name}: packed by its {p.code} code, which does not unpack to its value")
            e = k // stride if stride > 1 else k
            if i:
                e = e % p.width
            value = e + p.shift if p.shift else e
            if p.null_code is not None:
                value = pl.when(e == p.null_code).then(None).otherwise(value)
            out.append(value.alias(p.name))
            stride *= p.width
        return out[::-1]

    def holds(self, frame: pl.DataFrame) -> bool:
        """Whether every value of ``frame``'s columns fits this layout (its nulls too: only where a null has a code;
        a string's dense rank is of the frame it was measured on: never)."""
        for p in self.parts:
            s = frame[p.name]
            if p.code == "dense" or s.null_count() and p.null_code is None:
                return False
            if s.null_count() == s.len():
                continue
            if p.code == "physical":
                s = s.to_physical()
            lo, hi = s.min(), s.max()
            if not (isinstance(lo, int) and isinstance(hi, int)):
                return False
            if lo < p.low or hi > p.low + p.width - 1 - (0 if p.null_code is None else 1):
                return False
        return True


def fixed(columns: Sequence[str], widths: Sequence[int], lows: Sequence[int] | None = None) -> Packing:
    """A packing given in advance: column ``i``'s values ``lows[i] .. lows[i] + widths[i] - 1`` (lows: 0), no null
    (a null makes the key null). For keys made batch by batch and compared with each other: check each frame with
    :meth:`Packing.holds`. A ``ValueError`` when the widths do not fit in one key."""
    lows = list(lows) if lows is not None else [0] * len(columns)
    total = 1
    for w in widths:
        total *= w
    if total > KEYS:
        raise ValueError(f"{list(columns)}: widths {list(widths)} do not fit in one Int64 key")
    return Packing(tuple(_Part(c, "int", lo, w, None) for c, lo, w in zip(columns, lows, widths, strict=True)))


def bounded(columns: Sequence[str], bounds: Sequence[tuple[int, int]]) -> Packing | None:
    """The packing of integer columns whose values are known to lie within ``bounds`` (``(lowest, highest)`` of each,
    e.g. ids whose range a smaller frame gives: no pass over the rows to measure them), or None when they do not fit
    in one key. A null makes the key null. The caller vouches for the bounds: a value outside them packs wrong."""
    parts = [_Part(c, "int", lo, max(hi - lo + 1, 1), None) for c, (lo, hi) in zip(columns, bounds, strict=True)]
    total = 1
    for p in parts:
        total *= p.width
    return Packing(tuple(parts)) if parts and total <= KEYS and min(lo for lo, _ in bounds) >= -(1 << 63) else None


def packing(frames: Sequence[pl.DataFrame], columns: Sequence[str], nulls: Nulls = "unmatched",
            sorting: bool = False) -> Packing | None:
    """The packing of ``columns`` over every one of ``frames`` (their lowest and highest values), or None when a
    column is of another type or the values do not fit in one key (then use the columns). Integer columns pack;
    Categorical ones by their codes (for joins and group-bys: codes are not in their strings' order); with
    ``sorting`` (one frame, a key to sort by) string columns pack by their dense rank instead."""
    if not columns:
        return None
    parts = []
    total = 1
    for c in columns:
        p = _measure(frames, c, nulls, sorting)
        if p is None:
            return None
        total *= p.width
        if total > KEYS:
            return None
        parts.append(p)
    return Packing(tuple(parts))


def _measure(frames: Sequence[pl.DataFrame], c: str, nulls: Nulls, sorting: bool) -> _Part | None:
    """Column ``c`` of ``frames`` as a part of a packing, or None when it does not pack."""
    dtypes = [f.schema[c] for f in frames]
    has_null = any(f[c].null_count() for f in frames)
    if sorting and len(frames) == 1 and dtypes[0] == pl.String:
        s = frames[0][c]
        return _part(c, "dense", 1, s.n_unique() - (1 if has_null else 0), has_null, nulls)
    if all(d.is_integer() for d in dtypes):
        code: Literal["int", "physical"] = "int"
        series = [f[c] for f in frames]
    elif not sorting and all(isinstance(d, pl.Categorical | pl.Enum) for d in dtypes):
        code = "physical"
        series = [f[c].to_physical() for f in frames]
    else:
        return None
    lows = [lo for s in series if (lo := s.min()) is not None]
    highs = [hi for s in series if (hi := s.max()) is not None]
    if not lows:  # every value null (or no rows)
        return _part(c, code, 0, 0, has_null, nulls)
    lo, hi = min(lows), max(highs)
    if not (isinstance(lo, int) and isinstance(hi, int)) or hi >= KEYS:  # (a UInt64 above Int64's range)
        return None
    return _part(c, code, lo, hi, has_null, nulls)


def _part(c: str, code: Literal["int", "physical", "dense"], lo: int, hi: int, has_null: bool,
          nulls: Nulls) -> _Part | None:
    """The part of column ``c``, its values ``lo .. hi``: a code for null too when it has nulls and they are values.
    None when the value of code 0 is below Int64's range (the lowest Int64 with a null first)."""
    width = max(hi - lo + 1, 1)
    part = _Part(c, code, lo, width, None)
    if has_null and nulls != "unmatched":
        part = _Part(c, code, lo, width + 1, 0 if nulls == "first" else width)
    return part if part.shift >= -(1 << 63) else None


def with_key(frames: Sequence[pl.DataFrame], columns: Sequence[str], name: str = "_key", nulls: Nulls = "unmatched"
             ) -> tuple[tuple[pl.DataFrame, ...], list[str]]:
    """The frames with ``name``, their ``columns`` packed into one integer, and ``[name]`` to join or group on; the
    frames as they are and ``columns`` when they do not pack. With ``nulls="unmatched"`` a null in any column makes
    the key null: it matches nothing, as in a join on the columns."""
    p = packing(frames, columns, nulls)
    if p is None:
        return tuple(frames), list(columns)
    key = p.key(name)
    return tuple(f.with_columns(key) for f in frames), [name]


def join(left: pl.DataFrame, right: pl.DataFrame, on: Sequence[str], how: Literal["inner", "left"] = "inner",
         maintain_order: Literal["left"] | None = None) -> pl.DataFrame:
    """``left.join(right, on=on, how=how)``, on the columns packed into one integer when they pack: the same rows
    and columns either way (a null in a key column matches nothing)."""
    (lk, rk), by = with_key((left, right), on, "_key")
    if by != ["_key"]:
        return left.join(right, on=list(on), how=how, maintain_order=maintain_order)
    return lk.join(rk.drop(*on), on="_key", how=how, maintain_order=maintain_order).drop("_key")


def semi_join(frame: pl.DataFrame, keys: pl.DataFrame, on: Sequence[str]) -> pl.DataFrame:
    """The rows of ``frame`` whose columns ``on`` are a row of ``keys``, in their order (a semi join; a null matches
    nothing): a filter on the packed key when they pack."""
    p = packing((frame.select(*on), keys.select(*on)), on)
    if p is None:
        return frame.join(keys.select(*on), on=list(on), how="semi", maintain_order="left")
    return frame.filter(p.key().is_in(keys.select(p.key())["_key"].implode()))


def sort_key(df: pl.DataFrame, columns: Sequence[str], nulls: Literal["first", "last"] = "first") -> pl.Expr | None:
    """One integer that sorts the rows of ``df`` as ``columns`` do together (integers; strings by their dense rank;
    a null before or after every value), or None when they do not pack."""
    p = packing((df,), columns, nulls, sorting=True)
    return None if p is None else p.key()


def sort_by(df: pl.DataFrame, columns: Sequence[str], maintain_order: bool = False) -> pl.DataFrame:
    """``df.sort(columns, maintain_order=...)`` (nulls first), on packed keys: one sort on one key when the columns
    fit in one; else by the last group of columns that fits, then stably by the one before, and so on (one-key sorts
    cost less than one sort comparing several columns); on the columns themselves when a column alone does not
    pack."""
    parts = [_measure((df,), c, "first", sorting=True) for c in columns]
    groups: list[list[_Part]] = []
    total = KEYS + 1
    for part in parts:  # runs of columns, each as wide as fits in one key, from the first
        if part is None or part.width > KEYS:
            return df.sort(list(columns), maintain_order=maintain_order)
        total *= part.width
        if total > KEYS:
            groups.append([])
            total = part.width
        groups[-1].append(part)
    if not groups:
        return df.sort(list(columns), maintain_order=maintain_order)
    keys = [Packing(tuple(g)).key() for g in groups]
    out = df.sort(keys[-1], maintain_order=maintain_order)
    for k in reversed(keys[:-1]):
        out = out.sort(k, maintain_order=True)
    return out
