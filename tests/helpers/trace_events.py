"""A reader of the Chrome / Perfetto trace-event format (the JSON object format), as the format defines it and as
Perfetto imports it: timestamps in µs rounded to ns (Perfetto: ``llround(ts * 1000)``), complete events ("X") that
must nest on their thread (Perfetto drops those that do not), async begin/end pairs by id. Tests read spectrace's
timeline back through it, independently of the code that wrote it."""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Slice:
    pid: int
    tid: int
    name: str
    cat: str
    start: int  # ns
    end: int
    args: dict
    depth: int = 0
    parent: Slice | None = None


@dataclass
class Trace:
    doc: dict
    processes: dict[int, str] = field(default_factory=dict)
    threads: dict[tuple[int, int], str] = field(default_factory=dict)
    slices: list[Slice] = field(default_factory=list)
    async_slices: list[Slice] = field(default_factory=list)
    counters: list[dict] = field(default_factory=list)

    @property
    def meta(self) -> dict:
        return self.doc.get("otherData", {})


def ns(us: float) -> int:
    return int(round(us * 1000))


def read(path_or_text: str | Path) -> Trace:
    """Parse and check: every X event nests on its (pid, tid) thread; every async begin has its end."""
    text = Path(path_or_text).read_text(encoding="utf-8") if isinstance(path_or_text, Path) else path_or_text
    doc = json.loads(text)
    assert isinstance(doc, dict) and isinstance(doc["traceEvents"], list)
    tr = Trace(doc)
    by_thread: dict[tuple[int, int], list[Slice]] = defaultdict(list)
    opened: dict[tuple, list[dict]] = defaultdict(list)
    for e in doc["traceEvents"]:
        ph = e["ph"]
        assert isinstance(e["pid"], int)
        if ph == "M":
            if e["name"] == "process_name":
                tr.processes[e["pid"]] = e["args"]["name"]
            elif e["name"] == "thread_name":
                tr.threads[(e["pid"], e["tid"])] = e["args"]["name"]
            continue
        assert isinstance(e["ts"], int | float) and isinstance(e["name"], str)
        if ph == "X":
            assert e["dur"] >= 0 and isinstance(e["tid"], int)
            s = Slice(e["pid"], e["tid"], e["name"], e.get("cat", ""), ns(e["ts"]), ns(e["ts"]) + ns(e["dur"]),
                      e.get("args", {}))
            by_thread[(s.pid, s.tid)].append(s)
            tr.slices.append(s)
        elif ph == "C":
            assert all(isinstance(v, int | float) for v in e["args"].values())
            tr.counters.append(e)
        elif ph in ("b", "e"):
            k = (e["pid"], e.get("cat"), e["id"])
            if ph == "b":
                opened[k].append(e)
            else:
                b = opened[k].pop()
                tr.async_slices.append(Slice(e["pid"], e.get("tid", 0), b["name"], b.get("cat", ""), ns(b["ts"]),
                                             ns(e["ts"]), b.get("args", {})))
        else:
            raise AssertionError(f"unexpected phase {ph!r}")
    assert not [k for k, v in opened.items() if v], "async begin without its end"
    for key, ss in by_thread.items():
        ss.sort(key=lambda s: (s.start, -(s.end - s.start)))
        stack: list[Slice] = []
        for s in ss:
            while stack and stack[-1].end <= s.start:
                stack.pop()
            if stack:
                assert s.end <= stack[-1].end, f"slices do not nest on {key}: {stack[-1]} and {s}"
                s.parent, s.depth = stack[-1], len(stack)
            stack.append(s)
    return tr
