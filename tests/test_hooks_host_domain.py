"""The hooks' scheduler host ranges live in their own NVTX domain (spectrace.host): a capture that has them analyses
to the same phases as one without (the analysis selects the spectrace domain's ranges as phases)."""

from __future__ import annotations

import json
import sqlite3

from analyze.cli import main
from nvtx_hooks.phases import HOST_DOMAIN, SCHEDULER_RANGES
from tests.helpers import eagle_synth as es


def _with_host_ranges(path):
    """Each cycle of each thread: get_next_batch_to_run before it, run_batch around it, process_batch_result after,
    in the spectrace.host domain (id 2 here), as the hooks emit them."""
    con = sqlite3.connect(path)
    cycles = con.execute("SELECT start, end, globalTid FROM NVTX_EVENTS WHERE text = 'cycle'").fetchall()
    for g in {c[2] for c in cycles}:
        con.execute("INSERT INTO NVTX_EVENTS(start, eventType, text, globalTid, domainId) VALUES (1, 75, ?, ?, 2)",
                    (HOST_DOMAIN, g))
    for s, e, g in cycles:
        for name, t0, t1 in (("get_next_batch_to_run", s - 300, s - 100), ("run_batch", s - 50, e + 20),
                             ("process_batch_result", e + 30, e + 200)):
            con.execute("INSERT INTO NVTX_EVENTS(start, end, eventType, text, globalTid, endGlobalTid, domainId) "
                        "VALUES (?, ?, 59, ?, ?, ?, 2)", (t0, t1, "scheduler." + name, g, g))
    con.commit()
    con.close()
    return len(cycles)


def test_host_ranges_change_no_phase(tmp_path, capsys):
    assert {p.name for p in SCHEDULER_RANGES} >= {"scheduler.run_batch", "scheduler.get_next_batch_to_run"}
    docs = []
    for name, host in (("plain", False), ("host", True)):
        p = es.eagle(tmp_path / f"{name}.sqlite", accept_on="mark")
        if host:
            assert _with_host_ranges(p) == 8  # 4 cycles on each of 2 ranks
        assert main(["analyze", str(p), "--format", "json"]) == 0
        docs.append(json.loads(capsys.readouterr().out))
    a, b = docs
    assert [r["phase"] for r in a["phases_steady"]] == [r["phase"] for r in b["phases_steady"]]
    assert not any("scheduler" in r["phase"] for r in b["phases_steady"])
    for key in ("phases_steady", "budget", "cycles", "tokens", "diagnostics"):
        assert a.get(key) == b.get(key), key
