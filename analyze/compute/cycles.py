"""The decode cycles of an analysed trace, and which of them are the steady state.

One row per cycle instance with GPU work (:func:`cycles`): its rank, order, kind (``cycle`` or ``decode_step``,
:data:`analyze.compute.payload.CYCLE_NAMES`), GPU first/last op, period, the prefills that ran before it, batch
size, cycle index and accept length (from the payload, the hooks' ``accept`` marks or the manifest), tokens, and
whether it is in the steady state (:mod:`analyze.compute.steady_cycles` decides; :func:`selection` says what and
why). Tokens per cycle:

- EAGLE, payload: ``accept_length + batch_size`` (the payload's accept length counts accepted draft
  tokens summed over the batch, without the bonus token); the accept length is taken from the cycle
  range or from any range of the same process with the same cycle index (``draft_extend`` in SGLang);
- baseline (``decode_step``): ``batch_size`` (one token per request per step), from the payload or the
  manifest's ``speculative.batch``;
- EAGLE without a known accept length: unknown (null).

Two tables (:mod:`analyze.compute.view`): the cycles before any choice (:func:`raw_cycles`, once per result), and
flagged under the result's cycle choice (:func:`flagged_cycles`, kept with the result in its cache).
"""

from __future__ import annotations

import polars as pl

from nvtx_hooks import phases as ph

from ..model import Result
from ..read.manifest import speculative
from . import steady_cycles, view
from .payload import CYCLE_NAMES, accept_beyond_bound, base_expr, decode_frame

__all__ = ["cycles", "selection", "flagged_cycles", "raw_cycles", "prefill_rows", "STEPS_SOURCES", "draft_repeats"]


def cycles(res: Result) -> pl.DataFrame:
    """One row per cycle instance with GPU work: rank, n (order on its rank), kind, GPU first/last, period,
    batch_size, cycle_index, accept_length, tokens (null when unknown), and whether it is in the steady
    state (``steady``, ``why`` not, ``key`` = its identity across ranks; :mod:`analyze.compute.steady_cycles`)."""
    return flagged_cycles(res).cycles


def selection(res: Result) -> steady_cycles.Selection:
    """What :func:`cycles` decided: counts of cycles, warm-up and stalls, the text that says so."""
    return flagged_cycles(res).selection


@view.table()
def flagged_cycles(res: Result) -> steady_cycles.Flagged:
    """:func:`cycles` and :func:`selection`: the cycles flagged under the result's cycle choice
    (:func:`analyze.compute.steady_cycles.flag_cycles`)."""
    return steady_cycles.flag_cycles(raw_cycles(res), res.cycle_choice)


@view.table(kept=False, any_choice=True)
def raw_cycles(res: Result) -> pl.DataFrame:
    """One row per cycle instance with GPU work, before any choice of the steady ones (the what-if per batch size
    asks for one view of the result per batch size: made once for all of them)."""
    inst = decode_frame(res.instances).with_columns(base=base_expr())
    if "cycle" in inst.columns:  # an index the pairing ignored (analyze.compute.windows: PAYLOAD_CYCLE_INDEX) is none
        inst = inst.with_columns(cycle_index=pl.when(pl.col("cycle").is_not_null()).then("cycle_index"))
    counted = pl.col("left_out").is_null() if "left_out" in inst.columns else pl.lit(True)  # as in res.phases
    cyc = inst.filter(pl.col("base").is_in(CYCLE_NAMES) & (pl.col("i_ops") > 0) & counted)
    # Accept lengths of the ranges directly inside a cycle (SGLang's draft_extend): found without the index too.
    by = ["pid", *(["report"] if "report" in inst.columns else [])]
    kids = (inst.filter(pl.col("accept_length").is_not_null() & pl.col("parent").is_not_null())
            .group_by(*by, range_id="parent").agg(acc_kid=pl.col("accept_length").sort_by("start").first()))
    cyc = cyc.join(kids, on=[*by, "range_id"], how="left", maintain_order="left")
    known = pl.col("accept_length").is_not_null() & pl.col("cycle_index").is_not_null()
    acc = pl.concat([
        inst.filter(known).select("pid", "cycle_index", "accept_length", src=pl.lit("payload")),
        _accept_marks(res).filter(known).select("pid", "cycle_index", "accept_length", src=pl.lit("marks")),
    ]).sort("src", descending=True)  # a range's payload first, then the marks
    acc = acc.group_by("pid", "cycle_index").agg(acc_any=pl.col("accept_length").first(),
                                                 acc_src=pl.col("src").first())
    cyc = cyc.join(acc, on=["pid", "cycle_index"], how="left").sort("rank", "i_first")
    batch = _manifest_batch(res)
    prev_last = pl.col("i_last").shift(1).over("rank")
    cyc = cyc.with_columns(
        kind=pl.col("base"),
        n=pl.int_range(pl.len()).over("rank"),
        period_ns=pl.col("i_last") - prev_last,
        lead_ns=pl.col("i_first") - prev_last,
        accept_source=pl.when(pl.col("accept_length").is_not_null()).then(pl.lit("payload"))
        .otherwise(pl.coalesce("acc_src", pl.when(pl.col("acc_kid").is_not_null()).then(pl.lit("payload")))),
        accept_length=pl.coalesce("accept_length", "acc_any", "acc_kid"),
        payload_batch=pl.col("batch_size"),
        batch_size=pl.coalesce("batch_size", pl.lit(batch, pl.Int64)),
        pair_key=pl.col("key") if "key" in cyc.columns else pl.lit(None, pl.Int64),
        graphs=pl.col("i_graphs") if "i_graphs" in cyc.columns else pl.lit(None, pl.String),
    )
    beyond = accept_beyond_bound(_run_steps(res))  # an accept length no cycle can have: unknown (PAYLOAD_ACCEPT_LENGTH)
    cyc = cyc.with_columns(accept_length=pl.when(~beyond).then("accept_length"),
                           accept_source=pl.when(~beyond).then("accept_source"))
    cyc = _with_prefill(cyc, inst)
    cyc = _with_steps(res, cyc, inst, by)
    tokens = (pl.when(pl.col("kind") == "decode_step").then(pl.col("batch_size"))
              .otherwise(pl.col("accept_length") + pl.col("batch_size")))
    return cyc.with_columns(tokens=tokens).select(
        "rank", "pid", "range_id", "n", "kind", "range", "start", "end", "i_first", "i_last", "i_span_ns",
        "period_ns", "lead_ns", "prefill_ns", "prefills", "batch_size", "payload_batch", "graphs", "cycle_index",
        "pair_key", "accept_length", "accept_source", "tokens", "steps", "steps_source")


STEPS_SOURCES = ("payload", "no draft", "draft repeats")


def _with_steps(res: Result, cyc: pl.DataFrame, inst: pl.DataFrame, by: list[str]) -> pl.DataFrame:
    """``cyc`` with ``steps`` (the draft steps each cycle ran with) and ``steps_source`` (how it is known, one of
    :data:`STEPS_SOURCES`; null: unknown): the payload's (``verify``'s, the authority, else the cycle range's or any
    range's directly inside it); else 0 for a cycle with a ``verify`` but no ``draft`` range inside (SGLang's
    verify-only cycles, adaptive tiers at 0 steps); else, per group of cycles of one batch size and the same CUDA
    graphs, how many times the draft's GPU work repeats (each draft step runs the draft model's forward once: every
    kernel name runs a multiple of the step count times; :func:`draft_repeats`)."""
    if cyc.height == 0:
        return cyc.with_columns(steps=pl.lit(None, pl.Int64), steps_source=pl.lit(None, pl.String))
    kids = inst.filter(pl.col("parent").is_not_null()).select(*by, "parent", "base", "payload_steps", "range_id")
    per = (kids.group_by(*by, range_id="parent")
           .agg(_v_steps=pl.col("payload_steps").filter(pl.col("base") == "verify").max(),
                _k_steps=pl.col("payload_steps").max(),
                _drafts=(pl.col("base") == "draft").sum(), _verifies=(pl.col("base") == "verify").sum(),
                _draft_ids=pl.col("range_id").filter(pl.col("base") == "draft")))
    cyc = cyc.join(per, on=[*by, "range_id"], how="left", maintain_order="left")
    from_payload = pl.coalesce("_v_steps", "payload_steps", "_k_steps")
    no_draft = (pl.col("kind") == "cycle") & (pl.col("_verifies").fill_null(0) > 0) & (pl.col("_drafts").fill_null(0) == 0)
    cyc = cyc.with_columns(
        steps=pl.when(from_payload.is_not_null()).then(from_payload).when(no_draft).then(pl.lit(0, pl.Int64)),
        steps_source=pl.when(from_payload.is_not_null()).then(pl.lit("payload"))
        .when(no_draft).then(pl.lit("no draft")))
    todo = cyc.filter(pl.col("steps").is_null() & (pl.col("_drafts").fill_null(0) > 0))
    if todo.height and res.kernels is not None and res.kernels.height:
        groups = todo.select("rank", "payload_batch", "graphs", "_draft_ids").explode("_draft_ids")
        inferred = []
        for (rank, batch, graphs), g in groups.group_by("rank", "payload_batch", "graphs"):
            n = draft_repeats(res.kernels.filter(pl.col("rank") == rank), g["_draft_ids"])
            if n is not None:
                inferred.append((rank, batch, graphs, n[0]))
        if inferred:
            inf = pl.DataFrame(inferred, schema={"rank": cyc.schema["rank"], "payload_batch": cyc.schema["payload_batch"],
                                                 "graphs": cyc.schema["graphs"], "_inferred": pl.Int64}, orient="row")
            cyc = (cyc.join(inf, on=["rank", "payload_batch", "graphs"], how="left", nulls_equal=True,
                            maintain_order="left")
                   .with_columns(steps_source=pl.when(pl.col("steps").is_null() & pl.col("_inferred").is_not_null())
                                 .then(pl.lit("draft repeats")).otherwise("steps_source"),
                                 steps=pl.coalesce("steps", "_inferred")).drop("_inferred"))
    return cyc.drop("_v_steps", "_k_steps", "_drafts", "_verifies", "_draft_ids")


def draft_repeats(kernels: pl.DataFrame, draft_ids: pl.Series) -> tuple[int, int, int] | None:
    """How many times the GPU work of the draft instances ``draft_ids`` (range ids in ``kernels``: one rank's
    ``Result.kernels``) repeats per instance: each draft step runs the draft model's forward once, so every kernel
    name of it runs a multiple of the step count times. Per kernel name seen in at least half the instances, its
    most common count per instance; the greatest common divisor of those. ``(repeats, kernel names, instances)``,
    or None without instances or when nothing repeats (every name once per instance is one step, or a draft that is
    not a loop, or a graph launched whole: not guessed)."""
    import math

    ids = draft_ids.unique()
    if ids.len() == 0 or kernels.height == 0:
        return None
    k = kernels.filter(pl.col("range_id").is_in(ids.implode())).select("name", "count")
    per = (k.group_by("name", "count").agg(n=pl.len()).sort("n", "count", descending=[True, False])
           .group_by("name", maintain_order=True).agg(pl.col("count").first(), seen=pl.col("n").sum()))
    modal = per.filter(pl.col("seen") * 2 >= ids.len())["count"].to_list()
    g = math.gcd(*modal) if modal else 0
    return (g, len(modal), ids.len()) if g >= 2 else None


_PREFILL_NAMES = ("prefill",)


_PREFILL_ROWS = pl.Schema({"rank": pl.Int64, "range_id": pl.Int64, "cycle_id": pl.Int64, "span": pl.Int64,
                           "compute": pl.Int64, "comm": pl.Int64, "idle": pl.Int64, "gpu_idle": pl.Int64})


def prefill_rows(inst: pl.DataFrame, cyc: pl.DataFrame) -> pl.DataFrame:
    """The top-level prefill instances with GPU work, each with the cycle of ``cyc`` (every cycle, ``range_id``,
    ``i_first``) that ran next on its rank: ``rank, range_id, cycle_id`` (that cycle's range_id) and the prefill's
    GPU ``span`` (first op → last op), ``compute, comm, idle, gpu_idle``. A prefill after a rank's last cycle has
    none and is left out. One mapping for the cycles' ``prefill_ns`` and the budget's prefill pieces."""
    pre = inst.filter(base_expr().is_in(_PREFILL_NAMES) & (pl.col("i_ops") > 0) & pl.col("parent").is_null()
                      & pl.col("rank").is_not_null())
    if pre.height == 0 or cyc.height == 0:
        return pl.DataFrame(schema=_PREFILL_ROWS)
    return (pre.select("rank", "range_id", _t="i_first", span="i_span_ns",
                       compute=pl.col("i_busy_ns") - pl.col("i_comm_ns"), comm="i_comm_ns", idle="i_idle_ns",
                       gpu_idle="i_gpu_idle_ns").sort("_t")
            .join_asof(cyc.select("rank", cycle_id="range_id", _t="i_first").sort("_t"), on="_t", by="rank",
                       strategy="forward", check_sortedness=False)
            .filter(pl.col("cycle_id").is_not_null()).select(list(_PREFILL_ROWS)).cast(_PREFILL_ROWS))


def _with_prefill(cyc: pl.DataFrame, inst: pl.DataFrame) -> pl.DataFrame:
    """``cyc`` (sorted by rank, i_first) with ``prefill_ns``/``prefills``: the GPU spans (first op → last op) of
    the top-level prefill ranges that ran between the previous cycle's last GPU op and this cycle's first."""
    pre = (prefill_rows(inst, cyc).group_by("rank", range_id="cycle_id")
           .agg(prefill_ns=pl.col("span").sum(), prefills=pl.len()))
    return (cyc.join(pre, on=["rank", "range_id"], how="left", maintain_order="left")
            .with_columns(pl.col("prefill_ns").fill_null(0).cast(pl.Int64),
                          pl.col("prefills").fill_null(0).cast(pl.UInt32)))


def _accept_marks(res: Result) -> pl.DataFrame:
    """The hooks' ``accept`` marks decoded: ``rank, pid, time, batch_size, cycle_index, accept_length``.

    SGLang's v2 worker keeps accept lengths on the GPU; the hooks mark them where the scheduler has them on
    the host anyway, one or two cycles later, with the cycle index of the batch they belong to (join by index).
    """
    m = res.marks.filter((pl.col("domain") == ph.DOMAIN) & (pl.col("mark") == ph.ACCEPT.name))
    return decode_frame(m).select("rank", "pid", "time", "batch_size", "cycle_index", "accept_length")


def _run_steps(res: Result) -> int | None:
    """The run's draft steps as its manifest records them (None: unknown)."""
    s = speculative(res.trace.path).get("steps")
    return s if isinstance(s, int) and s >= 1 else None


def _manifest_batch(res: Result) -> int | None:
    b = speculative(res.trace.path).get("batch")
    return b if isinstance(b, int) else None
