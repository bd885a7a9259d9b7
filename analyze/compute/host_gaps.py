"""Host-gap anatomy: what the launching thread did while the GPU waited for it, by item, per steady cycle.

For every host-bound gap of a steady cycle (between cycles, and every seam whose cause is ``host``), the launching
thread's *host window* (:mod:`analyze.compute.host_windows`: from the end of the earlier GPU work, ``a``, to the
start of the call that launched the next range's first GPU op) is cut into pieces, each given to one item:

- a **host range** open on that thread: SGLang's scheduler ranges (``SGLANG_ENABLE_NVTX_SCHEDULER=1``, default NVTX
  domain) and the hooks' (``spectrace.host`` domain), both named ``scheduler.<method>`` (:data:`HOST_RANGE`: the
  same item whatever the domain); nested ranges give their time to the innermost; a range that crosses the
  window's edge gives only its part inside;
- outside every host range, a **CUDA API call** of that thread (the kept ones: ``wait``, ``launch``, ``copy``;
  :data:`analyze.compute.host_windows.API_KINDS`), named ``CUDA API: <kind>``;
- the **rest**: ``unattributed`` (no host range, no kept CUDA call).

Inside a host range the time its CUDA calls waited for the GPU is counted too (``wait_ns``, part of the range's
``ns``). With CPU sampling in the capture (``spectrace trace --cpu-sampling``), the samples of that thread inside
the windows are given to the same items, with their top native frame (:func:`analyze.read.export.cpu_samples`).

The items are summed per steady cycle (a cycle whose gap is not host-bound adds 0), per rank and gap, over the
steady state and over each segment; and for each class of slower cycles (:mod:`analyze.compute.anatomy`) the items
that grew over the typical cycles ("every 8th cycle: +510 µs in scheduler.get_next_batch_to_run").
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import polars as pl

from ..model import Result
from ..read import export, packed_keys, results
from . import attribute, cycle_budget, view
from .cycles import selection
from .host_windows import WINDOWS
from .payload import CYCLE_NAMES, base_expr
from .steady_cycles import class_label
from .steady_tables import instances_marked_steady

__all__ = ["HOST_RANGE", "UNATTRIBUTED", "ITEMS", "FRAMES", "HostGaps", "host_gaps", "item_advice"]

HOST_RANGE = r"^scheduler\."  # the host ranges: SGLang's (default domain) and the hooks' (spectrace.host)
UNATTRIBUTED = "unattributed"
_API = "CUDA API: "
_TOP_FRAMES = 3  # frames kept per item
_SHOWN = 0.1  # a class's items that grew by less than this share of its extra time are not named
ITEMS = pl.Schema({"rank": pl.Int64, "scope": pl.String, "gap": pl.String, "item": pl.String, "kind": pl.String,
                   "ns": pl.Float64, "wait_ns": pl.Float64, "share": pl.Float64, "samples": pl.Int64})
FRAMES = pl.Schema({"rank": pl.Int64, "gap": pl.String, "item": pl.String, "frame": pl.String, "samples": pl.Int64,
                    "share": pl.Float64})


@results.cacheable
@dataclass
class HostGaps:
    """The host-gap anatomy (module docstring; JSON: ``host_gaps``).

    ``items``: per rank, scope (``steady``, or a segment's key), gap (``between cycles`` or ``<from> → <to>``) and
    item: ``ns`` per steady cycle, ``wait_ns`` of it in CUDA calls that wait for the GPU, ``share`` of the gap's
    host window, ``samples``; ``windows``: per rank, scope and gap, the host window per steady cycle
    (``window_ns``), the steady cycles (``cycles``) and how many of them had a host-bound gap there
    (``host_bound``); ``classes``: per class of slower cycles, the items that grew; ``frames``: the top native
    frames of the CPU samples per item; ``python_frames``: the innermost Python frames of the Python samples
    per item (a capture with Python sampling exported with its payloads: ``spectrace trace --cpu-sampling``);
    ``has_ranges``/``sampled``: what the capture holds; ``notes``: what it
    lacks and how to capture it."""

    items: pl.DataFrame
    windows: pl.DataFrame
    classes: list[dict] = field(default_factory=list)
    frames: pl.DataFrame = field(default_factory=lambda: pl.DataFrame(schema=FRAMES))
    python_frames: pl.DataFrame = field(default_factory=lambda: pl.DataFrame(schema=FRAMES))
    has_ranges: bool = False
    sampled: bool = False
    notes: list[str] = field(default_factory=list)

    def as_dict(self) -> dict:
        d = asdict(self)
        for k in ("items", "windows", "frames", "python_frames"):
            d[k] = getattr(self, k).to_dicts()
        return d

    def top(self, gap: str, rank: int | None = None, n: int = 3) -> pl.DataFrame:
        """The ``n`` largest items of ``gap`` over the steady state (mean over ranks when ``rank`` is None)."""
        it = self.items.filter((pl.col("scope") == "steady") & (pl.col("gap") == gap))
        if rank is not None:
            it = it.filter(pl.col("rank") == rank)
        nr = max(it["rank"].n_unique(), 1)
        return (it.group_by("item", "kind").agg((pl.col("ns").sum() / nr).alias("ns"),
                                               (pl.col("wait_ns").sum() / nr).alias("wait_ns"),
                                               pl.col("samples").sum())
                .filter(pl.col("ns") > 0).sort("ns", "item", descending=[True, False]).head(n))


_WINDOWS = pl.Schema({"rank": pl.Int64, "scope": pl.String, "gap": pl.String, "window_ns": pl.Float64,
                      "cycles": pl.Int64, "host_bound": pl.Int64})


def _empty(notes: list[str]) -> HostGaps:
    return HostGaps(items=pl.DataFrame(schema=ITEMS), windows=pl.DataFrame(schema=_WINDOWS), notes=notes)


_NO_RANGES = ("no scheduler.* host ranges on the launching thread: the host windows are split by CUDA API calls "
              "alone; SGLANG_ENABLE_NVTX_SCHEDULER=1 (SGLang 0.5.14+) or spectrace trace's hooks name the scheduler "
              "functions")
_NO_SAMPLES = "no CPU samples: spectrace trace --cpu-sampling records where the host thread is in the rest"


def _hw(res: Result) -> pl.DataFrame:
    """``res.host_windows`` (empty when the result has none)."""
    hw = res.host_windows
    return pl.DataFrame(schema={**WINDOWS, "rank": pl.Int64}) if hw is None else hw


def _windows(res: Result) -> pl.DataFrame:
    """The host windows of the main cycles: ``rank, wid, gtid, start, end, gap, key, segment, steady``."""
    w = _hw(res).filter(pl.col("what") == "window").select("rank", wid="range_id", gtid="gtid", start="start",
                                                            end="end")
    si = res.seam_instances.select("rank", wid="range_id", parent="parent", prev="prev_range", nxt="range")
    inst = instances_marked_steady(res).filter(pl.col("rank").is_not_null()).select("rank", wid="range_id", top="top")
    cyc = cycle_budget.main_cycles(res).select("rank", "steady", top="range_id", key="key", segment="segment")
    between = (pl.col("parent").is_null() & base_expr("prev").is_in(CYCLE_NAMES) & base_expr("nxt").is_in(CYCLE_NAMES))
    return (w.join(si, on=["rank", "wid"]).join(inst, on=["rank", "wid"]).join(cyc, on=["rank", "top"])
            .with_columns(gap=pl.when(between).then(pl.lit(cycle_budget.GAP))
                          .otherwise(pl.format("{} → {}", "prev", "nxt")))
            .select("rank", "wid", "gtid", "start", "end", "gap", "key", "segment", "steady"))


def _host_ranges(res: Result, win: pl.DataFrame) -> pl.DataFrame:
    """The host ranges (:data:`HOST_RANGE`) of the windows' threads, nested: ``range_id, gtid, start, end, range,
    depth, parent``."""
    r = res.trace.ranges
    r = r.filter(pl.col("range").str.contains(HOST_RANGE) & ~pl.col("cross_thread")
                 & pl.col("gtid").is_in(win["gtid"].unique().implode()) & pl.col("end").is_not_null())
    return attribute.nest(r.select("range_id", "gtid", "start", "end", "range"))


def _pieces(win: pl.DataFrame, calls: pl.DataFrame, tl: pl.DataFrame, names: pl.DataFrame) -> pl.DataFrame:
    """Each window cut at every host-range boundary and CUDA call edge inside it: ``wid, gtid, s, e, range, what``
    (``range``: the innermost host range open over the piece; ``what``: the kind of the call it is in, or null).

    One sort of the edges: a call's start (+1, its kind) and end (−1) inside its window (the calls are clipped to
    it, so a running sum over all windows is each window's depth of open calls), the window's ends and the
    host-range boundaries inside it; no window function."""
    w = win.select("wid", "gtid", "start", "end")
    tlw = (tl.sort("gtid", "t").join_asof(w.select("gtid", "wid", _ws="start", _we="end").sort("gtid", "_ws"),
                                          left_on="t", right_on="_ws", by="gtid", strategy="backward",
                                          check_sortedness=False)
           .filter(pl.col("_we").is_not_null() & (pl.col("t") < pl.col("_we"))).select("wid", "gtid", "t"))
    none = pl.lit(None, pl.String)
    edges = pl.concat([
        w.select("wid", "gtid", t="start", d=pl.lit(0, pl.Int32), what=none),
        w.select("wid", "gtid", t="end", d=pl.lit(0, pl.Int32), what=none),
        tlw.select("wid", "gtid", "t", d=pl.lit(0, pl.Int32), what=none),
        calls.select("wid", "gtid", t="start", d=pl.lit(1, pl.Int32), what="what"),
        calls.select("wid", "gtid", t="end", d=pl.lit(-1, pl.Int32), what=none),
    ])
    edges = packed_keys.sort_by(edges, ["wid", "t", "d"])
    same = pl.col("wid") == pl.col("wid").shift(-1)
    pieces = (edges.with_columns(_depth=pl.col("d").cum_sum(), what=pl.col("what").forward_fill())
              .with_columns(what=pl.when(pl.col("_depth") > 0).then("what"), e=pl.when(same).then(pl.col("t").shift(-1)))
              .filter(pl.col("e").is_not_null() & (pl.col("e") > pl.col("t")))
              .select("wid", "gtid", "what", s="t", e="e"))
    if tl.height == 0:
        return pieces.with_columns(range=none)
    out = (pieces.sort("gtid", "s").join_asof(tl.sort("gtid", "t"), left_on="s", right_on="t", by="gtid",
                                              strategy="backward", check_sortedness=False).drop("t"))
    return out.join(names, left_on="current", right_on="range_id", how="left").drop("current")


def _label(df: pl.DataFrame, at: str, calls: pl.DataFrame, tl: pl.DataFrame, names: pl.DataFrame) -> pl.DataFrame:
    """``df`` (``wid, gtid``, time ``at``, sorted by ``gtid, at``) with ``range`` (the innermost host range open at
    ``at``) and ``what`` (the kind of the CUDA call of its window open at ``at``)."""
    out = df.join_asof(tl.sort("gtid", "t"), left_on=at, right_on="t", by="gtid", strategy="backward",
                       check_sortedness=False).drop("t")
    out = out.join(names, left_on="current", right_on="range_id", how="left").drop("current")
    c = calls.select("wid", _cs="start", _ce="end", _what="what").sort("wid", "_cs")
    out = (out.sort("wid", at).join_asof(c, left_on=at, right_on="_cs", by="wid", strategy="backward",
                                         check_sortedness=False)
           .with_columns(what=pl.when(pl.col(at) < pl.col("_ce")).then("_what")).drop("_cs", "_ce", "_what"))
    return out


def _item_expr() -> list[pl.Expr]:
    item = (pl.when(pl.col("range").is_not_null()).then("range")
            .when(pl.col("what").is_not_null()).then(pl.lit(_API) + pl.col("what")).otherwise(pl.lit(UNATTRIBUTED)))
    kind = (pl.when(pl.col("range").is_not_null()).then(pl.lit("range"))
            .when(pl.col("what").is_not_null()).then(pl.lit("api")).otherwise(pl.lit("rest")))
    return [item.alias("item"), kind.alias("kind")]


def _samples(res: Result, win: pl.DataFrame, calls: pl.DataFrame, tl: pl.DataFrame,
             names: pl.DataFrame, read: Callable = export.cpu_samples) -> pl.DataFrame | None:
    """The CPU samples of the windows' threads inside them, labelled: ``wid, item, kind, frame`` (None without
    sampling in the export). ``read``: :func:`analyze.read.export.cpu_samples` (native IP samples) or
    :func:`~analyze.read.export.python_samples` (Python stacks)."""
    if len(res.reports) > 1 or not Path(res.trace.path).is_file():
        return None
    s = read(res.trace.path, win["gtid"].unique().to_list())
    if s is None:
        return None
    s = (s.sort("gtid", "time").join_asof(win.select("gtid", "wid", _ws="start", _we="end").sort("gtid", "_ws"),
                                          left_on="time", right_on="_ws", by="gtid", strategy="backward",
                                          check_sortedness=False)
         .filter(pl.col("_we").is_not_null() & (pl.col("time") < pl.col("_we"))).drop("_ws", "_we"))
    return _label(s.sort("gtid", "time"), "time", calls, tl, names).with_columns(_item_expr())


@view.table()
def host_gaps(res: Result) -> HostGaps:
    """The host-gap anatomy of the steady cycles (:class:`HostGaps`, module docstring)."""
    hw = res.host_windows
    if hw is None or hw.height == 0:
        return _empty(["no host-bound gap: every seam's next launch call began before the GPU work ended"])
    allw = _windows(res)
    if allw.filter("steady").height == 0:
        return _empty(["no host-bound gap in the steady cycles"])
    calls = (hw.filter(pl.col("what") != "window").select("rank", wid="range_id", gtid="gtid", start="start",
                                                           end="end", what="what")
             .join(allw.select("rank", "wid"), on=["rank", "wid"], how="semi").drop("rank"))
    hr = _host_ranges(res, allw)
    tl = attribute.timeline(hr) if hr.height else pl.DataFrame(schema={"gtid": pl.Int64, "t": pl.Int64,
                                                                        "current": pl.Int64})
    names = hr.select("range_id", "range")
    pieces = _pieces(allw.select("wid", "gtid", "start", "end"), calls, tl, names)
    # summed per (window, range, call kind) first: the item's name is made on those few rows
    per_all = (pieces.group_by("wid", "range", "what").agg(ns=(pl.col("e") - pl.col("s")).sum())
               .with_columns(_item_expr(), wait_ns=pl.when(pl.col("what") == "wait").then("ns").otherwise(0))
               .group_by("wid", "item", "kind").agg(pl.col("ns").sum().cast(pl.Float64),
                                                    pl.col("wait_ns").sum().cast(pl.Float64)))
    win = allw.filter("steady")
    per_win = per_all.join(win.select("wid"), on="wid", how="semi")
    smp = _samples(res, win, calls, tl, names)
    notes = [] if hr.height else [_NO_RANGES]
    if smp is None or smp.height == 0:
        notes.append(_NO_SAMPLES if smp is None else "CPU samples in the capture, none of them inside the host "
                     "windows (the sampling period is longer than the gaps)")
        per_win = per_win.with_columns(samples=pl.lit(0, pl.Int64))
    else:
        per_win = (per_win.join(smp.group_by("wid", "item", "kind").agg(samples=pl.len().cast(pl.Int64)),
                                on=["wid", "item", "kind"], how="full", coalesce=True)
                   .with_columns(pl.col("ns", "wait_ns").fill_null(0.0), pl.col("samples").fill_null(0)))
    per_win = per_win.join(win.select("wid", "gap"), on="wid")
    wsum = win.with_columns(window_ns=(pl.col("end") - pl.col("start")).cast(pl.Float64))
    # every steady cycle counts (0 where its gap was not host-bound): the cycles per rank and segment
    steady = cycle_budget.main_cycles(res).filter("steady").select("rank", "key", "segment")
    scopes = [("steady", ["rank"])]
    if steady["segment"].n_unique() > 1:
        scopes.append(("segment", ["rank", "segment"]))
    items, wins = [], []
    for scope, by in scopes:
        n = steady.group_by(by).agg(_n=pl.len())
        it = (per_win.join(win.select("wid", *by), on="wid").group_by(*by, "gap", "item", "kind")
              .agg(pl.col("ns").sum(), pl.col("wait_ns").sum(), pl.col("samples").sum())
              .join(n, on=by).with_columns(pl.col("ns", "wait_ns") / pl.col("_n")).drop("_n"))
        ww = (wsum.group_by(*by, "gap").agg(window_ns=pl.col("window_ns").sum(), host_bound=pl.len().cast(pl.Int64))
              .join(n, on=by).with_columns(window_ns=pl.col("window_ns") / pl.col("_n"), cycles=pl.col("_n").cast(pl.Int64))
              .drop("_n"))
        it = it.join(ww.select(*by, "gap", "window_ns"), on=[*by, "gap"]).with_columns(
            share=pl.col("ns") / pl.col("window_ns")).drop("window_ns")
        sc = pl.lit("steady") if scope == "steady" else pl.format("segment {}", "segment")
        items.append(it.with_columns(scope=sc).select(list(ITEMS)).cast(ITEMS))  # type: ignore[arg-type]
        wins.append(ww.with_columns(scope=sc).select(list(_WINDOWS)).cast(_WINDOWS))  # type: ignore[arg-type]
    out = HostGaps(items=pl.concat(items).sort("rank", "scope", "gap", "ns", "item",
                                               descending=[False, False, False, True, False]),
                   windows=pl.concat(wins).sort("rank", "scope", "gap"), has_ranges=hr.height > 0,
                   sampled=smp is not None and smp.height > 0, notes=notes)
    if out.sampled and smp is not None:
        out.frames = _frames(smp, win)
    py = _samples(res, win, calls, tl, names, export.python_samples)
    if py is not None and py.height:
        out.python_frames = _frames(py, win)
    out.classes = _classes(res, per_all.select("wid", "item", "ns"), allw)
    return out


def _frames(smp: pl.DataFrame, win: pl.DataFrame) -> pl.DataFrame:
    """The top native frames of the samples per rank, gap and item (and over the whole gap: ``item`` null)."""
    s = smp.join(win.select("wid", "rank", "gap"), on="wid").filter(pl.col("frame").is_not_null())
    whole = s.with_columns(item=pl.lit(None, pl.String))
    both = pl.concat([s.select("rank", "gap", "item", "frame"), whole.select("rank", "gap", "item", "frame")])
    return (both.group_by("rank", "gap", "item", "frame").agg(samples=pl.len().cast(pl.Int64))
            .with_columns(share=pl.col("samples") / pl.col("samples").sum().over("rank", "gap", "item"))
            .sort("rank", "gap", "item", "samples", "frame", descending=[False, False, False, True, False],
                  nulls_last=False)
            .group_by("rank", "gap", "item", maintain_order=True).head(_TOP_FRAMES)
            .select(list(FRAMES)).cast(FRAMES))  # type: ignore[arg-type]


def _classes(res: Result, per_all: pl.DataFrame, allw: pl.DataFrame) -> list[dict]:
    """Per class of slower cycles (and the rare stalls): the items of each rank's gaps that grew over the typical
    steady cycles of the same segments, largest first (``label, rank, gap, item, class_ns, typical_ns, delta_ns,
    cycles, text``)."""
    info = selection(res)
    if not info.classes and not info.stalls:
        return []
    c = cycle_budget.main_cycles(res)
    typical = c.filter(pl.col("steady") & pl.col("cycle_class").is_null() & ~pl.col("slow")).select("rank", "key",
                                                                                                    "segment")
    groups = [(class_label(cl), c.filter((pl.col("cycle_class") == cl.id) & pl.col("slow") & pl.col("steady")))
              for cl in info.classes]
    if info.stalls:
        groups.append(("rare stalls (left out)", c.filter(pl.col("key").is_in([s.key for s in info.stalls]))))
    if not groups or typical.height == 0:
        return []
    cyc_items = (per_all.join(allw.select("wid", "rank", "key", "gap"), on="wid")
                 .group_by("rank", "key", "gap", "item").agg(pl.col("ns").sum()))
    out = []
    for label, members in groups:
        if members.height == 0:
            continue
        m = members.select("rank", "key", "segment")
        typ = typical.filter(pl.col("segment").is_in(m["segment"].unique().implode()))
        typ = typ if typ.height else typical

        def mean(which: pl.DataFrame) -> pl.DataFrame:
            n = which.group_by("rank").agg(_n=pl.len())
            return (cyc_items.join(which.select("rank", "key"), on=["rank", "key"]).group_by("rank", "gap", "item")
                    .agg(pl.col("ns").sum()).join(n, on="rank").with_columns(pl.col("ns") / pl.col("_n")).drop("_n"))

        d = (mean(m).rename({"ns": "class_ns"}).join(mean(typ).rename({"ns": "typical_ns"}),
                                                     on=["rank", "gap", "item"], how="full", coalesce=True)
             .with_columns(pl.col("class_ns", "typical_ns").fill_null(0.0))
             .with_columns(delta_ns=pl.col("class_ns") - pl.col("typical_ns")))
        extra = float(d.filter(pl.col("delta_ns") > 0)["delta_ns"].sum() or 0.0)
        grown = d.filter(pl.col("delta_ns") >= _SHOWN * max(extra, 1.0)).sort(
            "delta_ns", "rank", "item", descending=[True, False, False])
        for r in grown.iter_rows(named=True):
            out.append({"label": label, "rank": r["rank"], "gap": r["gap"], "item": r["item"],
                        "class_ns": r["class_ns"], "typical_ns": r["typical_ns"], "delta_ns": r["delta_ns"],
                        "cycles": m.filter(pl.col("rank") == r["rank"]).height,
                        "text": f"{label}: +{r['delta_ns'] / 1e3:,.1f} µs in {r['item']} ({r['gap']}, rank {r['rank']})"})
    return out


# ---- what to try, per item -----------------------------------------------------------------------------------

_OVERLAP = "SGLang's overlap scheduler (the default; off with --disable-overlap-schedule)"
_ADVICE = {
    "scheduler.recv_requests": "it polls for requests every iteration; --scheduler-recv-interval N polls every N-th",
    "scheduler.process_input_requests": "it handles the requests received each iteration; --scheduler-recv-interval N "
                                        "receives them every N-th iteration",
    "scheduler.get_next_batch_to_run": f"it runs after the GPU work ended, before the next launch; {_OVERLAP} runs it "
                                       "while the GPU runs the current batch",
    "scheduler.process_batch_result": f"it runs after the GPU work ended, before the next launch; {_OVERLAP} runs it "
                                      "while the GPU runs the next batch",
    "scheduler.run_batch": "the time inside run_batch before its first launch call (the batch's inputs prepared on the "
                           "host)",
    f"{_API}wait": "a synchronize or copy that returns after the GPU work ended (a `.tolist()` / `.item()`): copy to "
                   "pinned memory with non_blocking=True and wait on an event later",
    f"{_API}launch": "launch calls before the next range's first GPU op (launched one by one, not in its CUDA graph)",
    f"{_API}copy": "copies or memsets enqueued in the gap (a device-to-host copy to pageable memory returns only when "
                   "it is done)",
    UNATTRIBUTED: "no host range, CUDA call or CPU sample names it: capture with SGLANG_ENABLE_NVTX_SCHEDULER=1 (or "
                  "spectrace trace's hooks) and spectrace trace --cpu-sampling",
}


def item_advice(item: str) -> str:
    """What to try for one item (only what holds for it)."""
    return _ADVICE.get(item, f"host work inside {item}" if item.startswith("scheduler.") else "")
