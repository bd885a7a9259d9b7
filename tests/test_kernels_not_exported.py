"""An export with kernel launch calls but no kernel table: said (KERNELS_NOT_EXPORTED), never silently no kernels.

The count is the export's own: its CUDA API rows named cudaLaunchKernel* / cuLaunchKernel* (counted here with
sqlite3 beside the tool), whichever way it is read: in memory, through the copying store, and as a parquetdir
(the columnar store). An export without a kernel table and without kernel launches (CUDA graphs traced as a whole,
every kernel in a graph) is not warned about.
"""

from __future__ import annotations

import shutil
import sqlite3

import pytest

from analyze import analyze
from nvtx_hooks.capture import samples

LAUNCHES = "s.value LIKE 'cudaLaunchKernel%' OR s.value LIKE 'cuLaunchKernel%'"


@pytest.fixture(scope="module")
def no_kernel_table(tmp_path_factory):
    path = tmp_path_factory.mktemp("nk") / "no_kernels.sqlite"
    shutil.copy(samples.path("tp1_s3_graph"), path)
    with sqlite3.connect(path) as db:
        db.execute("DROP TABLE CUPTI_ACTIVITY_KIND_KERNEL")
        (n,) = db.execute(f"SELECT COUNT(*) FROM CUPTI_ACTIVITY_KIND_RUNTIME rt JOIN StringIds s ON s.id = rt.nameId "
                          f"WHERE {LAUNCHES}").fetchone()
    return path, n


def _warned(res) -> list[str]:
    return [d.message for d in res.diagnostics if d.code == "KERNELS_NOT_EXPORTED" and d.level == "warning"]


@pytest.mark.parametrize("store", [False, True])
def test_launches_without_a_kernel_table_are_said(no_kernel_table, store, tmp_path, monkeypatch):
    monkeypatch.setenv("SPECTRACE_CACHE_DIR", str(tmp_path / "cache"))
    path, n = no_kernel_table
    assert n > 1000
    (msg,) = _warned(analyze(path, store=store, cache=False))
    assert msg.startswith(f"{n} kernel launch calls, but the export has no kernel table")


def test_a_columnar_export_says_it_too(no_kernel_table, tmp_path, monkeypatch):
    from bench.export_dir import write_export_dir

    monkeypatch.setenv("SPECTRACE_CACHE_DIR", str(tmp_path / "cache"))
    path, n = no_kernel_table
    out = write_export_dir(path, tmp_path / "nk_pqtdir")
    (msg,) = _warned(analyze(out))
    assert msg.startswith(f"{n} kernel launch calls")


def test_no_warning_with_kernels_or_without_launches(no_kernel_table, tmp_path, monkeypatch):
    monkeypatch.setenv("SPECTRACE_CACHE_DIR", str(tmp_path / "cache"))
    assert _warned(analyze(samples.path("tp1_s3_graph"))) == []
    path, _ = no_kernel_table
    graphs_only = tmp_path / "graphs_only.sqlite"
    shutil.copy(path, graphs_only)
    with sqlite3.connect(graphs_only) as db:
        db.execute(f"DELETE FROM CUPTI_ACTIVITY_KIND_RUNTIME WHERE nameId IN (SELECT id FROM StringIds s WHERE "
                   f"{LAUNCHES})")
    assert _warned(analyze(graphs_only, cache=False)) == []
