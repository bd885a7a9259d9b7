"""A polars scalar (a Series' sum, min, max, mean, median) narrowed to the number it is: the value itself for
``real``/``whole`` (an int stays an int, so text and JSON do not change), ``float()``/``int()`` for
``to_float``/``to_int``, and the same ``TypeError`` as ``float(None)`` for anything that is not a number."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

import polars as pl
import pytest

from analyze.compute.scalars import real, real_or_none, to_float, to_int, whole, whole_or_none


def test_the_value_itself():
    total = real(pl.Series([1, 2, 4]).sum())
    assert total == 7 and type(total) is int  # not 7.0: a count printed as "7"
    assert real(pl.Series([0.5, 2.0]).mean()) == 1.25
    top = whole(pl.Series([3, 9, 4], dtype=pl.UInt32).max())
    assert top == 9 and type(top) is int
    assert real_or_none(pl.Series([], dtype=pl.Float64).max()) is None
    assert whole_or_none(pl.Series([None], dtype=pl.Int64).min()) is None
    assert whole_or_none(pl.Series([-2, 5]).min()) == -2


def test_conversions_are_float_and_int():
    assert to_float(pl.Series([1, 2]).sum()) == 3.0 and type(to_float(3)) is float
    assert to_float(Decimal("1.25")) == 1.25
    assert to_int(pl.Series([2.9]).max()) == 2 == int(2.9)
    assert to_int(pl.Series([-2.9]).min()) == -2 == int(-2.9)


@pytest.mark.parametrize("value", [None, "3", dt.date(2026, 1, 1), [1, 2]])
def test_what_is_not_a_number_is_refused_as_float_refuses_none(value):
    for narrow in (real, to_float, to_int):
        with pytest.raises(TypeError):
            narrow(value)
    with pytest.raises(TypeError):
        whole(value)
    with pytest.raises(TypeError):
        float(None)  # what the code raised before, on a missing value


def test_whole_refuses_a_float():
    with pytest.raises(TypeError):
        whole(pl.Series([1.0, 2.0]).max())
    assert real_or_none(1.5) == 1.5 and whole_or_none(True) is True  # bool is an int, as for int()
