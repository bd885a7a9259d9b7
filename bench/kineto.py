"""A ~1 GB torch profiler trace analysed in bounded memory: wall, CPU seconds and peak RSS.

    .venv/bin/python -m bench.kineto [--gb 1.0] [--dir DIR] [--keep]

Writes ``DIR/big.trace.json`` (one event a line): the events of a hand-made rank trace
(:func:`tests.helpers.kineto_synth.rank_trace`: per cycle 6 CUDA calls, 7 GPU operations, 5 annotations, and
the ``cpu_op``/``python_function``/flow events a real trace carries) repeated, each copy's times shifted by its
span and its correlation ids by their count, until the file reaches ``--gb``; then runs ``spectrace analyze FILE
--format json`` in a child process twice: cold (the tables and the store built) and warm (both reused), and prints
per run its wall time, CPU seconds (user + system) and peak RSS (the child's ``ru_maxrss``). A dev tool, not in
the wheel.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.helpers.kineto_synth import PERIOD, rank_trace

ROOT = Path(__file__).resolve().parents[1]


def write_big(path: Path, gb: float, block_cycles: int = 200) -> tuple[int, int]:
    """The trace, streamed to ``path``; (events, cycles)."""
    t = rank_trace(0, cycles=block_cycles, names="native")  # (no payload in the names: the cycles count on)
    events = [e for e in t["traceEvents"] if e.get("cat") != "Trace" and e.get("ph") != "i"]
    span, ncorr = block_cycles * PERIOD, max(e.get("args", {}).get("correlation", 0) for e in events)
    head = {k: v for k, v in t.items() if k not in ("traceEvents", "traceName")}
    n = reps = 0
    with path.open("w") as f:
        f.write("{\n" + "".join(f'  {json.dumps(k)}: {json.dumps(v)},\n' for k, v in head.items()))
        f.write('  "traceEvents": [\n')
        while f.tell() < gb * 1e9:
            shift, dc = reps * span, reps * ncorr
            block = []
            for e in events:
                e2 = dict(e, ts=round(e["ts"] + shift, 3))
                if "args" in e and "correlation" in e["args"]:
                    e2["args"] = dict(e["args"], correlation=e["args"]["correlation"] + dc)
                if e.get("ph") in ("s", "f"):
                    e2["id"] = e["id"] + dc
                block.append(e2)
            text = json.dumps(block)  # (the C encoder: one call per block)
            f.write(("" if reps == 0 else ",\n") + text[1:-1].replace("}, {", "},\n{"))
            n += len(block)
            reps += 1
        end = events[0]["ts"] + reps * span
        f.write(",\n" + json.dumps({"ph": "X", "cat": "Trace", "name": "PyTorch Profiler (0)", "pid": "Spans",
                                    "tid": "PyTorch Profiler", "ts": events[0]["ts"] - 100,
                                    "dur": end - events[0]["ts"] + 200}))
        f.write('\n  ],\n  "traceName": "big.trace.json"\n}\n')
    return n, reps * block_cycles


def run(path: Path) -> dict:
    """``spectrace analyze PATH --format json`` in a child: wall s, CPU s, peak RSS MB, exit code."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-m", "analyze.cli", "analyze", str(path), "--format", "json", "-q"],
                       capture_output=True, cwd=ROOT)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if p.returncode:
        sys.stderr.write(p.stderr.decode()[-2000:])
    return {"rc": p.returncode, "wall_s": round(wall, 2), "cpu_s": round(cpu, 2),
            "peak_mb": round(after.ru_maxrss / 1024)}  # (the largest child so far: run cold first)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.kineto", description=__doc__.split("\n")[0])
    ap.add_argument("--gb", type=float, default=1.0, help="size of the trace to write (default 1.0)")
    ap.add_argument("--dir", default=None, help="where to write it (default: a temporary folder, removed)")
    ap.add_argument("--keep", action="store_true", help="keep the trace and its caches")
    a = ap.parse_args(argv)
    d = Path(a.dir) if a.dir else Path(tempfile.mkdtemp(prefix="spectrace-bench-kineto-"))
    d.mkdir(parents=True, exist_ok=True)
    f = d / "big.trace.json"
    try:
        t0 = time.perf_counter()
        events, cycles = write_big(f, a.gb)
        print(f"wrote {f}: {os.path.getsize(f) / 1e9:.2f} GB, {events:,} events, {cycles:,} cycles "
              f"({time.perf_counter() - t0:.1f} s)")
        for label in ("cold", "warm"):
            r = run(f)
            print(f"{label}: wall {r['wall_s']} s, CPU {r['cpu_s']} s, peak RSS {r['peak_mb']} MB, rc {r['rc']}")
    finally:
        if not a.keep:
            shutil.rmtree(d, ignore_errors=True) if not a.dir else [shutil.rmtree(p, ignore_errors=True)
                                                                   for p in d.glob("big.trace.json*.spectrace")]
            if a.dir:
                f.unlink(missing_ok=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
