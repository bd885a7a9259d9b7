"""The what-if's Theil–Sen slope (`whatif_fit._theil_sen`): exact against the cross join it replaced, in bounded memory.

A real capture of 6,000 cycles (1.09 M kernels, node-level, H200) has 6,000 draft_extend rows with token counts: the
cross join of them took 1.7 GB (peak 2.13 GB for the whole `analyze`); the median is now selected from blocks of
slopes. The reference here is the old cross join, on random data of every kind it meets (integer and float x and y,
repeated x, no pair with two x values, odd and even pair counts).
"""

import numpy as np
import polars as pl
import pytest

from analyze.compute import whatif_fit


def cross_join_median(xy: pl.DataFrame) -> float:
    p = xy.with_row_index("i").join(xy.with_row_index("j"), how="cross", suffix="2")
    p = p.filter((pl.col("i") < pl.col("j")) & (pl.col("x") != pl.col("x2")))
    return float(p.select(((pl.col("y2") - pl.col("y")) / (pl.col("x2") - pl.col("x"))).median()).item() or 0.0)


def frames(seed: int, count: int, most: int):
    rng = np.random.default_rng(seed)
    for k in range(count):
        n = int(rng.integers(0, most))
        x = rng.integers(0, 5, n) if k % 4 < 2 else rng.normal(size=n)
        y = rng.integers(0, 10**6, n) if k % 2 == 0 else rng.normal(size=n) * 1e3
        yield pl.DataFrame({"x": x, "y": y})


def test_the_same_median_as_the_cross_join():
    checked = [(cross_join_median(xy), whatif_fit._theil_sen(xy)) for xy in frames(1, 200, 60)]
    assert all(a == b for a, b in checked)
    assert sum(a != 0 for a, _ in checked) > 100  # not all the degenerate case
    assert whatif_fit._theil_sen(pl.DataFrame({"x": [1.0, 1.0, 1.0], "y": [1.0, 2.0, 3.0]})) == 0.0  # no pair: 0


@pytest.mark.parametrize("at_once", [1, 7, 64])
def test_blocks_and_the_bracket_give_the_same(monkeypatch, at_once):
    """Blocks of a few slopes: the sample's bracket and, when it misses, the whole range."""
    monkeypatch.setattr(whatif_fit, "_SLOPES_AT_ONCE", at_once)
    for xy in frames(at_once, 60, 90):
        assert whatif_fit._theil_sen(xy) == cross_join_median(xy)


def test_a_hand_computed_slope():
    # pairs (0,1): 2/1, (0,2): 6/2, (1,2): 4/1 -> median 3
    assert whatif_fit._theil_sen(pl.DataFrame({"x": [0.0, 1.0, 2.0], "y": [0.0, 2.0, 6.0]})) == 3.0
    # four points on y = 5x + 1 and one outlier: the slope stays 5
    xy = pl.DataFrame({"x": [0.0, 1.0, 2.0, 3.0, 4.0], "y": [1.0, 6.0, 11.0, 16.0, 1e9]})
    assert whatif_fit._theil_sen(xy) == 5.0


def test_nulls_and_nans_as_the_cross_join():
    xy = pl.DataFrame({"x": [0.0, 1.0, None, 3.0, 4.0], "y": [1.0, None, 7.0, 16.0, 20.0]})
    assert whatif_fit._theil_sen(xy) == cross_join_median(xy)
    nan = float("nan")
    for xy in (pl.DataFrame({"x": [0.0, 1.0, 2.0, 3.0], "y": [1.0, nan, 7.0, 16.0]}),
               pl.DataFrame({"x": [0.0, nan, nan, 3.0, 4.0], "y": [1.0, 2.0, 7.0, 16.0, 3.0]}),
               pl.DataFrame({"x": [nan, nan, 1.0, 2.0, 2.0, 5.0], "y": [4.0, 1.0, 7.0, 2.0, 9.0, 3.0]}),
               # two NaN x are one x value to polars: their pair is no pair (the median 10, not 10.5)
               pl.DataFrame({"x": [nan, nan, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0],
                             "y": [0.0, 1.0, 1.0, 4.0, 9.0, 16.0, 25.0, 36.0]})):
        a, b = whatif_fit._theil_sen(xy), cross_join_median(xy)
        assert a == b or (np.isnan(a) and np.isnan(b)), xy
