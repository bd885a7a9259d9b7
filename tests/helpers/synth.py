"""Build small synthetic nsys SQLite exports from nsys's real DDL, for hand-computed tests."""

from __future__ import annotations

import sqlite3
from pathlib import Path

DDL = Path(__file__).parents[1] / "ddl"
DDLS = {
    "2022.4": ("ddl_2022.4.2.1.sql", "2022.4.2.1", "3.0.0", "EXPORT_META_DATA"),
    "2024.2": ("ddl_2024.2.3.38.sql", "2024.2.3.38", "3.11.1", "META_DATA_EXPORT"),
    "2025.3": ("ddl_2025.3.2.sql", "2025.3.2.0", "3.20.3", "META_DATA_EXPORT"),
    "2026.2": ("ddl_2026.2.1.210_h100fixture.sql", "2026.2.1.210", "3.25.0", "META_DATA_EXPORT"),
}
KERNEL = "CUPTI_ACTIVITY_KIND_KERNEL"


def gtid(pid: int, tid: int | None = None) -> int:
    """nsys's serialized id: ``<hw:8><vm:8><pid:24><tid:24>`` with VM 1; ``tid=None`` gives a globalPid."""
    return (1 << 48) | (pid << 24) | (tid or 0)


class Synth:
    """An in-progress export. Times are ns; every insert fills NOT NULL columns it was not given with 0."""

    def __init__(self, path: str | Path, version: str = "2025.3", duration: int = 100_000,
                 schema: str | None = None, mode: str | None = "Node"):
        ddl, product, schema_v, meta = DDLS[version]
        self.path = Path(path)
        if self.path.exists():
            self.path.unlink()
        self.con = sqlite3.connect(self.path)
        self.con.executescript((DDL / ddl).read_text())
        self._strings: dict[str, int] = {}
        self._corr: dict[int, int] = {}
        self._ensure_tables()
        self.insert(meta, name="EXPORT_PRODUCT_VERSION", value=product)
        self.insert(meta, name="EXPORT_SCHEMA_VERSION", value=schema or schema_v)
        self.insert("ANALYSIS_DETAILS", globalVid=1 << 48, duration=duration, startTime=0, stopTime=duration)
        if mode and self.has("META_DATA_CAPTURE"):
            self.insert("META_DATA_CAPTURE", name="PROCESS_0:CUDA_GRAPH_TRACE_OPTIONS:MODE", value=mode)

    def _ensure_tables(self) -> None:
        # Lazy DDL dumps lack tables their capture had no rows for; borrow those from the full 2024.2 DDL.
        full = (DDL / DDLS["2024.2"][0]).read_text()
        for stmt in full.split(";"):
            s = stmt.strip()
            if s.startswith("CREATE TABLE"):
                name = s.split()[2]
                if not self.has(name) and name.startswith(("CUPTI_ACTIVITY_KIND_MEM", "CUPTI_ACTIVITY_KIND_GRAPH")):
                    self.con.execute(s)

    def has(self, table: str) -> bool:
        return bool(self.con.execute("SELECT 1 FROM sqlite_master WHERE name=?", (table,)).fetchone())

    def insert(self, table: str, **values) -> None:
        info = self.con.execute(f"PRAGMA table_info('{table}')").fetchall()
        if not info:
            raise KeyError(f"{table} not in this DDL")
        cols = {r[1]: r for r in info}
        for c, r in cols.items():
            if r[3] and c not in values:  # NOT NULL without a value
                values[c] = "" if "TEXT" in (r[2] or "") else 0
        unknown = set(values) - set(cols)
        if unknown:
            raise KeyError(f"{table} has no {unknown}")
        names = ",".join(f'"{c}"' for c in values)
        self.con.execute(f"INSERT INTO {table} ({names}) VALUES ({','.join('?' * len(values))})", tuple(values.values()))

    def string(self, value: str) -> int:
        if value not in self._strings:
            sid = len(self._strings) + 1
            self._strings[value] = sid
            self.insert("StringIds", id=sid, value=value)
        return self._strings[value]

    def domain(self, pid: int, tid: int, name: str, domain_id: int, t: int = 1) -> None:
        self.insert("NVTX_EVENTS", start=t, eventType=75, text=name, globalTid=gtid(pid, tid), domainId=domain_id)

    def range(self, pid: int, tid: int, text: str, start: int, end: int | None, domain_id: int = 0,
              registered: bool = False, event_type: int = 59, end_tid: int | None = None, payload: int | None = None):
        kw = dict(start=start, end=end, eventType=event_type, globalTid=gtid(pid, tid), domainId=domain_id)
        if registered:
            kw["textId"] = self.string(text)
        else:
            kw["text"] = text
        if end_tid is not None:
            kw["endGlobalTid"] = gtid(pid, end_tid)
        if payload is not None:
            kw["uint64Value"] = payload
        self.insert("NVTX_EVENTS", **kw)

    def api(self, pid: int, tid: int, name: str, start: int, end: int, corr: int) -> None:
        self.insert("CUPTI_ACTIVITY_KIND_RUNTIME", start=start, end=end, eventClass=0, globalTid=gtid(pid, tid),
                    correlationId=corr, nameId=self.string(name), returnValue=0)

    def kernel(self, pid: int, device: int, stream: int, corr: int, start: int, end: int, name: str,
               graph_node: int | None = None) -> None:
        sid = self.string(name)
        self.insert(KERNEL, start=start, end=end, deviceId=device, contextId=1, streamId=stream, correlationId=corr,
                    globalPid=gtid(pid), demangledName=sid, shortName=sid, graphNodeId=graph_node)

    def memcpy(self, pid, device, stream, corr, start, end, kind=8):
        self.insert("CUPTI_ACTIVITY_KIND_MEMCPY", start=start, end=end, deviceId=device, contextId=1, streamId=stream,
                    correlationId=corr, globalPid=gtid(pid), bytes=1024, copyKind=kind)

    def memset(self, pid, device, stream, corr, start, end):
        self.insert("CUPTI_ACTIVITY_KIND_MEMSET", start=start, end=end, deviceId=device, contextId=1, streamId=stream,
                    correlationId=corr, globalPid=gtid(pid), value=0, bytes=1024)

    def graph(self, pid, device, stream, corr, start, end, graph_id=1):
        self.insert("CUPTI_ACTIVITY_KIND_GRAPH_TRACE", start=start, end=end, deviceId=device, contextId=1,
                    streamId=stream, correlationId=corr, globalPid=gtid(pid), graphId=graph_id, graphExecId=graph_id)

    def diagnostic(self, text: str, pid: int, t: int = 0, severity: int = 2) -> None:
        if not self.has("DIAGNOSTIC_EVENT"):  # 2022.4/2023.4 exports have no such table
            return
        self.insert("DIAGNOSTIC_EVENT", timestamp=t, timestampType=1, source=3, severity=severity, text=text,
                    globalPid=gtid(pid))

    def device(self, device: int, name: str = "NVIDIA H200") -> None:
        if not self.has("TARGET_INFO_GPU"):  # absent from the 2026.2 fixtures
            return
        self.insert("TARGET_INFO_GPU", id=device, name=name)

    def launch(self, pid: int, tid: int, name: str, api: tuple[int, int], corr: int,
               ops: list[tuple], device: int = 0) -> None:
        """An API call and the GPU ops it launched: ops are ``(start, end, name[, stream])``."""
        self.api(pid, tid, name, api[0], api[1], corr)
        for op in ops:
            start, end, kname = op[:3]
            stream = op[3] if len(op) > 3 else 7
            node = 1 if name.startswith("cudaGraphLaunch") else None
            self.kernel(pid, device, stream, corr, start, end, kname, graph_node=node)

    def save(self) -> Path:
        self.con.commit()
        self.con.close()
        return self.path
