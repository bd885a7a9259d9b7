"""Text for people: the tables of ``spectrace analyze``, ``comm``, ``compare`` and ``whatif`` (all text rendering is here)."""

from __future__ import annotations

from pathlib import Path

import polars as pl

from nvtx_hooks.phases import CYCLE_ORDER, base_name

from ..compute.collectives import short_name
from ..compute.whatif import MAX_STEPS, Model
from ..model import CommResult, Result

NO_PHASE = "(none)"  # how a null phase (GPU work outside every selected range) is shown


def _ms(ns) -> str:
    return f"{(ns or 0) / 1e6:,.3f}"


def _us(ns) -> str:
    return f"{(ns or 0) / 1e3:,.1f}"


def _pct(a, b) -> str:
    return f"{100 * a / b:5.1f}" if b else "    -"


def _grid(header: list[str], rows: list[list[str]], left: int = 1) -> list[str]:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(header)]

    def line(cells):
        return "  ".join(c.ljust(w) if i < left else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))

    return [line(header), line(["-" * w for w in widths]), *[line(r) for r in rows]]


def _phase_rows(df: pl.DataFrame, total_span: int) -> list[list[str]]:
    rows = []
    for r in df.iter_rows(named=True):
        span = r["span_ns"]
        rows.append([
            r["phase"], str(r["instances"]), _ms(span), _pct(span, total_span), _us(span / max(r["instances"], 1)),
            _ms(r["compute_ns"]), _pct(r["compute_ns"], span), _ms(r["comm_ns"]), _pct(r["comm_ns"], span),
            _ms(r["idle_ns"]), _pct(r["idle_ns"], span), _ms(r.get("gpu_idle_ns")), _ms(r["kernel_ns"]), str(r["ops"]),
        ])
    return rows


PHASE_HEADER = ["phase", "inst", "span ms", "%all", "µs/inst", "compute ms", "%", "comm ms", "%", "idle ms", "%",
                "GPU-idle ms", "kernel ms", "ops"]


def _order(df: pl.DataFrame, col: str) -> pl.DataFrame:
    """Phases in cycle order when they are cycle phases, else by time."""
    order = {n: i for i, n in enumerate(CYCLE_ORDER)}
    key = pl.col(col).map_elements(lambda t: order.get(base_name(t), 99), return_dtype=pl.Int64)
    return df.with_columns(_o=key).sort("_o", "span_ns" if "span_ns" in df.columns else col,
                                        descending=[False, True]).drop("_o")


def _refusals(refused: pl.DataFrame) -> list[str]:
    """One line per phase whose matched collectives do not end together (no wait/straggler numbers for it)."""
    return [f"  {r['phase'] if r['phase'] is not None else NO_PHASE}: {r['collectives']} matched collectives end "
            f"{_us(r['end_spread_p50_ns'])} µs apart (p50) > {_us(r['bound_ns'])} µs: they are not the same "
            "collectives on every rank, or the clocks disagree" for r in refused.iter_rows(named=True)]


def _comm_split(res: Result) -> list[str]:
    """Matched collectives per rank and phase: waiting for the last rank vs transfer (more in ``spectrace comm``)."""
    p, refused = res.phases, res.comm_refused
    if "comm_wait_ns" not in p.columns:
        return []
    p = _order(p.filter((pl.col("comm_wait_ns") + pl.col("comm_transfer_ns")) > 0), "phase").sort("rank",
                                                                                                  maintain_order=True)
    if not p.height and not refused.height:
        return []
    rows = [[r["phase"], str(r["rank"]), _ms(r["comm_wait_ns"] + r["comm_transfer_ns"]), _ms(r["comm_wait_ns"]),
             _pct(r["comm_wait_ns"], r["comm_wait_ns"] + r["comm_transfer_ns"]), _ms(r["comm_transfer_ns"])]
            for r in p.iter_rows(named=True)]
    out = ["", "Collectives matched across ranks: kernel time spent waiting for the last rank vs transferring "
               "(spectrace comm for stragglers)",
           *_grid(["phase", "rank", "collective ms", "wait ms", "%", "transfer ms"], rows, 2)]
    if refused.height:
        out += ["No wait/transfer split (refused) for:", *_refusals(refused)]
    return out


def analyze_table(res: Result) -> str:
    """``spectrace analyze``: all ranks, each rank, comm split, seams, parent ranges, coverage, diagnostics."""
    t, out = res.trace, []
    out.append(f"spectrace · {Path(t.path).name} · nsys {t.nsys_version} (schema {t.schema_version}) · "
               f"{res.ranks.height} rank(s) · CUDA graph trace: {t.graph_trace_mode or 'none'}")
    out.append(f"phases: {res.selection}")
    out.append("Each phase: span (first op start → last op end, per instance, summed) = compute + comm + idle;")
    out.append("GPU-idle is the part of idle in which the GPU ran nothing at all (no other phase's work either).")
    out.append("")
    pa = res.phases_all
    total = int(pa["span_ns"].sum()) if pa.height else 0
    out.append(f"All ranks ({res.ranks.height}), times summed over ranks")
    out += _grid(PHASE_HEADER, _phase_rows(_order(pa, "phase"), total))
    for rk in res.ranks.iter_rows(named=True):
        df = res.phases.filter(pl.col("rank") == rk["rank"])
        out.append("")
        dev = f"GPU {rk['device']}" + (f" {rk['device_name']}" if rk["device_name"] else "")
        out.append(f"Rank {rk['rank']} (pid {rk['pid']}, {dev})")
        out += _grid(PHASE_HEADER, _phase_rows(_order(df, "phase"), int(df["span_ns"].sum())))
    out += _comm_split(res)
    sa = res.seams_all
    if sa.height:
        out.append("")
        out.append("Seams: GPU idle between consecutive phases (last op of one → first op of the next), all ranks")
        rows = [[r["parent"] or "(top level)", f"{r['from']} → {r['to']}", str(r["instances"]), _ms(r["idle_ns"]),
                 _us(r["idle_ns"] / max(r["instances"], 1)), _ms(r["busy_ns"]), _ms(r["overlap_ns"])]
                for r in sa.iter_rows(named=True)]
        out += _grid(["within", "transition", "inst", "idle ms", "µs/inst", "other work ms", "overlap ms"], rows, 2)
    parents = res.ranges_all.join(res.seams_all.select(pl.col("parent").alias("range")).unique(), on="range",
                                  how="semi")
    if parents.height:
        out.append("")
        out.append("Parent ranges, inclusive (NVIDIA-style projection of everything launched inside), all ranks")
        rows = [[r["range"], str(r["instances"]), _ms(r["proj_span_ns"]), _us(r["proj_span_ns"] / max(r["instances"], 1)),
                 _ms(r["busy_ns"] - r["comm_ns"]), _ms(r["comm_ns"]), _ms(r["idle_ns"]), _pct(r["idle_ns"], r["proj_span_ns"])]
                for r in parents.iter_rows(named=True)]
        out += _grid(["range", "inst", "span ms", "µs/inst", "compute ms", "comm ms", "idle ms", "%idle"], rows)
    out += _tokens(res)
    cov = res.coverage
    gpu, att = int(cov["gpu_ns"].sum()), int(cov["attributed_ns"].sum())
    out.append("")
    out.append(f"Coverage: phases received {_ms(att)} of {_ms(gpu)} ms of GPU busy time inside the phased window "
               f"({_pct(att, gpu).strip()}%).")
    if res.diagnostics:
        out.append("")
        out.append("Diagnostics")
        out += [f"  {d.level:<7} {d.code}: {d.message}" for d in res.diagnostics]
    return "\n".join(out) + "\n"


def _tokens(res: Result) -> list[str]:
    """Tokens per cycle and measured acceptance (when the trace knows them)."""
    from ..compute.tokens import summary

    t = summary(res)
    if t.tokens_per_cycle is None:
        return []
    out = ["", f"Tokens: {t.tokens_per_cycle:.2f} per {t.kind} ({t.source}), {t.tokens_per_s:,.1f} tokens/s"]
    if t.accepted_per_request is not None:
        out[-1] += (f"; acceptance {t.accepted_per_request:.2f} accepted draft tokens per request per cycle "
                    f"(p50 {t.accepted_p50:g}, p90 {t.accepted_p90:g}; measured on {t.accepted_cycles} cycles "
                    f"from the {'accept marks' if t.acceptance_source == 'marks' else 'range payload'})")
    return out


def _us_or_dash(ns) -> str:
    return "-" if ns is None else f"{ns / 1e3:,.1f}"


def _ms_or_dash(ns) -> str:
    return "-" if ns is None else _ms(ns)


def _pct1(a, b) -> str:
    return f"{100 * a / b:.1f}" if b and a is not None else "-"


def comm_table(res: CommResult) -> str:
    """``spectrace comm``: collectives per phase, rank and kernel; stragglers; diagnostics."""
    c = res.clock
    out = [f"spectrace comm · {', '.join(Path(p).name for p in res.reports)} · {res.ranks.height} rank(s)",
           f"phases: {res.selection}",
           f"clock: {c['alignment']}; collective end spread p50 {_us_or_dash(c.get('end_spread_p50_ns'))} µs, "
           f"p99 {_us_or_dash(c.get('end_spread_p99_ns'))} µs (residual)"]
    for r in c.get("per_report", []):
        out.append(f"  report {r['report']} {Path(r['path']).name}: utcEpochNs {r['utc_epoch_ns']}, "
                   f"session offset {_us_or_dash(r['session_offset_ns'])} µs, refined by {_us_or_dash(r.get('refine_ns'))} µs")
    d = res.to_dict()["matching"]
    out.append(f"matched {d['matched_collectives']} collectives ({d['matched_kernels']} of {d['comm_kernels']} "
               f"communication kernels; {d['unmatched_kernels']} unmatched"
               + (f"; {d['left_out_kernels']} in instances left out: cut, lost or unpaired" if d["left_out_kernels"]
                  else "") + ")")
    out.append("wait = kernel time before the last rank arrived (latest start); transfer = the rest; "
               "skew = last arrival - own start")
    out.append("")
    s = res.collectives.with_columns(short_name(pl.col("name")).alias("name"), pl.col("phase").fill_null(NO_PHASE))
    rows = [[r["phase"], str(r["rank"]), r["name"], str(r["count"]), _ms(r["duration_ns"]), _ms_or_dash(r["wait_ns"]),
             _pct1(r["wait_ns"], r["duration_ns"]), _ms_or_dash(r["transfer_ns"]), _us_or_dash(r["skew_p50_ns"]),
             _us_or_dash(r["skew_p99_ns"]), "-" if r["last_arrivals"] is None else str(r["last_arrivals"])]
            for r in s.iter_rows(named=True)]
    out.append("Per phase, rank and kernel")
    out += _grid(["phase", "rank", "kernel", "count", "dur ms", "wait ms", "%wait", "transfer ms", "skew p50 µs",
                  "skew p99 µs", "last"], rows, 3)
    st = res.stragglers.with_columns(pl.col("phase").fill_null(NO_PHASE))
    rows = [[r["phase"], str(r["rank"]), f"{r['last_arrivals']}/{r['collectives']}", _pct1(r["last_arrivals"],
             r["collectives"]), _us_or_dash(r["mean_delay_ns"]), _us_or_dash(r["max_delay_ns"]), _ms(r["total_delay_ns"])]
            for r in st.iter_rows(named=True)]
    out.append("")
    out.append("Stragglers: who arrived last (strictly), and how much later than the next-latest rank")
    out += _grid(["phase", "rank", "last", "%", "mean delay µs", "max delay µs", "total delay ms"], rows, 2)
    if res.refused.height:
        out.append("")
        out.append("Refused: no wait, skew or straggler numbers for these phases")
        out += _refusals(res.refused)
    if res.diagnostics:
        out.append("")
        out.append("Diagnostics")
        out += [f"  {x.level:<7} {x.code}: {x.message}" for x in res.diagnostics]
    return "\n".join(out) + "\n"


def _f(v, scale=1e3, fmt="{:,.1f}") -> str:
    return "-" if v is None else fmt.format(v / scale)


def compare_table(doc: dict) -> str:
    """``spectrace compare``: per cycle (and per token) A, B and B − A, µs."""
    tok = doc["per_token"]
    out = [f"A: {doc['a']} ({doc['a_cycles']} cycles over ranks)", f"B: {doc['b']} ({doc['b_cycles']} cycles over ranks)"]
    for k in ("a", "b"):
        t = doc["tokens"][k]
        if t["tokens_per_cycle"] is not None:
            out.append(f"{k.upper()}: {t['tokens_per_cycle']:.2f} tokens per {t['kind']} ({t['source']}), "
                       f"{t['tokens_per_s']:.1f} tokens/s")
    out.append("")
    head = ["phase", "A µs/cycle", "B µs/cycle", "Δ µs"] + (["A µs/token", "B µs/token", "Δ µs/token"] if tok else [])
    rows = []
    for section in ("phases", "seams"):
        for r in doc[section]:
            cells = [r["phase"], _f(r["a_ns_per_cycle"]), _f(r["b_ns_per_cycle"]), _f(r["delta_ns"], fmt="{:+,.1f}")]
            if tok:
                cells += [_f(r["a_ns_per_token"]), _f(r["b_ns_per_token"]), _f(r["delta_ns_per_token"], fmt="{:+,.1f}")]
            rows.append(cells)
    p = doc["cycle_period"]
    cells = ["cycle period", _f(p["a_ns"]), _f(p["b_ns"]), _f(p["delta_ns"], fmt="{:+,.1f}")]
    if tok:
        d = p["b_ns_per_token"] - p["a_ns_per_token"]
        cells += [_f(p["a_ns_per_token"]), _f(p["b_ns_per_token"]), _f(d, fmt="{:+,.1f}")]
    rows.append(cells)
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(head)]
    fmt = lambda cs: "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cs, widths)))  # noqa: E731
    out += [fmt(head), fmt(["-" * w for w in widths]), *[fmt(r) for r in rows]]
    out.append("")
    out.append("Δ = B − A; per cycle = summed over ranks / cycles over ranks; rows: biggest movers first"
               + (" per token" if tok else ""))
    return "\n".join(out) + "\n"


def whatif_table(m: Model, max_steps: int = MAX_STEPS) -> str:
    """``spectrace whatif``: the fitted costs and the predictions per step count."""
    out = [f"what-if from {m.steps_now} draft steps: measured cycle {m.period_ns / 1e3:.1f} µs = draft "
           f"{m.cost_ns.get('draft', 0) / 1e3:.1f} + verify {m.cost_ns.get('verify', 0) / 1e3:.1f} + draft_extend "
           f"{m.cost_ns.get('draft_extend', 0) / 1e3:.1f} + seams {sum(m.seams(m.steps_now).values()) / 1e3:.1f} + other "
           f"{m.other_ns / 1e3:.1f} µs"]
    if m.alpha is not None:
        acc = f"{m.accepted_now:.2f}" if m.accepted_now is not None else "given"
        out.append(f"acceptance: {acc} accepted draft tokens/request/cycle → α = {m.alpha:.3f}")
    out += [f"note: {n}" for n in m.notes]
    out.append("")
    out.append(f"{'steps':>5}  {'cycle µs':>9}  {'draft':>8}  {'verify':>8}  {'extend':>8}  {'seams':>8}  {'other':>8}  "
               f"{'tok/cycle':>9}  {'tok/s':>9}")
    for p in m.predictions(max_steps):
        tok = f"{p['tokens_per_cycle']:9.2f}" if p["tokens_per_cycle"] is not None else f"{'-':>9}"
        tps = f"{p['tokens_per_s']:9.1f}" if p["tokens_per_s"] is not None else f"{'-':>9}"
        mark = " ← now (measured)" if p["measured"] else ""
        out.append(f"{p['steps']:5d}  {p['cycle_ns'] / 1e3:9.1f}  {p['draft_ns'] / 1e3:8.1f}  {p['verify_ns'] / 1e3:8.1f}  "
                   f"{p['draft_extend_ns'] / 1e3:8.1f}  {p['seams_ns'] / 1e3:8.1f}  {p['other_ns'] / 1e3:8.1f}  {tok}  {tps}{mark}")
    best = m.best(max_steps)
    out.append("")
    out.append(f"best: {best['steps']} steps, {best['tokens_per_s']:.1f} tok/s predicted" if best
               else "best: unknown without acceptance (shortest cycle is always 1 step)")
    return "\n".join(out) + "\n"
