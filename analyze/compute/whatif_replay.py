"""The what-if's replay: each measured cycle replayed on the trace's own CPU and GPU timelines.

A :class:`Replay` holds the replayable cycles of a trace (:func:`replay`, a table of the steady view): per window
(one rank's cycle, from its first phase's launch call to the next cycle's), the host's key calls in order (slots)
and the GPU phase each one launches, as arrays. :meth:`Replay.run` replays every window with each phase's GPU span
changed (:mod:`analyze.compute.whatif`: how, and what the predictions assume).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import polars as pl

from ..model import Result
from ..read import packed_keys, results
from . import view
from .cycles import cycles
from .payload import base_expr
from .scalars import to_float, to_int

__all__ = ["MODEL_PHASES", "Replay", "replay"]

MODEL_PHASES = ("draft", "verify", "draft_extend")  # the phases whose cost the model changes (by base name)


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
    :data:`MODEL_PHASES` (-1: any other range). ``trans``: index into ``labels`` of the seam this phase ends
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
        d = np.array([delta.get(p, 0.0) for p in MODEL_PHASES] + [0.0])
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


def _same_rank(by: int) -> pl.Expr:
    """On rows sorted by rank: whether the row ``by`` rows away (as :meth:`polars.Expr.shift` counts) is of the same
    rank (null ranks one rank). ``when(_same_rank(by)).then(x.shift(by))`` is ``x.shift(by).over("rank")`` without a
    window per rank (where no such row exists, the shifted value is null either way)."""
    return pl.col("rank").shift(by).eq_missing(pl.col("rank"))


def _qualified(res: Result) -> Callable[[str], pl.Expr]:
    """A range id qualified by its rank (range ids are unique per report only: a merged result has several), as one
    value: the two packed into one integer (:func:`analyze.read.packed_keys.bounded`, within the instances' ranks
    and ids), or, when they do not pack, a string. Null where either is."""
    inst = res.instances
    bounds = []
    for c in ("rank", "range_id"):
        lo, hi = inst[c].min(), inst[c].max()
        bounds.append((to_int(lo), to_int(hi)) if lo is not None and hi is not None else (0, 0))
    p = packed_keys.bounded(["rank", "range_id"], bounds)
    if p is None:
        return lambda col: pl.format("{}:{}", "rank", col)

    def packed(col: str) -> pl.Expr:
        q = packed_keys.bounded(["rank", col], bounds)
        assert q is not None  # (the same bounds as p's)
        return q.key(col)
    return packed


@dataclass
class _Cycles:
    """The steady cycles a replay starts from: ``cyc`` (``rank, n, range_id`` qualified, ``period_ns``: to the next
    steady cycle's first GPU op, null when that one is not steady) and ``periods`` (those with one)."""

    cyc: pl.DataFrame
    periods: pl.DataFrame


def _steady_cycles(res: Result, uid: Callable[[str], pl.Expr]) -> _Cycles:
    # A replayed window runs from one cycle's first GPU op to the next's: it holds the cycle and the wait before
    # the next one, so both must be steady (a cycle's period, tokens.DEFINITION, ends at its last op instead).
    cyc = (cycles(res).filter(pl.col("kind") == "cycle").sort("rank", "n")
           .with_columns(period_ns=pl.when(_same_rank(-1) & pl.col("steady").shift(-1))
                         .then(pl.col("i_first").shift(-1) - pl.col("i_first")))
           .filter("steady").with_columns(range_id=uid("range_id")))
    return _Cycles(cyc, cyc.filter(pl.col("period_ns").is_not_null()))


def _units(inst: pl.DataFrame, cyc_ids: pl.Series) -> pl.DataFrame:
    """The range instances with GPU work (the units a key call launches) with their cycle (``cyc``: the cycle
    itself or its parent) and the unit before them on their rank's GPU (``pred``, its last op, phase and cycle)."""
    units = (inst.select("rank", "gtid", "range_id", "parent", "range", "x_ops", gpu_first="x_first", gpu_last="x_last",
                         gpu_span="x_span_ns").filter(pl.col("x_ops") > 0).drop("x_ops")  # narrow, then the rows
             .with_columns(phase=base_expr(),
                           cyc=pl.when(pl.col("range_id").is_in(cyc_ids)).then("range_id")
                           .when(pl.col("parent").is_in(cyc_ids)).then("parent"))
             .sort("rank", "gpu_first")
             .with_columns(pl.when(_same_rank(1)).then(pl.col(c).shift(1)).alias(n)
                           for c, n in (("range_id", "pred"), ("gpu_last", "pred_gpu_last"), ("phase", "pred_phase"),
                                        ("cyc", "pred_cyc"))))
    code = {p: i for i, p in enumerate(MODEL_PHASES)}
    return units.with_columns(code=pl.col("phase").replace_strict(code, default=-1, return_dtype=pl.Int64))


# Each timing term of a key call, observed where it bound the phase's start (or the sync's return) in the trace.
_OBSERVED = (("launch_latency_obs", pl.col("host_bound")), ("device_gap_obs", pl.col("gpu_bound")),
             ("return_latency_obs", pl.col("waited")), ("own_time_obs", pl.col("sync") & ~pl.col("waited")))


def _key_calls(calls: pl.DataFrame, units: pl.DataFrame, threads: pl.DataFrame) -> tuple[pl.DataFrame, dict]:
    """The key calls of the cycles' threads (syncs, and each unit's launch) with the unit each launches and the
    terms of the replay: which one bound each phase's GPU start in the trace, the observed value where it did and a
    default where it did not (per rank and kind, else per rank, else 0), and the overall medians (``defaults``)."""
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
    fine = items.group_by("rank", "key").agg(pl.col(col).filter(ok).median().alias(f"_{col}_1") for col, ok in _OBSERVED)
    coarse = items.group_by("rank").agg(pl.col(col).filter(ok).median().alias(f"_{col}_2") for col, ok in _OBSERVED)
    items = (items.join(fine, on=["rank", "key"], how="left").join(coarse, on="rank", how="left")
             .with_columns(pl.coalesce(f"_{col}_1", f"_{col}_2", pl.lit(0.0)).alias(f"def_{col}") for col, _ in _OBSERVED))
    overall = items.select(x for col, ok in _OBSERVED for x in (ok.sum().alias(f"n{col}"),
                                                                 pl.col(col).filter(ok).median().alias(col))).row(0, named=True)
    defaults = {col[:-4]: to_float(overall[col]) if overall[f"n{col}"] else 0.0 for col, _ in _OBSERVED}
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
    return items, defaults


def _graph_gaps(calls: pl.DataFrame, items: pl.DataFrame, threads: pl.DataFrame) -> pl.DataFrame:
    """``items`` with ``gap_nodes``/``gap_launches``: the graph launches between a key call and the one before it
    (not the first launch of a phase): part of the host's time between them, node tracing's cost of each taken off
    that time too."""
    extra = (calls.select("rank", "gtid", "ops", "start", "graph", "sync", "unit")
             .filter(pl.col("graph") & ~pl.col("sync") & pl.col("unit").is_null())
             .join(threads, on=["rank", "gtid"], how="semi").select("rank", "ops", t="start").sort("t"))
    # (the keys as they come: a repeated s matches as the same s)
    gaps = (extra.join_asof(items.select("rank", "s").sort("s"), left_on="t", right_on="s", by="rank",
                            strategy="forward", check_sortedness=False)
            .group_by("rank", "s").agg(gap_nodes=pl.col("ops").sum().cast(pl.Float64),
                                       gap_launches=pl.len().cast(pl.Float64)))
    return items.join(gaps, on=["rank", "s"], how="left").with_columns(pl.col("gap_nodes", "gap_launches").fill_null(0))


def _cycle_starts(units: pl.DataFrame, items: pl.DataFrame, cyc: pl.DataFrame) -> pl.DataFrame:
    """Per steady cycle (``rank, n, cyc, period``): the launch call of its first phase (``window_start``)."""
    return (units.select("cyc", "range_id", "gpu_first").filter(pl.col("cyc").is_not_null()).sort("gpu_first")
            .group_by("cyc")
            .agg(pl.col("range_id").first())
            .join(items.select("unit", "s"), left_on="range_id", right_on="unit")
            .join(cyc.select("rank", "n", cyc="range_id", period="period_ns"), on="cyc")
            .select("rank", "n", "cyc", "period", window_start="s").sort("rank", "n"))


def _windows(first: pl.DataFrame, items: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
    """The windows (``win``: ``w, rank, n, cyc, period``; cycle n of a rank runs from the launch call of its first
    phase, :func:`_cycle_starts`, to that of cycle n + 1's) and the key calls of each (``long``: in window order, each
    with its window ``w`` and that window's cycle ``wcyc``; the call that closes a window is its last)."""
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
    return win, items[order["_i"]].with_columns(order["w"], order["wcyc"])


def _slots(long: pl.DataFrame) -> pl.DataFrame:
    """``long`` (by window) with each call's slot ``k`` in its window, the slots of the unit it follows on the GPU
    (``pred_k``) and of the work a sync waits for (``wait_k``), when those are in the same window, and the seam each
    unit ends inside its window's cycle (``trans``, an index into the returned ``labels``)."""
    # sorted by window: each row's slot is its distance from its window's first row (no window per group)
    i = pl.int_range(pl.len())
    long = long.with_columns(k=i - pl.when(~(pl.col("w") == pl.col("w").shift(1)).fill_null(False)).then(i).forward_fill())
    # A unit launched by several key calls in a window (a phase whose work two calls launch): its first call starts
    # it on the GPU (its span runs from its first op); the later ones are plain host calls.
    later = pl.col("unit").is_not_null() & pl.col("unit").is_duplicated().over("w") \
        & (pl.col("k") > pl.col("k").min().over("w", "unit"))
    if long.select(later.any()).item():
        long = long.with_columns(pl.when(later).then(None).otherwise(pl.col(c)).alias(c)
                                 for c in ("unit", "pred", "cyc", "pred_cyc", "code"))
    slot_of = long.select("w", "unit", "k").filter(pl.col("unit").is_not_null()).select("w", ref="unit", ref_k="k")
    # A window is one rank's: its units, the phases they follow and the work its syncs wait for are that rank's; the
    # window and the (qualified) range id are looked up as one packed key when they pack (one hash a row).
    (by_ref, pred_on, wait_on), on = packed_keys.with_key(
        (slot_of.rename({"ref_k": "_k"}), long.select("w", ref="pred"), long.select("w", ref="wait_range_id")),
        ["w", "ref"])
    # each row's slot looked up on the key columns (a unit is once in its window, above: no row repeats)
    by_ref = by_ref.select(*on, "_k")
    long = long.with_columns(pred_on.join(by_ref, on=on, how="left", maintain_order="left")["_k"].alias("pred_k"),
                             wait_on.join(by_ref, on=on, how="left", maintain_order="left")["_k"].alias("wait_k"))
    return long


def _labels_and_seams(long: pl.DataFrame) -> tuple[pl.DataFrame, list[str]]:
    """``long`` with the replay's item columns (:data:`_ITEM_COLS`), and the seam labels ``trans`` indexes."""
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
    return long, labels


def _arrays(long: pl.DataFrame, n_w: int) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """The item columns as ``(windows, slots)`` arrays (padded: False, -1 or NaN), and the items per window."""
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
    return arrays, n_items


def _build_replay(res: Result) -> Replay:
    """The :class:`Replay` of an analysed trace (its cycles, phase instances and key host calls): the steady cycles,
    the units on each rank's GPU, the key calls with their terms, the windows and each call's slot in its window,
    laid out as arrays."""
    uid = _qualified(res)
    steady = _steady_cycles(res, uid)
    cyc, periods = steady.cyc, steady.periods
    calls = res.host_calls
    if cyc.height == 0 or calls is None or calls.height == 0:
        return Replay(np.zeros(0, np.int64), np.zeros(0), np.zeros(0, np.int64), {}, [],
                      periods["period_ns"].cast(pl.Float64).to_numpy())
    calls = calls.with_columns(unit=uid("unit"), wait_range_id=uid("wait_range_id"))
    inst = res.instances.with_columns(range_id=uid("range_id"), parent=uid("parent"))
    cyc_ids = cyc["range_id"].implode()
    units = _units(inst, cyc_ids)
    threads = (inst.select("rank", "gtid", "range_id").filter(pl.col("range_id").is_in(cyc_ids))
               .select("rank", "gtid").unique())
    items, defaults = _key_calls(calls, units, threads)
    items = _graph_gaps(calls, items, threads)
    first = _cycle_starts(units, items, cyc)
    del units, calls, inst  # done with
    win, long = _windows(first, items)
    del items, first  # done with: freed before the slots are laid out
    long, labels = _labels_and_seams(_slots(long))
    arrays, n_items = _arrays(long, win.height)
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
