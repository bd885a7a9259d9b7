"""``make bench``: spectrace's speed and memory on a large TP8 trace, against a raw column read.

The trace is a real export inflated across ranks and time (:mod:`bench.inflate`), as SQLite and (``--formats``)
as an nsys-typed parquetdir (:mod:`bench.export_dir`). Each contender runs in its own process, alternately,
several times; we report medians of wall time and peak RSS (``ru_maxrss`` of the child), and the ratio
ours / raw read of the same format, and the per-round ratios' spread:

- ``read``: the columns the analysis needs (kernels, API calls, NVTX), nothing else: SQLite → Arrow via ADBC in
  64 Ki-row batches (the driver's default 1 Ki rows is ~2.5x slower), one query after another; a parquetdir's
  three table files read by polars (those columns only). The baseline the issues set.
- ``cold``: ``spectrace analyze REPORT --format json`` with no flags and no cache (removed first): the
  default path a new user gets (the parquet store for large exports, built and kept as the cache, and the
  analysis kept in it: the result cache).
- ``memory``: ``--no-store --no-cache``: everything in memory (only up to ``--memory-max`` kernels).
- ``stored``: the store there but no kept result (removed first): the analysis from the store (what every
  command cost before the result cache).
- ``second``: the cold command again, everything there: what a repeated command costs.
- ``reopen``: re-opening the cache (metadata, ranges, lazy scans): what a notebook pays.
- ``table`` (``spectrace analyze REPORT``, the text) / ``comm`` / ``whatif`` / ``compare`` (the report against
  itself) / ``report``: each verb's second run (its first, untimed, just before: the cache is rebuilt by
  ``cold`` and ``stored`` in every round, so each round has its own first runs).
- ``nsys``: ``nsys stats --report nvtx_gpu_proj_trace`` on the same SQLite, when nsys is on PATH.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# The contenders run in the environment this command was started with: importing polars here (machine()) writes
# its allocator setting into os.environ, which children would otherwise inherit.
CHILD_ENV = dict(os.environ)
DEFAULT_SRC = ROOT.parent / "shared" / "traces" / "tp2_probe_node.sqlite"
READ_SQL = (
    "SELECT start, end, deviceId, streamId, correlationId, globalPid, demangledName, graphNodeId "
    "FROM CUPTI_ACTIVITY_KIND_KERNEL",
    "SELECT start, end, globalTid, correlationId, nameId FROM CUPTI_ACTIVITY_KIND_RUNTIME",
    "SELECT start, end, eventType, globalTid, domainId, textId FROM NVTX_EVENTS",
)


def raw_read(path: str) -> int:
    """The baseline: read the needed columns into Arrow, nothing else."""
    import adbc_driver_sqlite.dbapi as adbc

    con = adbc.connect(f"file:{Path(path).resolve()}?mode=ro&immutable=1")
    rows = 0
    for q in READ_SQL:
        cur = con.cursor()
        cur.adbc_statement.set_options(**{"adbc.sqlite.query.batch_rows": "65536"})
        cur.execute(q)
        rows += cur.fetch_arrow_table().num_rows
        cur.close()
    con.close()
    return rows


def raw_read_dir(path: str) -> int:
    """The baseline for a parquetdir: the same columns, read by polars from the table files."""
    import polars as pl

    cols = [[c.strip() for c in q.split("SELECT ")[1].split(" FROM ")[0].split(",")] for q in READ_SQL]
    tables = [q.split(" FROM ")[1].strip() for q in READ_SQL]
    return sum(pl.read_parquet(Path(path) / f"{t}.parquet", columns=c).height for t, c in zip(tables, cols))


def export_dir_for(sqlite: Path) -> Path:
    """The trace as an nsys-typed parquetdir beside it (made once)."""
    from .export_dir import write_export_dir

    dst = sqlite.with_name(sqlite.stem + "_pqtdir")
    if not (dst / "CUPTI_ACTIVITY_KIND_KERNEL.parquet").exists():
        tmp = sqlite.with_name(f".{dst.name}.tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        write_export_dir(sqlite, tmp, "parquet")
        shutil.rmtree(dst, ignore_errors=True)
        os.replace(tmp, dst)
    return dst


def trace_for(kernels: int, src: Path, out: Path) -> Path:
    """The inflated trace with about ``kernels`` kernels over 8 ranks (cached by size)."""
    import sqlite3

    from .inflate import inflate

    con = sqlite3.connect(f"file:{src}?mode=ro", uri=True)
    per = con.execute("SELECT COUNT(*) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()[0]
    nproc = con.execute("SELECT COUNT(DISTINCT globalPid) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()[0]
    con.close()
    groups = max(1, 8 // max(nproc, 1))
    copies = max(1, round(kernels / (per * groups)))
    dst = out / f"inflated_{groups}x{copies}_{src.stem}.sqlite"
    if not dst.exists():
        out.mkdir(parents=True, exist_ok=True)
        t = time.perf_counter()
        counts = inflate(src, dst, groups, copies)
        print(f"generated {dst} in {time.perf_counter() - t:.1f} s: "
              + ", ".join(f"{k.split('_')[-1].lower()} {v:,}" for k, v in counts.items()), file=sys.stderr)
    return dst


def measure(path: Path, runs: int, with_nsys: bool, memory: bool) -> dict[str, list[tuple[float, float]]]:
    py = sys.executable
    cli = [py, "-m", "analyze.cli"]
    q = ["--format", "json", "-q"]
    from analyze.read.store import cache_dir_for

    cache = str(cache_dir_for(path))
    # The default path with no cache: the cache beside the report is removed first (in the timed child).
    cold = ("import shutil, sys; shutil.rmtree(sys.argv[1], ignore_errors=True); from analyze.cli import main; "
            "sys.exit(main(sys.argv[2:]))")
    reader = "raw_read_dir" if path.is_dir() else "raw_read"
    cmds = {"read": [py, "-c", f"from bench.bench import {reader}; {reader}({str(path)!r})"],
            "cold": [py, "-c", cold, cache, "analyze", str(path), *q]}
    if memory:
        cmds["memory"] = [*cli, "analyze", str(path), *q, "--no-store", "--no-cache"]
    # Not timed: the cache is (re)built here after ``cold`` removed it (small exports are analysed in memory
    # by default and leave none), so the contenders below always find it.
    cmds["_build_cache"] = [py, "-c", f"from analyze.read.store import open_store; open_store({str(path)!r})"]
    cmds["stored"] = [py, "-c", cold, str(Path(cache) / "results"), "analyze", str(path), *q, "--cache"]
    cmds["second"] = [*cli, "analyze", str(path), *q]
    cmds["reopen"] = [py, "-c", "from analyze.read.store import open_store; s = open_store(" + repr(str(path))
                      + "); s.head(); s.scan('ops').collect_schema()"]
    verbs = {"table": [*cli, "analyze", str(path)],
             "comm": [*cli, "comm", str(path), "--format", "json", "-q"],
             "whatif": [*cli, "whatif", str(path), "--steps-now", "3", "--format", "json"],
             "compare": [*cli, "compare", str(path), str(path), "--format", "json"],
             "report": [*cli, "report", str(path), "--steps-now", "3", "-o", str(path.parent / "report"), "-f"]}
    for name, cmd in verbs.items():  # each verb's first run (untimed: it keeps its tables), then its second
        cmds["_" + name] = cmd
        cmds[name] = cmd
    nsys = shutil.which("nsys")
    if with_nsys and nsys and not path.is_dir():
        cmds["nsys"] = [nsys, "stats", "--report", "nvtx_gpu_proj_trace", "--format", "csv", "--force-export=false",
                        str(path)]
    res: dict[str, list[tuple[float, float]]] = {k: [] for k in cmds if not k.startswith("_")}
    for i in range(runs + 1):  # the first round warms the page cache (and builds the cache) and is not counted
        for name, cmd in cmds.items():
            r = _child(cmd)
            if name.startswith("_"):
                continue
            if i:
                res[name].append(r)
            print(f"bench: {path.name} round {i} {name}: {r[0]:.2f} s, {r[1]:,.0f} MB", file=sys.stderr, flush=True)
    return res


def _child(cmd: list[str]) -> tuple[float, float]:
    """Run in a fresh grandchild so ru_maxrss is this command's own peak."""
    code = ("import resource,subprocess,sys,time,json;t=time.perf_counter();"
            "p=subprocess.run(sys.argv[1:],stdout=subprocess.DEVNULL,stderr=subprocess.PIPE,text=True);"
            "w=time.perf_counter()-t;"
            "print(json.dumps([p.returncode,w,resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss/1024,p.stderr[-400:]]))")
    out = subprocess.run([sys.executable, "-c", code, *cmd], capture_output=True, text=True, cwd=ROOT, env=CHILD_ENV)
    rc, wall, peak, err = json.loads(out.stdout)
    if rc != 0:
        raise SystemExit(f"bench: {' '.join(cmd[:4])}… failed: {err.strip()}")
    return wall, peak


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
        mem = int(Path("/proc/meminfo").read_text().split()[1]) / 2**20
    except OSError:
        mem = 0
    import polars as pl

    return (f"{cpu}, {os.cpu_count()} CPUs, {mem:.0f} GiB RAM, {platform.system()} {platform.release()}, "
            f"Python {platform.python_version()}, polars {pl.__version__}; load average at start "
            f"{os.getloadavg()[0]:.2f}")


def report(path: Path, kernels: int, runs: int, res: dict[str, list[tuple[float, float]]]) -> None:
    """The markdown table: medians, ÷ read of the medians, and the range of the per-round ratios."""
    med = {c: (statistics.median(w for w, _ in v), statistics.median(m for _, m in v)) for c, v in res.items()}
    size = (sum(f.stat().st_size for f in path.iterdir()) if path.is_dir() else os.path.getsize(path)) / 2**20
    print(f"\n## {path.name}: ~{kernels / 1e6:g} M kernels, {size:,.0f} MB; {runs} runs each after a warm-up "
          f"round, alternating, medians; load average now {os.getloadavg()[0]:.2f}")
    print("| contender | wall s | peak RSS MB | wall / read | per round |")
    print("|---|---:|---:|---:|---|")
    for c, (w, m) in med.items():
        rounds = [x / r for (x, _), (r, _) in zip(res[c], res["read"])]
        print(f"| {c} | {w:.2f} | {m:,.0f} | {w / med['read'][0]:.2f} | {min(rounds):.2f}–{max(rounds):.2f} |")
    sys.stdout.flush()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.bench", description=__doc__.splitlines()[0])
    ap.add_argument("--kernels", type=int, nargs="+", default=[1_000_000],
                    help="about how many kernels, one trace per value (default 1M)")
    ap.add_argument("--src", type=Path, default=DEFAULT_SRC, help="the real export to inflate")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "out", help="where inflated traces are cached")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--memory-max", type=int, default=2_000_000,
                    help="run the in-memory contender only up to this many kernels")
    ap.add_argument("--json", type=Path, help="also write the raw timings here")
    ap.add_argument("--no-nsys", action="store_true")
    ap.add_argument("--formats", nargs="+", choices=("sqlite", "parquetdir"), default=["sqlite", "parquetdir"],
                    help="which exports of the trace to measure (default both)")
    a = ap.parse_args(argv)
    if not a.src.exists():
        print(f"bench: {a.src} not found (pass --src)", file=sys.stderr)
        return 2
    print(f"# {machine()}")
    if not shutil.which("nsys"):
        print("# nsys is not on PATH: no nsys stats column")
    raw = {}
    for k in a.kernels:
        sqlite = trace_for(k, a.src, a.out)
        for path in [sqlite, export_dir_for(sqlite)] if "parquetdir" in a.formats else [sqlite]:
            if path.is_dir() and "parquetdir" in a.formats or not path.is_dir() and "sqlite" in a.formats:
                res = measure(path, a.runs, not a.no_nsys, k <= a.memory_max)
                raw[path.name] = res
                report(path, k, a.runs, res)
    if a.json:
        a.json.write_text(json.dumps(raw, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
