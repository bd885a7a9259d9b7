"""Issue 41: the same workload on the H200 profiled with nsys and with torch.profiler, side by side
(docs/torch-profiler.md, "Validation on the H200").

``python -m bench.torch_vs_nsys``: the bundled captures of ``tests/device/torch_profiler.sh``
(``tests/data/h200_tp1/tp1_kineto_*``: per shape two nsys exports and two torch profiler traces, and one trace with
SGLang's native span names only) analysed as ``spectrace analyze --format json`` does, printed as one markdown
table: per shape and quantity, nsys r1 / r2 and their spread |r1 − r2|, torch r1 / r2 and theirs, the difference of
the two tools' means and whether it lies within the larger of the two spreads. ``--native``: the native-spans trace
against the hooks' torch traces. ``--dir DIR``: read ``DIR/<run>.sqlite`` / ``DIR/<run>.trace.json`` (the
integrator's names: ``tp1_nsys_r1``, ``sched_torch_r2``, ``tp1_native``) instead of the bundle.

Quantities: per phase the GPU busy time per instance over the steady state (``phases_steady_all_ranks``:
``busy_ns / instances``; for the cycle's phases that is per cycle) and the GPU operations per instance; the cycle
period p50 (``tokens.period_p50_ns``); the steady state (cycles kept of all, warm-up, rare stalls left out);
the classes of slower cycles that recur (kind: the cycles affected); the segments (batch size: cycles, prefills,
period p50). Each run's own period as the workload measured it on the host (its JSON record's
``period_median_us``, per segment for the schedule) is printed beside it: the truth without any reader.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

from nvtx_hooks.capture import samples

__all__ = ["SHAPES", "Run", "RUNS", "NATIVE", "open_run", "metrics", "record", "spread_rows", "main"]

SHAPES = ("tp1", "sched")
PHASES = ("draft", "verify", "draft_extend", "host_overhead", "prefill_target_extend", "prefill_draft_extend")


@dataclass(frozen=True)
class Run:
    """One capture: its shape (``tp1``, ``sched``), tool (``nsys``, ``torch``) and repetition (1, 2; 0: native)."""

    shape: str
    tool: str
    rep: int

    @property
    def name(self) -> str:
        """The integrator's name (``tests/device/torch_profiler.sh``)."""
        return "tp1_native" if self.rep == 0 else f"{self.shape}_{self.tool}_r{self.rep}"

    @property
    def bundled(self) -> str:
        """The bundled name (``tests/data/h200_tp1``)."""
        return f"tp1_kineto_{'' if self.shape == 'tp1' else self.shape + '_'}{self.name.removeprefix(self.shape + '_')}"


RUNS = [Run(s, t, r) for s in SHAPES for t in ("nsys", "torch") for r in (1, 2)]
NATIVE = Run("tp1", "torch", 0)


def open_run(run: Run, folder: Path | None = None) -> Path:
    """The capture of ``run``: from ``folder`` (integrator's names) or the bundle (decompressed on first use)."""
    if folder is not None:
        return folder / (f"{run.name}.sqlite" if run.tool == "nsys" else f"{run.name}.trace.json")
    return samples.path(run.bundled) if run.tool == "nsys" else samples.trace(run.bundled)


def record(run: Run, folder: Path | None = None) -> dict:
    """The workload's JSON record of ``run`` (its host-measured truth)."""
    if folder is not None:
        lines = (folder / f"{run.name}.stdout.txt").read_text().splitlines()
    else:
        lines = (samples.DATA / f"{run.bundled}.record.json").read_text().splitlines()
    return json.loads(next(x for x in lines if x.startswith('{"rank"')))


def metrics(doc: dict) -> dict[str, object]:
    """The compared quantities of one analysis document (``spectrace analyze --format json``)."""
    out: dict[str, object] = {}
    for r in doc["phases_steady_all_ranks"]:
        if r["phase"] in PHASES:
            out[f"gpu_us {r['phase']}"] = r["busy_ns"] / r["instances"] / 1e3
            out[f"ops {r['phase']}"] = r["ops"] / r["instances"]
    out["period_p50_us"] = doc["tokens"]["period_p50_ns"] / 1e3
    st = doc["steady"]
    out["steady"] = (st["steady"], st["cycles"], st["warmup"], tuple(s["key"] for s in st["stalls"]))
    out["classes"] = tuple((c["kind"], tuple(c["keys"])) for c in st["classes"])
    out["segments"] = tuple((s["batch_size"], s["first_cycle"], s["last_cycle"], s["prefills"]) for s in doc["segments"])
    for s in doc["segments"]:
        out[f"segment_p50_us batch {s['batch_size']}"] = s["period_p50_ns"] / 1e3
    return out


def host_periods(rec: dict) -> dict[str, float]:
    """The workload's own median cycle period (µs): ``period_p50_us``, or per segment."""
    if rec.get("segments"):
        return {f"segment_p50_us batch {s['batch']}": s["period_median_us"] for s in rec["segments"]}
    return {"period_p50_us": rec["period_median_us"]}


def spread_rows(m: dict[Run, dict], shape: str) -> list[tuple]:
    """Per numeric quantity of ``shape``: (quantity, nsys r1, r2, spread, torch r1, r2, spread, Δ means, agrees)."""
    rows = []
    n1, n2, t1, t2 = (m[Run(shape, t, r)] for t in ("nsys", "torch") for r in (1, 2))
    for q, v in n1.items():
        if not isinstance(v, float) or q.startswith("ops"):
            continue
        a, b, c, d = (float(x[q]) for x in (n1, n2, t1, t2))  # type: ignore[arg-type]
        sn, st, delta = abs(a - b), abs(c - d), (c + d) / 2 - (a + b) / 2
        rows.append((q, a, b, sn, c, d, st, delta, abs(delta) <= max(sn, st)))
    return rows


def _analyse(path: Path) -> dict:
    from analyze import api
    from analyze.output.data import document

    return document(api.analyze(path))


def main(argv: list[str] | None = None) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="python -m bench.torch_vs_nsys", description=__doc__.split("\n\n")[0])
    p.add_argument("--dir", type=Path, help="the integrator's decompressed files instead of the bundle")
    a = p.parse_args(argv)
    m = {r: metrics(_analyse(open_run(r, a.dir))) for r in [*RUNS, NATIVE]}
    host = {r: host_periods(record(r, a.dir)) for r in [*RUNS, NATIVE]}
    f = "{:.1f}".format
    print("| shape | quantity | nsys r1 | nsys r2 | spread | torch r1 | torch r2 | spread | Δ torch − nsys | within |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for shape in SHAPES:
        for q, a, b, sn, c, d, st, delta, ok in spread_rows(m, shape):
            print(f"| {shape} | {q} | {f(a)} | {f(b)} | {f(sn)} | {f(c)} | {f(d)} | {f(st)} | {delta:+.1f} "
                  f"({delta / ((a + b) / 2):+.2%}) | {'yes' if ok else 'no'} |")
            hq = [host[Run(shape, t, r)].get(q) for t in ("nsys", "torch") for r in (1, 2)]
            if hq[0] is not None:
                print(f"| {shape} | {q}, host (the workload's record) | {f(hq[0])} | {f(hq[1])} | | {f(hq[2])} | "
                      f"{f(hq[3])} | | | |")
        for q in ("steady", "classes", "segments"):
            vals = [m[Run(shape, t, r)][q] for t in ("nsys", "torch") for r in (1, 2)]
            print(f"| {shape} | {q} | " + " | ".join(str(v) for v in vals[:2]) + " | | "
                  + " | ".join(str(v) for v in vals[2:]) + " | | | |")
        ops = [q for q in m[Run(shape, "nsys", 1)] if q.startswith("ops")]
        same = all(m[Run(shape, t, r)][q] == m[Run(shape, "nsys", 1)][q] for q in ops for t in ("nsys", "torch")
                   for r in (1, 2))
        print(f"| {shape} | GPU ops per instance, every phase | equal in all four: {same} | | | | | | | |")
    nat = m[NATIVE]
    print("\nnative spans only (tp1_native) against the hooks' torch traces (r1, r2):")
    for q, v in nat.items():
        hooks = [m[Run("tp1", "torch", r)].get(q) for r in (1, 2)]
        print(f"  {q}: {v} vs {hooks[0]}, {hooks[1]} (host {host[NATIVE].get(q, '')})")
    missing = [q for q in m[Run("tp1", "torch", 1)] if q not in nat]
    print(f"  not in the native trace: {', '.join(missing) or 'none'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
