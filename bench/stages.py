"""Where one spectrace command's time goes: wall and CPU seconds per stage, in one process.

    .venv/bin/python -m bench.stages [--cold] -- analyze REPORT --format json -q

The stages are the pipeline's own functions, timed from outside (wrapped for this run only): the store build
(:func:`analyze.read.store.build.build`), the per-process bodies (:func:`analyze.compute.pipeline.process`, two at a
time: their wall is the span from the first start to the last end), the global steps of
:func:`analyze.compute.pipeline._run` (cross-rank pairing, collective matching, phase sums), the result cache
(:mod:`analyze.read.results`), and the output (the JSON document or text table with its headline tables). CPU
seconds are the process's (every thread) over each stage's span, and the process's peak RSS so far when the stage
ended (where it jumps, that stage raised it); ``--cold``: the report's cache is removed
first. Prints a markdown table; a dev tool, not shipped in the wheel.
"""

from __future__ import annotations

import argparse
import contextlib
import resource
import shutil
import sys
import threading
import time
from pathlib import Path


class Clock:
    def __init__(self):
        self.rows: dict[str, list[float]] = {}
        self.lock = threading.Lock()
        self.span: dict[str, list[float]] = {}
        self.peak: dict[str, float] = {}  # the process's peak RSS (MB) when the stage last ended: where it jumps

    @staticmethod
    def now() -> tuple[float, float]:
        return time.perf_counter(), time.process_time()

    def wrap(self, module, name: str, label: str, overlapping: bool = False) -> None:
        fn = getattr(module, name)

        def timed(*a, **kw):
            w0, c0 = self.now()
            try:
                return fn(*a, **kw)
            finally:
                w1, c1 = self.now()
                with self.lock:
                    self.peak[label] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
                    if overlapping:  # threads: the span from the first start to the last end
                        s = self.span.setdefault(label, [w0, w1, c0, c1])
                        s[0], s[1], s[2], s[3] = min(s[0], w0), max(s[1], w1), min(s[2], c0), max(s[3], c1)
                    else:
                        r = self.rows.setdefault(label, [0.0, 0.0, 0])
                        r[0] += w1 - w0
                        r[1] += c1 - c0
                        r[2] += 1

        setattr(module, name, timed)

    def table(self, total: tuple[float, float]) -> str:
        rows = dict(self.rows)
        for k, (w0, w1, c0, c1) in self.span.items():
            rows[k] = [w1 - w0, c1 - c0, 1]
        out = ["| stage | wall s | CPU s | CPU / wall | peak RSS at its end MB |", "|---|---:|---:|---:|---:|"]
        for k, (w, c, _) in rows.items():
            out.append(f"| {k} | {w:.2f} | {c:.2f} | {c / w if w else 0:.2f} | {self.peak.get(k, 0):,.0f} |")
        out.append(f"| **whole command** (after imports) | **{total[0]:.2f}** | **{total[1]:.2f}** | "
                   f"{total[1] / total[0]:.2f} | {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:,.0f} |")
        return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "--" not in argv:
        print("usage: python -m bench.stages [--cold] -- VERB REPORT [ARGS]", file=sys.stderr)
        return 2
    i = argv.index("--")
    ap = argparse.ArgumentParser(prog="python -m bench.stages")
    ap.add_argument("--cold", action="store_true", help="remove the report's cache first")
    a = ap.parse_args(argv[:i])
    cmd = argv[i + 1:]
    w0, c0 = Clock.now()
    from analyze import cli
    from analyze.compute import collectives, pipeline, windows
    from analyze.output import data, html, text
    from analyze.read import results
    from analyze.read.store import install

    imports = Clock.now()
    if a.cold:
        from analyze.read.store import cache_dir_for

        shutil.rmtree(cache_dir_for(cmd[1]), ignore_errors=True)
    clock = Clock()
    clock.wrap(install, "build", "store build (read the export, write the parquet store)")
    clock.wrap(pipeline, "process", "per-process bodies (2 threads)", overlapping=True)
    clock.wrap(windows, "pair", "global: cycles paired across ranks")
    clock.wrap(collectives, "phase_comm_split", "global: collectives matched, comm split")
    clock.wrap(results, "load", "result cache: read")
    clock.wrap(results, "save", "result cache: write")
    clock.wrap(results, "keep_derived", "result cache: write derived tables")
    clock.wrap(data, "document", "output: JSON document (headline tables)")
    clock.wrap(text, "analyze_table", "output: text table (headline tables)")
    clock.wrap(html, "write_page", "output: HTML report")
    with contextlib.redirect_stdout(sys.stderr):
        t0 = Clock.now()
        rc = cli.main(cmd)
        t1 = Clock.now()
    print(f"imports {imports[0] - w0:.2f} s wall; peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:,.0f}"
          f" MB; exit {rc}; {Path(cmd[1]).name}")
    print(clock.table((t1[0] - t0[0], t1[1] - t0[1])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
