"""`make trace` / `make trace-baseline` end to end: stand-in server, built-in load, fake nsys."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FAKE = ROOT / "tests" / "data" / "fake_nsys.py"
pytestmark = pytest.mark.skipif(not shutil.which("make"), reason="make is not installed")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_make(target: str, tmp_path: Path) -> tuple[subprocess.CompletedProcess, list[dict]]:
    nsys = tmp_path / "nsys"
    nsys.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{FAKE}" "$@"\n')
    nsys.chmod(0o755)
    log = tmp_path / "server.log"
    venv = Path(sys.executable).parent.parent
    cmd = ["make", "-C", str(ROOT), "-o", f"{venv}/bin/spectrace", target, f"VENV={venv}",
           f"PORT={free_port()}", f"TRACE_DIR={tmp_path}", "TP=2", "STEPS=2", "MODEL=m", "DRAFT=d",
           f"SERVER={sys.executable} -m nvtx_hooks.capture.standin_server --log {log}",
           "LOAD_ARGS=--load builtin --num-prompts 5 --input-len 4 --output-len 3 --concurrency 2 "
           "--poll-interval 0.1 --stop-grace 10",
           f"TRACE_ARGS=--nsys {nsys} --stats"]
    env = {"PATH": "/usr/bin:/bin", "FAKE_NSYS_LOG": str(tmp_path / "nsys.log"), "HOME": str(tmp_path)}
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
    events = [json.loads(x) for x in log.read_text().splitlines()] if log.exists() else []
    return r, events


def test_make_trace_eagle3(tmp_path):
    r, ev = run_make("trace", tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    kinds = [e["event"] for e in ev]
    assert kinds[0] == "start" and kinds[-1] == "stop"
    assert kinds.count("generate") == 5 + 2  # the load plus two warmup requests
    assert kinds.index("start_profile") < kinds.index("stop_profile")
    assert kinds.index("start_profile") == 3  # after the warmup, before the load
    assert ev[0]["hooks"] == "1"  # SPECTRACE_HOOKS reaches the server through nsys and the driver
    assert ev[0]["unknown"] == ["--model-path", "m", "--tp", "2", "--speculative-algorithm", "EAGLE3",
                                "--speculative-draft-model-path", "d", "--speculative-num-steps", "2",
                                "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4"]
    assert ev[-1]["cycles"] == 7 * 3
    assert ev[0]["pid"] == ev[-1]["pid"]
    name = "sglang_eagle3_tp2_s2"
    m = json.loads((tmp_path / f"{name}.manifest.json").read_text())
    assert m["speculative"] == {"tp": 2, "algorithm": "EAGLE3", "steps": 2, "topk": 1, "draft_tokens": 4,
                                "model": "m", "draft_model": "d"}
    assert m["exit_code"] == 0 and m["exported"]
    assert (tmp_path / f"{name}.sqlite").exists() and (tmp_path / f"{name}_nvtx_gpu_proj_sum.csv").exists()
    assert "server stopped (exit 0)" in r.stderr


def test_make_trace_baseline(tmp_path):
    r, ev = run_make("trace-baseline", tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert not any(a.startswith("--speculative") for a in ev[0]["unknown"])
    m = json.loads((tmp_path / "sglang_baseline_tp2.manifest.json").read_text())
    assert m["speculative"]["algorithm"] == "none" and m["speculative"]["tp"] == 2


def test_server_that_dies_fails_the_run(tmp_path):
    from nvtx_hooks.capture import serve

    rc = serve.main(["--port", str(free_port()), "--poll-interval", "0.05", "--", sys.executable, "-c",
                     "raise SystemExit(4)"])
    assert rc == 1


def test_make_test_says_why_and_make_notebooks_says_how(tmp_path):
    """`make test` lists skip reasons (-rs); `make notebooks` without jupyter lab (an install older than the dev
    extra that declares it) says in one line how to install it (a venv whose python has no jupyterlab module: a
    stand-in that fails that import)."""
    venv = Path(sys.executable).parent.parent
    r = subprocess.run(["make", "-C", str(ROOT), "-n", "-o", f"{venv}/bin/spectrace", "test", f"VENV={venv}"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "-m pytest -q -rs -n 2 --dist loadfile -m 'not slow' -p no:nbmake tests" in r.stdout, \
        r.stdout + r.stderr
    bin_ = tmp_path / "v" / "bin"
    bin_.mkdir(parents=True)
    (bin_ / "python").write_text('#!/bin/sh\nexit 1\n')  # `import jupyterlab` fails
    (bin_ / "python").chmod(0o755)
    (bin_ / "spectrace").write_text("")
    r = subprocess.run(["make", "-s", "-C", str(ROOT), "-o", f"{bin_}/spectrace", "notebooks", f"VENV={tmp_path / 'v'}"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0
    # jupyterlab is in the dev extra: an older install gets it by installing that again
    assert r.stdout == (f"jupyter lab is not in {tmp_path / 'v'}: {bin_}/pip install -e '.[dev,cluster]', then make "
                        "notebooks again\n")
