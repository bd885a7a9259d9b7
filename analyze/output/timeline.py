"""``spectrace timeline``: an annotated timeline of the cycles in the Chrome / Perfetto trace-event format.

One JSON file (the trace-event format's *JSON object format*: ``traceEvents`` and ``otherData``) that opens in
ui.perfetto.dev ("Open trace file") and chrome://tracing. Times are the capture's session clock (µs in ``ts``/
``dur`` with three decimals: the export's nanoseconds exactly). Per rank, one process (``pid`` = rank + 1) with:

- **host threads** (one per CPU thread that has them): the phase ranges (NVTX push/pop, as captured), the
  scheduler's ranges when the capture has them (``scheduler.*`` NVTX ranges of any domain: SGLang's
  ``SGLANG_ENABLE_NVTX_SCHEDULER=1``, or the hooks' own), and the CUDA API calls that wait for the GPU
  (synchronising calls, with the wait) or launch a CUDA graph. NVTX start/end ranges and ranges that end on
  another thread are async slices (they need not nest);
- **the GPU** (one thread): each top-level range's GPU span (``cycle 17``, ``prefill``: first → last GPU op of what
  it launched), the GPU idle between them (``between cycles · host-bound``: the seam's ``bound``, its cause, is in
  the name, so the viewer colours it by cause), and inside each cycle its phases and the seams between them
  (``seam draft→verify · gpu-bound``); inside each phase its GPU span split into ``compute``, ``comm`` and
  ``idle`` (the union of its communication kernels, of its other operations, and what is left of the span: the
  same split as ``analyze``, so these slices sum to its per-phase numbers);
- **counters**: the cycle period (µs, at each cycle's last GPU op) and, when the capture has nsys GPU metrics,
  SMs active, tensor active and DRAM read/write (% of peak).

One more process, ``spectrace: annotations`` (``pid`` 0), has a track per class of slower cycles, per
straggler verdict and per finding, with a slice over each cycle it names (a finding that names no cycles: one
slice over the window); their ``args`` carry the numbers ``spectrace analyze`` prints.

**Which cycles** (:func:`choose`): every cycle by default; ``cycles``: ``A:B`` (the cycles ``A <= cycle < B``, as
``analyze`` numbers them; open ends allowed), ``class:N`` (the N-th class of slower cycles that ``analyze`` lists,
each of its cycles with the cycle before it), ``stalls``, or ``segment:N`` (a batch-size segment, 0-based).
**Bounded size**: at most ``max_events`` events (:data:`DEFAULT_MAX_EVENTS`; 0: no bound). Over it, whole cycles are
dropped from the end (from the first steady cycle on when the run was not chosen), and what was cut is said on
stderr by the caller and in ``otherData.cut``.

Slices nest on every thread (the format's rule, which Perfetto enforces): phases inside their cycle, the split
inside its phase; a range whose GPU span overlaps the one before it on the same level (concurrent streams) goes,
with what is inside it, to an async track of the rank ("GPU · overlapping") instead.
"""

from __future__ import annotations

import gzip
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import polars as pl

from nvtx_hooks.capture import files

from ..compute import cycle_budget
from ..model import InputError, Result
from . import targets

__all__ = ["DEFAULT_MAX_EVENTS", "REPORT_MAX_EVENTS", "SCHEDULER", "Timeline", "choose", "build", "write", "class_cycles",
           "finding_cycles"]

DEFAULT_MAX_EVENTS = 500_000  # about 60 MB of JSON: what ui.perfetto.dev and chrome://tracing open quickly
REPORT_MAX_EVENTS = 150_000  # the timeline beside a report's page (report --timeline-events)
SCHEDULER = r"(^|[:/ ])scheduler\."  # the scheduler's NVTX ranges, any domain (module docstring)
_ANNOT_PID = 0
_GPU_TID = 1
_HOST_TID0 = 10
_PUSH_POP = 59  # nsys eventType of an NVTX push/pop range (they nest on their thread)
_MISSING_EST = 40  # events per rank-cycle besides its GPU operations' (ranges, seams, API calls, counters)
_PER_OP = 1.3  # events per GPU operation (the split's runs of compute, comm and idle): 1.0-1.2 on the bundled captures


@dataclass
class Timeline:
    """A built timeline: the trace-event JSON (``text``), how many events, which cycles, what was cut."""

    text: str
    events: int
    keys: list[int]  # the cycles shown
    cut: str | None  # what the bound left out, in words (None: nothing)
    meta: dict[str, Any] = field(default_factory=dict)  # otherData
    path: Path | None = None  # where it was written

    def data(self, gz: bool = False) -> bytes:
        raw = files.utf8(self.text)
        return gzip.compress(raw, mtime=0) if gz else raw


# ---- which cycles -------------------------------------------------------------------------------------------



def class_cycles(res: Result) -> list[tuple[Any, list[int]]]:
    """Each class of slower cycles (``res.steady.cycle_classes``, in that order) with every cycle it names: the
    slower cycles of a recurring class (its ``keys`` lists the first 20 only), the rare stalls."""
    # (findings will carry the cycles they name, issue 37: finding_cycles reads them first)
    c = cycle_budget.kind_cycles(res)
    info = res.steady.selection
    stall_keys = sorted(int(s["key"]) for s in info.get("stalls") or [])
    out = []
    for cl in res.steady.cycle_classes:
        if cl.id is None:
            keys = stall_keys
        else:
            slower = pl.col("slow") | pl.lit(cl.kind == "shift")  # a level shift: every cycle of its level
            keys = sorted(c.filter((pl.col("cycle_class") == cl.id) & slower & pl.col("steady"))
                          ["key"].unique().to_list())
        out.append((cl, keys or list(cl.keys)))
    return out


def finding_cycles(res: Result, finding: Any, classes: list[tuple[Any, list[int]]] | None = None) -> list[int]:
    """The cycles a finding names: its own list when it carries one (``cycle_keys``), else those of the class of
    slower cycles it was made from (same ``every``, phase and rank; ``STALLS``: the rare stalls), or of the batch-size
    segment it is about (``verify (batch 128)``: its steady cycles); [] for a finding about every steady cycle."""
    own = getattr(finding, "cycle_keys", None)
    if own:
        return sorted(int(k) for k in own)
    classes = class_cycles(res) if classes is None else classes
    if finding.code == "STALLS":
        return next((k for cl, k in classes if cl.kind == "stall"), [])
    seg = re.search(r"\((batch \d+|graphs [\d+]+)\)$", finding.phase or "")
    if seg:  # a finding about one batch size's segment ("verify (batch 128)"): its cycles
        sg = next((x for x in res.steady.segments if x.key == seg.group(1)), None)
        if sg is not None:
            c = cycle_budget.kind_cycles(res)
            return sorted(c.filter(pl.col("key").is_between(sg.first_cycle, sg.last_cycle) & pl.col("steady"))
                          ["key"].unique().to_list())
    if finding.code in ("STRAGGLER_RANK", "RECURRING_SLOW_CYCLES", "LEVEL_SHIFT") and finding.cycles:
        for cl, k in classes:
            if (cl.kept and cl.every == finding.every and cl.phase == finding.phase and cl.rank == finding.rank
                    and cl.affected == finding.cycles):
                return k
    return []


def choose(res: Result, spec: str | None) -> tuple[list[int], str]:
    """The cycles ``spec`` names (module docstring), in order, and how to say it; InputError on a bad spec."""
    c = cycle_budget.kind_cycles(res)
    if c.height == 0:
        raise InputError("no decode cycles in this capture: nothing to put on a timeline (its phases need a "
                         "'cycle' or 'decode_step' range)", "NO_CYCLES")
    allk = sorted(c["key"].drop_nulls().unique().to_list())
    if spec is None or spec == "":
        return allk, f"every cycle ({allk[0]}–{allk[-1]})"
    s = spec.strip()
    m = re.fullmatch(r"(-?\d*)\s*:\s*(-?\d*)", s)
    if m:
        a = int(m.group(1)) if m.group(1) else None
        b = int(m.group(2)) if m.group(2) else None
        keys = [k for k in allk if (a is None or k >= a) and (b is None or k < b)]
        if not keys:
            raise InputError(f"--cycles {spec}: no cycle in it (this capture's cycles are {allk[0]}–{allk[-1]})",
                             "BAD_OPTION")
        return keys, f"cycles {keys[0]}–{keys[-1]}"
    classes = class_cycles(res)
    m = re.fullmatch(r"class:(\d+)", s)
    if m or s == "stalls":
        if m:
            i = int(m.group(1))
            if not 1 <= i <= len(classes):
                raise InputError(f"--cycles {spec}: this capture has {len(classes)} class(es) of slower cycles "
                                 "(`spectrace analyze --table cycle_classes` lists them, 1 first)", "BAD_OPTION")
            cl, keys = classes[i - 1]
        else:
            hit = [(cl, k) for cl, k in classes if cl.kind == "stall"]
            if not hit:
                raise InputError(f"--cycles {spec}: this capture has no rare stalls", "BAD_OPTION")
            cl, keys = hit[0]
        before = {k: p for p, k in zip(allk, allk[1:])}
        shown = sorted({*keys, *(before[k] for k in keys if k in before)})
        return shown, f"{cl.label}: its {len(keys)} cycle(s), each with the cycle before it"
    m = re.fullmatch(r"segment:(\d+)", s)
    if m:
        segs = res.steady.segments
        i = int(m.group(1))
        sg = next((x for x in segs if x.segment == i), None)
        if sg is None:
            raise InputError(f"--cycles {spec}: this capture has {len(segs)} segment(s) of one batch size "
                             f"(`spectrace analyze --table segments`; numbered from 0)", "BAD_OPTION")
        keys = [k for k in allk if sg.first_cycle <= k <= sg.last_cycle]
        return keys, f"segment {i} ({sg.key}): cycles {keys[0]}–{keys[-1]}"
    raise InputError(f"--cycles {spec}: give A:B (cycles A <= cycle < B), class:N, stalls or segment:N",
                     "BAD_OPTION")


def _estimate(res: Result, c: pl.DataFrame) -> pl.DataFrame:
    """``key, est``: events each cycle is expected to make (:data:`_PER_OP` per GPU operation, all ranks)."""
    ops = res.instances.select("rank", "range_id", "i_ops")
    return (c.join(ops, on=["rank", "range_id"], how="left")
            .group_by("key").agg(est=(_PER_OP * pl.col("i_ops").fill_null(0) + _MISSING_EST).sum()).sort("key"))


def _bounded(res: Result, keys: list[int], chosen: bool, max_events: int,
             scale: float = 1.0) -> tuple[list[int], str | None]:
    """``keys`` cut to what ``max_events`` holds (whole cycles; from the first steady cycle when the user did not
    choose the cycles), and the sentence saying what was cut (None: nothing)."""
    if not max_events:
        return keys, None
    c = cycle_budget.kind_cycles(res)
    est = _estimate(res, c.filter(pl.col("key").is_in(keys))).with_columns(pl.col("est") * scale)
    if est["est"].sum() <= max_events:
        return keys, None
    start = keys[0]
    if not chosen:
        steady = c.filter("steady")["key"]
        start = int(steady.min()) if steady.len() else keys[0]  # type: ignore[arg-type]
    est = est.filter(pl.col("key") >= start)
    kept = est.filter(pl.col("est").cum_sum() <= max_events)["key"].to_list() or est["key"].head(1).to_list()
    why = (f"{len(kept)} of {len(keys)} cycles shown ({kept[0]}–{kept[-1]}): the timeline is bounded to "
           f"{max_events:,} events (--max-events; 0 for no bound, or --cycles A:B for others)")
    return kept, why


# ---- the events ---------------------------------------------------------------------------------------------

_US = 1000.0


def _x(df: pl.DataFrame, name: pl.Expr, cat: str, pid: pl.Expr, tid: pl.Expr, start: str, end: str,
       args: list[pl.Expr | str] | None = None, level: int = 0) -> pl.DataFrame:
    """Complete ("X") events, one per row of ``df``: ``line`` (the event's JSON) and the sort keys."""
    ev = df.select(name=name, cat=pl.lit(cat), ph=pl.lit("X"),
                   ts=pl.col(start).cast(pl.Float64) / _US, dur=(pl.col(end) - pl.col(start)).cast(pl.Float64) / _US,
                   pid=pid, tid=tid,
                   **({"args": pl.struct(*args)} if args else {}),
                   _t=pl.col(start), _d=pl.col(end) - pl.col(start), _l=pl.lit(level))
    return _lines(ev.filter(pl.col("_d") > 0))


def _lines(ev: pl.DataFrame) -> pl.DataFrame:
    """``line`` (each event as JSON), ``_t``, ``_d``, ``_l`` (sort keys: start ns, duration ns, level)."""
    if ev.height == 0:
        return pl.DataFrame(schema={"line": pl.String, "_t": pl.Int64, "_d": pl.Int64, "_l": pl.Int32})
    keys = ev.select(pl.col("_t").cast(pl.Int64), pl.col("_d").cast(pl.Int64), pl.col("_l").cast(pl.Int32))
    text = ev.drop("_t", "_d", "_l").write_ndjson()
    return keys.with_columns(line=pl.Series(text.splitlines(), dtype=pl.String)).select("line", "_t", "_d", "_l")


def _meta_event(kind: str, pid: int, tid: int | None, args: dict) -> str:
    ev: dict[str, Any] = {"name": kind, "ph": "M", "pid": pid, "args": args}
    if tid is not None:
        ev["tid"] = tid
    return json.dumps(ev, ensure_ascii=False)


def _us(col: str) -> pl.Expr:
    return (pl.col(col).cast(pl.Float64) / _US).round(3).alias(col.replace("_ns", "_us"))


def _gpu_rows(inst: pl.DataFrame, seams: pl.DataFrame) -> pl.DataFrame:
    """The GPU thread's slices before they become events: ``rank, level, start, end, name, kind, id, parent, top``
    (one row per range's GPU span and per seam)."""
    rng = inst.select(
        "rank", level=pl.col("depth").cast(pl.Int64) - 1, start=pl.when(pl.col("leaf")).then("x_first").otherwise("i_first"),
        end=pl.when(pl.col("leaf")).then("x_last").otherwise("i_last"),
        name=pl.when(pl.col("cyc_key").is_not_null()).then(pl.format("{} {}", "range", "cyc_key")).otherwise("range"),
        kind=pl.lit("range"), id="range_id", parent="parent", top="top")
    sm = seams.select(
        "rank", level=pl.col("p_depth").fill_null(0).cast(pl.Int64),
        start="a", end="b",
        name=pl.when(pl.col("parent").is_null()).then(pl.lit("between cycles")).otherwise(
            pl.format("seam {}→{}", "prev_range", "range"))
        + pl.when(pl.col("cause").is_not_null()).then(pl.format(" · {}-bound", "cause")).otherwise(pl.lit("")),
        kind=pl.lit("seam"), id=-pl.col("range_id") - 1, parent="parent", top="s_top")
    return pl.concat([rng, sm], how="vertical_relaxed").filter(pl.col("end") > pl.col("start"))


def _overlapping(rows: pl.DataFrame) -> pl.Series:
    """Per row of ``rows`` (GPU slices), whether it overlaps an earlier slice of its rank and level (and so cannot
    nest on the GPU thread)."""
    s = rows.with_row_index("_i").sort("rank", "level", "start", pl.col("end"), descending=[False, False, False, True])
    prev = pl.col("end").cum_max().shift(1).over("rank", "level")
    bad = s.select("_i", bad=(pl.col("start") < prev).fill_null(False))
    return bad.sort("_i")["bad"]


def _split(ops: pl.DataFrame, leaves: pl.DataFrame) -> pl.DataFrame:
    """Each leaf range's GPU span cut into ``compute``, ``comm`` and ``idle`` intervals: ``rank, id, start, end,
    part``. Its operations are those of its rank inside its span; busy = their union, comm = the union of the
    communication kernels, compute = busy − comm, idle = span − busy (as :mod:`analyze.compute.breakdown`)."""
    schema = {"rank": pl.Int64, "id": pl.Int64, "start": pl.Int64, "end": pl.Int64, "part": pl.String}
    if ops.height == 0 or leaves.height == 0:
        return pl.DataFrame(schema=schema)
    lv = leaves.select("rank", "id", "start", "end").sort("rank", "start")
    o = (ops.select("rank", o_start="start", o_end="end", c=pl.col("comm").is_not_null()).sort("rank", "o_start")
         .join_asof(lv, left_on="o_start", right_on="start", by="rank", strategy="backward",
                    check_sortedness=False)  # sorted by rank, then start
         .filter(pl.col("id").is_not_null() & (pl.col("o_end") <= pl.col("end")) & (pl.col("o_end") > pl.col("o_start"))))
    if o.height == 0:
        return pl.DataFrame(schema=schema)

    # No window function per leaf (thousands of small groups): rows sorted by leaf, then start, and a leaf's times
    # lifted by its rank in that order (``_lift``) so that a running max or sum over all rows never carries from
    # one leaf into the next; a leaf's deltas sum to zero, so running sums need no reset at all.
    lo = int(lv["start"].min())  # type: ignore[arg-type]  # (ints)
    span = int(lv["end"].max()) - lo + 1  # type: ignore[arg-type]
    order = lv.select("id").unique().sort("id").with_columns(_lift=pl.int_range(pl.len(), dtype=pl.Int64) * span)
    if order.height * span >= 1 << 62:  # (never for a capture's nanoseconds; kept exact anyway)
        raise InputError("the timeline's window is too long to lay out", "BAD_OPTION")
    o = o.join(order, on="id").with_columns(pl.col("o_start", "o_end") - lo + pl.col("_lift"))

    def runs(x: pl.DataFrame) -> pl.DataFrame:
        x = x.sort("o_start")  # leaf by leaf (lifted), by start within each
        new = (pl.col("o_start") > pl.col("o_end").cum_max().shift(1)).fill_null(True)
        return (x.with_columns(_r=new.cast(pl.Int64).cum_sum())
                .group_by("_r").agg(pl.col("rank").first(), pl.col("id").first(), pl.col("_lift").first(),
                                    a=pl.col("o_start").min(), b=pl.col("o_end").max()))

    busy, comm = runs(o), runs(o.filter("c"))
    lvl = lv.join(order, on="id").with_columns(pl.col("start", "end") - lo + pl.col("_lift"))
    edges = pl.concat([
        busy.select("rank", "id", "_lift", t="a", db=pl.lit(1), dc=pl.lit(0)),
        busy.select("rank", "id", "_lift", t="b", db=pl.lit(-1), dc=pl.lit(0)),
        comm.select("rank", "id", "_lift", t="a", db=pl.lit(0), dc=pl.lit(1)),
        comm.select("rank", "id", "_lift", t="b", db=pl.lit(0), dc=pl.lit(-1)),
        lvl.select("rank", "id", "_lift", t="start", db=pl.lit(0), dc=pl.lit(0)),
        lvl.select("rank", "id", "_lift", t="end", db=pl.lit(0), dc=pl.lit(0)),
    ])
    same = pl.col("id") == pl.col("id").shift(-1)
    seg = (edges.group_by("t").agg(pl.col("rank", "id", "_lift").first(), pl.col("db").sum(), pl.col("dc").sum())
           .sort("t")
           .with_columns(b=pl.col("db").cum_sum(), c=pl.col("dc").cum_sum(), nxt=pl.when(same).then(pl.col("t").shift(-1)))
           .filter(pl.col("nxt").is_not_null() & (pl.col("nxt") > pl.col("t")))
           .with_columns(part=pl.when(pl.col("c") > 0).then(pl.lit("comm")).when(pl.col("b") > 0).then(pl.lit("compute"))
                         .otherwise(pl.lit("idle"))))
    # consecutive intervals of one kind (and leaf): one slice
    run = ((pl.col("part") != pl.col("part").shift(1)) | (pl.col("id") != pl.col("id").shift(1))).fill_null(True)
    return (seg.with_columns(_g=run.cast(pl.Int64).cum_sum()).group_by("_g")
            .agg(pl.col("rank", "id", "part", "_lift").first(), start=pl.col("t").min(), end=pl.col("nxt").max())
            .with_columns(pl.col("start", "end") - pl.col("_lift") + lo)
            .select(list(schema)).sort("rank", "id", "start"))


@dataclass
class _Window:
    keys: list[int]
    spans: pl.DataFrame  # key, a, b: each shown cycle's period on the GPU, over ranks (session clock, ns)
    intervals: list[tuple[int, int]]  # the merged time intervals shown


def _window(res: Result, keys: list[int]) -> _Window:
    """The shown cycles' time: each from the earliest of its CPU range, its GPU work and its period's start, to
    the next cycle's CPU start (the host's work after it: result processing, scheduling), over ranks; the run's
    first cycle from the capture's first range, its last to the capture's last."""
    every = cycle_budget.kind_cycles(res)
    lo = pl.min_horizontal(pl.col("start"), pl.col("i_first"),
                           pl.col("i_last") - pl.col("period_ns").fill_null(pl.col("i_last") - pl.col("i_first")))
    # the run's first and last cycles reach out to the first and last range of the capture (a prefill, a range
    # before the first cycle, the host's work after the last)
    inst = res.instances.filter(pl.col("rank").is_not_null())
    rng = res.trace.ranges.filter(pl.col("pid").is_in(res.ranks["pid"].implode()) & pl.col("end").is_not_null())
    first = pl.concat([inst.select(t=pl.min_horizontal(pl.col("start").min(), pl.col("i_first").min())),
                       rng.select(t=pl.col("start").min())])["t"].min()
    last = pl.concat([inst.select(t=pl.max_horizontal(pl.col("end").max(), pl.col("i_last").max())),
                      rng.select(t=pl.col("end").max())])["t"].max()
    allspans = (every.group_by("key").agg(a=lo.min(), b=pl.max_horizontal("end", "i_last").max(),
                                          s=pl.col("start").min()).sort("key")
                .with_columns(b=pl.max_horizontal("b", (pl.col("s").shift(-1) - 1).fill_null(last)),
                              a=pl.when(pl.int_range(pl.len()) == 0).then(pl.min_horizontal("a", pl.lit(first)))
                              .otherwise("a")))
    c = every.filter(pl.col("key").is_in(keys))
    spans = allspans.filter(pl.col("key").is_in(keys)).select("key", "a", "b")
    # a cycle on the GPU, over ranks: its period (previous cycle's last op → its last op), clipped so that
    # consecutive cycles do not overlap (they nest on an annotation track)
    gpu_lo = pl.col("i_last") - pl.col("period_ns").fill_null(pl.col("i_last") - pl.col("i_first"))
    gpu = (c.group_by("key").agg(a=gpu_lo.min(), b=pl.col("i_last").max()).sort("key")
           .with_columns(a=pl.max_horizontal("a", pl.col("b").shift(1).fill_null(pl.col("a")))))
    merged = (spans.sort("a").with_columns(_n=(pl.col("a") > pl.col("b").cum_max().shift(1)).fill_null(True)
                                           .cast(pl.Int64).cum_sum())
              .group_by("_n").agg(pl.col("a").min(), pl.col("b").max()).sort("a"))
    return _Window(keys, gpu.filter(pl.col("b") > pl.col("a")),
                   [(int(a), int(b)) for a, b in merged.select("a", "b").rows()])


def _inside(df: pl.DataFrame, w: _Window, start: str, end: str) -> pl.DataFrame:
    """The rows of ``df`` whose ``[start, end)`` overlaps a shown interval."""
    if df.height == 0:
        return df
    cond = pl.lit(False)
    if len(w.intervals) <= 64:
        for a, b in w.intervals:
            cond = cond | ((pl.col(end) > a) & (pl.col(start) < b))
        return df.filter(cond)
    iv = pl.DataFrame({"_a": [a for a, _ in w.intervals], "_b": [b for _, b in w.intervals]}).sort("_a")
    return (df.with_row_index("_i").sort(start).join_asof(iv, left_on=start, right_on="_a", strategy="backward")
            .filter(pl.col("_b").is_not_null() & (pl.col(start) < pl.col("_b"))).sort("_i").drop("_i", "_a", "_b"))


def _ops(res: Result, w: _Window) -> pl.DataFrame:
    parts = []
    ivs = w.intervals if len(w.intervals) <= 64 else [(w.intervals[0][0], w.intervals[-1][1])]
    for a, b in ivs:
        parts.append(res.ops_between(a, b + 1))
    ops = pl.concat(parts) if parts else res.ops_between(0, 0)
    return _inside(ops, w, "start", "end") if len(ivs) != len(w.intervals) else ops


def _instances(res: Result, w: _Window) -> pl.DataFrame:
    """The ranges with GPU work in the window: ``leaf`` (no child range with GPU work), ``top`` (outermost range),
    ``cyc_key`` (a cycle's number), ``left_out``."""
    c = cycle_budget.kind_cycles(res).select("rank", "range_id", cyc_key="key")
    inst = (res.steady.instances.filter(pl.col("rank").is_not_null() & (pl.col("i_ops") > 0))
            .join(c.select("rank", top="range_id", _top_key="cyc_key"), on=["rank", "top"], how="left"))
    # a cycle's ranges when the cycle is shown (not a neighbour reaching into its time on another rank); ranges
    # outside cycles (prefill, before the first) by time
    inst = pl.concat([inst.filter(pl.col("_top_key").is_in(w.keys)),
                      _inside(inst.filter(pl.col("_top_key").is_null()), w, "i_first", "i_last")]).drop("_top_key")
    kids = inst.filter(pl.col("parent").is_not_null()).select("rank", range_id="parent").unique()
    return (inst.join(kids.with_columns(_has=pl.lit(True)), on=["rank", "range_id"], how="left")
            .join(c, on=["rank", "range_id"], how="left")
            .with_columns(leaf=pl.col("_has").is_null()).drop("_has"))


def _rank_names(res: Result) -> dict[int, str]:
    r = res.ranks
    out = {}
    for row in r.iter_rows(named=True):
        bits = [f"rank {row['rank']}", f"pid {row['pid']}"]
        if row.get("device") is not None:
            bits.append(f"GPU {row['device']}" + (f" {row['device_name']}" if row.get("device_name") else ""))
        out[int(row["rank"])] = " · ".join(bits)
    return out


def _host(res: Result, w: _Window, inst: pl.DataFrame) -> tuple[pl.DataFrame, list[str]]:
    """Host-thread events (module docstring) and the threads' metadata events."""
    parts = []
    ranks = res.ranks
    first = ranks.filter(pl.col("report") == 0) if "report" in ranks.columns else ranks
    rng = res.trace.ranges
    found = rng.filter(pl.col("range").str.contains(SCHEDULER) & pl.col("end").is_not_null()) if rng.height else rng
    sched = (found.join(first.select("pid", "rank"), on="pid").select(
        "rank", "gtid", "start", "end", "range", "event_type", "cross_thread", "range_id") if found.height else None)
    ph = _inside(res.steady.instances.filter(pl.col("rank").is_not_null()), w, "start", "end").join(
        cycle_budget.kind_cycles(res).select("rank", "range_id", cyc_key="key"), on=["rank", "range_id"], how="left").select(
        "rank", "gtid", "start", "end", "range", "event_type", "cross_thread", "range_id", cat=pl.lit("phase"),
        key="cyc_key")
    frames = [ph]
    if sched is not None and sched.height:
        frames.append(_inside(sched, w, "start", "end").with_columns(cat=pl.lit("scheduler"),
                                                                       key=pl.lit(None, pl.Int64)))
    host = pl.concat(frames, how="vertical_relaxed").filter(pl.col("end") > pl.col("start"))
    calls = res.host_calls
    api = None
    if calls is not None and calls.height:
        names = res.trace.names
        api = (_inside(calls.filter(pl.col("sync") | pl.col("graph")), w, "start", "end")
               .join(names, on="name_id", how="left")
               .select("rank", "gtid", "start", "end", name=pl.col("name").fill_null("CUDA API"),
                       wait_ns=pl.col("wait_ns").fill_null(0)))
    threads = pl.concat([host.select("rank", "gtid"), *([api.select("rank", "gtid")] if api is not None else [])]
                        ).drop_nulls().unique().sort("rank", "gtid")
    threads = threads.with_columns(tid=pl.int_range(pl.len()).over("rank") + _HOST_TID0)
    meta = [_meta_event("thread_name", int(r) + 1, int(t), {"name": f"host thread {int(g) % (1 << 24)}"})
            for r, g, t in threads.rows()]
    meta += [_meta_event("thread_sort_index", int(r) + 1, int(t), {"sort_index": int(t)}) for r, _, t in threads.rows()]
    host = host.join(threads, on=["rank", "gtid"], how="left")
    nests = (pl.col("event_type") == _PUSH_POP) & ~pl.col("cross_thread").fill_null(False)
    sync = host.filter(nests)
    parts.append(_x(sync, pl.col("range"), "nvtx", pl.col("rank") + 1, pl.col("tid"), "start", "end",
                    [pl.col("cat").alias("kind"), "range_id", pl.col("key").alias("cycle")]))
    asy = host.filter(~nests)
    if asy.height:  # may overlap: async slices, one id each
        base = asy.select(name="range", cat=pl.lit("nvtx async"), pid=pl.col("rank") + 1, tid="tid",
                          id=pl.format("r{}-{}", "rank", "range_id"))
        b = base.with_columns(ph=pl.lit("b"), ts=asy["start"].cast(pl.Float64) / _US,
                              _t=asy["start"], _d=asy["end"] - asy["start"], _l=pl.lit(0))
        e = base.with_columns(ph=pl.lit("e"), ts=asy["end"].cast(pl.Float64) / _US,
                              _t=asy["end"], _d=pl.lit(0, pl.Int64), _l=pl.lit(0))
        parts += [_lines(b), _lines(e)]
    if api is not None and api.height:
        api = api.join(threads, on=["rank", "gtid"], how="left")
        parts.append(_x(api, pl.col("name"), "cuda_api", pl.col("rank") + 1, pl.col("tid"), "start", "end",
                        [_us("wait_ns")], level=9))
    return pl.concat(parts), meta


def _gpu(res: Result, w: _Window, inst: pl.DataFrame, ops: pl.DataFrame) -> tuple[pl.DataFrame, dict[str, int]]:
    """GPU-thread events (module docstring); the counts of what went to the overlap tracks."""
    depth = inst.select("rank", parent="range_id", p_depth=pl.col("depth").cast(pl.Int64))
    top = inst.select("rank", parent="range_id", s_top="top")
    si = res.seam_instances
    seams = (_inside(si, w, "a", "b").join(depth, on=["rank", "parent"], how="left")
             .join(top, on=["rank", "parent"], how="left")
             .with_columns(s_top=pl.coalesce("s_top", "range_id"))
             .join(cycle_budget.kind_cycles(res).select("rank", s_top="range_id", _k="key"), on=["rank", "s_top"], how="left")
             .filter(pl.col("parent").is_null() | pl.col("_k").is_in(w.keys)).drop("_k") if si.height else
             pl.DataFrame(schema={"rank": pl.Int64, "p_depth": pl.Int64, "a": pl.Int64, "b": pl.Int64,
                                  "parent": pl.Int64, "prev_range": pl.String, "range": pl.String, "cause": pl.String,
                                  "range_id": pl.Int64, "s_top": pl.Int64, "idle_ns": pl.Int64,
                                  "late_ns": pl.Int64, "block_ns": pl.Int64}))
    rows = _gpu_rows(inst, seams)
    rows = rows.with_columns(bad=_overlapping(rows))
    bad_ids = rows.filter("bad")["id"].to_list()
    moved = rows.filter(pl.col("bad") | pl.col("top").is_in(bad_ids) | pl.col("parent").is_in(bad_ids))
    moved_ids = set(moved["id"].to_list())
    keep = rows.filter(~pl.col("id").is_in(list(moved_ids)))
    leaves = inst.filter("leaf").select("rank", id="range_id", start="x_first", end="x_last", range="range")
    parts = _split(ops, leaves)
    info = inst.select("rank", id="range_id", cyc=pl.col("cyc_key"), steady="steady", left_out="left_out",
                       span_ns="x_span_ns", compute_ns="x_compute_ns", comm_ns="x_comm_ns", idle_ns="x_idle_ns",
                       gpu_idle_ns="x_gpu_idle_ns", ops="x_ops")
    rng = keep.filter(pl.col("kind") == "range").join(info, on=["rank", "id"], how="left")
    sm = keep.filter(pl.col("kind") == "seam").join(
        seams.select("rank", id=-pl.col("range_id") - 1, idle_ns="idle_ns", late_ns="late_ns", block_ns="block_ns"),
        on=["rank", "id"], how="left")
    pid, tid = pl.col("rank") + 1, pl.lit(_GPU_TID)
    out = [
        _x(rng, pl.col("name"), "gpu", pid, tid, "start", "end",
           [pl.col("id").alias("range_id"), pl.col("cyc").alias("cycle"), "steady", "left_out", _us("span_ns"),
            _us("compute_ns"), _us("comm_ns"), _us("idle_ns"), _us("gpu_idle_ns"), "ops"],
           level=1),
        _x(sm, pl.col("name"), "seam", pid, tid, "start", "end", [_us("idle_ns"), _us("late_ns"), _us("block_ns")],
           level=1),
    ]
    p_keep = parts.filter(~pl.col("id").is_in(list(moved_ids)))
    out.append(_x(p_keep, pl.col("part"), "split", pid, tid, "start", "end", level=3))
    # what cannot nest: async slices on one track per rank, each range and its split under one id
    if moved.height:
        asy = pl.concat([moved.select("rank", "start", "end", "name", "id", grp=pl.coalesce(
                             pl.when(pl.col("id").is_in(bad_ids)).then("id"), "top")),
                         parts.filter(pl.col("id").is_in(list(moved_ids))).select(
                             "rank", "start", "end", name="part", id="id", grp="id")], how="vertical_relaxed")
        base = asy.select("name", cat=pl.lit("gpu overlapping"), pid=pl.col("rank") + 1, tid=tid,
                          id=pl.format("g{}-{}", "rank", "grp"))
        out += [_lines(base.with_columns(ph=pl.lit("b"), ts=asy["start"].cast(pl.Float64) / _US, _t=asy["start"],
                                         _d=asy["end"] - asy["start"], _l=pl.lit(1))),
                _lines(base.with_columns(ph=pl.lit("e"), ts=asy["end"].cast(pl.Float64) / _US, _t=asy["end"],
                                         _d=pl.lit(0, pl.Int64), _l=pl.lit(1)))]
    return pl.concat(out), {"overlapping_ranges": int(moved.filter(pl.col("kind") == "range").height)}


def _counters(res: Result, w: _Window) -> tuple[pl.DataFrame, list[str]]:
    c = cycle_budget.kind_cycles(res).filter(pl.col("key").is_in(w.keys) & pl.col("period_ns").is_not_null())
    ev = c.select(name=pl.lit("cycle period µs"), ph=pl.lit("C"), ts=pl.col("i_last").cast(pl.Float64) / _US,
                  pid=pl.col("rank") + 1, args=pl.struct(period=(pl.col("period_ns") / _US).round(3)),
                  _t="i_last", _d=pl.lit(0), _l=pl.lit(0))
    out = [_lines(ev)]
    notes: list[str] = []
    samples = _gpu_metrics(res, w)
    if samples is not None and samples.height:
        out.append(_lines(samples))
    elif samples is not None:
        notes.append("no GPU-metrics samples in the window")
    return pl.concat(out), notes


_METRICS = ("sm_active_pct", "tensor_active_pct", "dram_read_pct", "dram_write_pct")


def _gpu_metrics(res: Result, w: _Window) -> pl.DataFrame | None:
    """Counter events of the main GPU metrics per rank in the window (None when the capture has none)."""
    from ..read import gpu_metrics

    paths = res.reports or [res.trace.path]
    r = res.ranks
    rep = pl.col("report").cast(pl.Int64) if "report" in r.columns else pl.lit(0, pl.Int64)
    gpus = r.select(pl.col("rank").cast(pl.Int64), rep.alias("report"), pl.col("device").cast(pl.Int64).alias("gpu"))
    frames, have = [], False
    for i, p in enumerate(paths):
        try:
            s = gpu_metrics.read(p)
        except (InputError, OSError):
            continue
        if s is None:
            continue
        have = True
        x = s.samples.filter(pl.col("metric").is_in(_METRICS))
        x = _inside(x, w, "start", "end")
        x = x.join(gpus.filter(pl.col("report") == i).drop("report"), on="gpu")
        if x.height:
            frames.append(x)
    if not frames:
        return pl.DataFrame() if have else None
    x = pl.concat(frames).pivot(on="metric", index=["rank", "start"], values="value", aggregate_function="mean")
    ms = [m for m in _METRICS if m in x.columns]
    return x.sort("rank", "start").select(
        name=pl.lit("GPU metrics % of peak"), ph=pl.lit("C"), ts=pl.col("start").cast(pl.Float64) / _US,
        pid=pl.col("rank") + 1, args=pl.struct(*[pl.col(m).cast(pl.Float64).alias(m.removesuffix("_pct")) for m in ms]),
        _t="start", _d=pl.lit(0), _l=pl.lit(0))


# ---- annotations ------------------------------------------------------------------------------------------------


def _annotations(res: Result, w: _Window) -> tuple[pl.DataFrame, list[str], dict]:
    """The annotation process: a track per class of slower cycles, straggler verdict and finding (module
    docstring); its events, metadata events, and what it lists (``otherData.annotations``)."""
    classes = class_cycles(res)
    found = res.steady.findings
    straggler = res.steady.straggler
    tracks: list[tuple[str, str, list[int] | None, dict]] = []  # thread name, slice name, cycles (None: all), args
    for cl, ck in classes:
        tracks.append((f"slower cycles: {cl.label}", cl.label, ck, {
            "label": cl.label, "text": cl.text, "kept": cl.kept, "cycles": cl.affected,
            "extra_us": round(cl.extra_ns / _US, 1), "typical_us": round(cl.typical_ns / _US, 1),
            "per_cycle_us": round(cl.per_cycle_ns / _US, 1), "rank": cl.rank, "phase": cl.phase, "piece": cl.piece,
            "waiting_ranks": ", ".join(map(str, cl.waiting_ranks)) or None}))
    for v in straggler.iter_rows(named=True):
        keys_v: list[int] | None = next((k for cl, k in classes if cl.kept and cl.waiting_ranks and cl.rank == v["rank"]
                       and cl.phase == v["phase"]), None)
        tracks.append((f"straggler: rank {v['rank']} in {v['phase']}", f"straggler rank {v['rank']} · {v['phase']}",
                       keys_v, {
                           "rank": v["rank"], "phase": v["phase"], "others_wait_us_per_cycle": round(
                               v["per_cycle_ns"] / _US, 1),
                           "share_of_waiting_pct": round(100 * v["wait_share"], 1),
                           "last_arrivals": v["last_arrivals"], "collectives": v["collectives"],
                           "mean_delay_us": round(v["mean_delay_ns"] / _US, 1),
                           "cycles": "its class's" if keys_v else "every steady cycle"}))
    for i, f in enumerate(found, 1):
        keys_f: list[int] | None = finding_cycles(res, f, classes) or None
        where = ", ".join(x for x in (f.phase, None if f.rank is None else f"rank {f.rank}") if x)
        tracks.append((f"finding {i}: {f.code}" + (f" · {where}" if where else ""), f"{f.code}" +
                       (f" · {where}" if where else ""), keys_f, {
                           "rank_in_list": i, "code": f.code, "severity": f.severity, "phase": f.phase,
                           "rank": f.rank, "every": f.every, "impact_us_per_cycle": round(f.impact_ns / _US, 1),
                           "share_of_cycle_pct": round(100 * f.share, 1), "evidence": f.evidence, "action": f.action,
                           "cycles": "named" if keys_f else "every steady cycle"}))
    spans = w.spans
    rows = []
    meta = [_meta_event("process_name", _ANNOT_PID, None, {"name": "spectrace: findings, stragglers, slower cycles"}),
            _meta_event("process_sort_index", _ANNOT_PID, None, {"sort_index": -1})]
    shown: dict[str, list] = {"classes": [], "stragglers": [], "findings": []}
    whole = [(a, b) for a, b in w.intervals]
    for t, (thread, name, keys, args) in enumerate(tracks, 1):
        meta.append(_meta_event("thread_name", _ANNOT_PID, t, {"name": thread}))
        meta.append(_meta_event("thread_sort_index", _ANNOT_PID, t, {"sort_index": t}))
        if keys is None:
            ivs, which = whole, [None] * len(whole)
        else:
            on = spans.filter(pl.col("key").is_in(keys))
            ivs, which = [(int(a), int(b)) for a, b in on.select("a", "b").rows()], on["key"].to_list()
        group = ("classes" if thread.startswith("slower") else "stragglers" if thread.startswith("straggler")
                 else "findings")
        shown[group].append({"track": thread, "cycles_in_window": len(ivs) if keys is not None else None})
        for (a, b), k in zip(ivs, which):
            rows.append({"name": name, "tid": t, "a": a, "b": b, "cycle": k, "args": json.dumps(args, ensure_ascii=False)})
    if not rows:
        return _lines(pl.DataFrame()), meta, shown
    df = pl.DataFrame(rows, schema={"name": pl.String, "tid": pl.Int64, "a": pl.Int64, "b": pl.Int64,
                                    "cycle": pl.Int64, "args": pl.String})
    # args differ per track: each event written by json (a few hundred at most)
    lines = [json.dumps({"name": r["name"], "cat": "annotation", "ph": "X", "ts": r["a"] / _US,
                         "dur": (r["b"] - r["a"]) / _US, "pid": _ANNOT_PID, "tid": r["tid"],
                         "args": {**({"cycle": r["cycle"]} if r["cycle"] is not None else {}),
                                  **json.loads(r["args"])}}, ensure_ascii=False)
             for r in df.iter_rows(named=True)]
    ev = df.select(line=pl.Series(lines, dtype=pl.String), _t="a", _d=pl.col("b") - pl.col("a"), _l=pl.lit(0, pl.Int32))
    return ev.filter(pl.col("_d") > 0), meta, shown


# ---- the document -----------------------------------------------------------------------------------------------


def build(res: Result, cycles: str | None = None, max_events: int = DEFAULT_MAX_EVENTS) -> Timeline:
    """The timeline of ``res`` (module docstring): the cycles ``cycles`` names (default every cycle), at most
    ``max_events`` events (0: no bound)."""
    keys, what = choose(res, cycles)
    chosen = cycles not in (None, "")
    keys, cut = _bounded(res, keys, chosen, max_events)
    tl = _build(res, keys, what, cut, max_events)
    if max_events and tl.events > max_events and len(keys) > 1:  # the estimate was short: once more, by the count
        est = float(_estimate(res, cycle_budget.kind_cycles(res).filter(pl.col("key").is_in(keys)))["est"].sum())
        keys, cut = _bounded(res, keys, True, max_events, scale=tl.events / max(est, 1.0))
        tl = _build(res, keys, what, cut or f"{len(keys)} cycles shown: bounded to {max_events:,} events", max_events)
    return tl


def _build(res: Result, keys: list[int], what: str, cut: str | None, max_events: int) -> Timeline:
    from .. import __version__

    w = _window(res, keys)
    inst = _instances(res, w)
    ops = _ops(res, w)
    host, host_meta = _host(res, w, inst)
    gpu, overlap = _gpu(res, w, inst, ops)
    counters, notes = _counters(res, w)
    ann, ann_meta, shown = _annotations(res, w)
    ev = pl.concat([host, gpu, counters, ann]).sort("_t", "_d", "_l", descending=[False, True, False])
    names = _rank_names(res)
    meta_ev = []
    for r, label in sorted(names.items()):
        meta_ev += [_meta_event("process_name", r + 1, None, {"name": label}),
                    _meta_event("process_sort_index", r + 1, None, {"sort_index": r}),
                    _meta_event("thread_name", r + 1, _GPU_TID, {"name": "GPU: cycles › phases, seams › compute, "
                                                                         "comm, idle"}),
                    _meta_event("thread_sort_index", r + 1, _GPU_TID, {"sort_index": 0})]
    meta_ev += host_meta + ann_meta
    meta = {
        "spectrace_version": __version__, "tool": "spectrace timeline",
        "reports": res.reports or [res.trace.path],
        "cycles": what, "cycles_shown": len(keys), "first_cycle": keys[0] if keys else None,
        "last_cycle": keys[-1] if keys else None, "cut": cut, "max_events": max_events or None,
        "events": ev.height + len(meta_ev), "steady_state": res.steady.selection["text"],
        "clock": "the capture's session clock; ts and dur in µs (three decimals: ns)",
        "gpu_thread": "top-level ranges' GPU spans and the GPU idle between them (named by its cause: gpu-, launch- "
                      "or host-bound); inside, phases and seams; inside each phase compute / comm / idle",
        "overlapping_ranges": overlap["overlapping_ranges"], "notes": notes, "annotations": shown,
    }
    body = ",\n".join([*meta_ev, *ev["line"].to_list()])
    text = '{"traceEvents":[\n' + body + '\n],\n"otherData":' + json.dumps(meta, ensure_ascii=False) + "}\n"
    return Timeline(text=text, events=ev.height + len(meta_ev), keys=keys, cut=cut, meta=meta)


def write(res: Result, path: str | os.PathLike, cycles: str | None = None, max_events: int = DEFAULT_MAX_EVENTS,
          inputs=None, force: bool = False) -> tuple[Path, Timeline]:
    """Build the timeline and write it to ``path`` (new, or replaced with ``force``; never an input; renamed into
    place when complete: :mod:`analyze.output.targets`); gzip-compressed when ``path`` ends in ``.gz``."""
    inputs = list(inputs) if inputs is not None else (res.reports or [res.trace.path])
    targets.check_file(path, inputs, "-o", replace=force)  # before the work
    tl = build(res, cycles, max_events)
    with targets.as_input_error():
        real = files.write_new(path, tl.data(gz=str(path).endswith(".gz")), option="-o", what="the timeline",
                               inputs=targets.inputs_of(inputs), fences=targets.fences(path, inputs), replace=force)
    return real, tl
