"""Is a fresh export complete on every rank? One line per rank: cycles with GPU work, lost tail if any.

A rank's GPU tail is lost when its ``cycle`` (or ``decode_step``) ranges go on after its last GPU operation:
its process ended before CUPTI flushed its buffers (or the window closed on it first). Reads the SQLite
export with the standard library only (``spectrace trace`` runs where polars may be missing); a cycle
counts as having GPU work when it overlaps the span of its process's GPU rows, as the analysis's cut
and lost-tail rules see it (``analyze/compute/windows.py``).
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from pathlib import Path

from ..phases import base_name

__all__ = ["Rank", "ranks", "lines"]

_CYCLES = ("cycle", "decode_step")  # what one decode iteration is called (EAGLE, baseline)
_OPS = ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET",
       "CUPTI_ACTIVITY_KIND_GRAPH_TRACE")
_PID = "(({col} >> 24) & 16777215)"


@dataclass
class Rank:
    pid: int
    device: int | None
    gpu_start_ns: int | None
    gpu_end_ns: int | None
    cycles: int
    with_gpu: int
    lost: int  # cycles that start after the last GPU op
    lost_until_ns: int | None  # the end of the last of them

    @property
    def complete(self) -> bool:
        return self.lost == 0 and (self.cycles == 0 or self.gpu_end_ns is not None)


def ranks(path: str | Path) -> list[Rank]:
    """Per process with GPU rows or cycle ranges, in device order (the analysis's rank order)."""
    con = sqlite3.connect(f"file:{Path(path).resolve()}?mode=ro", uri=True)
    try:
        have = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        gpu: dict[int, list] = {}
        for t in (t for t in _OPS if t in have):
            q = (f"SELECT {_PID.format(col='globalPid')} AS pid, deviceId, MIN(start), MAX(end), COUNT(*) "
                 f"FROM {t} GROUP BY pid, deviceId")
            for pid, dev, a, b, n in con.execute(q):
                g = gpu.setdefault(pid, [a, b, {}])
                g[0], g[1] = min(g[0], a), max(g[1], b)
                g[2][dev] = g[2].get(dev, 0) + n
        cyc: dict[int, list[tuple[int, int]]] = {}
        if "NVTX_EVENTS" in have:
            text = "COALESCE(n.text, s.value)" if "StringIds" in have else "n.text"
            join = "LEFT JOIN StringIds s ON s.id = n.textId" if "StringIds" in have else ""
            like = " OR ".join(f"{text} LIKE '%{c}'" for c in _CYCLES)
            q = (f"SELECT {_PID.format(col='n.globalTid')}, n.start, COALESCE(n.end, n.start), {text} "
                 f"FROM NVTX_EVENTS n {join} WHERE n.eventType IN (59, 60) AND ({like})")
            for pid, a, b, name in con.execute(q):
                if base_name(name) in _CYCLES:
                    cyc.setdefault(pid, []).append((a, b))
    finally:
        con.close()
    out = []
    for pid in sorted(set(gpu) | set(cyc)):
        a, b, devs = gpu.get(pid, (None, None, {}))
        dev = max(sorted(devs), key=lambda d: devs[d]) if devs else None
        cs = cyc.get(pid, [])
        after = [c for c in cs if b is None or c[0] > b]
        inside = [c for c in cs if a is not None and b is not None and c[0] <= b and c[1] >= a]
        out.append(Rank(pid, dev, a, b, len(cs), len(inside), len(after),
                        max((c[1] for c in after), default=None)))
    return sorted(out, key=lambda r: (r.device is None, r.device if r.device is not None else 0, r.pid))


def lines(rs: list[Rank]) -> list[str]:
    """One line per rank (ranks with GPU rows numbered in device order, as ``spectrace analyze`` does)."""
    out, n = [], 0
    for r in rs:
        if r.device is not None:
            who, n = f"rank {n} (pid {r.pid}, GPU {r.device})", n + 1
        else:
            who = f"pid {r.pid} (no GPU rows)"
        if r.cycles == 0:
            out.append(f"{who}: GPU work, no cycle ranges")
            continue
        s = f"{who}: {r.with_gpu} of {r.cycles} cycles with GPU work"
        if r.lost:
            stop = f"GPU rows stop at {r.gpu_end_ns / 1e6:,.3f} ms" if r.gpu_end_ns is not None else "no GPU rows"
            span = (f" ({(r.lost_until_ns - r.gpu_end_ns) / 1e6:,.3f} ms)" if r.gpu_end_ns is not None
                    and r.lost_until_ns is not None else "")
            s += f"; {stop}, {r.lost} cycle(s) after it: GPU tail lost{span}"
        else:
            s += ", no lost tail"
        out.append(s)
    return out
