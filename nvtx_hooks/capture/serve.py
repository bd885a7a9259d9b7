"""Drive an SGLang server for a capture: launch it, wait for health, open the profiler window,
send a fixed load, close the window, stop the server cleanly.

Run under ``spectrace trace`` (``make trace`` does)::

    python -m nvtx_hooks.capture.serve --port 30000 -- python -m sglang.launch_server ... --port 30000

Load: ``python -m sglang.bench_serving`` (random dataset) when SGLang is importable, else a
small built-in client posting ``/generate`` requests from a few threads. The cudaProfilerApi
window is opened with ``POST /start_profile {"activities": ["CUDA_PROFILER"]}`` and closed with
``/stop_profile`` (SGLang ≥ 0.5.7 starts it on the first GPU's process only).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from typing import Any

__all__ = ["main"]


def _url(a: argparse.Namespace, path: str) -> str:
    return f"http://{a.host}:{a.port}{path}"


def _http(method: str, url: str, body: dict | None = None, timeout: float = 30.0) -> tuple[int, bytes]:
    """One HTTP request; returns (status, body). Connection errors raise OSError."""
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method,
                                 headers={"Content-Type": "application/json"} if data else {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def _wait_healthy(a: argparse.Namespace, proc: subprocess.Popen) -> float:
    """Poll /health until 200; seconds waited. Raises if the server exits or the timeout passes."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < a.health_timeout:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with code {proc.returncode} before it was healthy")
        try:
            if _http("GET", _url(a, "/health"), timeout=5)[0] == 200:
                return time.monotonic() - t0
        except OSError:
            pass
        time.sleep(a.poll_interval)
    raise TimeoutError(f"server not healthy after {a.health_timeout:.0f} s")


def _have_bench_serving() -> bool:
    """True if ``sglang.bench_serving`` can be imported here (never imports it)."""
    import importlib.util

    try:
        return importlib.util.find_spec("sglang.bench_serving") is not None
    except (ImportError, ValueError):
        return False


def _bench_serving_command(a: argparse.Namespace) -> list[str]:
    """SGLang's load generator with a fixed random dataset."""
    return [sys.executable, "-m", "sglang.bench_serving", "--backend", "sglang", "--host", a.host,
            "--port", str(a.port), "--dataset-name", "random", "--num-prompts", str(a.num_prompts),
            "--random-input-len", str(a.input_len), "--random-output-len", str(a.output_len),
            "--random-range-ratio", "1.0", "--max-concurrency", str(a.concurrency), "--seed", "1"]


def _builtin_load(a: argparse.Namespace) -> dict[str, Any]:
    """Send ``num_prompts`` /generate requests from ``concurrency`` threads; returns counts."""
    words = "the quick brown fox jumps over the lazy dog ".split()
    todo = list(range(a.num_prompts))
    lock, done, failed = threading.Lock(), [0], [0]

    def worker() -> None:
        while True:
            with lock:
                if not todo:
                    return
                i = todo.pop()
            text = " ".join(words[(i + k) % len(words)] for k in range(a.input_len))
            body = {"text": text, "sampling_params": {"max_new_tokens": a.output_len, "temperature": 0,
                                                      "ignore_eos": True}}
            try:
                ok = _http("POST", _url(a, "/generate"), body, timeout=a.request_timeout)[0] == 200
            except OSError:
                ok = False
            with lock:
                (done if ok else failed)[0] += 1

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(max(1, a.concurrency))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return {"ok": done[0], "failed": failed[0]}


def _stop_server(proc: subprocess.Popen, grace: float) -> int:
    """SIGINT the server's process group, then SIGTERM, then SIGKILL; returns its exit code."""
    for sig, wait in ((signal.SIGINT, grace), (signal.SIGTERM, grace / 2), (signal.SIGKILL, 10)):
        if proc.poll() is not None:
            break
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            continue
    return proc.wait()


def _drive(a: argparse.Namespace) -> int:
    """Launch the server, run the load inside the profiler window, stop everything; exit code."""
    server = list(a.server)
    if server and server[0] == "--":
        server = server[1:]
    if not server:
        print("serve: no server command (… -- python -m sglang.launch_server …)", file=sys.stderr)
        return 2
    log = lambda msg: print(f"serve: {msg}", file=sys.stderr, flush=True)  # noqa: E731
    proc = subprocess.Popen(server, start_new_session=True)
    rc = 0
    try:
        log(f"server healthy after {_wait_healthy(a, proc):.1f} s")
        if a.warmup:
            _builtin_load(argparse.Namespace(**{**vars(a), "num_prompts": a.warmup, "concurrency": 1}))
        if a.profile:
            st, body = _http("POST", _url(a, "/start_profile"), {"activities": ["CUDA_PROFILER"]})
            log(f"/start_profile -> {st}")
        load = a.load
        if load == "auto":
            load = "bench_serving" if _have_bench_serving() else "builtin"
        t0 = time.monotonic()
        if load == "bench_serving":
            rc = subprocess.call(_bench_serving_command(a))
            log(f"bench_serving exit {rc} in {time.monotonic() - t0:.1f} s")
        else:
            res = _builtin_load(a)
            log(f"built-in load: {res['ok']} ok, {res['failed']} failed in {time.monotonic() - t0:.1f} s")
            rc = 0 if res["failed"] == 0 else 1
        if a.profile:
            st, _ = _http("POST", _url(a, "/stop_profile"), {})
            log(f"/stop_profile -> {st}")
    except (RuntimeError, TimeoutError, OSError) as e:
        log(f"error: {e}")
        rc = 1
    finally:
        src = _stop_server(proc, a.stop_grace)
        log(f"server stopped (exit {src})")
    return rc


def _build_parser() -> argparse.ArgumentParser:
    """Options of ``python -m nvtx_hooks.capture.serve``."""
    p = argparse.ArgumentParser(prog="python -m nvtx_hooks.capture.serve", description=__doc__.split("\n\n")[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--health-timeout", type=float, default=1800, help="seconds to wait for /health")
    p.add_argument("--poll-interval", type=float, default=2.0)
    p.add_argument("--load", choices=("auto", "bench_serving", "builtin"), default="auto")
    p.add_argument("--num-prompts", type=int, default=64)
    p.add_argument("--input-len", type=int, default=256)
    p.add_argument("--output-len", type=int, default=256)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--request-timeout", type=float, default=600)
    p.add_argument("--warmup", type=int, default=2, help="requests before the profiler window")
    p.add_argument("--profile", action=argparse.BooleanOptionalAction, default=True,
                   help="open/close the cudaProfilerApi window with /start_profile and /stop_profile")
    p.add_argument("--stop-grace", type=float, default=60, help="seconds the server gets to exit on SIGINT")
    p.add_argument("server", nargs=argparse.REMAINDER, help="-- SERVER COMMAND ...")
    return p


def main(argv: list[str] | None = None) -> int:
    """Entry point."""
    return _drive(_build_parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
