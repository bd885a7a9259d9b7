"""compare on a real TP2 pair that differs only in NCCL_PROTO (Simple → LL), captured by
tests/device/nccl_simple_vs_ll.sh: the verify change is attributed to communication.

The pair is bundled (``tests/data/h200_tp2/tp2_nccl_{simple,ll}.sqlite.xz``). Ground truth: the change in the NCCL kernels' summed time per steady
cycle in verify (from the kernel table, independent of the interval unions behind ``comm_ns``).
"""

from __future__ import annotations

import lzma
import shutil
from pathlib import Path

import polars as pl
import pytest

from analyze import analyze
from analyze.compute import steady_tables
from analyze.compute.compare import compare_results

DATA = Path(__file__).parent / "data" / "h200_tp2"


def capture(name: str, tmp: Path) -> Path:
    """The bundled capture (tests/data/h200_tp2, made by tests/device/nccl_simple_vs_ll.sh), decompressed into ``tmp``."""
    xz = DATA / f"{name}.sqlite.xz"
    out = tmp / f"{name}.sqlite"
    with lzma.open(xz) as f, open(out, "wb") as g:
        shutil.copyfileobj(f, g)
    return out


def nccl_per_cycle(res, phase: str) -> float:
    k = steady_tables.kernels(res).filter(pl.col("phase").str.ends_with(phase) & pl.col("name").str.starts_with("nccl"))
    return float(k["per_cycle_ns"].sum())


def test_simple_to_ll_is_communication(tmp_path):
    a = analyze(capture("tp2_nccl_simple", tmp_path))
    b = analyze(capture("tp2_nccl_ll", tmp_path))
    doc = compare_results(a, b).to_dict()
    v = next(r for r in doc["rows"] if r["phase"] == "verify")
    truth = nccl_per_cycle(b, "verify") - nccl_per_cycle(a, "verify")
    assert v["delta_comm_ns"] == pytest.approx(truth, rel=0.05)
    assert abs(v["delta_compute_ns"]) <= 0.05 * abs(v["delta_ns"])  # the compute did not change
    assert v["significant"]
