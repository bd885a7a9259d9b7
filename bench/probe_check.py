"""Issue 13's done-when checks on the captures of ``tests/device/probe_step_sweep.sh``,
``probe_repeat_runs.sh`` and ``probe_spin_host.sh`` (run here, not on the GPU host).

    python -m bench.probe_check DIR          # DIR: an unpacked tar (tpN_s3_graph.sqlite.xz, tpN_r2_s3_graph..., ...)

Per TP size in DIR: the median cycle period of every capture (spectrace's and one computed straight from the
SQLite), the run-to-run spread of repeated runs (``tpN_rR_sS_MODE``), the what-if predictions against the
measured periods (the median over the runs), the seam causes, the probe effect of each node/graph pair, and
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


def runs(caps: dict[str, Path], tp: str, steps, mode: str) -> list[str]:
    """The capture names of ``tp`` at ``steps`` draft steps in ``mode`` (graph/node): ``tpN_sS_MODE`` and the
    repeats ``tpN_rR_sS_MODE``, in name order."""
    pat = re.compile(rf"^{tp}(_r\d+)?_s{steps}_{mode}$")
    return sorted(n for n in caps if pat.match(n))


def check(tp: str, caps: dict[str, Path], src: Path, ok: list) -> None:
    """Every check of the issue on the captures of one TP size; verdicts appended to ``ok``. Where a step count
    has repeated runs (``tpN_rR_sS_MODE``), "measured" is the median of their periods and every run's fit is
    checked."""
    import polars as pl

    from analyze import analyze
    from analyze.compute.tokens import summary
    from analyze.compute.whatif import validate
    from analyze.compute.whatif_fit import fit

    res = {n: analyze(path, progress=False) for n, path in caps.items()}
    period = {n: summary(r).period_p50_ns for n, r in res.items()}
    print(f"\n######## {tp}\nMedian cycle period: spectrace / straight from the SQLite, µs")
    for n in caps:
        print(f"  {n:<18} {period[n] / 1e3:9.1f}  {median_cycle_period(caps[n]) / 1e3:9.1f}  "
              f"{res[n].trace.graph_trace_mode}")
    plain = src / "plain.jsonl"
    if plain.exists():
        rows = [json.loads(x) for x in plain.read_text().splitlines() if x.strip()]
        for s in sorted({r["steps"] for r in rows}):
            cps = [r["cycles_per_s"] for r in rows if r["steps"] == s]
            print(f"  no profiler, {s} steps: {statistics.mean(cps):.1f} cycles/s = "
                  f"{1e6 / statistics.mean(cps):.1f} µs (runs: {', '.join(f'{c:.1f}' for c in cps)})")
    for s in (1, 2, 3, 4):
        names = runs(caps, tp, s, "graph") + [f"{tp}_s{s}r_graph"] * (f"{tp}_s{s}r_graph" in period)
        if len(names) > 1:
            ps = [period[n] for n in names]
            print(f"  run-to-run, {s} steps, graph: {', '.join(f'{x / 1e3:.1f}' for x in ps)} µs: spread "
                  f"{100 * (max(ps) - min(ps)) / statistics.median(ps):.1f} % of the median")

    def measured(steps: int, mode: str) -> float | None:
        names = runs(caps, tp, steps, mode)
        return statistics.median(period[n] for n in names) if names else None

    g1, n1 = measured(1, "graph"), measured(1, "node")
    print("\nWhat-if: predicted 1-step cycle against the measured 1-step captures (median over runs)")
    for mode, kw in (("graph", {}), ("node", {}), ("node", {"as_traced": True})):
        for src_name in runs(caps, tp, 3, mode):
            if g1 is None:
                continue
            m = fit(res[src_name], 3, **kw)
            pred = m.cycle(1)
            err_g = 100 * (pred / g1 - 1)
            err_n = 100 * (pred / n1 - 1) if n1 else float("nan")
            label = src_name + (" --as-traced" if kw else "")
            print(f"  fitted on {label:<30} 3 steps {m.cycle(3) / 1e3:8.1f} (measured {period[src_name] / 1e3:.1f}); "
                  f"1 step {pred / 1e3:8.1f} µs: {err_g:+.1f} % vs graph, {err_n:+.1f} % vs node")
            if not kw:
                bound = 3 if mode == "graph" else 5
                verdict(abs(err_g) < bound, f"{src_name} predicts the 1-step period within {bound} % of the "
                        "graph-level 1-step capture(s)", ok)
    sweep = {s: [res[n] for n in runs(caps, tp, s, "graph")] for s in range(1, 11)}
    sweep = {s: r for s, r in sweep.items() if r}
    if len(sweep) > 1:
        v = validate(sweep)
        n_runs = max(len(r) for r in sweep.values())
        print(f"\nGraph-level sweep, error % (fitted on \\ predicts; {n_runs} run(s) per step count: measured = "
              "median over runs, the cell = the worst over the fitted runs):")
        worst_cell = (v.with_columns(a=pl.col("error_pct").abs()).sort("a").group_by("from_steps", "steps")
                      .agg(pl.col("error_pct").last()))
        table = worst_cell.pivot(on="steps", index="from_steps", values="error_pct").sort("from_steps")
        table = table.select("from_steps", *sorted(table.columns[1:], key=int))
        print("| fitted on \\ predicts | " + " | ".join(f"{c} steps" for c in table.columns[1:]) + " |")
        print("|---" * len(table.columns) + "|")
        for r in table.iter_rows():
            print(f"| {r[0]} steps | " + " | ".join(f"{x:+.1f}" for x in r[1:]) + " |")
        spread = v.group_by("steps").agg(pl.col("measured_spread_pct").first(), pl.col("runs").first()).sort("steps")
        if n_runs > 1:
            print("  run-to-run spread of the measured periods: " + ", ".join(
                f"{s} steps {x:.1f} % ({n} runs)" for s, x, n in spread.iter_rows()))
        cross = v.filter(pl.col("from_steps") != pl.col("steps"))
        worst = float(cross["error_pct"].abs().max())
        verdict(worst < 3, f"every cross-prediction of the graph-level sweep within 3 % (worst {worst:.1f} %, "
                f"{cross.height} predictions)", ok)
    print("\nSeam causes (dominant, all ranks)")
    for frm, want, names in (("draft", "launch", runs(caps, tp, 3, "node")), ("draft", "gpu", runs(caps, tp, 3, "graph")),
                             ("cycle", "host", [f"{tp}_sleep_graph", f"{tp}_sleep_node"])):
        for name in (n for n in names if n in res):
            sa = res[name].seams_all.with_columns(pl.col("from").str.extract(r"([^.:/ ]+)$", 1).alias("_f"))
            row = sa.filter(pl.col("_f") == frm)
            got = row["bound"][0] if row.height else None
            detail = ", ".join(f"{c} {row[f'{c}_bound_inst'][0]}" for c in ("gpu", "launch", "host")) if row.height else ""
            verdict(got == want, f"{name}: {frm}→ seam is {got} ({detail}); the issue expects {want}", ok)
    print("\nProbe effect of each pair")
    stems = sorted({n[: -len("_node")] for n in caps if n.endswith("_node") and n[: -len("_node")] + "_graph" in caps})
    for stem in stems:
        node, graph = caps[f"{stem}_node"], caps[f"{stem}_graph"]
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


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.probe_check", description=__doc__.split("\n\n")[0])
    p.add_argument("dir", type=Path)
    a = p.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="probe_check_"))
    try:
        caps = unpack(a.dir, tmp)
        if not caps:
            print(f"{a.dir}: no *.sqlite.xz", file=sys.stderr)
            return 2
        ok: list[bool] = []
        for tp in sorted({n.split("_")[0] for n in caps}):
            check(tp, {n: p for n, p in caps.items() if n.split("_")[0] == tp}, a.dir, ok)
        print(f"\n{sum(ok)} of {len(ok)} checks pass")
        return 0 if all(ok) else 1
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
