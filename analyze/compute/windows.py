"""Ranks paired by cycle: capture windows, the instances they cut, lost GPU tails, cross-rank instance keys.

In tensor parallelism every rank runs the same cycles, but each process's capture opens and closes at
its own point of its own cycle (only one rank calls ``cudaProfilerStart``; a rank exits before CUPTI
flushed its buffers). Pairing the k-th instance of a phase on every rank then pairs different cycles,
and summing a cut rank with a whole one mixes different cycles. Here:

- **Window** (per rank, :func:`rank_window`): ``window_start_ns`` = its first CUDA event (API call or GPU
  op), ``window_end_ns`` = the end of its last GPU op; ``ranges_start_ns``/``ranges_end_ns`` = the first
  start and last end of its selected ranges.
- **Cuts** (:func:`_edges`, column ``cut``): an instance with GPU work whose range began before
  ``window_start_ns`` may have lost launches (``window_start``) when the window evidently opened mid-run:
  another rank of the report was already recording at the range's start, or an earlier instance of the
  phase ran on this rank before its window (a run whose ranges begin before its first CUDA call is not
  cut). A rank's GPU tail is lost when its ranges go on after its GPU rows stop: a range of a phase that
  nearly always has GPU work on that rank (:data:`_ALWAYS_GPU`) starts after ``window_end_ns`` without any.
  Then instances with GPU work still open at ``window_end_ns`` or holding its last op are
  ``window_end``, the ones after it ``tail_lost``.
- **Keys** (:func:`_keys`, column ``key``): equal on every rank for the same instance of a phase. From
  the hooks' payload when present: the cycle index of the instance or its nearest ancestor (24 bits,
  unwrapped) and the order in that cycle. A payload index that cannot identify cycles is ignored, with a
  ``PAYLOAD_CYCLE_INDEX`` warning, and the instances are paired as without one: within a process, cycle
  ranges whose index repeats or goes back (:func:`cycle_index_problem`), or ranks that ran at the same time
  under indices they share none of (:func:`_disjoint_ranks`). Otherwise by time, per phase and rank: the instance offset under
  which the collectives launched inside the instances (the first :data:`_ALIGN_KERNELS` of each kernel
  name in each innermost instance) end together (the kernels of up to :data:`_VOTE_INSTANCES`
  reference-rank instances each vote for the offset to the other rank's instance holding the same-name
  kernel that ends nearest), checked per instance (median end difference of its paired collectives
  within :data:`END_SPREAD_BOUND_NS`, else ``misaligned``). One clock is assumed (one report; several
  reports shifted by their session start). Instances without communication inside take their parent's
  identity and their order in it.
- **Presence** (:func:`_presence`, :func:`_whole_cycles`, column ``left_out``): in a phase keyed on several
  ranks, an instance is left out (``unpaired``) when another rank with GPU work in that phase has the same
  key cut, misaligned or without GPU work, or lacks it while not recording (before its window, after its
  last GPU op); an instance missing on another rank that was recording stays counted (its collectives have
  no partner). A cycle with any part left out is left out, with everything inside it, on every rank
  (``cycle``). So all-rank rows sum the same cycles on every rank, and collectives are matched only
  between instances of one cycle.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import polars as pl

from nvtx_hooks import phases as ph

from ..model import Diagnostic
from ..read import packed_keys
from . import align, attribute
from .payload import CYCLE_NAMES, base_expr, decode_exprs, decode_frame
from .scalars import whole_or_none

__all__ = ["WRAP", "END_SPREAD_BOUND_NS", "CODES", "rank_window", "cycle_index_problem", "with_cycle",
           "ordinal", "Paired", "pair", "pair_reports"]

WRAP = 1 << ph._CYC_BITS  # the payload's cycle index counts modulo this
# Collectives of one cycle end within a few µs of each other on one node; paired instances (and, in
# collectives.py, the matched collectives of a phase) whose ends are further apart than this are refused.
END_SPREAD_BOUND_NS = 50_000
_ALWAYS_GPU = 0.9  # share of a phase's instances with GPU work above which a range without any means lost rows
_VOTE_INSTANCES = 64  # reference-rank instances per phase whose collectives vote for the time offset
_ALIGN_KERNELS = 4  # collectives per kernel name and innermost instance that take part in the time alignment
CODES = ("PAYLOAD_CYCLE_INDEX", "INSTANCE_PAIRING", "WINDOW_CUT", "GPU_TAIL_LOST", "UNPAIRED_INSTANCES", "MISALIGNED_INSTANCES")
_WINDOW_COLS = ("window_start_ns", "window_end_ns", "ranges_start_ns", "ranges_end_ns")
_PHASE = ["domain", "range"]
_CYCLE_PHASES = [p.name for p in ph.PHASES if p.role == "cycle"]


def rank_window(ops: pl.DataFrame, api_first: int | None, nested: pl.DataFrame) -> dict[str, int | None]:
    """One process's capture window (:data:`_WINDOW_COLS`, ns; None where it has no such rows); ``api_first``:
    the start of its first CUDA API call."""
    def first(df: pl.DataFrame, c: str):
        return df[c].min() if df.height else None

    def last(df: pl.DataFrame, c: str):
        return df[c].max() if df.height else None

    starts = [v for v in (api_first, first(ops, "start")) if v is not None]
    return {"window_start_ns": min(starts) if starts else None, "window_end_ns": last(ops, "end"),
            "ranges_start_ns": first(nested, "start"), "ranges_end_ns": last(nested, "end")}


def cycle_index_problem(sel: pl.DataFrame) -> str | None:
    """Why the payload's cycle index cannot identify the cycles of the selected ranges ``sel`` (None when it
    can): in some process, cycle ranges (``cycle``, ``decode_step``) carry an index that repeats or goes back
    (in start order, after unwrapping), e.g. every cycle the same index."""
    cols = [c for c in ("uint64", "int64") if c in sel.columns]
    if not cols or sel.height == 0:
        return None
    d = (decode_frame(sel.select("pid", "start", "range", *cols)).filter(base_expr().is_in(CYCLE_NAMES))
         .filter(pl.col("cycle_index").is_not_null()).sort("pid", "start"))
    step = pl.col("cycle_index").diff().over("pid")
    bad = (step.is_not_null() & (step > -(WRAP // 2)) & (step <= 0)).sum()
    per = (d.group_by("pid").agg(n=pl.len(), distinct=pl.col("cycle_index").n_unique(), bad=bad)
           .filter(pl.col("bad") > 0).sort("pid"))
    if per.height == 0:
        return None
    r = per.row(0, named=True)
    more = f" (and {per.height - 1} more process(es))" if per.height > 1 else ""
    return (f"the payload's cycle index does not identify cycles: process {r['pid']}'s {r['n']} cycle ranges carry "
            f"{r['distinct']} distinct indices, {r['bad']} of them repeated or going back{more}; " + _IGNORED)


_IGNORED = ("the index is ignored: cycles are paired across ranks as without a payload (by their collectives, else "
            "by order), accept lengths come from each cycle range or the ranges directly inside it")


def with_cycle(inst: pl.DataFrame, anc: pl.DataFrame, use_index: bool = True) -> pl.DataFrame:
    """One process's instances with ``cycle``: the payload cycle index of the instance or of its nearest
    ancestor that has one, unwrapped (the index counts modulo 2^24 in start order); null without any, or
    everywhere when the index is not to be used (:func:`cycle_index_problem`)."""
    if not use_index:
        return inst.with_columns(cycle=pl.lit(None, pl.Int64))
    own = (inst.select("range_id", "start", "uint64", "int64").with_columns(decode_exprs())
           .filter(pl.col("cycle_index").is_not_null()).sort("start", "range_id"))
    wraps = (pl.col("cycle_index").diff() < -(WRAP // 2)).fill_null(False).cum_sum()
    own = own.select(anc="range_id", _u=pl.col("cycle_index") + wraps.cast(pl.Int64) * WRAP)
    nearest = (anc.join(own, on="anc").join(inst.select(anc="range_id", _d="depth"), on="anc")
               .sort("_d", descending=True).unique("range_id", keep="first"))
    return inst.join(nearest.select("range_id", cycle="_u"), on="range_id", how="left")


# ---- cuts -------------------------------------------------------------------------------------------------


def _edges(inst: pl.DataFrame, ranks: pl.DataFrame) -> pl.DataFrame:
    """``inst`` (with its phase code ``_ph``, :func:`_phase_codes`) with ``cut`` (``window_start``, ``window_end``,
    ``tail_lost`` or null) and ``_tail`` (the rank's ranges go on after its GPU rows stop)."""
    w = ranks.select("rank", _w0="window_start_ns", _w1="window_end_ns",
                     _rep=pl.col("report") if "report" in ranks.columns else pl.lit(0))
    # The earliest window start of the other ranks of its report (one clock): were they recording while
    # this rank was not?
    others = (w.join(w.select(_r="rank", _o="_w0", _rep="_rep"), on="_rep").filter(pl.col("rank") != pl.col("_r"))
              .group_by("rank").agg(_w0o=pl.col("_o").min()))
    w = w.drop("_rep")
    x = (inst.drop("cut", "_tail", strict=False).join(w, on="rank", how="left")
         .join(others, on="rank", how="left"))
    gpu = pl.col("i_ops") > 0
    # Start: the range began before this rank's first CUDA event, while another rank was already recording
    # or after an earlier instance of the phase ran here unrecorded (the window opened mid-run).
    late = (pl.col("_w0o") <= pl.col("start")).fill_null(False) | (
        (pl.col("end") < pl.col("_w0")).fill_null(False).any().over("rank", "_ph"))
    rate = (x.filter(pl.col("start") <= pl.col("_w1")).group_by("rank", "_ph").agg(_rate=gpu.mean()))
    x = x.join(rate, on=["rank", "_ph"], how="left", nulls_equal=True)
    after = ((pl.col("start") > pl.col("_w1")) & ~gpu & (pl.col("_rate") >= _ALWAYS_GPU)).fill_null(False)
    x = x.with_columns(_after=after).with_columns(_tail=pl.col("_after").any().over("rank"))
    at_end = (pl.col("end") > pl.col("_w1")) | (pl.col("i_last") >= pl.col("_w1"))
    cut = (pl.when(gpu & (pl.col("start") < pl.col("_w0")) & late).then(pl.lit("window_start"))
           .when(pl.col("_tail") & gpu & at_end).then(pl.lit("window_end"))
           .when(pl.col("_after")).then(pl.lit("tail_lost")))
    return x.with_columns(cut=cut).drop("_w0", "_w1", "_w0o", "_rate", "_after")


# ---- keys -------------------------------------------------------------------------------------------------


def _dense(df: pl.DataFrame, by: list[str], cols: list[str]) -> pl.Series:
    """Per group ``by``, a dense number of the distinct values of ``cols`` in sorted order (rows as given; nulls
    last). One dense rank of the columns packed into one integer (a string column by its dense rank) when they are
    integers, or strings, and pack into one key (:func:`analyze.read.packed_keys.sort_key`); else one sort by every
    column."""
    packed = packed_keys.sort_key(df, [*by, *cols], nulls="last")
    if packed is not None:
        r = df.select(*by, _r=packed.rank("dense").cast(pl.Int64))
        return r.select(pl.col("_r") - pl.col("_r").min().over(by))["_r"].alias("_k")
    d = df.with_row_index("_i").sort(*by, *cols, nulls_last=True)
    new = pl.any_horizontal([pl.col(c).ne_missing(pl.col(c).shift(1)) for c in [*by, *cols]]).fill_null(True)
    first = pl.any_horizontal([pl.col(c).ne_missing(pl.col(c).shift(1)) for c in by]).fill_null(True)
    d = d.with_columns(_n=new.cast(pl.Int64).cum_sum(), _f=first)
    d = d.with_columns(_k=pl.col("_n") - pl.when("_f").then(pl.col("_n")).forward_fill())
    return d.sort("_i")["_k"]


def _epochs(x: pl.DataFrame) -> pl.DataFrame:
    """``cycle`` of every rank on the lowest rank's wrap count (each process unwrapped its own)."""
    firsts = (x.filter(pl.col("cycle").is_not_null()).sort("start").group_by("rank", maintain_order=True)
              .agg(_c=pl.col("cycle").first()))
    if firsts.height < 2:
        return x
    ref = firsts.sort("rank")["_c"][0]
    firsts = firsts.with_columns(_e=((pl.col("_c") - ref) / WRAP).round(0).cast(pl.Int64))
    return (x.join(firsts.select("rank", "_e"), on="rank", how="left")
            .with_columns(cycle=pl.col("cycle") - pl.col("_e").fill_null(0) * WRAP).drop("_e"))


def ordinal(df: pl.DataFrame, key: str, name: str, out: str, by: tuple[str, ...] = ("start",),
            keep_order: bool = False) -> pl.DataFrame:
    """``df`` with ``out``: each row's order by ``by`` among the rows of its (integer ``key``, ``name``).

    One integer per group (``key`` × a dense code of ``name``), one stable sort by it and ``by``, and the
    distance to the group's first row: no window over two columns. Rows come back grouped, or in their
    order with ``keep_order``."""
    if df.schema[name] == pl.Categorical:
        code = pl.col(name).to_physical().cast(pl.Int64)
    else:
        code = pl.col(name).rank("dense").cast(pl.Int64)
    d = df.with_columns(_nc=code)
    # one integer per group: (key, name code) packed, a null key a group of its own per name
    group = packed_keys.packing((d,), [key, "_nc"], nulls="last")
    if group is None:
        d = df.sort(*by, maintain_order=True) if by and not keep_order else df
        return d.with_columns(pl.int_range(pl.len(), dtype=pl.Int64).over(key, name).alias(out))
    if keep_order:
        d = d.with_row_index("_row")
    d = packed_keys.sort_by(d.with_columns(group.key("_gk")), ["_gk", *by], maintain_order=True)
    i = pl.int_range(pl.len(), dtype=pl.Int64)
    new = pl.col("_gk").ne_missing(pl.col("_gk").shift(1)).fill_null(True)
    d = d.with_columns((i - pl.when(new).then(i).forward_fill()).alias(out)).drop("_nc", "_gk")
    return d.sort("_row").drop("_row") if keep_order else d


@dataclass
class _TimeAlignment:
    """By-time keys and how they were found: ``keys`` (range_id, _a, _mis), ``offsets`` (domain, range,
    rank, offset, spread_p50_ns: median end difference of the paired collectives)."""

    keys: pl.DataFrame
    offsets: pl.DataFrame


def _time_keys(cand: pl.DataFrame, anc: pl.DataFrame, kern: pl.DataFrame, bound: int = END_SPREAD_BOUND_NS
              ) -> _TimeAlignment:
    """Keys by time for the instances ``cand`` (no payload) that have communication inside (see module doc).

    ``anc``: the nesting (:func:`attribute.ancestors`); ``kern``: communication kernels with ``range_id``
    (innermost).
    """
    # Phases by their code (:func:`_phase_codes`): one integer instead of two strings in the joins and groups below.
    cand = cand.drop("_ph").rename({"_phj": "_ph"})
    ph = ["_ph"]
    # the first few collectives of each name in each instance are enough to pair and check it
    inc = (kern.lazy().filter(pl.col("range_id").is_not_null() & (pl.col("j") < _ALIGN_KERNELS))
           .select("range_id", "name", "start", "end")
           .join(anc.lazy(), on="range_id").drop("range_id").rename({"anc": "range_id"}).collect())
    # The candidates with such kernels (each once), numbered in time order per rank and phase; each kernel then
    # gets its instance's rank, phase, start and number, and its phase's reference rank, in one join.
    io = (cand.select("range_id", "rank", *ph, _is="start")
          .filter(pl.col("range_id").is_in(inc["range_id"].unique().implode())))
    io = (packed_keys.sort_by(io, ["_is", "range_id"])
          .with_columns(_o=pl.int_range(pl.len(), dtype=pl.Int64).over("rank", *ph)))
    ref = io.group_by(ph).agg(_ref=pl.col("rank").min(), _n=(pl.col("rank") == pl.col("rank").min()).sum())
    # (numbered on the four columns first: the sort moves them, not the ten after the join; the rows as before)
    inc = ordinal(inc, "range_id", "name", "_j").join(io.drop("_is").join(ref, on=ph, how="left"), on="range_id",
                                                      how="left", maintain_order="left")
    is_ref = pl.col("rank") == pl.col("_ref")
    # Votes: each kernel of a sample of reference instances, for the offset to the instance of another
    # rank whose kernel of the same name ends nearest (within the bound).
    step = (pl.col("_n") // _VOTE_INSTANCES).clip(lower_bound=1)
    left = inc.filter(is_ref & (pl.col("_o") % step == 0)).select(*ph, "name", "end", _oref="_o")
    nonref = inc.filter(~is_ref)  # (the votes' other side, and the kernels checked below)
    right = nonref.select(*ph, "name", "rank", "end", _or="_o", _er="end")
    left = left.join(right.select(*ph, "rank").unique(), on=ph)
    (left, right), by = packed_keys.with_key((left, right), [*ph, "name", "rank"])  # one integer to look up by
    right = right.drop(*ph, "name", "rank") if by == ["_key"] else right
    votes = (left.sort("end").join_asof(right.sort("end"), on="end", by=by, strategy="nearest", check_sortedness=False)
             .filter((pl.col("_er") - pl.col("end")).abs() <= bound)
             .group_by(*ph, "rank", offset=pl.col("_or") - pl.col("_oref")).agg(_v=pl.len()))
    # the offset most kernels vote for (the smallest one on a tie)
    off = votes.sort("_v", pl.col("offset").abs(), descending=[True, False]).unique([*ph, "rank"], keep="first")
    offs = pl.concat([ref.select(*ph, rank="_ref", offset=pl.lit(0, pl.Int64)), off.select(*ph, "rank", pl.col("offset").cast(pl.Int64))])
    io = io.join(offs, on=[*ph, "rank"], how="left").with_columns(_a=pl.col("_o") - pl.col("offset"))
    # Check each paired instance: its collectives must end with the reference instance's.
    # (a kernel's row has its instance's phase, rank and number: its _a is that number less its rank's offset, which
    # is 0 on the reference rank)
    refk = inc.filter(is_ref).select(*ph, "name", "_j", _a="_o", _eref="end")
    others = nonref.join(off.select(*ph, "rank", pl.col("offset").cast(pl.Int64)), on=[*ph, "rank"], how="left",
                         maintain_order="left").with_columns(_a=pl.col("_o") - pl.col("offset"))
    (others, refk), on = packed_keys.with_key((others, refk), [*ph, "_a", "name", "_j"])
    # (in the kernels' order, grouped by instance: the per-instance group-by below takes the sorted path)
    diff = (others.join(refk.select(*on, "_eref"), on=on, maintain_order="left").drop("_key", strict=False)
            .with_columns(_x=(pl.col("end") - pl.col("_eref")).abs()))
    io = io.join(_median_above(diff, "range_id", "_x", bound, "_far"), on="range_id", how="left").with_columns(
        _mis=pl.col("_a").is_null() | pl.col("_far").fill_null(False))
    spread = diff.group_by(*ph, "rank").agg(spread_p50_ns=pl.col("_x").median().cast(pl.Int64))
    offsets = (offs.join(spread, on=[*ph, "rank"], how="left")
               .join(io.group_by(ph).agg(_ranks=pl.col("rank").n_unique()), on=ph)
               .filter(pl.col("_ranks") > 1).drop("_ranks")
               .join(cand.group_by("_ph").agg(pl.col(*_PHASE).first()), on="_ph").drop("_ph")
               .select(*_PHASE, pl.exclude(*_PHASE)).sort(*_PHASE, "rank"))
    return _TimeAlignment(io.select("range_id", "_a", "_mis"), offsets)


def _median_above(df: pl.DataFrame, by: str, col: str, bound: int, out: str) -> pl.DataFrame:
    """Per ``by``: whether the median of the integer ``col`` (nulls ignored; the mean of the two middle values
    for an even count) is above ``bound``, from counts, a max and a min instead of a median: more than half
    the values above it, or exactly half and the two middle values (the largest at or below, the smallest
    above) averaging above it. Null for a group without values."""
    x = pl.col(col)
    if df[by].null_count() == 0 and df[by].is_sorted():  # a group-by on a column flagged sorted: no hashing
        df = df.with_columns(pl.col(by).set_sorted())
    g = df.group_by(by).agg(_n=x.count(), _up=(x > bound).sum(), _lo=x.filter(x <= bound).max(),
                            _hi=x.filter(x > bound).min())
    half = 2 * pl.col("_up") == pl.col("_n")
    above = (2 * pl.col("_up") > pl.col("_n")) | (half & (pl.col("_lo") + pl.col("_hi") > 2 * bound))
    return g.select(by, pl.when(pl.col("_n") > 0).then(above).alias(out))


@dataclass
class _Keys:
    instances: pl.DataFrame  # range_id, cycle (on the lowest rank's wrap count), key (null: unpaired), misaligned
    payload_phases: list[str]
    offsets: pl.DataFrame  # _TimeAlignment.offsets
    ignored_index: str | None = None  # why the payload's cycle index was not used (:func:`_disjoint_ranks`)


def _keys(x: pl.DataFrame, anc: pl.DataFrame, kern: pl.DataFrame, bound: int = END_SPREAD_BOUND_NS) -> _Keys:
    """Cross-rank keys of the instances ``x`` (of ranked processes; see the module docstring); ``anc``: their
    nesting (:func:`attribute.ancestors`)."""
    if x["rank"].n_unique() < 2:  # nothing to pair: each instance's order in its phase
        ordered = x.sort("start", "range_id")
        out = ordered.select("range_id", "cycle", key=pl.int_range(pl.len(), dtype=pl.Int64).over("_ph"),
                             misaligned=pl.lit(False))
        return _Keys(out, [], pl.DataFrame())
    x = _epochs(x)
    disjoint = _disjoint_ranks(x)
    if disjoint:
        x = x.with_columns(cycle=pl.lit(None, pl.Int64))
    ordered = packed_keys.sort_by(x, ["start", "range_id"])
    pay = (ordered.filter(pl.col("cycle").is_not_null())
           .with_columns(_b=pl.int_range(pl.len(), dtype=pl.Int64).over("rank", "_ph", "cycle"))
           .select("range_id", *_PHASE, "_ph", _src=pl.lit(0), _a="cycle", _b="_b", _p=pl.lit("")))
    ta = _time_keys(x.filter(pl.col("cycle").is_null()), anc, kern, bound)
    # misaligned instances keep the key of their offset: their partners learn that they are bad
    tk = (ta.keys.filter(pl.col("_a").is_not_null()).join(x.select("range_id", *_PHASE, "_ph"), on="range_id")
          .select("range_id", *_PHASE, "_ph", _src=pl.lit(1), _a="_a", _b=pl.lit(0, pl.Int64), _p=pl.lit("")))
    mis = ta.keys.filter("_mis").select("range_id")
    known = pl.concat([pay, tk])
    # Instances without communication inside: their parent's identity and their order in the parent.
    ident = pl.format("{}:{}#{}#{}#{}#{}", "domain", "range", "_src", "_a", "_b", "_p")
    rest = ordered.filter(pl.col("parent").is_not_null()).join(known.select("range_id"), on="range_id", how="anti")
    for depth in sorted(rest["depth"].unique().drop_nulls().to_list()):
        lvl = rest.filter(pl.col("depth") == depth).join(
            known.select(parent="range_id", _pp=ident), on="parent")
        if lvl.height == 0:
            continue
        lvl = lvl.with_columns(_b=pl.int_range(pl.len(), dtype=pl.Int64).over("parent", "_ph")).select(
            "range_id", *_PHASE, "_ph", _src=pl.lit(2), _a=pl.lit(0, pl.Int64), _b="_b", _p="_pp")
        known = pl.concat([known, lvl])
    k = known.with_columns(key=_dense(known, ["_ph"], ["_src", "_a", "_b", "_p"]))
    out = (x.select("range_id", "cycle").join(k.select("range_id", "key"), on="range_id", how="left")
           .with_columns(misaligned=pl.col("range_id").is_in(mis["range_id"].implode())))
    phases_by_payload = sorted(x.filter(pl.col("cycle").is_not_null())["range"].unique().to_list())
    return _Keys(out, phases_by_payload, ta.offsets, disjoint)


def _disjoint_ranks(x: pl.DataFrame) -> str | None:
    """Two ranks whose payload-indexed cycle ranges ran at the same time (their spans overlap by more than
    half the shorter) but share no cycle index: the index cannot pair them (None when no such pair)."""
    c = (x.filter(pl.col("cycle").is_not_null() & base_expr().is_in(CYCLE_NAMES))
         .group_by("rank").agg(t0=pl.col("start").min(), t1=pl.col("start").max(), idx=pl.col("cycle").unique()))
    if c.height < 2:
        return None
    rows = c.sort("rank").to_dicts()
    for i, a in enumerate(rows):
        for b in rows[i + 1:]:  # a handful of ranks
            both = min(a["t1"], b["t1"]) - max(a["t0"], b["t0"])
            if both > 0.5 * min(a["t1"] - a["t0"], b["t1"] - b["t0"]) and not set(a["idx"]) & set(b["idx"]):
                return (f"the payload's cycle index does not identify cycles: ranks {a['rank']} and {b['rank']} ran "
                        "their cycles at the same time under indices they share none of; " + _IGNORED)
    return None


# ---- presence, and everything together ----------------------------------------------------------------


@dataclass
class Paired:
    instances: pl.DataFrame  # with cycle, cut, key, left_out
    kernels: pl.DataFrame  # with k (the instance key; -1 outside phases) and left_out
    diagnostics: list[Diagnostic] = field(default_factory=list)


def pair(inst: pl.DataFrame, kern: pl.DataFrame, ranks: pl.DataFrame, bound: int = END_SPREAD_BOUND_NS) -> Paired:
    """Cuts, keys and presence over every rank's instances (one clock); kernels keyed by their instance."""
    if "cycle" not in inst.columns:
        inst = inst.with_columns(cycle=pl.lit(None, pl.Int64))
    # Worked out on the few columns the steps read (the instance frame is ~50 columns: every join would copy it),
    # the four results then added to it.
    # Phases as integer codes (:func:`_phase_codes`) in every join and group below, not two strings.
    x = _edges(_phase_codes(inst.select(_PAIR_COLS)), ranks)
    ranked = x.filter(pl.col("rank").is_not_null())
    anc = attribute.ancestors(ranked.select("range_id", "parent", "depth"))
    ks = _keys(ranked.select("range_id", "rank", *_PHASE, "_ph", "_phj", "start", "parent", "depth", "cycle"), anc,
               kern, bound)
    x = (x.drop("cycle").join(ks.instances, on="range_id", how="left")
         .with_columns(pl.col("misaligned").fill_null(False)))
    x = x.join(_presence(x, ranks), on="range_id", how="left")
    left_out = (pl.when(pl.col("cut").is_not_null()).then("cut")
                .when(pl.col("misaligned")).then(pl.lit("misaligned"))
                .when(pl.col("_gone").fill_null(False)).then(pl.lit("unpaired")))
    x = _whole_cycles(x.with_columns(left_out=left_out), anc)
    diags = _diagnostics(x, ranks, ks)
    x = x.select("range_id", "cut", "cycle", "key", "left_out")
    m = kern.select("range_id").join(x.select("range_id", "key", "left_out"), on="range_id", how="left",
                                     maintain_order="left")
    kern = kern.drop("left_out", strict=False).hstack(m.select("key", "left_out"))
    if m["key"].null_count() == kern["range_id"].null_count() and m["left_out"].null_count() == m.height:
        # every kernel inside an instance has its key, none left out: the same columns without the conditions
        return Paired(_with_pairing(inst, x), kern.with_columns(k=pl.col("key").fill_null(-1).cast(pl.Int64))
                      .drop("key"), diags)
    inside = pl.col("range_id").is_not_null()
    kern = kern.with_columns(
        k=pl.when(inside).then(pl.col("key")).otherwise(-1).cast(pl.Int64),
        left_out=pl.when(inside & pl.col("key").is_null()).then(pl.coalesce("left_out", pl.lit("unpaired")))
        .otherwise("left_out"),
    ).drop("key")
    return Paired(_with_pairing(inst, x), kern, diags)


def _phase_codes(x: pl.DataFrame) -> pl.DataFrame:
    """``x`` with ``_ph``: an integer per phase (``domain, range``; a null in either is a value, as in a group-by),
    and ``_phj``: the same, null where either is null (a join on the two columns matches no such row)."""
    ids = x.select(_PHASE).unique().with_row_index("_ph").with_columns(pl.col("_ph").cast(pl.Int64))
    x = x.join(ids, on=_PHASE, how="left", nulls_equal=True, maintain_order="left")
    return x.with_columns(_phj=pl.when(pl.col("domain").is_not_null() & pl.col("range").is_not_null()).then("_ph"))


_PAIR_COLS = ("range_id", "rank", *_PHASE, "start", "end", "i_ops", "i_last", "parent", "depth", "cycle")


def _with_pairing(inst: pl.DataFrame, x: pl.DataFrame) -> pl.DataFrame:
    """``inst`` with ``x``'s ``cut, cycle, key, left_out`` (``x``: a row per instance, ``range_id`` unique), in
    place of any it had: added as columns when the rows are in the same order, else joined."""
    wide = inst.drop("cut", "_tail", "cycle", "key", "left_out", "misaligned", strict=False)
    if x.height == wide.height and x["range_id"].equals(wide["range_id"]):
        return wide.hstack(x.drop("range_id"))
    return wide.join(x, on="range_id", how="left", maintain_order="left")


def pair_reports(results: list) -> Paired:
    """:func:`pair` over the ranks of several analysed reports (one per node or rank): ranks numbered across
    them in order and a ``report`` column, as :func:`analyze.compute.pipeline.merge_results` does; times put on
    report 0's session clock (utcEpochNs) for the pairing only, then given back as each report has them."""
    offs = align.session_offsets([r.trace.utc_epoch_ns for r in results]) or [0] * len(results)
    insts, kerns, rks = [], [], []
    base = idb = 0
    for i, (r, off) in enumerate(zip(results, offs)):
        tag = {"report": pl.lit(i, pl.Int32), "_off": pl.lit(off, pl.Int64), "_idb": pl.lit(idb, pl.Int64)}
        insts.append(r.instances.drop("cut", "key", "left_out", "report", strict=False).with_columns(
            rank=pl.col("rank") + base, range_id=pl.col("range_id") + idb, parent=pl.col("parent") + idb,
            **{c: pl.col(c) + off for c in ("start", "end", "i_last")}, **tag))
        kerns.append(r.comm_kernels.drop("k", "left_out", "_g", "report", strict=False).with_columns(
            rank=pl.col("rank") + base, range_id=pl.col("range_id") + idb, start=pl.col("start") + off,
            end=pl.col("end") + off, **tag))
        rks.append(r.ranks.with_columns(rank=pl.col("rank") + base, report=pl.lit(i, pl.Int32),
                                        **{c: pl.col(c) + off for c in ("window_start_ns", "window_end_ns")}))
        base += r.ranks.height
        idb += int(r.instances["range_id"].max() or 0) + 1
    p = pair(pl.concat(insts, how="diagonal_relaxed"), pl.concat(kerns, how="diagonal_relaxed"),
             pl.concat(rks, how="diagonal_relaxed"))
    back = {"range_id": pl.col("range_id") - pl.col("_idb")}
    inst = p.instances.with_columns(**back, parent=pl.col("parent") - pl.col("_idb"),
                                    **{c: pl.col(c) - pl.col("_off") for c in ("start", "end", "i_last")})
    kern = p.kernels.with_columns(**back, start=pl.col("start") - pl.col("_off"), end=pl.col("end") - pl.col("_off"))
    return Paired(inst.drop("_off", "_idb").sort("report", "range_id"), kern.drop("_off", "_idb"), p.diagnostics)


def _paired_phases(x: pl.DataFrame) -> pl.DataFrame:
    """Phases paired across ranks (keys on several ranks) and the ranks taking part: every rank with GPU work
    in the phase (``_ph, rank``; phases with a null domain or name are not paired)."""
    has = x.filter((pl.col("i_ops") > 0) & pl.col("rank").is_not_null() & pl.col("_phj").is_not_null())
    multi = has.group_by("_ph").agg(_keyed=pl.col("rank").filter(pl.col("key").is_not_null()).n_unique()).filter(
        pl.col("_keyed") > 1)
    return has.select("_ph", "rank").unique().join(multi.select("_ph"), on="_ph")


def _presence(x: pl.DataFrame, ranks: pl.DataFrame) -> pl.DataFrame:
    """Per keyed instance with GPU work of a paired phase: ``_gone`` when another taking-part rank has the
    same key cut, misaligned or without GPU work, or lacks it while not recording (the instance starts
    before that rank's window or after its last GPU op); ``_solo`` when another rank lacks it while recording
    (counted, but its collectives have no partner)."""
    # Phases by their code; null outside the paired phases. (phase, key, rank), (phase, key) and (phase, rank) each
    # packed into one integer where they fit (:func:`analyze.read.packed_keys.with_key`): one-column group-bys and
    # joins.
    part = _paired_phases(x)
    x = x.with_columns(_ph=pl.when(pl.col("_ph").is_in(part["_ph"].unique().implode())).then("_ph"))
    keyed = x.filter(pl.col("key").is_not_null() & pl.col("rank").is_not_null() & pl.col("_ph").is_not_null()).select(
        "range_id", "rank", "_ph", "key", "start", _gpu=pl.col("i_ops") > 0,
        _okr=(pl.col("i_ops") > 0) & pl.col("cut").is_null() & ~pl.col("misaligned"))
    (keyed,), gkr = packed_keys.with_key((keyed,), ["_ph", "key", "rank"], "_gkr")
    (keyed,), gk = packed_keys.with_key((keyed,), ["_ph", "key"], "_gk")
    (keyed, part), pr = packed_keys.with_key((keyed, part), ["_ph", "rank"], "_pr")
    state = keyed.group_by(gkr).agg(*[pl.col(c).first() for c in dict.fromkeys([*gk, *pr]) if c not in gkr],
                                    _ok=pl.col("_okr").all())
    # Where every taking-part rank has the key (the rule), no rank lacks it: count the other ranks' bad states.
    st = state.join(part.select(pr), on=pr, how="semi")
    per_key = st.group_by(gk).agg(_np=pl.len(), _nf=(~pl.col("_ok")).sum())
    n_part = part.group_by("_ph").agg(_nt=pl.len())
    mine = (keyed.filter("_gpu").join(per_key, on=gk, how="left").join(n_part, on="_ph", how="left")
            .join(st.select(*gkr, _own="_ok"), on=gkr, how="left"))
    full = pl.col("_np") == pl.col("_nt")
    bad_others = pl.col("_nf") - (~pl.col("_own")).cast(pl.UInt32)
    whole = mine.filter(full).select("range_id", _gone=bad_others > 0, _solo=pl.lit(False))
    lack = mine.filter(~full)
    if lack.height == 0:
        return whole
    # Otherwise, rank by rank: a rank without the key counts by whether it was recording when the instance started.
    state = keyed.group_by("_ph", "key", "rank").agg(_ok=pl.col("_okr").all())
    part = part.select("_ph", "rank")
    w = ranks.select(_s="rank", _w0="window_start_ns", _w1="window_end_ns")
    other = (lack.select("range_id", "rank", "_ph", "key", "start")
             .join(part.rename({"rank": "_s"}), on="_ph").filter(pl.col("_s") != pl.col("rank"))
             .join(state.rename({"rank": "_s"}), on=["_ph", "key", "_s"], how="left")
             .join(w, on="_s", how="left"))
    outside = (pl.col("start") < pl.col("_w0")) | (pl.col("start") > pl.col("_w1"))
    some = other.group_by("range_id").agg(
        _gone=((pl.col("_ok") == False) | (pl.col("_ok").is_null() & outside)).any(),  # noqa: E712
        _solo=(pl.col("_ok").is_null() & ~outside).any())
    return pl.concat([whole, some])


def _whole_cycles(x: pl.DataFrame, anc: pl.DataFrame) -> pl.DataFrame:
    """Left out whole: a cycle (a range of a ``cycle``-role phase: cycle, prefill, decode_step) with any part
    left out is left out with everything inside it, and so is the same cycle (key) on every other rank
    (``left_out`` = ``cycle`` where nothing else applies): every phase's all-rank row covers the same cycles
    as the cycle count."""
    if x["left_out"].null_count() == x.height:  # nothing left out: no cycle to leave out
        return x
    cyc = x.filter(pl.col("rank").is_not_null() & base_expr().is_in(_CYCLE_PHASES)).select("_phj", "key", anc="range_id")
    if cyc.height == 0:
        return x
    inside = anc.join(cyc, on="anc").join(x.select("range_id", "left_out"), on="range_id")
    bad = inside.group_by("anc", "_phj", "key").agg(_bad=pl.col("left_out").is_not_null().any()).filter("_bad")
    keys_ = bad.filter(pl.col("key").is_not_null()).select("_phj", "key").unique()
    dropped = pl.concat([bad.select("anc"), cyc.join(keys_, on=["_phj", "key"]).select("anc")])
    gone = anc.join(dropped.unique(), on="anc")["range_id"].unique()
    return x.with_columns(left_out=pl.when(pl.col("range_id").is_in(gone.implode()))
                          .then(pl.coalesce("left_out", pl.lit("cycle"))).otherwise("left_out"))


# ---- diagnostics ----------------------------------------------------------------------------------------


def _ms(ns) -> str:
    return f"{ns / 1e6:,.3f}"


def _names(df: pl.DataFrame, span: bool = False) -> str:
    """``'draft' ×2 (t0–t1 ms), ...`` from rows of ``range, n[, t0, t1]``."""
    parts = []
    for r in df.sort("t0" if span else "range").iter_rows(named=True):
        s = f"{r['range']!r} ×{r['n']}"
        parts.append(s + (f" ({_ms(r['t0'])}–{_ms(r['t1'])} ms)" if span else ""))
    return ", ".join(parts)


def _diagnostics(x: pl.DataFrame, ranks: pl.DataFrame, ks: _Keys) -> list[Diagnostic]:
    out: list[Diagnostic] = []
    if ks.ignored_index:
        out.append(Diagnostic("warning", "PAYLOAD_CYCLE_INDEX", ks.ignored_index))
    multi_ph = _paired_phases(x).select("_ph").unique()
    multi = x.select("_ph", *_PHASE).join(multi_ph, on="_ph", how="semi").unique("_ph").drop("_ph")
    gpu_ranks = x.filter((pl.col("i_ops") > 0) & pl.col("rank").is_not_null())["rank"].n_unique()
    if gpu_ranks > 1 and multi.height:
        how = []
        if ks.payload_phases:
            how.append("by the payload's cycle index: " + ", ".join(repr(p) for p in ks.payload_phases))
        off = ks.offsets.join(multi.select(_PHASE), on=_PHASE)
        if off.height:
            per_phase = []
            for (_, rng), g in off.group_by(_PHASE, maintain_order=True):
                ref = whole_or_none(g["rank"].min())
                shifts = ", ".join(f"rank {r['rank']}'s n-th = rank {ref}'s (n{-r['offset']:+d})-th" + (
                    f", ends {r['spread_p50_ns'] / 1e3:,.1f} µs apart" if r["spread_p50_ns"] is not None else "")
                    for r in g.iter_rows(named=True) if r["offset"] is not None and r["rank"] != ref)
                per_phase.append(f"{rng!r} ({shifts})")
            how.append("by time, the instance offset under which collectives end together (p50 end "
                       "difference): " + "; ".join(per_phase))
        counted = (x.filter(pl.col("left_out").is_null() & (pl.col("i_ops") > 0)).join(multi_ph, on="_ph")
                   .group_by("_ph").agg(pl.col("range").first(), n=pl.col("key").n_unique()).sort("range"))
        same = ", ".join(f"{r['range']!r} ×{r['n']}" for r in counted.iter_rows(named=True))
        out.append(Diagnostic("info", "INSTANCE_PAIRING", "instances paired across ranks " + "; ".join(how)
                              + (f". Counted on every rank: {same}" if same else "")))
    w = ranks.select("rank", "window_start_ns", "window_end_ns", "ranges_end_ns")
    cut = x.filter(pl.col("cut").is_in(["window_start", "window_end"]))
    # the rank with the most cut instances first, then by rank: whatever the export's row order
    cut = cut.with_columns(_n=pl.len().over("rank")).sort(["_n", "rank"], descending=[True, False])
    for (rank,), g in cut.group_by("rank", maintain_order=True):
        r = w.filter(pl.col("rank") == rank).row(0, named=True)
        sides = []
        for side in ("window_start", "window_end"):
            s = g.filter(pl.col("cut") == side).group_by("range").agg(n=pl.len())
            if s.height:
                sides.append(f"at its {side.split('_')[1]} {_names(s)}")
        out.append(Diagnostic(
            "warning", "WINDOW_CUT",
            f"rank {rank}: {g.height} instance(s) with GPU work cut by its capture window "
            f"({_ms(r['window_start_ns'])}–{_ms(r['window_end_ns'])} ms): {'; '.join(sides)}; left out of per-phase "
            "sums and cross-rank numbers on every rank"))
    out += _tails(x, w)
    un = x.filter(pl.col("left_out").is_in(["unpaired", "cycle"]) & (pl.col("i_ops") > 0))
    if un.height:
        kept = x.filter(pl.col("left_out").is_null() & (pl.col("i_ops") > 0)).group_by("_phj").agg(
            _lo=pl.col("start").min(), _hi=pl.col("start").max())
        un = un.join(kept, on="_phj", how="left").with_columns(
            _inside=(pl.col("start") > pl.col("_lo")) & (pl.col("start") < pl.col("_hi")))
        for (rank,), g in un.sort("rank").group_by("rank", maintain_order=True):
            per = g.group_by("range").agg(n=pl.len(), t0=pl.col("start").min(), t1=pl.col("end").max())
            inside = bool(g["_inside"].fill_null(False).any())
            out.append(Diagnostic(
                "warning" if inside else "info", "UNPAIRED_INSTANCES",
                f"rank {rank}: {g.height} instance(s) whose instance or cycle is absent, cut or without GPU work on "
                f"another rank{' (some in mid-run)' if inside else ''}: {_names(per, True)}; left out of per-phase "
                "sums and cross-rank matching"))
    solo = x.filter(pl.col("_solo").fill_null(False) & pl.col("left_out").is_null())
    for (rank,), g in solo.group_by("rank", maintain_order=True):
        per = g.group_by("range").agg(n=pl.len(), t0=pl.col("start").min(), t1=pl.col("end").max())
        out.append(Diagnostic(
            "warning", "UNPAIRED_INSTANCES",
            f"rank {rank}: {g.height} instance(s) missing on another rank while it was recording: {_names(per, True)}; "
            "counted in its per-phase sums, but its collectives have no partner (not matched)"))
    mis = x.filter(pl.col("left_out") == "misaligned")
    for (rank,), g in mis.group_by("rank", maintain_order=True):
        per = g.group_by("range").agg(n=pl.len(), t0=pl.col("start").min(), t1=pl.col("end").max())
        out.append(Diagnostic(
            "warning", "MISALIGNED_INSTANCES",
            f"rank {rank}: {g.height} instance(s) could not be paired by time (their collectives do not end within "
            f"{END_SPREAD_BOUND_NS / 1e3:,.0f} µs of the reference rank's): {_names(per, True)}; left out"))
    return sorted(out, key=lambda d: CODES.index(d.code))


def _tails(x: pl.DataFrame, w: pl.DataFrame) -> list[Diagnostic]:
    """GPU_TAIL_LOST: a rank's ranges go on without GPU rows, or other ranks have GPU work for cycles it lacks."""
    out = []
    top = x.filter(pl.col("parent").is_null() & pl.col("rank").is_not_null())
    lost = top.filter(pl.col("cut") == "tail_lost").group_by("rank").agg(_lost=pl.len(), _names=pl.col("range").unique())
    # Cycles (top-level keys) with whole GPU work on another rank, after this rank's last GPU op, without GPU
    # work here.
    have = top.filter((pl.col("i_ops") > 0) & pl.col("key").is_not_null())
    ranks = w.select("rank", "window_end_ns")
    pk = have.filter(pl.col("cut").is_null()).group_by("_phj", "key").agg(
        _t=pl.col("start").min(), _g=pl.col("i_last").max(), _on=pl.col("rank"))
    keyed_ranks = have.select("_phj", "rank").unique()
    lack = (pk.join(keyed_ranks, on="_phj").filter(~pl.col("_on").list.contains(pl.col("rank")))
            .join(ranks, on="rank").filter(pl.col("_t") > pl.col("window_end_ns"))
            .group_by("rank").agg(_lack=pl.len(), _upto=pl.col("_g").max()))
    cut = x.filter(pl.col("cut") == "window_end").group_by("rank").agg(_cut=pl.len())
    rows = (ranks.join(lost, on="rank", how="left").join(lack, on="rank", how="left").join(cut, on="rank", how="left")
            .join(w.select("rank", "ranges_end_ns"), on="rank")
            .with_columns(_lack=pl.when(pl.col("_lost").is_null() & (pl.col("_lack") >= 2)).then("_lack"))
            .filter(pl.col("_lost").is_not_null() | pl.col("_lack").is_not_null()).sort("rank"))
    for r in rows.iter_rows(named=True):
        end = max(v for v in (r["ranges_end_ns"] if r["_lost"] else None, r["_upto"] if r["_lack"] else None)
                  if v is not None)
        what = []
        if r["_lost"]:
            what.append(f"{r['_lost']} top-level instance(s) ({', '.join(repr(n) for n in sorted(r['_names']))}) "
                        "have ranges but no GPU work")
        if r["_lack"]:
            what.append(f"other ranks have GPU work for {r['_lack']} top-level instance(s) it lacks")
        if r["_cut"]:
            what.append(f"{r['_cut']} instance(s) are cut at its last GPU op")
        out.append(Diagnostic(
            "warning", "GPU_TAIL_LOST",
            f"rank {r['rank']}: its GPU rows stop at {_ms(r['window_end_ns'])} ms but the run goes on to {_ms(end)} ms "
            f"({_ms(end - r['window_end_ns'])} ms lost): {'; '.join(what)}. Those instances, and the same cycles on "
            "every other rank, are left out (the process likely ended before CUPTI flushed its buffers)"))
    return out
