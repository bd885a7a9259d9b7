"""Periodic-straggler shapes from a real TP capture: one rank's host waits before a phase every Nth cycle.

Dev tool, not shipped in the wheel. With one GPU only, a multi-rank straggler cannot be captured, so it is
*built*: :func:`inject` copies a real multi-rank nsys SQLite export (e.g. ``tests/data/h200_tp2``) and moves
its events as if the host thread of rank R had waited D µs just before it opened phase P's NVTX range in
each of its cycles c with ``c % N == K``, and the other ranks had waited for it at the next collective.
The output is a model of a capture, not a capture: say so wherever it is used. ::

    python -m bench.inject SRC DST --delay RANK:PHASE:EVERY:OFFSET:US [--delay ...] [--json FILE] [--force]

c is the cycle index of the ``cycle`` range's spectrace payload when the rank's cycles carry one, else the
cycle's order on that rank (0 = its first cycle with GPU work in the capture); only cycles with GPU work
in the capture are delayed. Ranks are the processes with GPU ops, ordered by device then pid. The
injections are applied in time order, each on the times the earlier ones left (cumulative). One injection
(rank R, t0 = start of P's range in that cycle, delay D):

- **R, host**: every event of R's process (NVTX, CUDA API calls, sync records, graph-node events,
  profiler overhead, diagnostics) starting at or after t0 moves by D; one spanning t0 (``cycle``) ends D
  later. R stays D late until it blocks on its GPU: a blocking wait (``*Synchronize``, synchronous
  ``cudaMemcpy``) returns at max(its start + D + what it did not block, the new end of the GPU work it
  waited for), so from its return R is only max(D − how long it blocked beyond 5 µs, its GPU's shift)
  late (``host_caught_up_ns``: D minus R's final lateness). Time inside such a wait is compressed so
  the host's order and nesting hold. (The sleep is hidden where the GPU was busy long enough.)
- **R, GPU**: an op whose launching API call (same pid and correlationId) started at or after t0 becomes
  ready as late as that call. When it was launch-bound (the first op of its launch, its stream idle by
  the time the launch is usually submitted) it starts exactly that much later. Otherwise (queued behind
  earlier work, or later in a graph) it was ready at ``min(start, api_start + lat)``, lat = R's median
  time from that API's start to its first op on an idle stream, measured per API name in the capture
  (H200 TP2: ~8-12 µs for kernel launches, ~15-35 µs for cudaGraphLaunch, whose first kernel starts
  *before* the call returns: hence the call's start, not its end), and starts at ``max(start, ready + D)``.
  From the first such op (P's first GPU op) on, R's ops shift by the running maximum of what they need,
  up to the next collective: D_gpu, the first op's shift, is D on an idle GPU and less behind a queue.
- **Collective**: R's communication kernel (``analyze.compute.comm_patterns``) is matched on each other
  rank by the communication kernel whose end is closest to its end (within 10 µs; collectives of one job
  end within ~1 µs, consecutive ones >= ~45 µs apart). With old_last = the latest start of the matched
  kernels and R's arrival = its start + its shift, Δ = max(0, max(old_last, arrival) − old_last). R's
  kernel: start += its shift, end = old end + Δ; the others' kernels: start unchanged, end += Δ (they
  wait longer); every later op of every rank moves by Δ.
- **Later collectives**: R's ops after a collective still cannot start before their (late) launches, so
  where they are launch-bound R may arrive last again at a later collective (it had arrived early at the
  first, e.g. because the other rank was late itself), and the others wait there too. All of R's
  collectives after t0 in one pass: Δ_k = max(0, max_{j<=k}(need_j + start_R,j − old_last_j)), need_j =
  the most R's ops up to collective j need; the ops between collectives k−1 and k move by
  max(Δ_{k−1}, what they need). Usually Δ_k = Δ_0 (``extra_waits``: how many later collectives added).
  If no collective follows t0, nothing changes on the other ranks.
- **Other ranks, host**: a rank's host is held only where it blocks on its GPU: at each blocking wait
  that returns after a matched collective's old end, that wait ends (and every later event starts) as
  late as that collective; events spanning that return (``host_overhead``, ``cycle``) end that late.
  Launches it made while its GPU was behind do not move.
- **Graph-level captures** (``--cuda-graph-trace=graph``: a replay is one row of
  CUPTI_ACTIVITY_KIND_GRAPH_TRACE, no kernels inside): a graph replay is taken to hold a collective, as
  TP decode graphs do. Rows of the ranks that end together (within 10 µs) are matched like kernels: R's
  row start += its shift, end = old end + Δ; the others' rows are the waiting ops (end += Δ) and
  everything after them moves by Δ. The arrival is the replay's start, i.e. the compute before the
  collective inside is taken to be the same on every rank.
- **Session**: events of other processes (the launcher) after the ranks' last event move with the
  latest rank; ANALYSIS_DETAILS' duration and stopTime grow by as much, so nothing lies past the end.

Approximations: the other ranks' GPUs keep their idle gaps after a wait (in reality a gap where the GPU
waited for a launch would shrink and the rank would wait at the next collective instead: on tp2_s3_node
such gaps add up to ~13 µs per cycle outside graphs); ops of R on other streams after P's first op
shift with it; R's other threads shift with its main thread; a wait is taken to wait for all of the
rank's GPU work that ended before it returned.

The result is checked before it is written into place (:class:`InvalidResult`): every GPU op starts at
or after the start of the API call that launched it; per (pid, stream) the ops keep their order and ops
that did not overlap still do not; NVTX ranges keep start <= end and their nesting per thread; the
collectives matched across ranks in the source end as close together as they did (within 1 µs).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sqlite3
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

import polars as pl

RUNTIME = "CUPTI_ACTIVITY_KIND_RUNTIME"
NVTX = "NVTX_EVENTS"
GRAPH_TRACE = "CUPTI_ACTIVITY_KIND_GRAPH_TRACE"
KERNEL = "CUPTI_ACTIVITY_KIND_KERNEL"
GPU_TABLES = (KERNEL, "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET", GRAPH_TRACE)
NVTX_RANGE_TYPES = (59, 60)  # push/pop and start/end ranges
MATCH_TOL_NS = 10_000  # collectives of one job end within ~1 µs; consecutive ones are >= ~45 µs apart
IDLE_LAT_FALLBACK_NS = 10_000  # launch latency when a capture has no launch onto an idle stream
END_TOL_NS = 1_000  # how much further apart matched collectives may end after the injection
WAIT_FLOOR_NS = 5_000  # a sync call that does not block still takes a few µs
# A host call that blocks until GPU work is done.
WAIT_API = r"Synchronize|^cu(da)?Memcpy(_v\d+)?$|^cuMemcpy[DH]to[DH](_v\d+)?$"
_I = pl.Int64


class InjectError(Exception):
    """A bad input or spec (the CLI prints it on one line and exits 2)."""


class InvalidResult(RuntimeError):
    """The built trace breaks an invariant (a bug in the model, never written into place)."""


@dataclass(frozen=True)
class Spec:
    """Rank ``rank`` waits ``delay_us`` before phase ``phase`` in cycles c with ``c % every == offset``."""

    rank: int
    phase: str
    every: int
    offset: int
    delay_us: float

    @property
    def delay_ns(self) -> int:
        return round(self.delay_us * 1000)


def parse_spec(text: str) -> Spec:
    """``RANK:PHASE:EVERY:OFFSET:US`` → :class:`Spec` (InjectError if malformed)."""
    parts = str(text).split(":")
    what = f"--delay {text!r}"
    if len(parts) != 5:
        raise InjectError(f"{what}: expected RANK:PHASE:EVERY:OFFSET:US, e.g. 1:draft:4:0:500")
    rank, phase, every, offset, us = (p.strip() for p in parts)
    try:
        rank_i, every_i, offset_i = int(rank), int(every), int(offset)
        delay = float(us)
    except ValueError:
        raise InjectError(f"{what}: RANK, EVERY and OFFSET must be integers and US a number") from None
    if not phase:
        raise InjectError(f"{what}: PHASE is empty")
    if rank_i < 0:
        raise InjectError(f"{what}: RANK must be >= 0")
    if every_i < 1:
        raise InjectError(f"{what}: EVERY must be >= 1")
    if not 0 <= offset_i < every_i:
        raise InjectError(f"{what}: OFFSET must be in 0..EVERY-1")
    if not math.isfinite(delay) or delay <= 0:
        raise InjectError(f"{what}: US must be a positive number of microseconds")
    return Spec(rank_i, phase, every_i, offset_i, delay)


def _spec(s: Spec | str | dict | tuple) -> Spec:
    """A spec given as a Spec, a string, a dict or a tuple, checked like the CLI's."""
    if isinstance(s, dict):
        s = Spec(**s)
    elif isinstance(s, tuple | list):
        s = Spec(*s)
    if isinstance(s, Spec):
        s = f"{s.rank}:{s.phase}:{s.every}:{s.offset}:{s.delay_us}"
    return parse_spec(s)


# --- reading ---------------------------------------------------------------------------------------------

def _frame(con: sqlite3.Connection, sql: str, cols: dict[str, pl.DataType]) -> pl.DataFrame:
    rows = con.execute(sql).fetchall()
    return pl.DataFrame(rows, schema=cols, orient="row")


def _pid(col: str) -> str:
    return f"(({col} >> 24) & {0xFFFFFF})"


@dataclass
class _Trace:
    tables: dict[str, list[str]]
    host_tables: list[tuple[str, str, str | None]]  # (table, time column, pid column or None)
    host: pl.DataFrame  # t, rid, pid, tid, s0, e0, start, end, corr, name
    gpu: pl.DataFrame  # t, rid, pid, stream, dev, corr, s0, e0, comm, label, start, end
    ranks: list[int]  # pids by rank
    lat: pl.DataFrame  # pid, name, lat, lat_any
    wait_names: list[int]
    labels: dict[int, str]  # kernel shortName ids -> names


def _read(con: sqlite3.Connection) -> _Trace:
    tables = {t: [r[1] for r in con.execute(f"PRAGMA table_info('{t}')")]
              for (t,) in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    for need in (NVTX, RUNTIME):
        if need not in tables:
            raise InjectError(f"not an nsys export with CUDA and NVTX traces (no {need} table)")
    if not any(t in tables for t in GPU_TABLES):
        raise InjectError("no GPU activity tables in this export")
    host_tables, parts = [], []
    gpu_tables = [t for t in GPU_TABLES if t in tables]
    for t, cols in tables.items():
        if t in gpu_tables:
            continue
        tcol = "start" if "start" in cols else "timestamp" if "timestamp" in cols else None
        if tcol is None:
            continue
        pcol = "globalTid" if "globalTid" in cols else "globalPid" if "globalPid" in cols else None
        host_tables.append((t, tcol, pcol))
        i = len(host_tables) - 1
        end = '"end"' if "end" in cols and tcol == "start" else "NULL"
        pid = _pid(pcol) if pcol else "-1"
        tid = "globalTid" if pcol == "globalTid" else "NULL"
        corr = "correlationId" if t == RUNTIME else "NULL"
        name = "nameId" if t == RUNTIME else "NULL"
        parts.append(f'SELECT {i}, rowid, {pid}, {tid}, {tcol}, {end}, {corr}, {name} FROM "{t}"')
    hcols = {"t": pl.Int32, "rid": _I, "pid": _I, "tid": _I, "s0": _I, "e0": _I, "corr": _I, "name": _I}
    host = _frame(con, " UNION ALL ".join(parts), hcols).with_columns(start="s0", end="e0")

    comm_ids = _comm_name_ids(con) if KERNEL in tables else set()
    gparts = []
    for i, t in enumerate(GPU_TABLES):
        if t not in gpu_tables:
            continue
        label = "shortName" if t == KERNEL else "NULL"
        comm = f"demangledName IN ({','.join(map(str, comm_ids)) or 'NULL'})" if t == KERNEL else (
            "1" if t == GRAPH_TRACE else "0")
        gparts.append(f'SELECT {i}, rowid, {_pid("globalPid")}, streamId, deviceId, correlationId, start, '
                      f'"end", {comm}, {label} FROM "{t}"')
    gcols = {"t": pl.Int32, "rid": _I, "pid": _I, "stream": _I, "dev": _I, "corr": _I, "s0": _I, "e0": _I,
             "comm": pl.Boolean, "label": _I}
    gpu = _frame(con, " UNION ALL ".join(gparts), gcols).with_columns(
        start="s0", end="e0")
    if gpu.is_empty():
        raise InjectError("no GPU ops in this export")
    ranks = (gpu.group_by("pid").agg(dev=pl.col("dev").min()).sort("dev", "pid")["pid"].to_list())
    names = _frame(con, f"SELECT DISTINCT s.id, s.value FROM StringIds s JOIN {RUNTIME} r ON r.nameId = s.id",
                   {"id": _I, "value": pl.String})
    wait_names = names.filter(pl.col("value").str.contains(WAIT_API))["id"].to_list()
    labels = {}
    if KERNEL in tables:
        labels = dict(con.execute(f"SELECT DISTINCT s.id, s.value FROM StringIds s JOIN {KERNEL} k "
                                  "ON k.shortName = s.id").fetchall())
    return _Trace(tables, host_tables, host, gpu, ranks, _latencies(host, gpu), wait_names, labels)


def _comm_name_ids(con: sqlite3.Connection) -> set[int]:
    from analyze.compute.comm_patterns import EXCLUDE, PATTERNS

    names = _frame(con, f"SELECT DISTINCT s.id, s.value FROM StringIds s JOIN {KERNEL} k "
                        "ON k.demangledName = s.id", {"id": _I, "value": pl.String})
    rx = "|".join(f"(?:{p.regex})" for p in PATTERNS)
    return set(names.filter(pl.col("value").str.contains(rx) & ~pl.col("value").str.contains(EXCLUDE))["id"])


def _launches(host: pl.DataFrame, gpu: pl.DataFrame) -> pl.DataFrame:
    """GPU ops with their launching API call (a0, name) and the end of the op before them on their stream."""
    api = host.filter(pl.col("corr").is_not_null() & pl.col("pid").is_in(gpu["pid"].unique().implode()))
    api = api.select("pid", "corr", a0="start", name="name").unique(["pid", "corr"], keep="first")
    g = gpu.sort("pid", "stream", "start", "end").with_columns(
        prev_end=pl.col("end").cum_max().shift(1).over("pid", "stream"),
        first=pl.col("start") == pl.col("start").min().over("pid", "corr"))
    return g.join(api, on=["pid", "corr"], how="left")


def _latencies(host: pl.DataFrame, gpu: pl.DataFrame) -> pl.DataFrame:
    """Per (pid, API name): median time from the call's start to its first op when the stream was idle."""
    g = _launches(host, gpu).filter(pl.col("first") & pl.col("a0").is_not_null()
                                    & (pl.col("prev_end").is_null() | (pl.col("prev_end") < pl.col("a0"))))
    g = g.with_columns(lat=pl.col("start") - pl.col("a0"))
    per = g.group_by("pid", "name").agg(pl.col("lat").median().cast(_I))
    any_ = g.group_by("pid").agg(lat_any=pl.col("lat").median().cast(_I))
    return per.join(any_, on="pid", how="left")


# --- cycles ----------------------------------------------------------------------------------------------

def _ranges(con: sqlite3.Connection) -> pl.DataFrame:
    """NVTX ranges with their base name and decoded payload (cycle_index)."""
    from analyze.compute.payload import decode_exprs
    from nvtx_hooks.phases import base_name

    types = ",".join(map(str, NVTX_RANGE_TYPES))
    r = _frame(con, f"SELECT n.rowid, {_pid('n.globalTid')}, n.globalTid, n.start, n.\"end\", "
                    f"COALESCE(s.value, n.text), n.uint64Value, n.int64Value FROM {NVTX} n "
                    f"LEFT JOIN StringIds s ON s.id = n.textId "
                    f"WHERE n.eventType IN ({types}) AND n.\"end\" IS NOT NULL",
               {"rid": _I, "pid": _I, "tid": _I, "start": _I, "end": _I, "text": pl.String, "uint64": _I,
                "int64": _I})
    texts = r["text"].drop_nulls().unique().to_list()
    base = pl.DataFrame({"text": texts, "base": [base_name(t) for t in texts]}, schema={"text": pl.String,
                                                                                        "base": pl.String})
    return r.join(base, on="text", how="left").with_columns(decode_exprs()).drop("uint64", "int64")


@dataclass
class _Point:
    rank: int
    pid: int
    phase: str
    cycle: int
    key_source: str
    rid: int  # NVTX rowid of the phase range
    t0_src: int
    delay: int
    order: int  # spec order, for ties


def _points(con: sqlite3.Connection, tr: _Trace, specs: list[Spec]) -> list[_Point]:
    rng = _ranges(con)
    cyc = rng.filter(pl.col("base") == "cycle").sort("start")
    launched = _launches(tr.host, tr.gpu).filter(pl.col("a0").is_not_null()).select("pid", t="a0").sort("t")
    # a cycle has GPU work when an op was launched by a call inside it
    work = (launched.join_asof(cyc.select("pid", "rid", "start", "end").sort("start"), left_on="t",
                               right_on="start", by="pid", strategy="backward", check_sortedness=False)
            .filter(pl.col("t") <= pl.col("end")).group_by("rid").len())
    cyc = cyc.join(work, on="rid", how="inner").sort("pid", "start")
    out = []
    for n, sp in enumerate(specs):
        if sp.rank >= len(tr.ranks):
            raise InjectError(f"--delay {sp.rank}:{sp.phase}:...: rank {sp.rank} does not exist "
                              f"(the capture has {len(tr.ranks)} ranks: 0..{len(tr.ranks) - 1})")
        pid = tr.ranks[sp.rank]
        c = cyc.filter(pl.col("pid") == pid)
        if c.is_empty():
            raise InjectError(f"rank {sp.rank} (pid {pid}) has no 'cycle' ranges with GPU work")
        payload = c["cycle_index"].null_count() == 0
        c = c.with_columns(key=pl.col("cycle_index") if payload else pl.int_range(pl.len(), dtype=_I))
        ph = rng.filter((pl.col("pid") == pid) & (pl.col("base") == sp.phase)).sort("start")
        if ph.is_empty():
            known = sorted(set(rng.filter(pl.col("pid") == pid)["base"].drop_nulls()))
            raise InjectError(f"rank {sp.rank} has no {sp.phase!r} ranges (it has: {', '.join(known)})")
        # the phase range of each cycle: the first one starting inside it on the same thread
        inside = (ph.select("tid", p_rid="rid", p_start="start")
                  .join_asof(c.select("tid", "rid", "start", "end", "key").sort("start"), left_on="p_start",
                             right_on="start", by="tid", strategy="backward", check_sortedness=False)
                  .filter(pl.col("p_start") <= pl.col("end")).sort("p_start").unique("rid", keep="first"))
        sel = inside.filter(pl.col("key") % sp.every == sp.offset).sort("p_start")
        if sel.is_empty():
            raise InjectError(f"--delay {sp.rank}:{sp.phase}:{sp.every}:{sp.offset}: selects no cycle of "
                              f"rank {sp.rank} with a {sp.phase!r} range and GPU work")
        for row in sel.iter_rows(named=True):
            out.append(_Point(sp.rank, pid, sp.phase, int(row["key"]), "payload" if payload else "order",
                              int(row["p_rid"]), int(row["p_start"]), sp.delay_ns, n))
    return out


# --- one injection ---------------------------------------------------------------------------------------

def _asof(left: pl.DataFrame, on: str, right: pl.DataFrame, r_on: str, val: str, *, by: str | None = None,
          strict: bool = False, default: int | None = 0) -> pl.Series:
    """Per row of ``left``: ``val`` of the last ``right`` row with ``r_on`` <= ``on`` (< if strict) and the same
    ``by``, else ``default``."""
    x = left[on]
    out = pl.Series(val, [default] * left.height, dtype=_I)
    groups = [(None, right)] if by is None else right.partition_by(by, as_dict=True).items()
    for g, r in groups:
        r = r.sort(r_on)
        pos = r[r_on].search_sorted(x.fill_null(0), side="left" if strict else "right").cast(_I) - 1
        hit = (pos >= 0) & x.is_not_null()
        if by is not None:
            hit = hit & (left[by] == g[0])
        out = pl.select(pl.when(hit).then(r[val].gather(pos.clip(0))).otherwise(out)).to_series()
    return out.alias(val)


def _partners(tr: _Trace, comms: pl.DataFrame, pid: int) -> pl.DataFrame:
    """Per collective k of R, each other rank's communication op that ends closest to it (<= MATCH_TOL_NS)."""
    schema = {"k": _I, "p_t": pl.Int32, "p_rid": _I, "p_start": _I, "p_end": _I, "p_label": _I, "o_pid": _I}
    out = [pl.DataFrame(schema=schema)]
    for o in tr.ranks:
        oc = (tr.gpu.filter((pl.col("pid") == o) & pl.col("comm"))
              .select(p_t="t", p_rid="rid", p_start="start", p_end="end", p_label="label").sort("p_end"))
        if o == pid or oc.is_empty() or comms.is_empty():
            continue
        m = (comms.select("k", "end").sort("end")
             .join_asof(oc, left_on="end", right_on="p_end", strategy="nearest", coalesce=False)
             .with_columns(dist=(pl.col("end") - pl.col("p_end")).abs())
             .filter(pl.col("dist") <= MATCH_TOL_NS)
             .sort("dist").unique(["p_t", "p_rid"], keep="first")  # one partner per kernel
             .select(*schema.keys() - {"o_pid"}, o_pid=pl.lit(o, _I)))
        out.append(m.select(schema.keys()))
    return pl.concat(out).sort("k", "o_pid")


def _steps(t: pl.DataFrame, on: str, steps: list[tuple[int, int]]) -> pl.Series:
    """The step function ``steps`` ([(from, value)], sorted) at ``t[on]``; 0 before the first step."""
    right = pl.DataFrame(steps, schema={"_b": _I, "_h": _I}, orient="row")
    return _asof(t, on, right, "_b", "_h")


def _moved(t: pl.DataFrame, on: str, steps: list[tuple[int, int]]) -> pl.Series:
    """``t[on]`` moved by ``steps``, never past the next step's image: where the shift steps down (R's host
    caught up inside a blocking wait) the time inside the wait is compressed, so the map stays monotone."""
    caps = [(b, nb + nh) for (b, _), (nb, nh) in zip(steps, steps[1:])] + [(steps[-1][0], None)]
    right = pl.DataFrame(caps, schema={"_b": _I, "_c": _I}, orient="row")
    cap = _asof(t, on, right, "_b", "_c", default=None)
    return pl.min_horizontal(t[on] + _steps(t, on, steps), cap).alias(on)


def _inject_one(tr: _Trace, pt: _Point) -> dict:
    host, gpu = tr.host, tr.gpu
    pid, d = pt.pid, pt.delay
    nvtx_i, api_i = _host_index(tr, NVTX), _host_index(tr, RUNTIME)
    t0 = int(host.filter((pl.col("t") == nvtx_i) & (pl.col("rid") == pt.rid))["start"][0])
    rec = {"rank": pt.rank, "pid": pid, "phase": pt.phase, "cycle": pt.cycle, "key_source": pt.key_source,
           "t0_ns": t0, "t0_src_ns": pt.t0_src, "delay_ns": d, "gpu_delay_ns": None, "wait_added_ns": 0,
           "collective": None, "others": [], "final_shift_ns": 0, "extra_waits": 0, "host_caught_up_ns": 0}

    # R's ops: when each was ready (launch-bound: its start, else min(start, a0 + lat)); launched after t0?
    r = (_launches(host, gpu.filter(pl.col("pid") == pid)).join(tr.lat, on=["pid", "name"], how="left")
         .with_columns(lat=pl.coalesce("lat", "lat_any", pl.lit(IDLE_LAT_FALLBACK_NS, _I))))
    sent = pl.col("a0") + pl.col("lat")
    bound = pl.col("first") & (pl.col("prev_end").is_null() | (pl.col("prev_end") < sent))
    r = r.with_columns(
        ready=pl.when(bound).then(pl.col("start")).otherwise(pl.min_horizontal("start", sent)),
        launched=pl.col("a0").is_not_null() & (pl.col("a0") >= t0))
    first = r.filter("launched").sort("start", "end").head(1)
    f0 = int(first["start"][0]) if first.height else None
    seq = (r.filter(pl.col("start") >= (f0 if f0 is not None else pl.col("start").max() + 1))
           .sort("start", "comm", "end", "t", "rid")
           .with_columns(seg=pl.col("comm").cast(_I).cum_sum() - pl.col("comm").cast(_I)))
    comms = seq.filter("comm").select("t", "rid", "start", "end", "label", k=pl.int_range(pl.len(), dtype=_I))
    partners = _partners(tr, comms, pid)
    last = (pl.concat([comms.select("k", last="start"), partners.select("k", last="p_start")])
            .group_by("k").agg(pl.col("last").max()))
    waits = (host.filter((pl.col("pid") == pid) & (pl.col("t") == api_i) & pl.col("name").is_in(tr.wait_names)
                         & (pl.col("start") >= t0))
             .select("start", "end", blocked=pl.max_horizontal(
                 pl.col("end") - pl.col("start") - WAIT_FLOOR_NS, pl.lit(0, _I))).sort("end"))
    # R's host is D late from t0 until it blocks on its GPU: a wait returns at max(its start + D + what it
    # did not block, the awaited work's new end); from there R is only that late (never less than its GPU).
    steps = [(t0, d)]
    while True:
        seq = seq.with_columns(h=_steps(seq, "a0", steps)).with_columns(
            need=pl.when("launched").then(pl.max_horizontal(pl.col("ready") + pl.col("h") - pl.col("start"),
                                                            pl.lit(0, _I))).otherwise(pl.lit(0, _I)))
        seq = seq.with_columns(cm=pl.col("need").cum_max().over("seg"))
        # Δ_k = max(0, max_{j<=k}(need_j + start_R,j - old_last_j)); ops between k-1 and k: from Δ_{k-1}
        ck = (comms.join(seq.select("t", "rid", "cm"), on=["t", "rid"]).join(last, on="k").sort("k")
              .with_columns(delta=(pl.col("cm") + pl.col("start") - pl.col("last")).cum_max().clip(0))
              .with_columns(base=pl.col("delta").shift(1).fill_null(0)))
        bases = pl.concat([ck.select(seg="k", base="base"),
                           ck.tail(1).select(seg=pl.col("k") + 1, base="delta")])
        seq = (seq.drop("base", "delta", "ss", "es", strict=False).join(bases, on="seg", how="left")
               .with_columns(ss=pl.max_horizontal(pl.col("base").fill_null(0), "cm"))
               .join(ck.select("t", "rid", "delta"), on=["t", "rid"], how="left")
               .with_columns(es=pl.coalesce("delta", "ss")))
        # R's GPU lateness when each later wait returns: the shift of its last op that had ended by then
        h_now, after = steps[-1][1], steps[-1][0]
        w = waits.filter(pl.col("start") >= after)
        g = _asof(w, "end", seq.select("end", "es").sort("end"), "end", "es")
        w = w.with_columns(h_new=pl.max_horizontal(pl.lit(h_now, _I) - pl.col("blocked"), g)).filter(
            pl.col("h_new") < h_now)
        if w.is_empty():
            break
        steps.append((int(w["end"][0]), int(w["h_new"][0])))

    if f0 is not None:
        rec["gpu_delay_ns"] = int(seq.filter(pl.col("start") == f0)["ss"].max())
    rec["host_caught_up_ns"] = d - steps[-1][1]
    gshift, anchors = [seq.select("t", "rid", "ss", "es")], []
    if not ck.is_empty():
        c0 = ck.row(0, named=True)
        rec.update(wait_added_ns=c0["delta"] if partners.filter(pl.col("k") == 0).height else 0,
                   final_shift_ns=int(ck["delta"][-1]),
                   extra_waits=int((ck["delta"].diff().fill_null(0) > 0).sum()))
        rec["collective"] = {"table": GPU_TABLES[c0["t"]], "rowid": c0["rid"],
                             "name": _label(tr, c0["t"], c0["label"]),
                             "old_start_ns": c0["start"], "old_end_ns": c0["end"],
                             "start_ns": c0["start"] + max(c0["base"], c0["cm"]),
                             "end_ns": c0["end"] + c0["delta"]}
    partners = partners.join(ck.select("k", "delta", "base"), on="k")
    for p in partners.filter(pl.col("k") == 0).iter_rows(named=True):
        rec["others"].append({"rank": tr.ranks.index(p["o_pid"]), "pid": p["o_pid"],
                              "table": GPU_TABLES[p["p_t"]], "rowid": p["p_rid"],
                              "name": _label(tr, p["p_t"], p["p_label"]),
                              "start_ns": p["p_start"], "old_end_ns": p["p_end"],
                              "end_ns": p["p_end"] + p["delta"], "wait_added_ns": p["delta"]})
    for o in partners["o_pid"].unique().to_list():
        po = partners.filter(pl.col("o_pid") == o).sort("p_start")
        # the other rank's ops: its matched kernels wait; every later op moves with the last one before it
        ops = gpu.filter(pl.col("pid") == o).select("t", "rid", "start")
        sh = _asof(ops, "start", po, "p_start", "delta", strict=True)
        ops = (ops.with_columns(ss=sh, es=sh)
               .join(po.select(t="p_t", rid="p_rid", pb="base", pd="delta"), on=["t", "rid"], how="left")
               .with_columns(ss=pl.coalesce("pb", "ss"), es=pl.coalesce("pd", "es")))
        gshift.append(ops.select("t", "rid", "ss", "es"))
        # its host: held from the first blocking wait that returns after a collective's old end
        w = host.filter((pl.col("pid") == o) & (pl.col("t") == api_i) & pl.col("name").is_in(tr.wait_names))
        w = w.select("end").sort("end")
        anchors.append(w.with_columns(pid=pl.lit(o, _I), g=_asof(w, "end", po, "p_end", "delta")))

    sh = pl.concat(gshift)
    gpu = (gpu.join(sh, on=["t", "rid"], how="left")
           .with_columns(start=pl.col("start") + pl.col("ss").fill_null(0),
                         end=pl.col("end") + pl.col("es").fill_null(0))
           .with_columns(end=pl.max_horizontal("start", "end")).drop("ss", "es"))
    # R's host: the steps (an event spanning t0 ends D later; one ending exactly at t0 does not move)
    is_r = pl.col("pid") == pid
    s_r = _moved(host, "start", steps)
    e_r = _moved(host, "end", [(t0 + 1, d), *steps[1:]])
    host = host.with_columns(start=pl.when(is_r).then(s_r).otherwise("start"),
                             end=pl.when(is_r).then(e_r).otherwise("end"))
    anc = pl.concat(anchors).filter(pl.col("g") > 0).sort("end") if anchors else pl.DataFrame()
    if not anc.is_empty():
        anc = anc.with_columns(g=pl.col("g").cum_max().over("pid"))
        s_sh = _asof(host, "start", anc, "end", "g", by="pid")
        e_sh = _asof(host, "end", anc, "end", "g", by="pid")
        host = host.with_columns(start=pl.col("start") + s_sh, end=pl.col("end") + e_sh)
    tr.host, tr.gpu = host, gpu
    return rec


def _host_index(tr: _Trace, table: str) -> int:
    return next(i for i, (t, _, _) in enumerate(tr.host_tables) if t == table)


def _label(tr: _Trace, t: int, label: int | None) -> str:
    return "CUDA graph replay" if GPU_TABLES[t] == GRAPH_TRACE else tr.labels.get(label, "?")


# --- session, checks, writing ----------------------------------------------------------------------------

def _session(tr: _Trace) -> int:
    """Move the other processes' events after the ranks' last one with the latest rank; returns the growth."""
    ranks = pl.col("pid").is_in(tr.ranks)
    last = pl.coalesce("e0", "s0").max()
    new_last = pl.coalesce("end", "start").max()
    rk = pl.concat([tr.host.filter(ranks).select(a=last, b=new_last),
                    tr.gpu.filter(ranks).select(a=last, b=new_last)])
    t_old, t_new = rk["a"].max(), rk["b"].max()
    grow = max(0, int(t_new - t_old)) if t_old is not None else 0
    if grow:
        tr.host = tr.host.with_columns(
            start=pl.when(~ranks & (pl.col("s0") >= t_old)).then(pl.col("start") + grow).otherwise("start"),
            end=pl.when(~ranks & (pl.col("e0") >= t_old)).then(pl.col("end") + grow).otherwise("end"))
    return grow


def _nesting_errors(host: pl.DataFrame, nvtx_i: int) -> int:
    """NVTX ranges per thread whose nesting (parent, order among siblings) changed."""
    r = (host.filter((pl.col("t") == nvtx_i) & pl.col("e0").is_not_null() & pl.col("tid").is_not_null())
         .sort("tid", "s0", pl.col("e0"), descending=[False, False, True]))
    bad = r.filter(pl.col("end") < pl.col("start")).height
    stack: list[tuple] = []
    prev_tid = None
    for tid, s0, e0, s, e in r.select("tid", "s0", "e0", "start", "end").iter_rows():
        if tid != prev_tid:
            stack, prev_tid = [], tid
        while stack and stack[-1][1] <= s0:  # ended before this one started: a finished sibling or uncle
            done = stack.pop()
            if done[3] > s:
                bad += 1
        if stack and e0 <= stack[-1][1]:
            if not (stack[-1][2] <= s and e <= stack[-1][3]):
                bad += 1
        stack.append((s0, e0, s, e))
    return bad


def _check(tr: _Trace, src_pairs: pl.DataFrame) -> None:
    host, gpu = tr.host, tr.gpu
    errors = []
    api = host.filter(pl.col("t") == _host_index(tr, RUNTIME)).select("pid", "corr", a0="s0", a="start")
    launch = gpu.join(api.unique(["pid", "corr"]), on=["pid", "corr"])
    n = launch.filter((pl.col("start") < pl.col("a")) & (pl.col("s0") >= pl.col("a0"))).height
    if n:
        errors.append(f"{n} GPU ops start before the API call that launched them")
    g = gpu.sort("pid", "stream", "s0", "e0", "t", "rid").with_columns(
        ps0=pl.col("s0").shift(1).over("pid", "stream"), ps=pl.col("start").shift(1).over("pid", "stream"),
        m0=pl.col("e0").cum_max().shift(1).over("pid", "stream"),
        m=pl.col("end").cum_max().shift(1).over("pid", "stream"))
    n = g.filter((pl.col("s0") > pl.col("ps0")) & (pl.col("start") < pl.col("ps"))).height
    if n:
        errors.append(f"{n} GPU ops changed order on their stream")
    n = g.filter((pl.col("s0") >= pl.col("m0")) & (pl.col("start") < pl.col("m"))).height
    if n:
        errors.append(f"{n} GPU ops now overlap an earlier op of their stream")
    n = gpu.filter(pl.col("end") < pl.col("start")).height + host.filter(
        (pl.col("end") < pl.col("start")) & (pl.col("e0") >= pl.col("s0"))).height
    if n:
        errors.append(f"{n} events end before they start")
    n = _nesting_errors(host, _host_index(tr, NVTX))
    if n:
        errors.append(f"{n} NVTX ranges lost their nesting")
    if not src_pairs.is_empty():
        ends = gpu.select("t", "rid", "end")
        p = (src_pairs.join(ends, left_on=["a_t", "a_rid"], right_on=["t", "rid"])
             .join(ends, left_on=["b_t", "b_rid"], right_on=["t", "rid"], suffix="_b"))
        n = p.filter((pl.col("end") - pl.col("end_b")).abs() > pl.col("dist0") + END_TOL_NS).height
        if n:
            errors.append(f"{n} matched collectives no longer end together")
    if errors:
        raise InvalidResult("the injected trace is inconsistent: " + "; ".join(errors))


def _collective_pairs(tr: _Trace) -> pl.DataFrame:
    """Communication ops of the first rank and their partner (closest end, <= MATCH_TOL_NS) on each other
    rank."""
    c = tr.gpu.filter(pl.col("comm"))
    a = c.filter(pl.col("pid") == tr.ranks[0]).select(a_t="t", a_rid="rid", e="e0").sort("e")
    out = []
    for o in tr.ranks[1:]:
        b = c.filter(pl.col("pid") == o).select(b_t="t", b_rid="rid", eb="e0").sort("eb")
        if a.is_empty() or b.is_empty():
            continue
        m = (a.join_asof(b, left_on="e", right_on="eb", strategy="nearest", coalesce=False)
             .with_columns(dist0=(pl.col("e") - pl.col("eb")).abs()).filter(pl.col("dist0") <= MATCH_TOL_NS)
             .sort("dist0").unique(["b_t", "b_rid"], keep="first"))
        out.append(m.select("a_t", "a_rid", "b_t", "b_rid", "dist0"))
    schema = {"a_t": pl.Int32, "a_rid": _I, "b_t": pl.Int32, "b_rid": _I, "dist0": _I}
    return pl.concat([pl.DataFrame(schema=schema), *out])


def _write(con: sqlite3.Connection, tr: _Trace, grow: int) -> None:
    changed = (pl.col("start") != pl.col("s0")) | (pl.col("end") != pl.col("e0"))
    for i, (t, tcol, _) in enumerate(tr.host_tables):
        rows = tr.host.filter((pl.col("t") == i) & changed.fill_null(pl.col("start") != pl.col("s0")))
        if rows.is_empty():
            continue
        if "end" in tr.tables[t] and tcol == "start":
            con.executemany(f'UPDATE "{t}" SET start = ?, "end" = ? WHERE rowid = ?',
                            rows.select("start", "end", "rid").iter_rows())
        else:
            con.executemany(f'UPDATE "{t}" SET "{tcol}" = ? WHERE rowid = ?',
                            rows.select("start", "rid").iter_rows())
    for i, t in enumerate(GPU_TABLES):
        rows = tr.gpu.filter((pl.col("t") == i) & changed)
        if not rows.is_empty():
            con.executemany(f'UPDATE "{t}" SET start = ?, "end" = ? WHERE rowid = ?',
                            rows.select("start", "end", "rid").iter_rows())
    if "ANALYSIS_DETAILS" in tr.tables:
        dur = con.execute("SELECT MAX(duration) FROM ANALYSIS_DETAILS").fetchone()[0] or 0
        latest = max(tr.host.select(pl.coalesce("end", "start").max()).item() or 0, tr.gpu["end"].max() or 0)
        grow = max(grow, latest - dur)
        if grow > 0:
            con.execute("UPDATE ANALYSIS_DETAILS SET duration = duration + ?, stopTime = stopTime + ?",
                        (grow, grow))


# --- the API and the CLI ---------------------------------------------------------------------------------

def inject(src: str | os.PathLike, dst: str | os.PathLike, specs, *, force: bool = False) -> list[dict]:
    """Write ``src`` with the delays of ``specs`` injected to ``dst``; one dict per injection, in time order.

    ``specs``: :class:`Spec`, ``"RANK:PHASE:EVERY:OFFSET:US"`` strings, dicts or tuples. ``src`` is only
    read; the result is built in a temporary file beside ``dst``, checked, then renamed into place.

    Each dict (times in ns, on the timeline as it stood when that injection was applied; later
    injections only move what comes after their own t0): ``rank``, ``pid``, ``phase``, ``cycle`` (payload
    index or order), ``key_source`` ("payload"|"order"), ``t0_ns`` (start of the phase's range before the
    delay; it now starts at t0_ns + delay_ns), ``t0_src_ns`` (the same in the source), ``delay_ns`` (D),
    ``gpu_delay_ns`` (D_gpu; None when R launched nothing after t0), ``wait_added_ns`` (Δ at R's first
    collective after t0), ``collective`` (R's kernel or graph replay: table, rowid, name, old and new
    start/end), ``others`` (per other rank its matched kernel: rank, pid, table, rowid, name, start_ns,
    old_end_ns, end_ns, wait_added_ns), ``final_shift_ns`` (Δ at R's last collective: how late every rank's
    GPU ends up), ``extra_waits`` (later collectives that added to Δ), ``host_caught_up_ns``.
    """
    src, dst = Path(src), Path(dst)
    specs = [_spec(s) for s in specs]
    if not specs:
        raise InjectError("no --delay given")
    if not src.is_file():
        raise InjectError(f"{src}: no such file")
    if dst.resolve() == src.resolve() or (dst.exists() and os.path.samefile(src, dst)):
        raise InjectError(f"{dst}: is the source; write the injected trace elsewhere")
    if dst.is_dir():
        raise InjectError(f"{dst}: is a directory")
    if dst.exists() and not force:
        raise InjectError(f"{dst}: exists (use --force to overwrite)")
    if not dst.parent.is_dir():
        raise InjectError(f"{dst.parent}: no such directory")
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{dst.name}.", suffix=".tmp", dir=dst.parent)
    except OSError as e:
        raise InjectError(f"{dst.parent}: cannot write there ({e.strerror})") from None
    os.close(fd)
    tmp = Path(tmp)
    try:
        try:
            shutil.copyfile(src, tmp)
        except OSError as e:
            raise InjectError(f"{src}: cannot copy it ({e.strerror})") from None
        con = sqlite3.connect(tmp)
        try:
            try:
                con.execute("PRAGMA journal_mode=MEMORY")
                tr = _read(con)
            except sqlite3.DatabaseError as e:
                raise InjectError(f"{src}: not a readable SQLite export ({e})") from None
            points = _points(con, tr, specs)
            pairs = _collective_pairs(tr)
            out = []
            nvtx_i = _host_index(tr, NVTX)
            todo = list(points)
            while todo:  # in time order, on the times the earlier injections left
                now = tr.host.filter(pl.col("t") == nvtx_i).select("rid", "start")
                starts = dict(now.filter(pl.col("rid").is_in([p.rid for p in todo])).iter_rows())
                nxt = min(todo, key=lambda p: (starts[p.rid], p.order))
                todo.remove(nxt)
                out.append(_inject_one(tr, nxt))
            grow = _session(tr)
            _check(tr, pairs)
            _write(con, tr, grow)
            con.commit()
        finally:
            con.close()
        os.replace(tmp, dst)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.inject", description=__doc__.splitlines()[0])
    p.add_argument("src", help="nsys SQLite export of a multi-rank run (only read)")
    p.add_argument("dst", help="where to write the injected copy")
    p.add_argument("--delay", action="append", default=[], metavar="RANK:PHASE:EVERY:OFFSET:US",
                   help="rank RANK's host waits US µs before PHASE in its cycles c with "
                        "c %% EVERY == OFFSET")
    p.add_argument("--json", metavar="FILE", help="write the injections (the ground truth) as JSON")
    p.add_argument("--force", action="store_true", help="overwrite DST")
    a = p.parse_args(argv)
    try:
        specs = [parse_spec(s) for s in a.delay]
        out = inject(a.src, a.dst, specs, force=a.force)
    except InjectError as e:
        print(f"bench.inject: error: {e}", file=sys.stderr)
        return 2
    except InvalidResult as e:
        print(f"bench.inject: {e}", file=sys.stderr)
        return 1
    doc = {"source": str(a.src), "output": str(a.dst), "model": "bench/inject.py (built, not captured)",
           "specs": [asdict(s) for s in specs], "injections": out}
    if a.json:
        Path(a.json).write_text(json.dumps(doc, indent=1) + "\n")
    n = len(out)
    mean = (lambda k: sum(r[k] or 0 for r in out) / n / 1000) if n else (lambda k: 0.0)
    print(f"{n} injections into {a.dst} (a model, not a capture): mean delay {mean('delay_ns'):.1f} µs, "
          f"GPU delay {mean('gpu_delay_ns'):.1f} µs, wait added to the other ranks "
          f"{mean('wait_added_ns'):.1f} µs",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
