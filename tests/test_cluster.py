"""Several reports analysed on a real Dask cluster (``spectrace[cluster]``), only small results crossing.

A ``dask.distributed`` LocalCluster with worker *processes* runs the per-report map through
``Client.get_executor()``; the merged result must equal the one computed here in one process.
"""

from __future__ import annotations

import pickle
from pathlib import Path

import polars as pl
import pytest
from test_collectives_real import split_probe

from analyze import analyze
from analyze.compute.pipeline import result_for_merge

distributed = pytest.importorskip("distributed", reason="pip install 'spectrace[cluster]'")
pytestmark = pytest.mark.slow  # a Dask LocalCluster with worker processes: make test-all (CI)


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    d = tmp_path_factory.mktemp("split")
    return [str(split_probe(d, 1412)), str(split_probe(d, 1413, shift=50_000, utc_delta=-20_000))]


def test_dask_local_cluster_equals_one_process(reports):
    local = analyze(reports, jobs=1)
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None,
                                  silence_logs=40) as cluster, distributed.Client(cluster) as client:
        workers = set(client.scheduler_info()["workers"])
        assert len(workers) == 2
        ex = client.get_executor()
        remote = analyze(reports, executor=ex)
        # the per-report map really ran on the workers: each future's result came from a worker process
        futs = [client.submit(result_for_merge, p, None, None, None, None, pure=False) for p in reports]
        client.gather(futs)
        ran_on = {w for who in client.who_has(futs).values() for w in who}
        assert ran_on <= workers and ran_on
    assert remote.reports == local.reports and remote.clock == local.clock
    assert remote.ranks.select("rank", "pid", "report").rows() == [(0, 1412, 0), (1, 1413, 1)]
    key = ["rank", "phase"]
    assert remote.phases.sort(key).equals(local.phases.sort(key))
    assert remote.seams.sort("rank", "from", "to").equals(local.seams.sort("rank", "from", "to"))
    draft = remote.phases.filter(pl.col("phase") == "eagle3.draft")
    assert int((draft["comm_wait_ns"] + draft["comm_transfer_ns"]).sum()) > 0  # matched across the two reports


def test_only_small_results_cross(reports):
    """What a worker sends back: per-instance frames, no GPU operations (a fraction of the report's size)."""
    res = result_for_merge(reports[0], None, None, None, None)
    assert res.ops is None and res.trace.ops.height == 0 and res.trace.api.height == 0
    assert len(pickle.dumps(res)) < Path(reports[0]).stat().st_size / 2
