"""Which decode cycles are the steady state: warm-up and stalls detected, or the user's choice.

Input: the cycles of a trace (:func:`analyze.compute.tokens.cycles`: ``rank, n, kind, i_first, i_last,
period_ns, cycle_index``); output: the same rows with ``steady`` (bool) and ``why`` (null, ``warm-up``,
``stall``, ``pause``, ``skipped``, ``outside window``), and a small dict saying what was left out and why.

Detection (the default), on each rank's cycle periods (first GPU op of a cycle → first of the next):

- the *band* is ``median × (1 + tol)`` with ``tol = max(10 %, 5 × 1.4826 × MAD / median)``: at least 10 %
  above the median, wider on a noisy rank (1.4826 × MAD estimates the standard deviation);
- *warm-up*: the cycles before the first run of :data:`SETTLE` consecutive periods inside the band (looked
  for in the first half of the run; if the period never settles, nothing is called warm-up). Ranks of one
  job run the same cycles, so the longest warm-up over ranks is left out on every rank;
- *stall*: after warm-up, a cycle whose period is above the band on any rank; left out on every rank;
  a *pause* when the period is more than :data:`PAUSE` × the median (the GPU had nothing to do for that
  long: no requests, a prefill burst, a copy stitched in time), left out the same way but not a stall.

Cycles are identified across ranks by the payload's cycle index when every cycle has one, else by their
order ``n`` on each rank. ``skip_cycles=N`` leaves out exactly the first N cycles of each rank (0: none);
``window`` keeps only cycles ``START <= n < END`` (``"5:50"``, open ends allowed) or cycles whose first
GPU op lies in a time range on the session clock (``"1.5s:3s"``, units ns/us/µs/ms/s). With either,
stalls are still found and named, but kept.
"""

from __future__ import annotations

import re

import polars as pl

from ..model import InputError

SETTLE = 3  # consecutive in-band periods that end the warm-up
MIN_TOL = 0.10  # the band is at least this far above the median period
MAD_K = 5.0  # ... or this many robust standard deviations
PAUSE = 10.0  # a period this many times the median is a pause, not a stall
UNITS = {"ns": 1, "us": 1_000, "µs": 1_000, "ms": 1_000_000, "s": 1_000_000_000}


def parse_window(text: str | tuple | None) -> dict | None:
    """``"START:END"`` → ``{"unit": "cycle"|"ns", "start": int|None, "end": int|None, "text": ...}``."""
    if text is None:
        return None
    if isinstance(text, tuple | list):
        a, b = text
        return {"unit": "cycle", "start": a, "end": b, "text": f"{'' if a is None else a}:{'' if b is None else b}"}
    parts = str(text).split(":")
    if len(parts) != 2:
        raise InputError(f"--window {text!r}: expected START:END (cycles, e.g. 5:50, or times, e.g. 1.5s:3s)",
                         "BAD_OPTION")
    vals, units = [], set()
    for p in parts:
        p = p.strip()
        if not p:
            vals.append(None)
            continue
        m = re.fullmatch(r"(\d+(?:\.\d*)?)\s*(ns|us|µs|ms|s)?", p)
        if not m or (m.group(2) is None and "." in m.group(1)):
            raise InputError(f"--window {text!r}: {p!r} is neither a cycle number nor a time such as 250ms",
                             "BAD_OPTION")
        units.add("cycle" if m.group(2) is None else "ns")
        vals.append(int(m.group(1)) if m.group(2) is None else int(float(m.group(1)) * UNITS[m.group(2)]))
    if len(units) > 1:
        raise InputError(f"--window {text!r}: give both ends as cycles or both as times", "BAD_OPTION")
    if vals[0] is not None and vals[1] is not None and vals[1] <= vals[0]:
        raise InputError(f"--window {text!r}: END must be after START", "BAD_OPTION")
    return {"unit": units.pop() if units else "cycle", "start": vals[0], "end": vals[1], "text": str(text)}


def check_choice(skip_cycles: int | None, window) -> dict:
    """The ``cycle_choice`` of a Result from the user's options (InputError when they make no sense)."""
    if skip_cycles is not None and window is not None:
        raise InputError("give --skip-cycles or --window, not both", "BAD_OPTION")
    if skip_cycles is not None and skip_cycles < 0:
        raise InputError(f"--skip-cycles must be >= 0, not {skip_cycles}", "BAD_OPTION")
    out: dict = {}
    if skip_cycles is not None:
        out["skip_cycles"] = int(skip_cycles)
    w = parse_window(window)
    if w is not None:
        out["window"] = w
    return out


def _band(cyc: pl.DataFrame) -> pl.DataFrame:
    """Per rank: median period, band limit."""
    p = pl.col("period_ns")
    return (cyc.filter(p.is_not_null()).group_by("rank")
            .agg(median_ns=p.median(), mad_ns=(p - p.median()).abs().median())
            .with_columns(tol=pl.max_horizontal(pl.lit(MIN_TOL), MAD_K * 1.4826 * pl.col("mad_ns") / pl.col("median_ns")))
            .with_columns(limit_ns=pl.col("median_ns") * (1 + pl.col("tol"))))


def flag_cycles(cyc: pl.DataFrame, choice: dict | None = None) -> tuple[pl.DataFrame, dict]:
    """``cyc`` with ``steady``/``why`` and ``key`` (the cross-rank cycle identity), and what was decided."""
    choice = choice or {}
    if cyc.height == 0:
        return cyc.with_columns(steady=pl.lit(True), why=pl.lit(None, pl.String), key=pl.col("n")), {
            "how": "none", "cycles": 0, "steady": 0, "left_out": 0, "warmup": 0, "stalls": [],
            "text": "no cycle ranges: the whole run"}
    main = cyc["kind"].mode().sort()[0]
    by_index = cyc.filter(pl.col("kind") == main)["cycle_index"].null_count() == 0
    cyc = cyc.with_columns(key=pl.col("cycle_index") if by_index else pl.col("n"))
    band = _band(cyc.filter(pl.col("kind") == main))
    c = cyc.join(band.select("rank", "median_ns", "limit_ns"), on="rank", how="left")
    c = c.with_columns(out=(pl.col("kind") == main) & (pl.col("period_ns") > pl.col("limit_ns")).fill_null(False))
    # Warm-up per rank: first n where SETTLE consecutive periods are in band (in the first half of the run).
    ok = ((pl.col("period_ns") <= pl.col("limit_ns")) & pl.col("period_ns").is_not_null()).cast(pl.Int32)
    m = c.filter(pl.col("kind") == main).sort("rank", "n").with_columns(
        _run=ok.rolling_sum(SETTLE).shift(-(SETTLE - 1)).over("rank"), _half=(pl.len() // 2).over("rank"))
    first = (m.filter((pl.col("_run") == SETTLE) & (pl.col("n") <= pl.col("_half")))
             .group_by("rank").agg(pl.col("n").min().alias("n0")))
    first = first.join(m.select("rank", "n", "key"), left_on=["rank", "n0"], right_on=["rank", "n"], how="left")
    settled = first.height == band.height
    warm_key = int(first["key"].max()) if first.height and settled else None
    how = "detected"
    is_main = pl.col("kind") == main
    if "skip_cycles" in choice:
        how = "skip"
        why = pl.when(is_main & (pl.col("n") < choice["skip_cycles"])).then(pl.lit("skipped"))
    elif "window" in choice:
        how = "window"
        w = choice["window"]
        col = pl.col("n") if w["unit"] == "cycle" else pl.col("i_first")
        inside = pl.lit(True)
        if w["start"] is not None:
            inside = inside & (col >= w["start"])
        if w["end"] is not None:
            inside = inside & (col < w["end"])
        why = pl.when(~inside).then(pl.lit("outside window"))
    else:
        warm = pl.lit(False) if warm_key is None else pl.col("key") < warm_key
        stall_keys = c.filter(pl.col("out") & ~warm)["key"].unique().implode()
        pause_keys = c.filter(pl.col("out") & ~warm & (pl.col("period_ns") > PAUSE * pl.col("median_ns")))["key"]
        why = (pl.when(is_main & warm).then(pl.lit("warm-up"))
               .when(is_main & pl.col("key").is_in(pause_keys.unique().implode())).then(pl.lit("pause"))
               .when(is_main & pl.col("key").is_in(stall_keys)).then(pl.lit("stall")))
    c = c.with_columns(why=why.otherwise(pl.lit(None, pl.String))).with_columns(steady=pl.col("why").is_null())
    if how == "detected":
        stalls = c.filter(pl.col("why") == "stall")
    else:  # named, but kept: the user chose the cycles
        warm = pl.lit(False) if warm_key is None else pl.col("key") < warm_key
        stalls = c.filter(pl.col("out") & ~warm & pl.col("steady")
                          & (pl.col("period_ns") <= PAUSE * pl.col("median_ns")))
    pauses = c.filter(pl.col("why") == "pause").group_by("key").agg(n=pl.col("n").min(),
                                                                     period_ns=pl.col("period_ns").max())
    per_rank = c.filter(is_main).group_by("rank").agg(total=pl.len(), steady=pl.col("steady").sum())
    if how != "detected" and int(per_rank["steady"].max()) == 0:
        m = c.filter(is_main)
        raise InputError(
            f"{'--skip-cycles ' + str(choice['skip_cycles']) if how == 'skip' else '--window ' + choice['window']['text']}"
            f" leaves no cycle: there are {int(per_rank['total'].max())} per rank (n = 0…{int(m['n'].max())}), their "
            f"first GPU ops from {m['i_first'].min() / 1e9:.3f} s to {m['i_first'].max() / 1e9:.3f} s on the "
            "capture's clock", "BAD_OPTION")
    info = {
        "how": how,
        "kind": main,
        "identity": "cycle index" if by_index else "order on each rank",
        "cycles": int(per_rank["total"].max()),
        "steady": int(per_rank["steady"].max()),
        "left_out": int((per_rank["total"] - per_rank["steady"]).max()),
        "warmup": int(c.filter(pl.col("why") == "warm-up").group_by("rank").len()["len"].max() or 0)
        if how == "detected" else 0,
        "settled": settled,
        "median_ns": float(band["median_ns"].median()) if band.height else None,
        "limit_ns": float(band["limit_ns"].median()) if band.height else None,
        "tolerance": float(band["tol"].max()) if band.height else None,
        "stalls": stalls.group_by("key").agg(n=pl.col("n").min(), period_ns=pl.col("period_ns").max(),
                                             excess_ns=(pl.col("period_ns") - pl.col("median_ns")).max())
        .sort("key").to_dicts(),
        "pauses": pauses.sort("key").to_dicts(),
        "choice": {k: (v["text"] if k == "window" else v) for k, v in choice.items()},
    }
    info["text"] = describe(info)
    return c.drop("out", "median_ns", "limit_ns"), info


def _span(keys: list[int]) -> str:
    if not keys:
        return ""
    return f"{keys[0]}" if len(keys) == 1 else f"{keys[0]}–{keys[-1]}"


def describe(info: dict) -> str:
    """One sentence: which cycles the numbers use, what was left out and why, how to choose."""
    if info["how"] == "none":
        return info["text"]
    kind = "cycles" if info["kind"] == "cycle" else f"{info['kind']} ranges"
    head = f"steady state: {info['steady']} of {info['cycles']} {kind} per rank"
    st = info["stalls"]
    st_txt = ", ".join(f"{s['n']} ({s['period_ns'] / 1e3:,.0f} µs)" for s in st[:5]) + (" …" if len(st) > 5 else "")
    if info["how"] != "detected":
        chosen = (f"--skip-cycles {info['choice']['skip_cycles']}" if info["how"] == "skip"
                  else f"--window {info['choice']['window']}")
        tail = f"; {len(st)} stall(s) kept (cycle {st_txt})" if st else ""
        return f"{head} ({chosen}){tail}."
    left = []
    if info["warmup"]:
        left.append(f"{info['warmup']} warm-up (cycle{'s' if info['warmup'] > 1 else ''} "
                    f"{_span(list(range(info['warmup'])))}: before the period "
                    f"settles within {info['tolerance']:.0%} of its median {info['median_ns'] / 1e3:,.1f} µs)")
    if st:
        left.append(f"{len(st)} stall{'s' if len(st) > 1 else ''} (period above {info['limit_ns'] / 1e3:,.1f} µs: "
                    f"cycle {st_txt})")
    pa = info.get("pauses") or []
    if pa:
        left.append(f"{len(pa)} pause{'s' if len(pa) > 1 else ''} (period over {PAUSE:.0f} × the median: cycle "
                    + ", ".join(f"{p['n']} ({p['period_ns'] / 1e6:,.1f} ms)" for p in pa[:5]) + ")")
    text = head + ("; left out: " + ", ".join(left[:-1]) + (" and " if len(left) > 1 else "") + left[-1] if left
                   else "; nothing left out")
    if not info["settled"]:
        text += " (the period never settled: no warm-up detected)"
    return text + ". Choose with --skip-cycles N or --window START:END (--skip-cycles 0: the whole run)."
