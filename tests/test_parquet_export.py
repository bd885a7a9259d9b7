"""parquetdir / arrowdir inputs: identical results to the SQLite path on the same capture.

No nsys is installed here, so the directories are written from the SQLite export with the typing
nsys 2024.2 uses in parquet (ids UInt64, negative system ids keeping their bits, StringIds.id
Int32): :func:`bench.export_dir.write_export_dir`.
"""

from __future__ import annotations

import polars as pl
import pytest
from test_scale import _same

from analyze import analyze
from analyze.read.export import load
from analyze.read.exportdir import DirReader, is_export_dir
from bench.export_dir import write_export_dir
from tests.helpers.paths import PROBE, need


@pytest.fixture(scope="module")
def sqlite_res():
    return analyze(need(PROBE), keep_ops=True, store=False)


@pytest.mark.parametrize("fmt", ["parquet", "arrow"])
def test_export_dir_matches_sqlite(tmp_path, sqlite_res, fmt):
    d = write_export_dir(PROBE, tmp_path / f"probe_{fmt[:3]}dir", fmt)
    assert is_export_dir(d) and not is_export_dir(tmp_path)
    if fmt == "parquet":
        sch = pl.read_parquet_schema(d / "CUPTI_ACTIVITY_KIND_KERNEL.parquet")
        assert sch["globalPid"] == pl.UInt64 and sch["demangledName"] == pl.UInt64
        assert pl.read_parquet_schema(d / "StringIds.parquet")["id"] == pl.Int32
    res = analyze(str(d), keep_ops=True, store=False)
    _same(res, sqlite_res)  # rows whose sort keys tie may come in either order, as in any two runs
    key = ["pid", "corr", "start", "kind"]
    assert res.ops.sort(key).equals(sqlite_res.ops.sort(key))


def test_uint64_ids_keep_their_bits(tmp_path):
    d = write_export_dir(need(PROBE), tmp_path / "p_pqtdir")
    r = DirReader(d)
    # system rows carry negative ids in SQLite (0xFE00...): the same signed values come back
    neg = r.frame("SELECT globalPid FROM DIAGNOSTIC_EVENT WHERE globalPid < 0")
    assert neg.height > 0 and neg.schema["globalPid"] == pl.Int64
    t = load(d)
    assert set(t.ops["pid"].unique()) == {1412, 1413}
