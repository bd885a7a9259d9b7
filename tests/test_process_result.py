"""pipeline.process returns a ProcessResult per process, and the Result is made of exactly those frames: every
instance, communication kernel, key host call, kernel statistic (and kept operation) of the Result came from
one process's result, on a real two-rank capture."""

from __future__ import annotations

import polars as pl
import pytest

from analyze.compute import pipeline
from tests.helpers.paths import tp2


@pytest.fixture
def seen(monkeypatch) -> list[pipeline.ProcessResult]:
    """Every ProcessResult the pipeline gets, in the order it gets them."""
    out: list[pipeline.ProcessResult] = []
    real = pipeline.process

    def recording(source, pid, ctx):
        out.append(real(source, pid, ctx))
        return out[-1]

    monkeypatch.setattr(pipeline, "process", recording)
    return out


def rows(seen: list[pipeline.ProcessResult], field: str) -> int:
    return sum(getattr(o, field).height for o in seen if getattr(o, field) is not None)


def test_the_result_is_made_of_the_process_results(tmp_path, seen):
    res = pipeline.result_of(tp2("tp2_s3_graph", tmp_path), store=False)
    assert all(isinstance(o, pipeline.ProcessResult) for o in seen)
    gpu = [o for o in seen if o.comm_kernels is not None]
    assert len(seen) == 3 and len(gpu) == res.ranks.height == 2  # two ranks with GPU work, a third with API calls
    assert rows(seen, "instances") == res.instances.height
    assert rows(seen, "comm_kernels") == res.comm_kernels.height > 0
    assert rows(seen, "host_calls") == res.host_calls.height > 0
    assert rows(seen, "coverage") == res.coverage.height == 2
    assert rows(seen, "ops") == 0 and res.ops is None  # not kept unless asked
    stats = pl.concat([o.kernel_stats for o in seen])
    assert stats["kernel_ns"].sum() == res.kernels["kernel_ns"].sum() > 0
    assert rows(seen, "seams") >= res.seam_instances.height > 0  # the seams of left-out instances are not counted
    assert sum(o.facts["graph_ops"] for o in seen) > 0


def test_kept_operations_come_from_the_process_results(tmp_path, seen):
    res = pipeline.result_of(tp2("tp2_s3_graph", tmp_path), store=False, keep_ops=True)
    assert res.ops is not None and rows(seen, "ops") == res.ops.height > 0


@pytest.mark.parametrize("names", [["gemm", "nccl", "[CUDA memcpy HtoD]"], ["gemm", "gemm", "[CUDA memcpy HtoD]"]])
def test_kernel_stats_sum_ops_per_instance_and_name(names):
    """Hand-computed: ops outside any range are left out; with a name under two kinds (two name ids), the two
    kinds' ops of an instance are summed under the one name (the path that groups twice); with names all
    distinct, each (instance, kind) sum is the row."""
    kinds = pl.DataFrame({"name": names}).with_columns(pl.col("name").cast(pl.Categorical))
    ops = pl.DataFrame({"pid": [7] * 6, "range_id": [1, 1, 1, 2, 2, None], "_kind": [0, 1, 0, 1, 2, 0],
                        "start": [0, 10, 20, 100, 130, 200], "end": [5, 13, 30, 104, 150, 260]})
    nested = pl.DataFrame({"range_id": [1, 2]})  # the process's ranges (their ids bound the packed key)
    got = pipeline._kernel_stats(ops, kinds, 3, nested).with_columns(pl.col("name").cast(pl.String))
    want = {(1, names[0]): (2, 15), (1, names[1]): (1, 3), (2, names[1]): (1, 4), (2, names[2]): (1, 20)}
    if names[0] == names[1]:  # range 1: gemm 5 + 3 + 10 ns in three ops
        want = {(1, "gemm"): (3, 18), (2, "gemm"): (1, 4), (2, names[2]): (1, 20)}
    assert {(r, n): (c, k) for r, n, c, k in got.select("range_id", "name", "count", "kernel_ns").rows()} == want
    assert got.height == len(want) and set(got["pid"]) == {7} and set(got["rank"]) == {3}
    assert got.schema["count"] == pl.Int64 and got.schema["kernel_ns"] == pl.Int64
