"""tests/device/host_anatomy_and_adaptive.sh on CPU: the device script's logic with a stand-in nsys and the workload
on CPU (tiny model, cycle counts divided by CYCLE_SCALE): what it runs, what it packs, what comes back."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FAKE = ROOT / "tests" / "data" / "fake_nsys.py"
SCRIPT = ROOT / "tests" / "device" / "host_anatomy_and_adaptive.sh"


def _stand_ins(tmp_path: Path) -> tuple[Path, Path]:
    """A bin folder with a stand-in nsys (tests/data/fake_nsys.py) and the scripts' python3: this one (its venv:
    torch, the package); returns the folder and the nsys."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    nsys = bindir / "nsys"
    nsys.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{FAKE}" "$@"\n')
    nsys.chmod(0o755)
    py = bindir / "python3"
    py.write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    py.chmod(0o755)
    return bindir, nsys


@pytest.mark.slow
def test_device_script_on_cpu(tmp_path):
    pytest.importorskip("torch", reason="the workload needs torch (pip install torch==2.13.0)")
    if shutil.which("bash") is None or shutil.which("xz") is None:
        pytest.skip("needs bash and xz")
    bindir, nsys = _stand_ins(tmp_path)
    out = tmp_path / "out"
    env = {**os.environ, "PATH": f"{bindir}:{os.environ['PATH']}", "NSYS": str(nsys), "OUT": str(out),
           "STAGE": str(tmp_path / "stage"), "W": str(tmp_path / "cap"), "CYCLE_SCALE": "50", "REPS": "1",
           "FAKE_NSYS_LOG": str(tmp_path / "nsys.log"), "OMP_NUM_THREADS": "1",
           "WORKLOAD_ARGS": "--device cpu --hidden 32 --ffn 64 --layers 2 --warmup 1"}
    r = subprocess.run(["bash", str(SCRIPT)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    files = sorted(p.name for p in out.iterdir())
    assert files == ["adaptive.tar", "adaptive_plain.tar", "hook_overhead.txt", "log.txt", "recurring.tar",
                     "sched.tar"]
    bench = [json.loads(ln) for ln in (out / "hook_overhead.txt").read_text().splitlines() if ln.startswith("{")]
    assert len(bench) == 2 and {r["case"] for r in bench[0]["rows"]} >= {"patched decode-cycle entry",
                                                                          "patched scheduler method (host range)"}
    assert all(p.stat().st_size < 16 << 20 for p in out.iterdir())
    names = {}
    for t in ("sched", "recurring", "adaptive", "adaptive_plain"):
        with tarfile.open(out / f"{t}.tar") as tf:
            names[t] = sorted(tf.getnames())
            tf.extractall(tmp_path / "x", filter="data")
    caps = {"sched": ["sglang", "hooks", "cpu"], "recurring": ["shift", "stalls", "overlap"]}
    for t, kinds in caps.items():
        assert names[t] == sorted(f"tp1_sched_{k}{ext}" for k in kinds
                                  for ext in (".manifest.json", ".sqlite.xz", ".stdout.txt"))
    assert names["adaptive"] == sorted(f"tp1_adaptive_{k}{ext}" for k in ("node", "graph")
                                       for ext in (".manifest.json", ".sqlite.xz", ".stdout.txt"))
    assert names["adaptive_plain"] == ["tp1_adaptive_plain.jsonl"]
    x = tmp_path / "x"

    def record(name):
        m = json.loads((x / f"{name}.manifest.json").read_text())
        (rec,) = m["program_output"]
        return m, rec

    m, rec = record("tp1_sched_sglang")
    assert rec["scheduler"]["ranges"] == "sglang" and rec["extras"][0]["rule"] == "every=8"
    assert m["speculative"]["scheduler"]["ranges"] == "sglang" and rec["cycles"] == 4  # 200 / 50
    m, rec = record("tp1_sched_cpu")
    assert m["cpu_sampling"]["options"][:3] == ["--sample=process-tree", "--cudabacktrace=all",
                                                "--python-backtrace=cuda"]
    assert rec["scheduler"]["busy_us"] == 300
    assert record("tp1_sched_shift")[1]["extras"][0]["rule"] == "from=2"  # 130 / 50
    assert record("tp1_sched_stalls")[1]["extras"][0]["rule"] == "p=0.25"
    assert record("tp1_sched_overlap")[1]["scheduler"]["overlap"] is True
    m, rec = record("tp1_adaptive_graph")
    assert [(s["batch"], s["steps"]) for s in rec["segments"]] == [(1, 4), (8, 3), (32, 1), (64, 0), (8, 3)]
    assert "--cuda-graph-trace=graph" in m["nsys"]["profile_command"]
    (plain,) = [json.loads(ln) for ln in (x / "tp1_adaptive_plain.jsonl").read_text().splitlines()]
    assert plain["rep"] == 1 and [(s["batch"], s["steps"]) for s in plain["segments"]] == [
        (bs, k) for bs in (1, 8, 32, 64) for k in range(5)]
    for name in ("tp1_sched_hooks", "tp1_adaptive_node"):
        assert (x / f"{name}.sqlite.xz").read_bytes()[:6] == b"\xfd7zXZ\x00"
    log = (out / "log.txt").read_text()
    assert "skip" not in log and log.count("capture tp1_") == 8


@pytest.mark.slow
def test_torch_profiler_script_on_cpu(tmp_path):
    """tests/device/torch_profiler.sh: every run's files made in the stage folder, and only the tar and the log in
    OUT (the device returns at most 8 files)."""
    pytest.importorskip("torch", reason="the workload needs torch (pip install torch==2.13.0)")
    pytest.importorskip("ijson", reason="scrub reads torch traces with ijson")
    if shutil.which("bash") is None or shutil.which("xz") is None:
        pytest.skip("needs bash and xz")
    bindir, nsys = _stand_ins(tmp_path)
    out = tmp_path / "out"
    env = {**os.environ, "PATH": f"{bindir}:{os.environ['PATH']}", "NSYS": str(nsys), "OUT": str(out),
           "STAGE": str(tmp_path / "stage"), "W": str(tmp_path / "cap"), "OMP_NUM_THREADS": "1",
           "FAKE_NSYS_LOG": str(tmp_path / "nsys.log"),
           "WORKLOAD_ARGS": "--device cpu --hidden 32 --ffn 64 --layers 2 --cycles 3 --warmup 1"}
    script = ROOT / "tests" / "device" / "torch_profiler.sh"
    r = subprocess.run(["bash", str(script)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert sorted(p.name for p in out.iterdir()) == ["log.txt", "torch_profiler.tar"]
    with tarfile.open(out / "torch_profiler.tar") as tf:
        names = {Path(n).name for n in tf.getnames()}
    runs = [f"{s}_{t}_r{i}" for s in ("tp1", "sched") for t in ("nsys", "torch") for i in (1, 2)] + ["tp1_native"]
    for run in runs:
        assert f"{run}.stdout.txt" in names, run
        if "_nsys_" in run:
            assert {f"{run}.sqlite.xz", f"{run}.manifest.json"} <= names, run
        else:
            assert f"{run}.trace.json.xz" in names, run
    assert "log.txt" in names
    log = (out / "log.txt").read_text()
    assert "skipped" not in log and log.count(": exit 0") == 9
