"""Python scalars read out of polars (a Series' ``sum``/``min``/``max``/``mean``, a row's value), narrowed to
the numbers they are.

polars types such a scalar as any literal it can hold (a number, a date, a string, a list, or None); a numeric
column's is a number. These check that at run time (``TypeError`` otherwise, as ``float(None)`` raises) so the
type checker knows it too: :func:`to_float`/:func:`to_int` convert like ``float``/``int``; :func:`real`,
:func:`real_or_none` and :func:`whole` return the value itself (an int stays an int: text and JSON unchanged).
"""

from __future__ import annotations

from decimal import Decimal

__all__ = ["real", "real_or_none", "to_float", "to_int", "whole", "whole_or_none"]


def real(value: object) -> float:
    """``value`` itself, an int or a float (typed ``float``, which includes int); ``TypeError`` otherwise."""
    if isinstance(value, (int, float)):
        return value
    raise TypeError(f"expected a number, got {value!r}")


def real_or_none(value: object) -> float | None:
    """``value`` itself, an int, a float or None."""
    return None if value is None else real(value)


def whole(value: object) -> int:
    """``value`` itself, an int; ``TypeError`` otherwise."""
    if isinstance(value, int):
        return value
    raise TypeError(f"expected an integer, got {value!r}")


def whole_or_none(value: object) -> int | None:
    """``value`` itself, an int or None."""
    return None if value is None else whole(value)


def to_float(value: object) -> float:
    """``float(value)`` of a number (a Decimal included); ``TypeError`` for anything else, None included."""
    if isinstance(value, (int, float, Decimal)):
        return float(value)
    raise TypeError(f"expected a number, got {value!r}")


def to_int(value: object) -> int:
    """``int(value)`` of a number (a float is truncated, as ``int`` does); ``TypeError`` for anything else."""
    if isinstance(value, (int, float, Decimal)):
        return int(value)
    raise TypeError(f"expected a number, got {value!r}")
