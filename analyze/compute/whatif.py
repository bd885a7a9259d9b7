"""What if the speculative decoder drafted N steps instead? A cost model fitted on one trace, replayed on
the trace's own CPU and GPU timelines.

**Costs** (per decode cycle, from one trace at ``S0`` draft steps; phases recognised by base name with any
prefix: ``draft``, ``verify``, ``draft_extend``; a cycle is a ``cycle`` range): each phase's cost is its GPU
span (first op → last op) per cycle, taking for each cycle the *smallest* span over the TP ranks (a rank that
arrived late does not wait in its first all-reduce, so its span is the work), then the median over cycles.
For ``S`` steps (chain drafting, top-k 1: ``S + 1`` tokens verified per request):

- ``draft(S) = draft(S0) · S / S0`` (each step runs the draft model once; no fixed part);
- ``verify(S) = verify(S0) + b · (S − S0)``: ``b`` from a baseline trace (``decode_step`` verifies 1 token per
  request: the line through (1, baseline step) and (S0 + 1, verify)); without one ``b = 0``;
- ``draft_extend(S) = e0 + e1 · tokens(S)`` (Theil–Sen over the cycles when accept lengths are known);
- acceptance: ``E[k | S] = α + α² + … + α^S``, α solved so that ``E[k | S0]`` is the measured mean;
  ``tokens(S) = batch · (1 + E[k | S])``; tokens/s = tokens(S) / cycle(S).

**Cycle time: a replay** (:class:`Replay`). Each measured cycle is replayed from its first GPU phase to the
next cycle's, with every phase instance's GPU span changed by its phase's cost change (``draft(S) −
draft(S0)``, …) and everything else as the trace recorded it:

- the host runs its key calls (:mod:`analyze.compute.host`: each phase's first launch, every sync-like call) in
  order; the time between two of them is the host's own work and does not change;
- a launch call takes the time it took (a launch that returned after the earlier GPU work ended is slow,
  not blocked: it does not move with the GPU); a sync-like call returns at ``max(start + own time, the GPU
  work it waits for + return latency)``;
- the GPU runs phases in launch order (one queue per rank): a phase starts at ``max(its launch call's
  end + launch latency, the previous phase's end + device gap)``; which term bound it in the trace gives
  that term's value, the other takes its median over the phases where it bound (clipped so that the
  trace is reproduced exactly);
- only the steady-state cycles are replayed (:mod:`analyze.compute.steady_cycles`: warm-up and stalls left out, or
  the user's ``--skip-cycles``/``--window``): windows from a steady cycle's first GPU op to the next steady
  cycle's; predicted cycle = the measured cycle period (:data:`analyze.compute.tokens.DEFINITION`, what
  ``analyze``, ``compare`` and the report print) moved by the mean change of the replayed windows, so that
  the unchanged replay gives exactly that period.

Replaying the trace unchanged reproduces every measured period exactly. On a node-level CUDA-graph trace,
each graph launch call also carries node tracing's cost on the host, which grows with the graph's node
count; unless ``as_traced``, it is estimated (slope of launch time over node count across the trace's graph
launches) and removed from every graph launch before the replay, so that the prediction is for the program,
not for the traced program (the note says how much). ``--timing GRAPH`` fits on a graph-level pass instead.

Validated on real step sweeps of the embedded workload (README: "Reports, comparison and what-if").
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np
import polars as pl

from ..model import InputError, Result
from ..read import results
from ..read.manifest import speculative
from . import view
from .cycles import cycles
from .payload import base_expr
from .scalars import real_or_none, to_float, to_int
from .tokens import summary

__all__ = ["MAX_STEPS", "Replay", "Model", "SegmentModel", "fit_segments", "run_alpha", "join_runs",
           "solve_alpha", "fit", "to_dict", "validate", "MIN_LOG_LINES", "calibrate", "NEAR_BEST", "fitted",
           "with_segments", "replay", "will_replay", "phase_spans"]

_MODEL_PHASES = ("draft", "verify", "draft_extend")
MAX_STEPS = 10


def _cycle_phases(res: Result) -> pl.DataFrame:
    """Per rank and cycle (``n``): each child phase's GPU span (``x_span_ns``) by base name, one row each."""
    c = cycles(res).filter((pl.col("kind") == "cycle") & pl.col("steady")).select(
        "rank", "n", parent="range_id", tokens="tokens", accept_length="accept_length", batch_size="batch_size")
    kids = phase_spans(res)
    # on the rank too: range ids are unique per report only, and a merged result has several
    return (c.join(kids, on=["rank", "parent"])
            .group_by("rank", "n", "phase").agg(pl.col("x_span_ns").sum(), pl.col("tokens").first(),
                                                pl.col("accept_length").first(), pl.col("batch_size").first()))


@view.table(kept=False, any_choice=True)
def phase_spans(res: Result) -> pl.DataFrame:
    """The phases with GPU work (``rank, parent, x_span_ns, x_ops, phase``: by base name), whatever the cycle
    choice: made once for every batch size's view."""
    return (res.instances.select("rank", "parent", "range", "x_span_ns", "x_ops")
            .filter(pl.col("x_ops") > 0).with_columns(phase=base_expr()).drop("range"))


# ---- the replay ----------------------------------------------------------------------------------------

_ITEM_COLS = ("s", "e", "sync", "has_unit", "code", "launch_latency", "device_gap", "gpu_span", "pred", "pred_gpu_last",
              "wait", "w_off", "w_ext", "own_time", "return_latency", "trans", "nodes", "graph", "gap_nodes", "gap_launches")


@results.cacheable
@dataclass
class Replay:
    """The replayable cycles of a trace: per window (one rank's cycle, from its first phase's launch call to
    the next cycle's), the host's key calls in order (slots) and the GPU phase each one launches.

    Arrays are ``(windows, slots)``, padded with NaN. ``pred``/``wait``: the slot (same window) that launched
    the phase this one follows on the GPU / the work a sync waits for, -1 when that was launched before the
    window (then ``pred_gpu_last``/``w_ext`` hold its measured time). ``code``: index of the phase in
    :data:`_MODEL_PHASES` (-1: any other range). ``trans``: index into ``labels`` of the seam this phase ends
    (-1: not a seam inside the window's cycle).
    """

    rank: np.ndarray
    period: np.ndarray  # measured period per window
    n_items: np.ndarray
    a: dict[str, np.ndarray]
    labels: list[str]
    rest: np.ndarray  # measured periods of the cycles that could not be replayed
    defaults: dict[str, float] = field(default_factory=dict)

    @property
    def windows(self) -> int:
        return len(self.period)

    def run(self, delta: dict[str, float], cut: tuple[float, int] = (0.0, 0)) -> tuple[np.ndarray, np.ndarray,
                                                                                       np.ndarray]:
        """Replay with each phase's GPU span changed by ``delta[phase]`` (ns) and ``cut = (ns, n0)``: ns per graph
        node beyond ``n0`` taken off every graph launch call. Returns the period per window, the within-cycle
        seams per window and the seam ending at each slot."""
        a, n_w = self.a, self.windows
        k_max = a["s"].shape[1] if n_w else 0
        if not n_w:
            return np.zeros(0), np.zeros(0), np.zeros((0, 0))
        # Slot by slot over every window at once, on each column's slots laid out one after another (``_Slots``: a
        # slot's windows contiguous, what does not change with ``delta`` worked out once per cut): the same
        # arithmetic, element for element, as on the (windows, slots) arrays.
        t = self._slots(cut)
        d = np.array([delta.get(p, 0.0) for p in _MODEL_PHASES] + [0.0])
        g = np.maximum(t.gpu_span + d[t.code], 0.0)
        e_, s_gpu, a_gpu = (np.full((k_max, n_w), np.nan) for _ in range(3))
        a_flat = a_gpu.reshape(-1)  # a view: slot k of window w at k * n_w + w

        for k in range(k_max):
            sk = t.s[0] if k == 0 else e_[k - 1] + t.host_gap[k]
            plain = sk + t.dur[k]
            sync = t.sync[k]
            sub = np.where(sync, sk, plain)  # a sync call's own op is submitted at its start, a launch's at its end
            after_pred = np.where(t.has_pred[k], a_flat[t.pred_at[k]], t.pred_gpu_last[k]) + t.device_gap[k]
            start = np.fmax(sub + t.launch_latency[k], after_pred)
            unit = t.has_unit[k]
            s_gpu[k] = np.where(unit, start, np.nan)
            a_gpu[k] = np.where(unit, start + g[k], np.nan)
            waited = np.where(t.has_wait[k], a_flat[t.wait_at[k]], t.w_ext[k]) + t.w_off[k]
            e_[k] = np.where(sync, np.fmax(sk + t.own_time[k], waited + t.return_latency[k]), plain)
        rows = np.arange(n_w)
        s_gpu_w = np.ascontiguousarray(s_gpu.T)  # (windows, slots) again, as the callers and the sums take them
        period = s_gpu_w[rows, self.n_items - 1] - s_gpu_w[:, 0]
        gap = np.ascontiguousarray(np.where(a["trans"] >= 0, s_gpu_w - np.where(a["pred"] >= 0, a_flat[t.pred_at.T],
                                                                               np.nan), np.nan))
        seams = np.nansum(np.maximum(gap, 0.0), axis=1)  # (the sums in the order of the (windows, slots) array)
        return period, seams, gap

    def _slots(self, cut: tuple[float, int]) -> _Slots:
        """The arrays :meth:`run` reads, slot-major, for the launch cut ``cut`` (kept until :meth:`let_go`: every
        replay of a model has the same cut)."""
        memo = self.__dict__.setdefault("_slots_memo", {})
        if cut not in memo:
            memo.clear()
            memo[cut] = _Slots.of(self.a, cut)
        return memo[cut]

    def seam_slots(self) -> dict[str, np.ndarray]:
        """Where each seam of ``labels`` that the windows have sits in the flat (windows, slots) arrays, in their
        order (``gap.reshape(-1)[at]`` is ``gap[trans == i]``); worked out once, kept until :meth:`let_go`."""
        if "_seam_slots" not in self.__dict__:
            tr = self.a["trans"].reshape(-1) if self.windows else np.zeros(0, np.int64)
            at = {lab: np.flatnonzero(tr == i) for i, lab in enumerate(self.labels)}
            self.__dict__["_seam_slots"] = {lab: x for lab, x in at.items() if len(x)}
        return self.__dict__["_seam_slots"]

    def let_go(self) -> None:
        """Let go of what :meth:`run` keeps between replays (as large as the arrays: a later run makes it again)."""
        self.__dict__.pop("_slots_memo", None)
        self.__dict__.pop("_seam_slots", None)

    def __getstate__(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k not in ("_slots_memo", "_seam_slots")}


@dataclass
class _Slots:
    """A :class:`Replay`'s arrays slot-major (``[slot, window]``, each slot's windows contiguous) and what a replay
    computes from them that does not depend on the phases' changes: each call's duration less the launch cut, the
    host's own time before each key call, where the slot a phase follows and the slot a sync waits for sit in the
    flat slot-major arrays (``k * windows + w``)."""

    s: np.ndarray
    dur: np.ndarray
    host_gap: np.ndarray
    sync: np.ndarray
    has_unit: np.ndarray
    code: np.ndarray
    gpu_span: np.ndarray
    launch_latency: np.ndarray
    device_gap: np.ndarray
    pred_gpu_last: np.ndarray
    has_pred: np.ndarray
    pred_at: np.ndarray
    has_wait: np.ndarray
    wait_at: np.ndarray
    w_ext: np.ndarray
    w_off: np.ndarray
    own_time: np.ndarray
    return_latency: np.ndarray

    @classmethod
    def of(cls, a: dict[str, np.ndarray], cut: tuple[float, int]) -> _Slots:
        n_w = a["s"].shape[0]

        def t(x: np.ndarray) -> np.ndarray:
            return np.ascontiguousarray(x.T)

        dur = a["e"] - a["s"] - np.where(a["graph"], cut[0] * np.maximum(a["nodes"] - cut[1], 0.0), 0.0)
        dur = np.maximum(dur, 0.0)
        # the host's own time since the previous key call, less node tracing's cost of launches in it (slot 0: none)
        traced = cut[0] * (a["gap_nodes"][:, 1:] - cut[1] * a["gap_launches"][:, 1:])
        host_gap = np.maximum(a["s"][:, 1:] - a["e"][:, :-1] - traced, 0.0)
        windows = np.arange(n_w)[None, :]
        return cls(s=t(a["s"]), dur=t(dur), host_gap=np.concatenate([np.zeros((1, n_w)), t(host_gap)]),
                   sync=t(a["sync"]), has_unit=t(a["has_unit"]), code=t(a["code"]), gpu_span=t(a["gpu_span"]),
                   launch_latency=t(a["launch_latency"]), device_gap=t(a["device_gap"]),
                   pred_gpu_last=t(a["pred_gpu_last"]), has_pred=t(a["pred"] >= 0),
                   pred_at=t(np.maximum(a["pred"], 0)) * n_w + windows, has_wait=t(a["wait"] >= 0),
                   wait_at=t(np.maximum(a["wait"], 0)) * n_w + windows, w_ext=t(a["w_ext"]), w_off=t(a["w_off"]),
                   own_time=t(a["own_time"]), return_latency=t(a["return_latency"]))


_PACK_BELOW = 1 << 22  # windows: below it, a window and a range id are joined on as one integer (_build_replay)


def _same_rank(by: int) -> pl.Expr:
    """On rows sorted by rank: whether the row ``by`` rows away (as :meth:`polars.Expr.shift` counts) is of the same
    rank (null ranks one rank). ``when(_same_rank(by)).then(x.shift(by))`` is ``x.shift(by).over("rank")`` without a
    window per rank (where no such row exists, the shifted value is null either way)."""
    return pl.col("rank").shift(by).eq_missing(pl.col("rank"))


def _build_replay(res: Result) -> Replay:
    """The :class:`Replay` of an analysed trace (its cycles, phase instances and key host calls)."""
    empty = Replay(np.zeros(0, np.int64), np.zeros(0), np.zeros(0, np.int64), {}, [], np.zeros(0))
    # Range ids are unique per report only (a merged result has several): qualified by rank here.

    def uid(col: str) -> pl.Expr:
        return pl.col("rank") * (1 << 40) + pl.col(col)

    # A replayed window runs from one cycle's first GPU op to the next's: it holds the cycle and the wait before
    # the next one, so both must be steady (a cycle's period, tokens.DEFINITION, ends at its last op instead).
    cyc = (cycles(res).filter(pl.col("kind") == "cycle").sort("rank", "n")
           .with_columns(period_ns=pl.when(_same_rank(-1) & pl.col("steady").shift(-1))
                         .then(pl.col("i_first").shift(-1) - pl.col("i_first")))
           .filter("steady").with_columns(range_id=uid("range_id")))
    periods = cyc.filter(pl.col("period_ns").is_not_null())
    calls = res.host_calls
    if cyc.height == 0 or calls is None or calls.height == 0:
        return Replay(empty.rank, empty.period, empty.n_items, {}, [], periods["period_ns"].cast(pl.Float64).to_numpy())
    calls = calls.with_columns(unit=uid("unit"), wait_range_id=uid("wait_range_id"))
    inst = res.instances.with_columns(range_id=uid("range_id"), parent=uid("parent"))
    cyc_ids = cyc["range_id"].implode()
    units = (inst.select("rank", "gtid", "range_id", "parent", "range", "x_ops", gpu_first="x_first", gpu_last="x_last",
                         gpu_span="x_span_ns").filter(pl.col("x_ops") > 0).drop("x_ops")  # narrow, then the rows
             .with_columns(phase=base_expr(),
                           cyc=pl.when(pl.col("range_id").is_in(cyc_ids)).then("range_id")
                           .when(pl.col("parent").is_in(cyc_ids)).then("parent"))
             .sort("rank", "gpu_first")
             .with_columns(pl.when(_same_rank(1)).then(pl.col(c).shift(1)).alias(n)
                           for c, n in (("range_id", "pred"), ("gpu_last", "pred_gpu_last"), ("phase", "pred_phase"),
                                        ("cyc", "pred_cyc"))))
    code = {p: i for i, p in enumerate(_MODEL_PHASES)}
    units = units.with_columns(code=pl.col("phase").replace_strict(code, default=-1, return_dtype=pl.Int64))
    threads = inst.select("rank", "gtid", "range_id").filter(pl.col("range_id").is_in(cyc_ids)).select("rank", "gtid").unique()
    items = (calls.select("rank", "gtid", "name_id", "sync", "unit", "ops", "graph", "wait_end", "wait_range_id", "start",
                          "end")  # the columns, then the rows (a filter copies every column it is given)
             .filter(pl.col("sync") | pl.col("unit").is_not_null()).join(threads, on=["rank", "gtid"], how="semi")
             .select("rank", "name_id", "sync", "unit", "ops", "graph", "wait_end", "wait_range_id",
                     s="start", e="end")
             .join(units.select("range_id", "gpu_first", "gpu_last", "gpu_span", "code", "pred", "pred_gpu_last", "cyc", "phase",
                                "pred_phase",
                                "pred_cyc"), left_on="unit", right_on="range_id", how="left")
             .join(units.select(wait_range_id="range_id", _wait_gpu_last="gpu_last"), on="wait_range_id", how="left"))
    # Which term bound each phase's GPU start in the trace, and the defaults for the other term.
    sub = pl.when("sync").then("s").otherwise("e")
    host_bound_expr = pl.col("pred_gpu_last").is_null() | (pl.col("e") > pl.col("pred_gpu_last"))
    items = items.with_columns(launch_latency_obs=pl.col("gpu_first") - sub,
                               device_gap_obs=pl.col("gpu_first") - pl.col("pred_gpu_last"),
                               host_bound=pl.col("unit").is_not_null() & host_bound_expr,
                               gpu_bound=pl.col("unit").is_not_null() & ~host_bound_expr,
                               waited=pl.col("sync") & (pl.col("s") < pl.col("wait_end"))
                               & (pl.col("e") >= pl.col("wait_end")),
                               return_latency_obs=pl.col("e") - pl.col("wait_end"),
                               own_time_obs=pl.col("e") - pl.col("s"))
    items = items.with_columns(key=pl.when("sync").then(pl.lit("sync")).otherwise("phase"))
    # Each term's medians where it was observed, per rank and phase (else per rank, else 0): the defaults where it
    # was not. The four terms in one group-by per level and one join each (each join copies every column of items).
    observed = (("launch_latency_obs", pl.col("host_bound")), ("device_gap_obs", pl.col("gpu_bound")),
                ("return_latency_obs", pl.col("waited")), ("own_time_obs", pl.col("sync") & ~pl.col("waited")))
    fine = items.group_by("rank", "key").agg(pl.col(col).filter(ok).median().alias(f"_{col}_1") for col, ok in observed)
    coarse = items.group_by("rank").agg(pl.col(col).filter(ok).median().alias(f"_{col}_2") for col, ok in observed)
    items = (items.join(fine, on=["rank", "key"], how="left").join(coarse, on="rank", how="left")
             .with_columns(pl.coalesce(f"_{col}_1", f"_{col}_2", pl.lit(0.0)).alias(f"def_{col}") for col, _ in observed))
    overall = items.select(x for col, ok in observed for x in (ok.sum().alias(f"n{col}"),
                                                                pl.col(col).filter(ok).median().alias(col))).row(0, named=True)
    defaults = {col[:-4]: to_float(overall[col]) if overall[f"n{col}"] else 0.0 for col, _ in observed}
    items = items.with_columns(
        launch_latency=pl.when("host_bound").then("launch_latency_obs")
        .otherwise(pl.min_horizontal("def_launch_latency_obs", "launch_latency_obs")),
        device_gap=pl.when("gpu_bound").then("device_gap_obs")
        .otherwise(pl.min_horizontal("def_device_gap_obs", "device_gap_obs")),
        return_latency=pl.when("waited").then("return_latency_obs")
        .otherwise(pl.min_horizontal("def_return_latency_obs", "return_latency_obs")),
        own_time=pl.when("waited").then(pl.min_horizontal("def_own_time_obs", "own_time_obs")).otherwise("own_time_obs"),
        w_off=(pl.col("wait_end") - pl.col("_wait_gpu_last")).fill_null(0),
    ).select("rank", "s", "e", "sync", "unit", "ops", "graph", "wait_end", "wait_range_id", "gpu_span", "code", "pred",
             "pred_gpu_last", "cyc", "phase", "pred_phase", "pred_cyc", "launch_latency", "device_gap",
             "return_latency", "own_time", "w_off")  # what the windows need: the sorts and joins below copy less
    # Graph launches between two key calls (not the first launch of a phase) are part of the host's time
    # between them: node tracing's cost of each is taken off that time too.
    extra = (calls.select("rank", "gtid", "ops", "start", "graph", "sync", "unit")
             .filter(pl.col("graph") & ~pl.col("sync") & pl.col("unit").is_null())
             .join(threads, on=["rank", "gtid"], how="semi").select("rank", "ops", t="start").sort("t"))
    # (the keys as they come: a repeated s matches as the same s)
    gaps = (extra.join_asof(items.select("rank", "s").sort("s"), left_on="t", right_on="s", by="rank",
                            strategy="forward", check_sortedness=False)
            .group_by("rank", "s").agg(gap_nodes=pl.col("ops").sum().cast(pl.Float64),
                                       gap_launches=pl.len().cast(pl.Float64)))
    items = items.join(gaps, on=["rank", "s"], how="left").with_columns(pl.col("gap_nodes", "gap_launches").fill_null(0))
    # Windows: cycle n of a rank runs from the launch call of its first phase to that of cycle n + 1's.
    first = (units.select("cyc", "range_id", "gpu_first").filter(pl.col("cyc").is_not_null()).sort("gpu_first")
             .group_by("cyc")
             .agg(pl.col("range_id").first())
             .join(items.select("unit", "s"), left_on="range_id", right_on="unit")
             .join(cyc.select("rank", "n", cyc="range_id", period="period_ns"), on="cyc")
             .select("rank", "n", "cyc", "period", window_start="s").sort("rank", "n"))
    del units, calls, inst  # done with
    first = first.with_columns(next_window_start=pl.col("window_start").shift(-1).over("rank"),
                               n_next=pl.col("n").shift(-1).over("rank"))
    win = first.filter(pl.col("period").is_not_null() & (pl.col("n_next") == pl.col("n") + 1)).with_row_index("w")
    bounds = win.select("rank", "w", "window_start", "next_window_start", wcyc="cyc").sort("window_start")
    # The window of each key call (and the call that closes each window) worked out on three narrow columns, then
    # the calls' columns gathered once, in the windows' order: sorting and joining all of them copied them thrice.
    at = items.select("rank", "s", "unit").with_row_index("_i")
    inside = (at.sort("s").join_asof(bounds, left_on="s", right_on="window_start", by="rank", strategy="backward",
                                     check_sortedness=False)
              .filter(pl.col("w").is_not_null() & (pl.col("s") < pl.col("next_window_start"))))
    closing = at.join(win.select("rank", "w", wcyc="cyc", s="next_window_start"), on=["rank", "s"]).filter(
        pl.col("unit").is_not_null())
    order = pl.concat([x.select("_i", "w", "wcyc", "s") for x in (inside, closing)], how="vertical_relaxed").sort("w", "s")
    long = items[order["_i"]].with_columns(order["w"], order["wcyc"])
    del items, at, inside, closing, order  # done with: freed before the slots are laid out
    # sorted by window: each row's slot is its distance from its window's first row (no window per group)
    i = pl.int_range(pl.len())
    long = long.with_columns(k=i - pl.when(~(pl.col("w") == pl.col("w").shift(1)).fill_null(False)).then(i).forward_fill())
    slot_of = long.select("w", "unit", "k").filter(pl.col("unit").is_not_null()).select("w", ref="unit", ref_k="k")
    by_pred = slot_of.rename({"ref": "pred", "ref_k": "pred_k"})
    by_wait = slot_of.rename({"ref": "wait_range_id", "ref_k": "wait_k"})
    # A window is one rank's: its units, the phases they follow and the work its syncs wait for are that rank's, so
    # the window and the range id (qualified by rank: uid) pack into one integer key (one hash of an integer a row).
    ids = res.instances["range_id"]
    if win.height < _PACK_BELOW and (ids.len() == ids.null_count() or (to_int(ids.min()) >= 0
                                                                     and to_int(ids.max()) < (1 << 40))):
        def packed_key(ref: str) -> pl.Expr:
            return pl.col("w").cast(pl.Int64) * (1 << 40) + pl.col(ref) % (1 << 40)

        by_ref, on = slot_of.select(_key=packed_key("ref"), _k="ref_k"), ["_key"]
        refs = long.select(_pred=packed_key("pred"), _wait=packed_key("wait_range_id"))
        pred_on, wait_on = refs.select(_key="_pred"), refs.select(_key="_wait")
        repeats = by_ref["_key"].is_duplicated().any()
    else:
        by_ref, on = slot_of.rename({"ref_k": "_k"}), ["w", "ref"]
        pred_on = long.select("w", ref="pred")
        wait_on = long.select("w", ref="wait_range_id")
        repeats = slot_of.select(pl.struct("w", "ref").is_duplicated().any()).item()
    if repeats:  # a unit twice in a window: rows repeat
        long = (long.join(by_pred, on=["w", "pred"], how="left")
                .join(by_wait, on=["w", "wait_range_id"], how="left"))
    else:  # each row's slot looked up on the key columns (a join of every column copied them all twice)
        long = long.with_columns(pred_on.join(by_ref, on=on, how="left", maintain_order="left")["_k"].alias("pred_k"),
                                 wait_on.join(by_ref, on=on, how="left", maintain_order="left")["_k"].alias("wait_k"))
    labels = sorted(long.select(pl.format("{}→{}", "pred_phase", "phase").filter(pl.col("pred_cyc") == pl.col("wcyc")))
                    .unique().to_series().drop_nulls().to_list())
    long = long.with_columns(
        trans=pl.when((pl.col("cyc") == pl.col("wcyc")) & (pl.col("pred_cyc") == pl.col("wcyc"))
                      & pl.col("pred_k").is_not_null())
        .then(pl.format("{}→{}", "pred_phase", "phase").replace_strict(
            {lab: i for i, lab in enumerate(labels)}, default=-1, return_dtype=pl.Int64)).otherwise(-1),
        has_unit=pl.col("unit").is_not_null(), pred=pl.col("pred_k").fill_null(-1), wait=pl.col("wait_k").fill_null(-1),
        w_ext=pl.col("wait_end") - pl.col("w_off"), nodes=pl.col("ops"), code=pl.col("code").fill_null(-1)
    ).select("w", "k", *_ITEM_COLS)
    del slot_of
    n_w = win.height
    k_max = to_int(long["k"].max()) + 1 if long.height else 0
    arrays = {}
    # each row's place in the flat (windows, slots) arrays, worked out once for every column
    flat = long["w"].to_numpy().astype(np.int64) * k_max + long["k"].to_numpy()
    for c in _ITEM_COLS:
        values = long[c]
        if values.dtype == pl.Boolean:
            arr = np.zeros(n_w * k_max, bool)
            arr[flat] = values.fill_null(False).to_numpy()
        elif c in ("pred", "wait", "trans", "code"):
            arr = np.full(n_w * k_max, -1, np.int64)
            arr[flat] = values.to_numpy()
        else:
            arr = np.full(n_w * k_max, np.nan)
            arr[flat] = values.cast(pl.Float64).to_numpy()
        arrays[c] = arr.reshape(n_w, k_max)
    n_items = long.group_by("w").agg(pl.len()).sort("w")["len"].to_numpy() if n_w else np.zeros(0, np.int64)
    done = win["cyc"].implode()
    rest = periods.filter(~pl.col("range_id").is_in(done))["period_ns"].cast(pl.Float64).to_numpy()
    return Replay(win["rank"].to_numpy(), win["period"].cast(pl.Float64).to_numpy(), n_items, arrays, labels, rest,
                  defaults)


@view.table(kept=False)
def replay(res: Result) -> Replay:
    """The :class:`Replay` of ``res`` (:func:`_build_replay`), once per result and cycle choice in this process (a
    caller while another thread builds it waits for that one's: the JSON document builds it beside the findings,
    whose fit asks for it, when :func:`will_replay`)."""
    return _build_replay(res)


def will_replay(res: Result) -> bool:
    """Whether :func:`fitted` (its default options) will build the replay: neither fitted nor kept with the result
    yet, and the draft step count known (what a second thread may build meanwhile)."""
    if view.known(_fitted, res, steps_now=None, alpha=None, as_traced=False):
        return False
    try:
        _steps_known(res, None)
    except InputError:
        return False
    return not view.known(replay, res)


def _graph_launch_cost(res: Result) -> tuple[float, int] | None:
    """Node tracing's host cost per node of a graph launch and the smallest graph (nodes) of the trace: the
    slope of the median launch time of each node count (Theil–Sen over node counts), or None with fewer
    than two counts. Launches of that smallest graph are the reference: a larger graph's launch is assumed
    to cost the same but for node tracing's cost per extra node."""
    calls = res.host_calls
    if calls is None or calls.height == 0:
        return None
    g = (calls.filter(pl.col("graph") & (pl.col("ops") > 0))
         .group_by("ops").agg(y=(pl.col("end") - pl.col("start")).median()).select(x="ops", y="y").sort("x"))
    if g.height < 2:
        return None
    return max(_theil_sen(g.cast({"x": pl.Float64})), 0.0), int(g["x"][0])


# ---- the model ----------------------------------------------------------------------------------------


@results.cacheable
@dataclass
class Model:
    """The fitted costs (ns per cycle), acceptance and replay of one trace."""

    steps_now: int
    period_ns: float  # measured: the cycle period (tokens.DEFINITION: mean over the steady cycles)
    cost_ns: dict[str, float]  # phase → min-over-ranks span per cycle, median over cycles
    other_ns: float
    verify_per_token_ns: float  # b: per verified token per request
    extend_per_token_ns: float  # e1
    batch_size: float | None
    alpha: float | None  # per-token acceptance; None = unknown
    accepted_now: float | None  # accepted draft tokens per request per cycle, measured
    notes: list[str] = field(default_factory=list)
    replay: Replay | None = None
    launch_cut_ns: float = 0.0  # per graph node beyond the smallest graph's, taken off each graph launch
    launch_cut_from: int = 0  # that smallest graph's node count
    graph_mode: str | None = None
    probe: dict | None = None  # fitted on the graph-level pass of a pair: the probe effect (analyze.compute.probe)
    # verify's GPU time as a function of the tokens it verifies per cycle, measured at these points (segments of
    # other batch sizes): (tokens, ns), sorted; None: the linear ``verify_per_token_ns`` (baseline, or assumed)
    verify_points: tuple[tuple[float, float], ...] | None = None
    # "baseline", "segments" (the points above), "gpu_metrics" (a prior from verify's measured bound:
    # :func:`_verify_prior`) or "assumed" (0 per token)
    verify_source: str = "assumed"
    verify_prior: dict | None = None  # with "gpu_metrics": verify's utilisation row the prior was taken from
    steps_source: str = "given"  # how steps_now is known (_steps_known): given, the manifest's, or inferred
    alpha_given: bool = False  # alpha is the caller's (--acceptance), not measured
    segments: list[SegmentModel] = field(default_factory=list)  # one per batch size (fit_segments), when several
    # the capture's excess over the run without a profiler at steps_now (whatif --unprofiled-log: calibrate), per
    # cycle: taken off every predicted period (None: not calibrated)
    calibration_ns: float | None = None
    # Replay.run per (phase deltas, launch cut), reduced to what predict, cycle and seams ask of it (the windows'
    # mean change of period, each seam's median, the within-cycle seams' median): not its per-window arrays
    _runs: dict[tuple, tuple[float, dict[str, float], float]] = field(default_factory=dict, repr=False, compare=False)

    @property
    def _cut(self) -> tuple[float, int]:
        return self.launch_cut_ns, self.launch_cut_from

    def deltas(self, steps: int) -> dict[str, float]:
        """Change of each model phase's GPU span per cycle from ``steps_now`` to ``steps``."""
        out = {"draft": self.draft(steps) - self.draft(self.steps_now),
               "verify": self.verify(steps) - self.verify(self.steps_now), "draft_extend": 0.0}
        tok, tok0 = self.tokens_per_cycle(steps), self.tokens_per_cycle(self.steps_now)
        if tok is not None and tok0 is not None:
            out["draft_extend"] = self.extend_per_token_ns * (tok - tok0)
        return out

    def draft(self, steps: int) -> float:
        return self.cost_ns.get("draft", 0.0) * steps / self.steps_now

    def verify(self, steps: int) -> float:
        if self.verify_points and self.batch_size:
            b = self.batch_size
            return self.cost_ns.get("verify", 0.0) + _interp(self.verify_points, b * (steps + 1)) - _interp(
                self.verify_points, b * (self.steps_now + 1))
        return self.cost_ns.get("verify", 0.0) + self.verify_per_token_ns * (steps - self.steps_now)

    def extrapolated(self, steps: int) -> bool:
        """Whether the prediction at ``steps`` leaves what was measured: more than one step from the trace's own
        step count, or verified tokens outside the measured points of the verify curve."""
        if abs(steps - self.steps_now) > 1:
            return True
        if self.verify_points and self.batch_size:
            t = self.batch_size * (steps + 1)
            return not self.verify_points[0][0] <= t <= self.verify_points[-1][0]
        return False

    def expected_accepted(self, steps: int) -> float | None:
        if self.alpha is None:
            return None
        a = self.alpha
        return sum(a ** i for i in range(1, steps + 1))

    def tokens_per_cycle(self, steps: int) -> float | None:
        k = self.expected_accepted(steps)
        return None if k is None or self.batch_size is None else self.batch_size * (1 + k)

    def _replayed(self, steps: int) -> tuple[float, dict[str, float], float]:
        """:meth:`Replay.run` at ``steps`` reduced (kept: predict, cycle and seams ask for the same replay): the
        replayed windows' mean change of period, each seam's median GPU idle, the median of the seams' sum."""
        key = (tuple(sorted(self.deltas(steps).items())), self._cut)
        if key not in self._runs:
            r = self.replay
            if r is None:
                raise ValueError("a Model without its Replay cannot predict (fit builds both)")
            period, seams, gap = r.run(dict(key[0]), self._cut)
            flat = gap.reshape(-1)
            self._runs[key] = (float(np.mean(period - r.period)) if r.windows else 0.0,
                               {lab: float(np.median(np.maximum(flat[at], 0.0))) for lab, at in r.seam_slots().items()},
                               float(np.median(seams)) if r.windows else 0.0)
        return self._runs[key]

    def cycle(self, steps: int) -> float:
        """Predicted cycle period: the mean of the replayed steady periods (the measured one without a replay)."""
        if self.replay is None or self.replay.windows == 0:
            return self.period_ns + sum(self.deltas(steps).values())
        # The replayed windows' mean change, on the measured period (a window runs from one cycle's first GPU
        # op to the next's; the period, tokens.DEFINITION, from the previous cycle's last op to its own).
        return self.period_ns + self._replayed(steps)[0]

    def seams(self, steps: int) -> dict[str, float]:
        """Predicted GPU idle of each seam inside a cycle (median over cycles and ranks)."""
        if self.replay is None or self.replay.windows == 0:
            return {}
        return dict(self._replayed(steps)[1])

    def seams_total(self, steps: int) -> float:
        if self.replay is None or self.replay.windows == 0:
            return 0.0
        return self._replayed(steps)[2]

    def predict(self, steps: int) -> dict:
        s0 = self.steps_now
        d, v = self.draft(steps), self.verify(steps)
        e = self.cost_ns.get("draft_extend", 0.0) + self.deltas(steps)["draft_extend"]
        tok = self.tokens_per_cycle(steps)
        cyc = self.cycle(steps) - (self.calibration_ns or 0.0)
        seam = self.seams_total(steps)
        return {
            "steps": steps, "cycle_ns": cyc, "draft_ns": d, "verify_ns": v, "draft_extend_ns": e,
            "seams_ns": seam, "other_ns": cyc - d - v - e - seam, "tokens_per_cycle": tok,
            "tokens_per_s": tok / cyc * 1e9 if tok is not None and cyc > 0 else None,
            "measured": steps == s0, "extrapolated": self.extrapolated(steps),
        }

    def predictions(self, max_steps: int = MAX_STEPS) -> list[dict]:
        return [self.predict(s) for s in range(1, max_steps + 1)]

    def best(self, max_steps: int = MAX_STEPS, measured_only: bool = False) -> dict | None:
        """The step count with the most tokens/s, or None when acceptance is unknown (``measured_only``: among the
        predictions that are not extrapolated)."""
        return _best(self.predictions(max_steps), measured_only)

    def verify_text(self) -> str:
        """How verify's cost per extra verified token is known: measured (segments, baseline) or assumed."""
        if self.segments and self.verify_source == "assumed":  # the whole run of a trace with several batch sizes
            return (f"the whole run mixes {len(self.segments)} batch sizes: its verify GPU time is ASSUMED "
                    "independent of the verified tokens (one average); per batch size it is measured — each "
                    "segment's verify time at the tokens it verifies per cycle makes a curve (the per-segment models)")
        if self.verify_source == "segments" and self.verify_points:
            pts = ", ".join(f"{t:,.0f} tokens {v / 1e3:,.0f} µs" for t, v in self.verify_points)
            return ("verify GPU time interpolated in the tokens it verifies per cycle, measured on the segments of "
                    f"other batch sizes ({pts}); outside them extrapolated")
        if self.verify_source == "gpu_metrics" and self.verify_prior:
            p = self.verify_prior
            return (f"verify GPU time {self.verify_per_token_ns / 1e3:+.2f} µs per extra verified token per request: "
                    f"a PRIOR from verify's measured hardware bound, not a measured slope — {p['bound']}-bound "
                    f"(DRAM read {p['dram_read_pct']:.0f} % of peak, tensor cores {p['tensor_active_pct']:.0f} % "
                    f"active over {p['samples']:,} GPU-metrics samples); the tensor-active share of verify's time "
                    "taken to grow with the tokens, the rest (weight reads) not; give --baseline, or a trace with "
                    "several batch sizes, to measure it")
        if self.verify_source == "baseline":
            return (f"verify GPU time {self.verify_per_token_ns / 1e3:+.2f} µs per extra verified token per request "
                    "(measured against the baseline's decode step)")
        return ("verify GPU time ASSUMED independent of the verified tokens (+0.00 µs per extra token: decode "
                "memory-bound): not measured; give --baseline, or a trace with several batch sizes")

    def assumptions(self) -> list[str]:
        """What the predictions assume, with this trace's numbers (``whatif --explain``)."""
        r = self.replay
        dflt = (r.defaults if r is not None else {}) | {}
        n = r.windows if r is not None else 0
        rest = len(r.rest) if r is not None else 0
        out = [
            f"draft GPU time ∝ steps: {self.cost_ns.get('draft', 0) / 1e3:.1f} µs at {self.steps_now} steps "
            "(smallest span over ranks per cycle, median over cycles; no fixed part)",
            self.verify_text(),
            f"draft_extend GPU time {self.extend_per_token_ns / 1e3:+.2f} µs per generated token",
            "each cycle is replayed on the trace's own timelines: host calls in their order, the time between "
            "them unchanged (the host's own work does not depend on the step count)",
            "launch calls take the time they took; a launch that returned after the earlier GPU work ended is "
            "slow, not blocked: it does not move with the GPU (README: what the bundled sweep shows)",
            "sync-like calls return at max(start + own time, end of the GPU work they wait for + return latency)"
            f" (median return latency {dflt.get('return_latency', 0) / 1e3:.1f} µs)",
            "the GPU runs the phases of a rank in launch order, one queue: a phase starts at max(launch end + "
            f"launch latency, previous phase end + device gap) (medians where not bound: latency "
            f"{dflt.get('launch_latency', 0) / 1e3:.1f} µs, gap {dflt.get('device_gap', 0) / 1e3:.1f} µs)",
            f"predicted cycle = the measured cycle period moved by the mean change over {n} replayed windows "
            f"(first GPU op of a steady cycle → first of the next{f'; {rest} cycles not replayed' if rest else ''});"
            " ranks replayed independently (their skew stays as measured)",
        ]
        if self.launch_cut_ns:
            out.append(f"node-level graph tracing adds {self.launch_cut_ns / 1e3:.2f} µs per graph node to each "
                       "graph launch call on the host (slope of launch time over node count across this trace's "
                       f"graph launches); removed beyond the smallest graph's {self.launch_cut_from} nodes before "
                       "the replay (--as-traced keeps it; --timing GRAPH measures launches without it)")
        elif self.graph_mode == "Node":
            out.append("node-level graph trace replayed as traced: its graph launch calls keep node tracing's "
                       "host cost")
        return out


def _best(predictions: list[dict], measured_only: bool) -> dict | None:
    """The prediction with the most tokens/s (``measured_only``: among those not extrapolated); None without any."""
    rows = [p for p in predictions if p["tokens_per_s"] is not None and not (measured_only and p["extrapolated"])]
    return max(rows, key=lambda p: p["tokens_per_s"]) if rows else None


def _interp(points: tuple[tuple[float, float], ...], x: float) -> float:
    """Piecewise-linear ``f(x)`` through ``points`` (sorted by x), extended by the end segments' slopes."""
    if len(points) == 1:
        return points[0][1]
    i = 1
    while i < len(points) - 1 and x > points[i][0]:
        i += 1
    (x0, y0), (x1, y1) = points[i - 1], points[i]
    return y0 + (y1 - y0) * (x - x0) / (x1 - x0) if x1 != x0 else y1


# predicted tokens/s this close to the best's is a tie: runs of the same workload without a profiler differ by
# 2.1 % at the median (max − min over six runs, docs/whatif-per-batch.md)
NEAR_BEST = 0.02
_MIN_SEGMENT_CYCLES = 5  # a segment's own model needs this many typical steady cycles
_OWN_ALPHA_CYCLES = 100  # ... and this many to use its own acceptance rather than the whole run's


@results.cacheable
@dataclass
class SegmentModel:
    """The what-if of one segment (cycles of one batch size): its own costs, acceptance and predictions.

    ``others``: the same batch size's models from runs of the same workload at other step counts (``whatif
    --other-steps``). A prediction at ``steps`` comes from the run measured nearest to it (this one on a tie):
    at a step count some run measured, the prediction is that run's measured period; it is extrapolated more
    than one step from every measured count."""

    segment: int
    key: str
    batch_size: int | None
    cycles: int  # typical steady cycles the model is fitted on (all ranks)
    first_cycle: int
    period_ns: float  # the segment's typical cycle period (p50 of its typical steady cycles): what it moves from
    model: Model
    others: tuple[Model, ...] = ()
    unprofiled_ns: float | None = None  # the period without a profiler at the measured steps (calibrate), if known

    @property
    def measured_steps(self) -> list[int]:
        """The step counts this batch size was measured at (this run's first)."""
        return list(dict.fromkeys(m.steps_now for m in (self.model, *self.others)))

    def model_for(self, steps: int) -> Model:
        """The model of the run measured nearest to ``steps`` (this run's on a tie)."""
        return min((self.model, *self.others), key=lambda m: abs(m.steps_now - steps))

    def predict(self, steps: int) -> dict:
        m = self.model_for(steps)
        return m.predict(steps) | {"from_steps": m.steps_now}

    def predictions(self, max_steps: int = MAX_STEPS) -> list[dict]:
        return [self.predict(s) for s in range(1, max_steps + 1)]

    def best(self, max_steps: int = MAX_STEPS, measured_only: bool = False) -> dict | None:
        """As :meth:`Model.best`, over the predictions of every run."""
        return _best(self.predictions(max_steps), measured_only)

    def near_best(self, max_steps: int = MAX_STEPS) -> list[int]:
        """The step counts, not extrapolated, predicted within :data:`NEAR_BEST` of the best's tokens/s (the best
        first): a tie within what runs of the same workload differ by."""
        preds = self.predictions(max_steps)
        best = _best(preds, measured_only=True)
        if best is None:
            return []
        near = [p["steps"] for p in preds if p["tokens_per_s"] is not None
                and not p["extrapolated"] and p["tokens_per_s"] >= best["tokens_per_s"] * (1 - NEAR_BEST)]
        return [best["steps"], *(s for s in near if s != best["steps"])]

    def as_dict(self, max_steps: int = MAX_STEPS) -> dict:
        m = self.model
        preds = [{k: p[k] for k in ("steps", "cycle_ns", "tokens_per_s", "tokens_per_cycle", "verify_ns",
                                    "measured", "extrapolated", "from_steps")} for p in self.predictions(max_steps)]
        best, now = self.best(max_steps, measured_only=True), self.predict(m.steps_now)
        best_any = self.best(max_steps)
        gain = (best["tokens_per_s"] / now["tokens_per_s"] - 1
                if best and now["tokens_per_s"] else None)
        return {"segment": self.segment, "key": self.key, "batch_size": self.batch_size, "cycles": self.cycles,
                "first_cycle": self.first_cycle, "period_ns": self.period_ns, "steps_now": m.steps_now,
                "measured_steps": self.measured_steps,
                **({"unprofiled_period_ns": self.unprofiled_ns, "calibration_ns": m.calibration_ns}
                   if self.unprofiled_ns is not None else {}),
                "alpha": m.alpha, "verify_source": m.verify_source, "predictions": preds,
                "best_steps": best["steps"] if best else None, "near_best_steps": self.near_best(max_steps),
                "gain": gain,
                "best_steps_extrapolated": best_any["steps"] if best_any and best_any["extrapolated"]
                and best_any["steps"] != (best or {}).get("steps") else None}


def fit_segments(res: Result, steps_now: int | None = None, alpha: float | None = None,
                 as_traced: bool = False) -> list[SegmentModel]:
    """One model per segment of the trace (:func:`analyze.compute.anatomy.segments`: the cycles of one decode batch
    size; a batch size visited several times, as a serving run does, is one model over all its visits), each
    fitted on the segment's own steady cycles and moving from its typical period (the p50 of its cycles
    in no class of slower ones: a prefill or the first cycles after a batch change are not what the next cycle at
    another step count would take). Verify's cost per extra verified token is *measured* across segments: with
    several batch sizes, the segments' verify times at their verified tokens per cycle (batch × (steps + 1)) make a
    curve, interpolated for each segment's other step counts (extrapolated beyond its ends; said). None when the
    trace has one batch size only (the whole-trace model is its model)."""
    import dataclasses

    from . import anatomy

    # A serving run visits a batch size several times: its segments are pooled, one model per batch size.
    visits: dict[str, list[anatomy.Segment]] = {}
    for g in anatomy.segments(res):
        visits.setdefault(g.key, []).append(g)
    groups = [v for v in visits.values() if sum(g.cycles for g in v) >= _MIN_SEGMENT_CYCLES]
    if len(groups) < 2:
        return []
    s0 = _steps_of(res, steps_now)
    c = cycles(res)
    # acceptance: the segment's own when it has enough cycles to measure it, else the whole run's (one draft
    # model, one data set: a few dozen cycles measure α to ± 0.1, which moves the best step count)
    pooled = alpha if alpha is not None else run_alpha(res, s0)
    out = []
    # by batch size (a serving run's visits come in any order), then by the first visit
    for group in sorted(groups, key=lambda v: (v[0].batch_size is None, v[0].batch_size or 0, v[0].segment)):
        g, ids = group[0], [x.segment for x in group]
        one = dataclasses.replace(res.cycle_choice, segment=tuple(ids) if len(ids) > 1 else g.segment)
        typ = c.filter(pl.col("steady") & pl.col("segment").is_in(ids) & pl.col("cycle_class").is_null()
                       & ~pl.col("slow") & pl.col("period_ns").is_not_null())
        if typ.height < _MIN_SEGMENT_CYCLES:
            continue
        period = to_float(typ["period_ns"].median())
        own = alpha is None and typ.select("key").unique().height >= _OWN_ALPHA_CYCLES
        try:
            m = fit(view.with_choice(res, one), s0, alpha=None if own else pooled, as_traced=as_traced,
                    period_ns=period)
        except InputError:
            continue
        m.notes.append("acceptance α measured on this segment's own cycles" if own else
                       f"acceptance α of the whole run (this segment has fewer than {_OWN_ALPHA_CYCLES} cycles)")
        out.append(SegmentModel(g.segment, g.key, g.batch_size, typ.height, g.first_cycle, period, m))
    # the verify curve: each batch size's verify time at the tokens it verifies per cycle
    pts: dict[float, list[float]] = {}
    for sm in out:
        if sm.batch_size:
            pts.setdefault(float(sm.batch_size * (s0 + 1)), []).append(sm.model.cost_ns["verify"])
    if len(pts) >= 2:
        curve = tuple(sorted((t, float(np.median(v))) for t, v in pts.items()))
        for sm in out:
            sm.model.verify_points, sm.model.verify_source = curve, "segments"
            sm.model._runs.clear()
            sm.model.other_ns = sm.model.predict(s0)["other_ns"]
    return out


def run_alpha(res: Result, steps: int) -> float | None:
    """The whole run's per-token acceptance α (from its accepted tokens per request per cycle), None unknown."""
    tk = summary(res, steps=steps)
    return solve_alpha(tk.accepted_per_request, steps) if tk.accepted_per_request is not None else None


def join_runs(segments: list[SegmentModel], runs: Iterable[tuple[str, Result]], alpha: float | None,
              as_traced: bool = False) -> list[str]:
    """Join each segment with the same batch size's models from runs of the same workload at other step counts
    (``runs``: each run's name and analysed Result; ``whatif --other-steps``), fitted with ``alpha``, this run's
    acceptance; notes on what was not joined. InputError when a run's step count is neither recorded nor
    inferable."""
    notes, unused = [], []  # the runs' own notes first, then the batch sizes not joined
    by_batch = {sm.batch_size: sm for sm in segments if sm.batch_size}
    for name, ro in runs:
        try:
            steps, how = _steps_known(ro, None)
        except InputError as e:
            raise InputError(f"--other-steps {name}: the number of draft steps is not recorded (no manifest "
                             "with speculative.steps beside it) and cannot be inferred", e.code) from None
        if how.startswith("inferred"):
            notes.append(f"{name}: {steps} draft steps, {how}")
        segs = fit_segments(ro, steps, alpha=alpha, as_traced=as_traced)
        if not segs:
            notes.append(f"{name}: fewer than two batch sizes with enough cycles: not used")
        for o in segs:
            if o.batch_size in by_batch:
                by_batch[o.batch_size].others += (o.model,)
        left = sorted(b for b in {o.batch_size for o in segs} - set(by_batch) if b is not None)
        if left:
            unused.append(f"{name}: batch sizes {', '.join(map(str, left))} are not in the main run: not used")
    return notes + unused


MIN_LOG_LINES = 3  # decode log lines a batch size needs to be calibrated: one may hold a batch change's slow cycles


def calibrate(m: Model, periods: pl.DataFrame, source: str) -> list[str]:
    """Calibrate the predictions on a log of the same workload without a profiler at the measured step count
    (``periods``: :func:`analyze.read.server_log.decode_periods`, per batch size ``period_ns``): each segment's
    excess over it at the measured steps — per cycle, on the host (the profiler's cost and the run's own
    variation, docs/whatif-per-batch.md) — is taken off every predicted period of that batch size, the joined
    runs' too. Without segments, the whole run's model when the log has its batch size. A batch size needs
    :data:`MIN_LOG_LINES` lines (a line's interval may hold the slower cycles after a batch change: with two lines
    per batch size, H200 logs were up to 18 % off the runs' typical period). Notes on what was and was not
    calibrated."""
    enough = periods.filter(pl.col("lines") >= MIN_LOG_LINES)
    by_batch = dict(zip(enough["batch_size"].to_list(), enough["period_ns"].to_list()))

    def excess(model: Model, unprofiled_ns: float) -> float:  # the capture's period at its steps over the log's
        return model.cycle(model.steps_now) - unprofiled_ns

    if not m.segments:
        bs = round(m.batch_size) if m.batch_size is not None else None
        if bs not in by_batch:
            return [f"--unprofiled-log {source}: fewer than {MIN_LOG_LINES} decode lines at this run's batch size "
                    f"({bs}): not calibrated"]
        m.calibration_ns = excess(m, by_batch[bs])
        return [f"calibrated on {source}: {m.cycle(m.steps_now) / 1e3:,.1f} µs per cycle in the capture, "
                f"{by_batch[bs] / 1e3:,.1f} µs without the profiler: {m.calibration_ns / 1e3:+,.1f} µs taken off "
                "every predicted period"]
    segs = [sm for sm in m.segments if sm.batch_size in by_batch]
    offsets = []
    for sm in segs:
        sm.unprofiled_ns = by_batch[sm.batch_size]
        off = excess(sm.model, sm.unprofiled_ns)
        offsets.append(f"{sm.batch_size} {off / 1e3:+,.1f} µs")
        for o in (sm.model, *sm.others):
            o.calibration_ns = off
    notes = []
    if segs:
        notes.append(f"calibrated on {source} (the periods without a profiler at {m.steps_now} steps): per batch size "
                     "the capture's excess per cycle taken off every predicted period: " + ", ".join(offsets)
                     + "; the whole-run table above is not calibrated")
    left = [str(sm.batch_size) for sm in m.segments if sm not in segs]
    if left:
        notes.append(f"--unprofiled-log {source}: fewer than {MIN_LOG_LINES} decode lines at batch size "
                     f"{', '.join(left)}: not calibrated")
    return notes


_SLOPES_AT_ONCE = 1 << 22  # Theil–Sen: pairwise slopes computed at a time (32 MB of float64)


def _slope_blocks(x: np.ndarray, y: np.ndarray):
    """The slopes ``(y_j - y_i) / (x_j - x_i)`` of the pairs ``i < j`` with ``x_i != x_j``, a block of rows ``i`` at a
    time (at most about ``_SLOPES_AT_ONCE`` pairs each), as float64 arrays."""
    n = len(x)
    rows = max(1, _SLOPES_AT_ONCE // max(n, 1))
    j = np.arange(n)
    for i0 in range(0, n, rows):
        i = np.arange(i0, min(i0 + rows, n))[:, None]
        keep = (j[None, :] > i) & (x[None, :] != x[i])
        if x.dtype.kind == "f":  # NaN equals NaN, as in polars' comparison
            keep &= ~(np.isnan(x)[None, :] & np.isnan(x[i]))
        ii, jj = np.broadcast_to(i, keep.shape)[keep], np.broadcast_to(j, keep.shape)[keep]
        yield (y[jj] - y[ii]) / (x[jj] - x[ii])


def _theil_sen(xy: pl.DataFrame) -> float:
    """Median of the pairwise slopes of ``x, y`` (robust to warm-up and stall outliers).

    Exact, in memory bounded by ``_SLOPES_AT_ONCE`` whatever the rows (a cross join of 6,000 rows took 1.7 GB): the
    slopes are counted once to find the median's ranks, narrowed to a bracket from a sample of them, and the
    values there selected; the median of the middle two as polars takes it."""
    xy = xy.drop_nulls(["x", "y"])  # a pair with a null has a null slope, which the median leaves out
    x, y = xy["x"].to_numpy(), xy["y"].to_numpy()
    n = len(x)
    # the pairs with two x values: all pairs but those within a group of equal x (the NaNs one group, as above)
    same = np.unique(x, return_counts=True, equal_nan=True)[1]
    total = n * (n - 1) // 2 - int((same * (same - 1) // 2).sum())
    if total == 0:
        return 0.0
    ranks = ((total - 1) // 2, total // 2)  # the middle one or two, 0-based
    step = max(1, total // _SLOPES_AT_ONCE)
    sample = np.sort(np.concatenate([b[::step] for b in _slope_blocks(x, y)]))
    if step == 1 and not np.isnan(sample[ranks[1]]):  # the sample is every slope (NaN sorted last, as polars does)
        return to_float(pl.Series(sample[list(ranks)]).median()) or 0.0
    margin = 4 * int(np.sqrt(len(sample))) + 2
    at = [r * len(sample) // total for r in ranks]
    lo, hi = sample[max(at[0] - margin, 0)], sample[min(at[1] + margin, len(sample) - 1)]
    for bracket in ((lo, hi), (-np.inf, np.inf)):  # the second only if the sample's bracket missed the middle
        below, kept = 0, []
        for b in _slope_blocks(x, y):
            below += int(np.count_nonzero(b < bracket[0]))
            kept.append(b[(b >= bracket[0]) & (b <= bracket[1])])
        inside = np.concatenate(kept)
        if below <= ranks[0] and ranks[1] < below + len(inside):
            inside.sort()
            mid = inside[[r - below for r in ranks]]
            return to_float(pl.Series(mid).median()) or 0.0
    # NaN slopes (a NaN in x or y) are in no range: polars' own median of the cross join, which sorts them last
    p = xy.with_row_index("i").join(xy.with_row_index("j"), how="cross", suffix="2")
    p = p.filter((pl.col("i") < pl.col("j")) & (pl.col("x") != pl.col("x2")))
    return float(p.select(((pl.col("y2") - pl.col("y")) / (pl.col("x2") - pl.col("x"))).median()).item() or 0.0)


def solve_alpha(accepted: float, steps: int) -> float:
    """α in [0, 1] with α + α² + … + α^steps = accepted (bisection; clipped to the reachable range)."""
    if accepted <= 0:
        return 0.0
    if accepted >= steps:
        return 1.0
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        if sum(mid ** i for i in range(1, steps + 1)) < accepted:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def _steps_of(res: Result, steps_now: int | None) -> int:
    """The trace's draft step count (:func:`_steps_known`); InputError when unknown."""
    return _steps_known(res, steps_now)[0]


def _steps_known(res: Result, steps_now: int | None) -> tuple[int, str]:
    """The trace's draft step count and how it is known: the caller's, else the manifest's, else inferred from the
    draft phase's repeated structure (:func:`_draft_repeats`); InputError when none of them knows it."""
    if steps_now is not None:
        if steps_now < 1:
            raise InputError(f"--steps-now must be >= 1, not {steps_now}")
        return steps_now, "given"
    spec = speculative(res.trace.path)
    if isinstance(spec.get("steps"), int) and spec["steps"] >= 1 and not spec.get("baseline"):
        return spec["steps"], "the manifest's speculative.steps"
    rep = _draft_repeats(res)
    if rep is not None:
        n, names, inst = rep
        return n, (f"inferred: the draft phase's GPU work repeats {n} times per instance "
                   f"({names} kernel names each run a multiple of {n} times in most of {inst} instances); "
                   "--steps-now N if that is wrong")
    raise InputError(f"{res.trace.path}: the number of draft steps is not recorded (no manifest with "
                     "speculative.steps beside it) and cannot be inferred (no draft phase whose kernels repeat: 1 step, "
                     "or a draft that is not a loop); "
                     "pass --steps-now N (Python: steps_now=N; the notebooks: SPECTRACE_STEPS=N)", "NO_STEPS")


def _draft_repeats(res: Result) -> tuple[int, int, int] | None:
    """How many times the draft phase's GPU work repeats per instance: each draft step runs the draft model's
    forward once, so every kernel name of it runs a multiple of the step count times. Per kernel name seen in at
    least half the draft instances, its most common count per instance; the greatest common divisor of those.
    ``(repeats, kernel names, draft instances)``, or None without draft instances or when nothing repeats (every
    name once per instance is one step, or a draft that is not a loop: not guessed)."""
    import math

    inst = res.instances.select("range_id", "range").filter(base_expr("range") == "draft").select("range_id")
    if inst.height == 0 or res.kernels is None or res.kernels.height == 0:
        return None
    k = res.kernels.select("name", "count").filter(res.kernels["range_id"].is_in(inst["range_id"].implode()))
    per = (k.group_by("name", "count").agg(n=pl.len()).sort("n", "count", descending=[True, False])
           .group_by("name", maintain_order=True).agg(pl.col("count").first(), seen=pl.col("n").sum()))
    modal = per.filter(pl.col("seen") * 2 >= inst.height)["count"].to_list()
    g = math.gcd(*modal) if modal else 0
    return (g, len(modal), inst.height) if g >= 2 else None


_ASSUMED_NOTE = "no baseline: verify cost assumed independent of the number of verified tokens"


def with_segments(m: Model, res: Result, steps_now: int | None = None, alpha: float | None = None,
                  as_traced: bool = False) -> Model:
    """``m`` (the whole run's model, no baseline) with its per-segment models (:func:`fit_segments`); with several
    batch sizes its note on verify's assumed cost says that the segments measure it."""
    m.segments = fit_segments(res, steps_now, alpha=alpha, as_traced=as_traced)
    if m.segments:
        m.notes = [f"the whole run mixes {len(m.segments)} batch sizes: its verify cost assumed independent of the "
                   "verified tokens (one average); measured per batch size (the per-segment models)"
                   if n == _ASSUMED_NOTE else n for n in m.notes]
    return m


def fitted(res: Result, steps_now: int | None = None, alpha: float | None = None, as_traced: bool = False) -> Model:
    """:func:`fit` (no baseline) with its per-segment models (:func:`fit_segments`) and the replays its document
    (:func:`to_dict`) asks for: a table kept with the result (:mod:`analyze.compute.view`), so that a second command
    on the same capture (``whatif``, ``report``, ``analyze``'s findings) reads the model instead of fitting it. One
    object per result and options: callers do not change it."""
    return _fitted(res, steps_now=steps_now, alpha=alpha, as_traced=as_traced)


@view.table(name="whatif_fit", params=("steps_now", "alpha", "as_traced"))
def _fitted(res: Result, steps_now: int | None, alpha: float | None, as_traced: bool) -> Model:
    m = with_segments(fit(res, steps_now, alpha=alpha, as_traced=as_traced), res, steps_now, alpha, as_traced)
    try:
        to_dict(m)  # the replays, kept in the model
    except InputError:
        pass  # (raised again where the document is asked for)
    for r in (m.replay, *(sm.model.replay for sm in m.segments)):
        if r is not None:
            r.let_go()
    return m


def fit(res: Result, steps_now: int | None = None, baseline: Result | None = None, alpha: float | None = None,
        as_traced: bool = False, period_ns: float | None = None) -> Model:
    """Fit the cost model on one analysed trace (``baseline``: an analysed decode_step trace, optional).

    ``as_traced``: predict the traced program (node tracing's graph launch cost kept); by default it is
    removed on a node-level trace. ``period_ns``: the measured period the predictions move from (default: the
    trace's cycle period).
    """
    s0, how = _steps_known(res, steps_now)
    cp = _cycle_phases(res)
    if cp.height == 0:
        raise InputError(f"{res.trace.path}: no cycle ranges with draft/verify phases inside; what-if needs "
                         "an EAGLE trace (cycle ⊃ draft, verify, draft_extend)", "NO_CYCLES")
    per = (cp.filter(pl.col("phase").is_in(_MODEL_PHASES))
           .group_by("n", "phase").agg(pl.col("x_span_ns").min(), pl.col("tokens").first()))
    cost = {k: float(v) for k, v in per.group_by("phase").agg(pl.col("x_span_ns").median()).sort("phase").iter_rows()}
    if "verify" not in cost:
        raise InputError(f"{res.trace.path}: no verify phase inside the cycles", "NO_VERIFY")
    tk = summary(res, steps=s0)
    period = (tk.period_ns if period_ns is None else period_ns) if tk.kind == "cycle" else None
    if period is None:
        raise InputError(f"{res.trace.path}: fewer than two cycles per rank; no cycle period", "NO_PERIOD")
    notes = []
    b = 0.0
    source = "assumed"
    prior = None
    if baseline is not None:
        bt = summary(baseline)
        step = real_or_none(cycles(baseline).filter((pl.col("kind") == "decode_step") & pl.col("steady"))
                            .group_by("n").agg(pl.col("i_span_ns").min())["i_span_ns"].median())
        if step is None:
            notes.append(f"{baseline.trace.path} has no decode_step ranges: not used for the verify slope")
        else:
            source = "baseline"
            b = (cost["verify"] - step) / s0
            if b < 0:
                notes.append(f"the baseline step ({step / 1e3:.1f} µs) is slower than verify: slope clipped to 0")
                b = 0.0
            notes.append(f"verify cost per verified token per request from the baseline step ({step / 1e3:.1f} µs, "
                         f"batch {bt.batch_size}): {b / 1e3:.2f} µs")
    else:
        prior = _verify_prior(res)
        if prior is None:
            notes.append(_ASSUMED_NOTE)
        else:
            source = "gpu_metrics"
            b = cost["verify"] * prior["tensor_active_pct"] / 100 / (s0 + 1)
            notes.append(f"no baseline: verify cost per verified token per request from verify's measured bound "
                         f"({prior['bound']}-bound, tensor cores {prior['tensor_active_pct']:.0f} % active, DRAM "
                         f"read {prior['dram_read_pct']:.0f} %): {b / 1e3:.2f} µs (a prior, docs/gpu-metrics.md)")
    e1 = 0.0
    ext = per.filter((pl.col("phase") == "draft_extend") & pl.col("tokens").is_not_null())
    if ext.height >= 3 and ext["tokens"].n_unique() > 1:
        e1 = _theil_sen(ext.select(x="tokens", y="x_span_ns"))
    if tk.accepted_per_request is not None:
        where = "the hooks' accept marks" if tk.acceptance_source == "marks" else "the range payload"
        notes.append(f"acceptance measured on {tk.accepted_cycles} cycles ({where}): mean {tk.accepted_per_request:.2f}, "
                     f"p50 {tk.accepted_p50:g}, p90 {tk.accepted_p90:g} accepted "
                     "draft tokens per request")
    alpha_given = alpha is not None
    if alpha is None and tk.accepted_per_request is not None:
        alpha = solve_alpha(tk.accepted_per_request, s0)
    elif alpha is None:
        notes.append("acceptance unknown (no accept-length payload): cycle times only; --acceptance sets it")
    batch = tk.batch_size
    if alpha is not None and batch is None:
        batch = 1.0
        notes.append("batch size unknown: tokens and tokens/s are per request")
    rp = replay(res)
    mode = res.trace.graph_trace_mode
    cut = (0.0, 0)
    if mode == "Node" and not as_traced:
        lc = _graph_launch_cost(res)
        if lc is None:
            notes.append("node-level graph trace with one graph size only: node tracing's launch cost cannot be "
                         "estimated; replayed as traced")
        else:
            cut = lc
    if rp.windows == 0:
        notes.append("no cycle could be replayed (no key host calls: an older result?): phase cost changes are "
                     "added to the measured period")
    m = Model(s0, float(period), cost, 0.0, b, e1, batch, alpha, tk.accepted_per_request, notes, rp, *cut, mode,
              verify_source=source, verify_prior=prior if source == "gpu_metrics" else None, steps_source=how,
              alpha_given=alpha_given)
    m.other_ns = m.predict(s0)["other_ns"]
    if cut[0]:
        now = m.cycle(s0)
        notes.append(f"node tracing's graph launch cost removed ({cut[0] / 1e3:.2f} µs per node beyond {cut[1]}): "
                     f"the model's cycle at "
                     f"{s0} steps is {now / 1e3:.1f} µs against {period / 1e3:.1f} µs traced "
                     f"({100 * (now / period - 1):+.1f} %)")
    return m


def _verify_prior(res: Result) -> dict | None:
    """Verify's utilisation over the steady state of ``res`` (all ranks; :mod:`analyze.compute.utilisation`) when
    GPU-metrics samples measure it: ``bound, dram_read_pct, tensor_active_pct, samples``; else None.

    The prior for verify's cost per extra verified token when nothing measures it: the share of verify's time its
    tensor cores are active grows with the tokens it verifies, the rest (reading the weights, memory-bound at small
    batch) does not: ``b = verify × tensor_active / (steps + 1)`` per extra token per request. Memory-bound verify
    (tensor cores a few % active) gives almost 0, as the old assumption; compute-bound verify nearly its full
    per-token weight."""
    from . import utilisation

    u = utilisation.phases(res)
    if u.height == 0:
        return None
    row = u.filter(pl.col("rank").is_null() & (pl.col("scope") == "steady") & (pl.col("phase") == "verify")
                   & (pl.col("instances") > 0) & pl.col("tensor_active_pct").is_not_null())
    if row.height == 0:
        return None
    r = row.row(0, named=True)
    return {k: r[k] for k in ("bound", "dram_read_pct", "tensor_active_pct", "samples")}


def to_dict(m: Model, max_steps: int = MAX_STEPS) -> dict:
    """The JSON document: ``{"predictions": [...], "best": ..., "best_measured": ..., "model": ..., "segments":
    [...]}`` (``best``: over every prediction; ``best_measured``: over those not extrapolated)."""
    best = m.best(max_steps)
    near = m.best(max_steps, measured_only=True)
    return {
        "predictions": m.predictions(max_steps),
        "best": best["steps"] if best else None,
        "best_measured": near["steps"] if near else None,
        "model": {
            "steps_now": m.steps_now, "steps_source": m.steps_source, "period_ns": m.period_ns, "cost_ns": m.cost_ns, "other_ns": m.other_ns,
            "verify_per_token_ns": m.verify_per_token_ns, "verify_source": m.verify_source,
            **({"verify_prior": m.verify_prior} if m.verify_prior else {}),
            "extend_per_token_ns": m.extend_per_token_ns,
            "batch_size": m.batch_size, "alpha": m.alpha, "accepted_per_request": m.accepted_now,
            "seams_ns": m.seams(m.steps_now), "launch_cut_per_node_ns": m.launch_cut_ns,
            "launch_cut_from_nodes": m.launch_cut_from,
            "replayed_cycles": m.replay.windows if m.replay is not None else 0,
            "assumptions": m.assumptions(), "notes": m.notes,
        },
        "segments": [sm.as_dict(max_steps) for sm in m.segments],
        **({"probe_effect": m.probe} if m.probe is not None else {}),
    }


def validate(results: dict[int, Result | Sequence[Result]], baseline: Result | None = None,
             as_traced: bool = True) -> pl.DataFrame:
    """Predicted vs measured cycle time: a model from each trace (steps → analysed Result, or a list of repeated
    runs' Results) predicts every step count.

    Measured at ``steps`` = the median over its runs of each run's cycle period (one run: that run's, so a model
    predicts its own period exactly); ``runs``/``measured_spread_pct`` say over how many runs and how far apart
    they were ((max − min) / median), i.e. how much of an error is run-to-run noise. ``from_run`` numbers the
    runs of ``from_steps`` in the order given. ``as_traced`` (default): models keep the traces' own probe
    effect, so that like is compared with like."""
    runs = {s: [r] if isinstance(r, Result) else list(r) for s, r in results.items()}
    models = {s: [fit(r, s, baseline=baseline, as_traced=as_traced) for r in rs] for s, rs in runs.items()}
    measured = {}
    for s, rs in runs.items():
        periods = [m.period_ns for m in models[s]]  # the trace's own period, whatever the fit's options
        toks = [t for t in (summary(r, steps=s).tokens_per_cycle for r in rs) if t is not None]
        med = float(np.median(periods))
        measured[s] = (med, float(np.median(toks)) if toks else None, len(rs),
                       100 * (max(periods) - min(periods)) / med)
    rows = []
    for s0, ms in models.items():
        for i, m in enumerate(ms):
            for s, (meas, tok, n, spread) in measured.items():
                p = m.predict(s)
                pred, ptok = p["cycle_ns"], p["tokens_per_cycle"]
                rows.append({"from_steps": s0, "from_run": i, "steps": s, "predicted_ns": pred, "measured_ns": meas,
                             "error_pct": 100 * (pred - meas) / meas, "runs": n, "measured_spread_pct": spread,
                             "predicted_tokens": ptok, "measured_tokens": tok,
                             "tokens_error_pct": 100 * (ptok - tok) / tok if ptok is not None and tok else None})
    return pl.DataFrame(rows).sort("from_steps", "from_run", "steps")
