"""Issue 13's done-when checks on the captures of ``tests/device/issue13_sweep.sh`` (run here, not on the GPU host).

    python -m bench.probe_check DIR          # DIR: the unpacked issue13_tpN.tar (tpN_s3_graph.sqlite.xz, ...)

Prints the median cycle period of every capture (spectrace's and one computed straight from the SQLite),
the what-if predictions against the measured periods, the seam causes, the probe effect of each pair, and
PASS/FAIL for each criterion of the issue. :func:`median_cycle_period` is also the tests' independent
measure of the cycle period.
"""

from __future__ import annotations

import argparse
import json
import lzma
import re
import shutil
import sqlite3
import statistics
import sys
import tempfile
from pathlib import Path

OP_TABLES = ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_GRAPH_TRACE", "CUPTI_ACTIVITY_KIND_MEMCPY",
             "CUPTI_ACTIVITY_KIND_MEMSET")


def median_cycle_period(path) -> float:
    """Straight from the SQLite, without spectrace: per ``cycle`` range (one thread: the first process's), the
    earliest GPU op launched by a CUDA call inside it on its thread; the median of consecutive differences."""
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    first_op: dict[int, int] = {}
    for table in OP_TABLES:
        if con.execute("SELECT 1 FROM sqlite_master WHERE name=?", (table,)).fetchone():
            for c, pid, s in con.execute(f"SELECT correlationId, globalPid, start FROM {table}"):
                key = (pid >> 24, c)
                first_op[key] = min(s, first_op.get(key, s))
    by_thread: dict[int, list[tuple[int, int, int]]] = {}
    for c, t, s, e in con.execute('SELECT correlationId, globalTid, start, "end" FROM CUPTI_ACTIVITY_KIND_RUNTIME'):
        by_thread.setdefault(t, []).append((s, e, c))
    cyc = con.execute("""SELECT n.start, n."end", n.globalTid FROM NVTX_EVENTS n LEFT JOIN StringIds s
                         ON s.id = n.textId WHERE COALESCE(n.text, s.value) LIKE '%cycle' ORDER BY n.start""").fetchall()
    periods = []
    for tid in sorted({t for _, _, t in cyc}):
        calls = by_thread.get(tid, [])
        firsts = []
        for a, b, _ in (x for x in cyc if x[2] == tid):
            ops = [first_op[(tid >> 24, c)] for s, e, c in calls if a <= s and e <= b and (tid >> 24, c) in first_op]
            if ops:
                firsts.append(min(ops))
        periods += [y - x for x, y in zip(firsts, firsts[1:])]
    return statistics.median(periods)


def unpack(src: Path, dst: Path) -> dict[str, Path]:
    """Decompress every NAME.sqlite.xz of ``src`` into ``dst`` (manifests beside them): name → path."""
    out = {}
    for f in sorted(src.glob("*.sqlite.xz")):
        name = f.name[: -len(".sqlite.xz")]
        with lzma.open(f) as a, open(dst / f"{name}.sqlite", "wb") as b:
            shutil.copyfileobj(a, b)
        out[name] = dst / f"{name}.sqlite"
    for m in src.glob("*.manifest.json"):
        shutil.copy(m, dst / m.name)
    return out


def verdict(ok: bool, text: str, results: list) -> None:
    results.append(ok)
    print(f"  {'PASS' if ok else 'FAIL'}  {text}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.probe_check", description=__doc__.split("\n\n")[0])
    p.add_argument("dir", type=Path)
    a = p.parse_args(argv)
    import polars as pl

    from analyze import analyze
    from analyze.compute.tokens import summary
    from analyze.compute.whatif import fit, validate

    tmp = Path(tempfile.mkdtemp(prefix="probe_check_"))
    try:
        caps = unpack(a.dir, tmp)
        if not caps:
            print(f"{a.dir}: no *.sqlite.xz", file=sys.stderr)
            return 2
        tp = sorted({n.split("_")[0] for n in caps})[0]
        res = {n: analyze(path, progress=False) for n, path in caps.items()}
        period = {n: summary(r).period_p50_ns for n, r in res.items()}
        print(f"Median cycle period ({tp}): spectrace / straight from the SQLite, µs")
        for n in caps:
            print(f"  {n:<16} {period[n] / 1e3:9.1f}  {median_cycle_period(caps[n]) / 1e3:9.1f}  "
                  f"{res[n].trace.graph_trace_mode}")
        plain = a.dir / "plain.jsonl"
        if plain.exists():
            rows = [json.loads(x) for x in plain.read_text().splitlines() if x.strip()]
            for s in sorted({r["steps"] for r in rows}):
                cps = [r["cycles_per_s"] for r in rows if r["steps"] == s]
                print(f"  no profiler, {s} steps: {statistics.mean(cps):.1f} cycles/s = "
                      f"{1e6 / statistics.mean(cps):.1f} µs (runs: {', '.join(f'{c:.1f}' for c in cps)})")
        for a_, b_ in ((f"{tp}_s3_graph", f"{tp}_s3r_graph"), (f"{tp}_s1_graph", f"{tp}_s1r_graph")):
            if a_ in period and b_ in period:
                print(f"  run-to-run: {b_} vs {a_}: {100 * (period[b_] / period[a_] - 1):+.1f} %")
        ok: list[bool] = []
        g, n_ = f"{tp}_s1_graph", f"{tp}_s1_node"
        print("\nWhat-if: predicted 1-step cycle against the measured 1-step captures")
        for src, kw in ((f"{tp}_s3_graph", {}), (f"{tp}_s3_node", {}), (f"{tp}_s3_node", {"as_traced": True})):
            if src not in res or g not in res:
                continue
            m = fit(res[src], 3, **kw)
            pred = m.cycle(1)
            err_g = 100 * (pred / period[g] - 1)
            err_n = 100 * (pred / period[n_] - 1) if n_ in period else float("nan")
            label = src + (" --as-traced" if kw else "")
            print(f"  fitted on {label:<28} 3 steps {m.cycle(3) / 1e3:8.1f} (measured {period[src] / 1e3:.1f}); "
                  f"1 step {pred / 1e3:8.1f} µs: {err_g:+.1f} % vs {g}, {err_n:+.1f} % vs {n_}")
            if not kw:
                bound = 3 if src.endswith("graph") else 5
                verdict(abs(err_g) < bound, f"{src} predicts the 1-step period within {bound} % of {g}", ok)
        sweep = {int(re.search(r"_s(\d)_graph$", n).group(1)): r for n, r in res.items()
                 if re.search(r"_s\d_graph$", n)}
        if len(sweep) > 1:
            v = validate(sweep)
            print("\nGraph-level sweep, error % (fitted on \\ predicts):")
            table = v.pivot(on="steps", index="from_steps", values="error_pct").sort("from_steps")
            print("| fitted on \\ predicts | " + " | ".join(f"{c} steps" for c in table.columns[1:]) + " |")
            print("|---" * len(table.columns) + "|")
            for r in table.iter_rows():
                print(f"| {r[0]} steps | " + " | ".join(f"{x:+.1f}" for x in r[1:]) + " |")
            worst = float(v["error_pct"].abs().max())
            verdict(worst < 3, f"every cross-prediction of the graph-level sweep within 3 % (worst {worst:.1f} %)", ok)
        print("\nSeam causes (dominant, all ranks)")
        for name, frm, want in ((f"{tp}_s3_node", "draft", "launch"), (f"{tp}_s3_graph", "draft", "gpu"),
                                (f"{tp}_sleep_graph", "cycle", "host"), (f"{tp}_sleep_node", "cycle", "host")):
            if name not in res:
                continue
            sa = res[name].seams_all.with_columns(pl.col("from").str.extract(r"([^.:/ ]+)$", 1).alias("_f"))
            row = sa.filter(pl.col("_f") == frm)
            got = row["bound"][0] if row.height else None
            detail = ", ".join(f"{c} {row[f'{c}_bound_inst'][0]}" for c in ("gpu", "launch", "host")) if row.height else ""
            verdict(got == want, f"{name}: {frm}→ seam is {got} ({detail}); the issue expects {want}", ok)
        print("\nProbe effect of each pair")
        for stem in (f"{tp}_s3", f"{tp}_s1", f"{tp}_sleep"):
            node, graph = caps.get(f"{stem}_node"), caps.get(f"{stem}_graph")
            if node is None or graph is None:
                continue
            pe = analyze(node, timing=graph, progress=False).probe_effect
            ratio = 100 * (median_cycle_period(node) / median_cycle_period(graph) - 1)
            print(f"  {stem}: inflation {pe['inflation']:+.2f} % (raw ratio {ratio:+.2f} %)")
            u = pe["unprofiled"]
            if u:
                vs, own = u["period_vs_unprofiled"], u["own_vs_unprofiled"]

                def pc(x):
                    return "-" if x is None else f"{x:+.1f} %"

                print(f"      unprofiled {u['cycles_per_s']:.1f} cycles/s ({u['source']}): trace period graph "
                      f"{pc(vs['graph'])}, node {pc(vs['node'])}; own cycles/s slower: graph {pc(own['graph'])}, "
                      f"node {pc(own['node'])}")
            for ph in pe["phases"]:
                print(f"      {ph['phase']:<14} span {ph['span_ns']['graph'] / 1e3:8.1f} / {ph['span_ns']['node'] / 1e3:8.1f}"
                      f" µs, launch {ph['launch_ns']['graph'] / 1e3:6.1f} / {ph['launch_ns']['node'] / 1e3:6.1f} µs")
            verdict(abs(pe["inflation"] - ratio) < 0.5, f"{stem}: inflation within 0.5 points of the raw ratio", ok)
        print(f"\n{sum(ok)} of {len(ok)} checks pass")
        return 0 if all(ok) else 1
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
