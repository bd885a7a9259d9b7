"""Decode cycles and generated tokens: from the spectrace payload, else the capture's manifest.

A *cycle* is one ``cycle`` range (EAGLE) or one ``decode_step`` range (baseline), recognised by
:func:`nvtx_hooks.phases.base_name` with any prefix. Tokens per cycle:

- EAGLE, payload: ``accept_length + batch_size`` (the payload's accept length counts accepted draft
  tokens summed over the batch, without the bonus token); the accept length is taken from the cycle
  range or from any range of the same process with the same cycle index (``draft_extend`` in SGLang);
- baseline (``decode_step``): ``batch_size`` (one token per request per step), from the payload or the
  manifest's ``speculative.batch``;
- EAGLE without a known accept length: unknown (null).

**Cycle period and tokens/s, the one definition** (:data:`DEFINITION`; CLI, JSON, report, compare and
what-if all use :func:`summary`): a cycle's period is the time from the previous cycle's last GPU op to
its own last GPU op on the same rank (what it waited for before it started, prefill included, and what it
ran); the trace's cycle period is the mean of those over the steady-state cycles
(:mod:`analyze.compute.steady`: warm-up and rare outliers left out, recurring slow cycles kept) of each
rank, averaged over ranks, i.e. steady time per cycle; tokens per cycle is the mean over the same cycles
(first rank); tokens/s = tokens per cycle / cycle period. Anchored at the cycle's end, one late event is
one cycle on every rank: a rank that starts cycle k late and a rank that waits for it inside cycle k both
see a long cycle k.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import polars as pl

from nvtx_hooks import phases as ph

from ..model import Result
from ..read import results
from . import steady
from .scalars import real_or_none, to_float

__all__ = ["CYCLE_NAMES", "DEFINITION", "base_expr", "cycle_order", "decode_exprs", "decode_frame",
           "manifest_path", "speculative", "read_manifest", "cycles", "selection", "prefill_rows", "Tokens",
           "summary"]

CYCLE_NAMES = ("cycle", "decode_step")
DEFINITION = ("cycle period = last GPU op of the previous cycle → last GPU op of this cycle, mean over the "
              "steady-state cycles of each rank, averaged over ranks; tokens/s = tokens per cycle (mean over the same cycles) "
              "/ cycle period")
_U = pl.UInt64


def base_expr(col: str = "range") -> pl.Expr:
    """``base_name`` as a polars expression (phase name after the last ``.:/ `` separator when known)."""
    # Worked out once per distinct name (a handful), then looked up: no regex per row.
    names = pl.col(col).unique(maintain_order=True)
    tail = names.str.extract(r"([^.:/ ]+)$", 1)
    base = pl.when(names.is_in(ph.NAMES)).then(names).when(tail.is_in(ph.NAMES)).then(tail).otherwise(names)
    return pl.col(col).replace_strict(names, base)


def cycle_order(col: str = "phase") -> pl.Expr:
    """Where a phase runs in a decode cycle (:data:`nvtx_hooks.phases.CYCLE_ORDER`, by base name); others 99."""
    return base_expr(col).replace_strict(list(ph.CYCLE_ORDER), list(range(len(ph.CYCLE_ORDER))), default=99,
                                         return_dtype=pl.Int64)


def decode_exprs(uint64: str = "uint64", int64: str = "int64") -> list[pl.Expr]:
    """``batch_size``, ``cycle_index``, ``accept_length`` decoded from the payload columns (null if none), from
    every payload version :data:`nvtx_hooks.phases.PAYLOAD_LAYOUTS` defines (1 and 2; the fields sit where each
    version's layout puts them)."""
    v = pl.coalesce(pl.col(uint64).cast(_U, strict=False), pl.col(int64).cast(_U, strict=False))
    ver = v // (1 << ph.VERSION_SHIFT)

    def field(name: str) -> pl.Expr:
        expr: pl.Expr = pl.lit(None, pl.Int64)
        for version, layout in ph.PAYLOAD_LAYOUTS.items():
            _, shift, bits, offset = next(f for f in layout if f[0] == name)
            raw = (v // (1 << shift)) % (1 << bits)
            val = pl.when(raw > 0).then(raw.cast(pl.Int64) - offset) if offset else raw.cast(pl.Int64)
            expr = pl.when(ver == version).then(val).otherwise(expr)
        return expr

    return [field("batch_size").alias("batch_size"), field("cycle_index").alias("cycle_index"),
            field("accept_length").alias("accept_length")]


def decode_frame(df: pl.DataFrame) -> pl.DataFrame:
    """``df`` with the decoded payload columns added (``uint64``/``int64`` columns may be absent)."""
    for c in ("uint64", "int64"):
        if c not in df.columns:
            df = df.with_columns(pl.lit(None, pl.Int64).alias(c))
    return df.with_columns(decode_exprs())


def manifest_path(report: str | Path) -> Path:
    """``NAME.manifest.json`` beside ``NAME.sqlite``."""
    p = Path(report)
    name = p.name[: -len(".sqlite")] if p.name.endswith(".sqlite") else p.stem
    return p.with_name(name + ".manifest.json")


def speculative(report: str | Path) -> dict:
    """The manifest's ``speculative`` settings; for the embedded workload, completed from its command line
    with the workload's defaults (manifests written before every setting was recorded lack them)."""
    m = read_manifest(report) or {}
    spec = dict(m.get("speculative") or {})
    if spec.get("workload") and isinstance(m.get("command"), list):
        from nvtx_hooks.capture.manifest import speculative_config

        spec = {**speculative_config([str(t) for t in m["command"]]), **spec}
    return spec


def read_manifest(report: str | Path) -> dict | None:
    """The capture's manifest (beside it, or a bundled sample's), or None when there is none or it is not JSON."""
    p = manifest_path(report)
    if not p.exists():
        from nvtx_hooks.capture import samples

        if Path(report).resolve().parent == samples.cache_dir().resolve():
            p = samples.data_dir(Path(report).name.removesuffix(".sqlite")) / p.name
    try:
        return json.loads(p.read_text())
    except (OSError, ValueError):
        return None


def cycles(res: Result) -> pl.DataFrame:
    """One row per cycle instance with GPU work: rank, n (order on its rank), kind, GPU first/last, period,
    batch_size, cycle_index, accept_length, tokens (null when unknown), and whether it is in the steady
    state (``steady``, ``why`` not, ``key`` = its identity across ranks; :mod:`analyze.compute.steady`)."""
    key = ("cycles", repr(sorted(res.cycle_choice.items())))
    if key not in res.memo:
        res.memo[key] = results.derived(res, key, lambda: steady.flag_cycles(_raw_cycles(res), res.cycle_choice))
    return res.memo[key][0]


def selection(res: Result) -> dict:
    """What :func:`cycles` decided: counts of cycles, warm-up and stalls, the text that says so."""
    cycles(res)
    return res.memo[("cycles", repr(sorted(res.cycle_choice.items())))][1]


def _raw_cycles(res: Result) -> pl.DataFrame:
    """:func:`_cycles`, once per result whatever the cycle choice (the what-if per batch size asks for one view of
    the result per batch size; the views share the memo)."""
    key = ("cycles, any choice",)
    if key not in res.memo:
        res.memo[key] = _cycles(res)
    return res.memo[key]


def _cycles(res: Result) -> pl.DataFrame:
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
    cyc = _with_prefill(cyc, inst)
    tokens = (pl.when(pl.col("kind") == "decode_step").then(pl.col("batch_size"))
              .otherwise(pl.col("accept_length") + pl.col("batch_size")))
    return cyc.with_columns(tokens=tokens).select(
        "rank", "pid", "range_id", "n", "kind", "range", "start", "end", "i_first", "i_last", "i_span_ns",
        "period_ns", "lead_ns", "prefill_ns", "prefills", "batch_size", "payload_batch", "graphs", "cycle_index",
        "pair_key", "accept_length", "accept_source", "tokens")


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


def _manifest_batch(res: Result) -> int | None:
    b = speculative(res.trace.path).get("batch")
    return b if isinstance(b, int) else None


@dataclass
class Tokens:
    """What one trace says about generated tokens (None where unknown)."""

    kind: str | None  # "cycle" (speculative) or "decode_step" (baseline); None without cycles
    source: str | None  # "payload", "manifest" or None
    cycles: int  # cycle instances on the ranks, summed
    steps: int | None  # speculative draft steps (payload cannot carry it: manifest or caller)
    batch_size: float | None
    period_ns: float | None  # the cycle period (DEFINITION: mean over the steady-state cycles)
    period_p50_ns: float | None  # median over the same cycles
    tokens_per_cycle: float | None
    accepted_per_request: float | None  # accepted draft tokens per request per cycle (bonus excluded)
    tokens_per_s: float | None
    acceptance_source: str | None = None  # "payload" (a range's payload), "marks" (the hooks' accept marks)
    accepted_cycles: int = 0  # cycles (first rank) whose accepted tokens are known
    accepted_p50: float | None = None  # accepted draft tokens per request per cycle: median, p90
    accepted_p90: float | None = None
    steady_cycles: int = 0  # cycles the numbers use, summed over ranks
    period_p90_ns: float | None = None

    def as_dict(self) -> dict:
        return asdict(self)


def summary(res: Result, steps: int | None = None) -> Tokens:
    """Tokens per cycle, tokens/s and the acceptance of a trace over its steady-state cycles (:data:`DEFINITION`;
    first rank's cycles for tokens: ranks run the same)."""
    c = cycles(res)
    spec = speculative(res.trace.path)
    if steps is None and isinstance(spec.get("steps"), int) and not spec.get("baseline"):
        steps = spec["steps"]
    if c.height == 0:
        return Tokens(None, None, 0, steps, None, None, None, None, None, None)
    kind = c["kind"].mode().sort()[0]
    every = c.filter(pl.col("kind") == kind)
    c = every.filter("steady")
    if c.height == 0:
        c = every  # the choice left no cycle: numbers over all (the selection text says so)
    if c["period_ns"].null_count() < c.height:  # the period and the tokens over the same cycles: those with a period
        c = c.filter(pl.col("period_ns").is_not_null())
    r0 = c.filter(pl.col("rank") == c["rank"].min())
    period = real_or_none(c.group_by("rank").agg(pl.col("period_ns").mean())["period_ns"].mean())
    p50, p90 = real_or_none(c["period_ns"].median()), c["period_ns"].quantile(0.9, "nearest")
    known = r0.filter(pl.col("tokens").is_not_null())
    payload_bs = r0["batch_size"].is_not_null().any() and _has_payload(res)
    src = None
    tpc: float | None = None
    acc: float | None = None
    bs: float | None = None
    if known.height:
        tpc = to_float(known["tokens"].mean())
        bs = to_float(known["batch_size"].mean())
        src = "payload" if payload_bs else "manifest"
        if kind == "cycle":
            per = known["accept_length"] / known["batch_size"]
            acc = to_float(per.mean())
            dist = (to_float(per.quantile(0.5, "nearest")), to_float(per.quantile(0.9, "nearest")))
            how = known["accept_source"].drop_nulls().unique().sort().to_list()
    elif r0["batch_size"].is_not_null().any():
        bs = to_float(r0["batch_size"].mean())
    if steps is None and kind == "decode_step":
        steps = 0
    tps = tpc / period * 1e9 if tpc is not None and period else None
    p90_ns = float(p90) if p90 is not None else None
    if acc is None:
        return Tokens(kind, src, every.height, steps, bs, period, p50, tpc, acc, tps, steady_cycles=c.height,
                      period_p90_ns=p90_ns)
    return Tokens(kind, src, every.height, steps, bs, period, p50, tpc, acc, tps, "+".join(how) or None,
                  known.height, *dist, steady_cycles=c.height, period_p90_ns=p90_ns)


def _has_payload(res: Result) -> bool:
    inst = decode_frame(res.instances.select("uint64", "int64"))
    return bool(inst["batch_size"].is_not_null().any())
