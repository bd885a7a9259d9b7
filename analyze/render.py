"""Render an analysis :class:`~analyze.analysis.Result` for people (text tables) and machines (JSON, CSV, SQLite)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import polars as pl

from nvtx_hooks.phases import CYCLE_ORDER, base_name

from .analysis import Result
from .errors import InputError


def _ms(ns) -> str:
    return f"{(ns or 0) / 1e6:,.3f}"


def _us(ns) -> str:
    return f"{(ns or 0) / 1e3:,.1f}"


def _pct(a, b) -> str:
    return f"{100 * a / b:5.1f}" if b else "    -"


def _grid(header: list[str], rows: list[list[str]], left: int = 1) -> list[str]:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(header)]

    def line(cells):
        return "  ".join(c.ljust(w) if i < left else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))

    return [line(header), line(["-" * w for w in widths]), *[line(r) for r in rows]]


def _phase_rows(df: pl.DataFrame, total_span: int) -> list[list[str]]:
    rows = []
    for r in df.iter_rows(named=True):
        span = r["span_ns"]
        rows.append([
            r["phase"], str(r["instances"]), _ms(span), _pct(span, total_span), _us(span / max(r["instances"], 1)),
            _ms(r["compute_ns"]), _pct(r["compute_ns"], span), _ms(r["comm_ns"]), _pct(r["comm_ns"], span),
            _ms(r["idle_ns"]), _pct(r["idle_ns"], span), _ms(r.get("gpu_idle_ns")), _ms(r["kernel_ns"]), str(r["ops"]),
        ])
    return rows


PHASE_HEADER = ["phase", "inst", "span ms", "%all", "µs/inst", "compute ms", "%", "comm ms", "%", "idle ms", "%",
                "GPU-idle ms", "kernel ms", "ops"]


def _order(df: pl.DataFrame, col: str) -> pl.DataFrame:
    """Phases in cycle order when they are cycle phases, else by time."""
    order = {n: i for i, n in enumerate(CYCLE_ORDER)}
    key = pl.col(col).map_elements(lambda t: order.get(base_name(t), 99), return_dtype=pl.Int64)
    return df.with_columns(_o=key).sort("_o", "span_ns" if "span_ns" in df.columns else col,
                                        descending=[False, True]).drop("_o")


def _comm_split(res: Result) -> list[str]:
    """Matched collectives per rank and phase: waiting for the last rank vs transfer (more in ``spectrace comm``)."""
    p = res.phases
    if "comm_wait_ns" not in p.columns or not int((p["comm_wait_ns"] + p["comm_transfer_ns"]).sum()):
        return []
    p = _order(p.filter((pl.col("comm_wait_ns") + pl.col("comm_transfer_ns")) > 0), "phase").sort("rank",
                                                                                                  maintain_order=True)
    rows = [[r["phase"], str(r["rank"]), _ms(r["comm_wait_ns"] + r["comm_transfer_ns"]), _ms(r["comm_wait_ns"]),
             _pct(r["comm_wait_ns"], r["comm_wait_ns"] + r["comm_transfer_ns"]), _ms(r["comm_transfer_ns"])]
            for r in p.iter_rows(named=True)]
    return ["", "Collectives matched across ranks: kernel time spent waiting for the last rank vs transferring "
                "(spectrace comm for stragglers)",
            *_grid(["phase", "rank", "collective ms", "wait ms", "%", "transfer ms"], rows, 2)]


def table(res: Result) -> str:
    """The human-readable report."""
    t, out = res.trace, []
    out.append(f"spectrace · {Path(t.path).name} · nsys {t.nsys_version} (schema {t.schema_version}) · "
               f"{res.ranks.height} rank(s) · CUDA graph trace: {t.graph_trace_mode or 'none'}")
    out.append(f"phases: {res.selection}")
    out.append("Each phase: span (first op start → last op end, per instance, summed) = compute + comm + idle;")
    out.append("GPU-idle is the part of idle in which the GPU ran nothing at all (no other phase's work either).")
    out.append("")
    pa = res.phases_all
    total = int(pa["span_ns"].sum()) if pa.height else 0
    out.append(f"All ranks ({res.ranks.height}), times summed over ranks")
    out += _grid(PHASE_HEADER, _phase_rows(_order(pa, "phase"), total))
    for rk in res.ranks.iter_rows(named=True):
        df = res.phases.filter(pl.col("rank") == rk["rank"])
        out.append("")
        dev = f"GPU {rk['device']}" + (f" {rk['device_name']}" if rk["device_name"] else "")
        out.append(f"Rank {rk['rank']} (pid {rk['pid']}, {dev})")
        out += _grid(PHASE_HEADER, _phase_rows(_order(df, "phase"), int(df["span_ns"].sum())))
    out += _comm_split(res)
    sa = res.seams_all
    if sa.height:
        out.append("")
        out.append("Seams: GPU idle between consecutive phases (last op of one → first op of the next), all ranks")
        rows = [[r["parent"] or "(top level)", f"{r['from']} → {r['to']}", str(r["instances"]), _ms(r["idle_ns"]),
                 _us(r["idle_ns"] / max(r["instances"], 1)), _ms(r["busy_ns"]), _ms(r["overlap_ns"])]
                for r in sa.iter_rows(named=True)]
        out += _grid(["within", "transition", "inst", "idle ms", "µs/inst", "other work ms", "overlap ms"], rows, 2)
    parents = res.ranges_all.join(res.seams_all.select(pl.col("parent").alias("range")).unique(), on="range",
                                  how="semi")
    if parents.height:
        out.append("")
        out.append("Parent ranges, inclusive (NVIDIA-style projection of everything launched inside), all ranks")
        rows = [[r["range"], str(r["instances"]), _ms(r["proj_span_ns"]), _us(r["proj_span_ns"] / max(r["instances"], 1)),
                 _ms(r["busy_ns"] - r["comm_ns"]), _ms(r["comm_ns"]), _ms(r["idle_ns"]), _pct(r["idle_ns"], r["proj_span_ns"])]
                for r in parents.iter_rows(named=True)]
        out += _grid(["range", "inst", "span ms", "µs/inst", "compute ms", "comm ms", "idle ms", "%idle"], rows)
    cov = res.coverage
    gpu, att = int(cov["gpu_ns"].sum()), int(cov["attributed_ns"].sum())
    out.append("")
    out.append(f"Coverage: phases received {_ms(att)} of {_ms(gpu)} ms of GPU busy time inside the phased window "
               f"({_pct(att, gpu).strip()}%).")
    if res.diagnostics:
        out.append("")
        out.append("Diagnostics")
        out += [f"  {d.level:<7} {d.code}: {d.message}" for d in res.diagnostics]
    return "\n".join(out) + "\n"


def to_json(res: Result) -> str:
    return json.dumps(res.to_dict(), indent=2, default=str) + "\n"


CSV_TABLES = ("phases", "ranges", "seams", "ranks", "coverage", "instances")


def frame(res: Result, name: str) -> pl.DataFrame:
    """One result table by name; ``phases``/``ranges``/``seams`` include all-ranks rows (rank null)."""
    if name == "phases":
        return pl.concat([res.phases, res.phases_all.drop("ranks")], how="diagonal_relaxed")
    if name == "ranges":
        return pl.concat([res.ranges, res.ranges_all.drop("ranks")], how="diagonal_relaxed")
    if name == "seams":
        return pl.concat([res.seams, res.seams_all.drop("ranks")], how="diagonal_relaxed")
    if name == "ranks":
        return res.ranks.with_columns(pl.col("devices").cast(pl.List(pl.String)).list.join(","))
    if name == "coverage":
        return res.coverage
    if name == "instances":
        return res.instances
    raise InputError(f"unknown table {name!r}; one of {', '.join(CSV_TABLES)}", "BAD_TABLE")


def to_csv(res: Result, name: str = "phases") -> str:
    buf = io.StringIO()
    frame(res, name).write_csv(buf)
    return buf.getvalue()


def to_db(res: Result, path: str | Path) -> None:
    """Write every result table into a SQLite database with sqlite-utils (tables replaced)."""
    import sqlite_utils

    p = Path(path)
    if p.exists() and p.resolve() == Path(res.trace.path).resolve():
        raise InputError(f"{p}: --db must not be the input report (spectrace never writes to it)", "DB_IS_INPUT")
    db = sqlite_utils.Database(p)
    for name in CSV_TABLES:
        db[name].drop(ignore=True)
        rows = frame(res, name).to_dicts()
        if rows:
            db[name].insert_all(rows, alter=True)
    db["diagnostics"].drop(ignore=True)
    if res.diagnostics:
        db["diagnostics"].insert_all([d.as_dict() for d in res.diagnostics])
    db["meta"].drop(ignore=True)
    meta = {k: v for k, v in res.to_dict().items() if isinstance(v, str | int | float) or v is None}
    db["meta"].insert_all([{"key": k, "value": str(v)} for k, v in meta.items()], pk="key")
    db.close()
