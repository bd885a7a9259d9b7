"""The readers, sources and op windows follow the Protocols that type them (analyze/read/protocols.py,
analyze.model.WindowReader): every member there on each implementation, on a real capture."""

from __future__ import annotations

import pytest

from analyze import analyze
from analyze.model import WindowReader
from analyze.read.export import load, open_reader
from analyze.read.exportdir import DirReader
from analyze.read.protocols import ExportReader, ProcessSource
from analyze.read.source import ManyWindows, MemorySource, StoreSource, open_source
from analyze.read.sqlite import Reader
from tests.helpers.paths import tp2


@pytest.fixture(scope="module")
def capture(tmp_path_factory):
    return tp2("tp2_s3_graph", tmp_path_factory.mktemp("protocols"))


def test_both_readers_are_export_readers(capture, tmp_path):
    from bench.export_dir import write_export_dir

    folder = write_export_dir(capture, tmp_path / "run_pqtdir", "parquet")
    for path, kind in ((capture, Reader), (folder, DirReader)):
        r = open_reader(path)
        try:
            assert type(r) is kind and isinstance(r, ExportReader)
            assert r.max_rowid("CUPTI_ACTIVITY_KIND_KERNEL") > 0 and r.has("StringIds", "id", "value")
        finally:
            r.close()


def test_both_sources_are_process_sources(capture, tmp_path):
    memory = MemorySource(load(capture))
    stored = open_source(capture, store=True, cache=False)
    try:
        assert type(stored) is StoreSource
        for s in (memory, stored):
            assert isinstance(s, ProcessSource)
        # the same GPU operations per process (two ranks); the store keeps only the API calls the analysis needs,
        # so a process with none of those is not among its processes
        assert memory.ops_rows == stored.ops_rows and len(stored.ops_rows) == 2
        assert set(stored.ops_rows) <= set(stored.pids) <= set(memory.pids)
    finally:
        stored.close()


def test_a_result_reads_its_op_windows_through_a_window_reader(capture):
    res = analyze(capture)
    assert isinstance(res.window, WindowReader) and isinstance(ManyWindows([res.window]), WindowReader)
    t0, t1 = res.instances["start"].min(), res.instances["end"].max()
    assert res.window(t0, t1).height == ManyWindows([res.window])(t0, t1).height > 0


def test_a_partial_implementation_is_not_one():
    class OnlyOps:
        def ops(self, pid, columns=None): ...

    assert not isinstance(OnlyOps(), ProcessSource) and not isinstance(OnlyOps(), ExportReader)
    assert not isinstance(object(), WindowReader)
