"""Make a large multi-rank export from a real one: replicate it across ranks and time.

``rank_groups`` copies of the source's processes become new processes (pid + k·pid_step, devices
shifted so every copy sits on its own GPUs); ``time_copies`` copies follow each other in time,
with correlation ids offset so they stay unique per process. The result is a valid nsys export
(same schema, same string table) for benchmarks; it is never the user's file.
"""

from __future__ import annotations

import argparse
import sqlite3
import sys
from pathlib import Path

COPY_TABLES = ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET",
               "CUPTI_ACTIVITY_KIND_RUNTIME", "NVTX_EVENTS")
STATIC_TABLES = ("StringIds", "META_DATA_EXPORT", "EXPORT_META_DATA", "TARGET_INFO_GPU", "ENUM_NSYS_EVENT_TYPE")
PID_STEP = 1 << 10


def _cols(con: sqlite3.Connection, schema: str, table: str) -> list[str]:
    return [r[1] for r in con.execute(f"PRAGMA {schema}.table_info('{table}')")]


def inflate(src: str | Path, dst: str | Path, rank_groups: int = 4, time_copies: int = 17) -> dict:
    """Write the inflated export to ``dst``; returns row counts."""
    src, dst = Path(src), Path(dst)
    if dst.exists():
        dst.unlink()
    con = sqlite3.connect(dst)
    con.execute("PRAGMA journal_mode=OFF")
    con.execute("PRAGMA synchronous=OFF")
    con.execute(f"ATTACH DATABASE '{src.resolve().as_uri()}?mode=ro&immutable=1' AS s")
    tables = {r[0]: r[1] for r in con.execute("SELECT name, sql FROM s.sqlite_master WHERE type='table'")}
    for t in (*STATIC_TABLES, *COPY_TABLES, "ANALYSIS_DETAILS"):
        if t in tables:
            con.execute(tables[t])
    for t in STATIC_TABLES:
        if t in tables:
            con.execute(f"INSERT INTO main.{t} SELECT * FROM s.{t}")
    duration = con.execute("SELECT MAX(duration) FROM s.ANALYSIS_DETAILS").fetchone()[0]
    ndev = con.execute("SELECT COUNT(DISTINCT deviceId) FROM s.CUPTI_ACTIVITY_KIND_KERNEL").fetchone()[0] or 1
    max_corr = con.execute("SELECT MAX(correlationId) FROM s.CUPTI_ACTIVITY_KIND_RUNTIME").fetchone()[0] or 0
    corr_step = max_corr + 1
    if "TARGET_INFO_GPU" in tables:
        gcols = _cols(con, "s", "TARGET_INFO_GPU")
        sel = ", ".join(f"id + {ndev} * g.k" if c == "id" else c for c in gcols)
        con.execute("WITH RECURSIVE g(k) AS (SELECT 1 UNION ALL SELECT k + 1 FROM g WHERE k < ?) "
                    f"INSERT INTO main.TARGET_INFO_GPU SELECT {sel} FROM s.TARGET_INFO_GPU, g", (rank_groups - 1,))
    counts = {}
    for t in COPY_TABLES:
        if t not in tables:
            continue
        cols = _cols(con, "s", t)
        for g in range(rank_groups):
            pid_shift = (g * PID_STEP) << 24
            for c in range(time_copies):
                shift = c * duration
                expr = []
                for col in cols:
                    if col in ("start", "end", "timestamp"):
                        expr.append(f'"{col}" + {shift}' if col != "end" else f'"end" + {shift}')
                    elif col in ("globalTid", "globalPid", "endGlobalTid"):
                        expr.append(f"CASE WHEN {col} > 0 THEN {col} + {pid_shift} ELSE {col} END")
                    elif col == "correlationId":
                        expr.append(f"correlationId + {c * corr_step}")
                    elif col == "deviceId":
                        expr.append(f"deviceId + {g * ndev}")
                    else:
                        expr.append(f'"{col}"')
                # domain-create rows are per process: keep them once per copy of a process (time copy 0)
                where = " WHERE eventType != 75" if t == "NVTX_EVENTS" and c > 0 else ""
                con.execute(f"INSERT INTO main.{t} SELECT {', '.join(expr)} FROM s.{t}{where}")
        counts[t] = con.execute(f"SELECT COUNT(*) FROM main.{t}").fetchone()[0]
    dcols = _cols(con, "s", "ANALYSIS_DETAILS")
    vals = ", ".join(f"duration * {time_copies}" if c in ("duration",) else c for c in dcols)
    con.execute(f"INSERT INTO main.ANALYSIS_DETAILS SELECT {vals} FROM s.ANALYSIS_DETAILS")
    con.commit()
    con.execute("DETACH DATABASE s")
    con.close()
    return counts


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("src")
    p.add_argument("dst")
    p.add_argument("--rank-groups", type=int, default=4)
    p.add_argument("--time-copies", type=int, default=17)
    a = p.parse_args(argv)
    counts = inflate(a.src, a.dst, a.rank_groups, a.time_copies)
    for t, n in counts.items():
        print(f"{t}: {n:,} rows", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
