"""The unprofiled decode period per batch size, from a server's decode log (``whatif --unprofiled-log``).

SGLang's scheduler (TP rank 0) logs a line every ``--decode-log-interval`` decode batches (default 40); the
parts read here are the same in 0.4.6, 0.5.5 and 0.5.23 (``../shared/docs/sglang-eagle3.md``)::

    Decode batch, #running-req: 64, #token: 9216, token usage: 0.02, accept len: 2.47, accept rate: 0.49,
    cuda graph: True, gen throughput (token/s): 41234.56, #queue-req: 0

``gen throughput`` is the tokens generated since the previous line over the wall time since it; ``accept len``
the tokens accepted per request per verify forward (the bonus token included). A line's decode period is then
``running_req × accept_len / gen_throughput``: the time of one decode cycle of that batch, without a profiler.
A line without ``accept len`` (no speculation) counts one token per request per cycle. Lines are grouped by
``#running-req`` (the batch at the line; it may have moved inside the interval: the median over a batch size's
lines is used), lines with a throughput of 0 are left out. Anything else in the file (other log lines, JSON) is
ignored; the workload of :mod:`nvtx_hooks.capture.workload` writes the same lines (``--decode-log-interval``).
"""

from __future__ import annotations

import os
from pathlib import Path

import polars as pl

from nvtx_hooks.capture.bounds import BATCH_MAX, STEPS_MAX, TOKENS_PER_S_MAX
from nvtx_hooks.capture.files import InputFileError, read_input

from ..model import InputError

__all__ = ["decode_periods", "left_out_note", "PATTERNS", "LOG_MAX_BYTES"]

LOG_MAX_BYTES = 1 << 30  # a server log read whole: at most 1 GiB

# What a decode log line's parts look like (matched anywhere in a line that contains "Decode batch").
PATTERNS = {
    "running_req": r"#running-req:\s*(\d+)",
    "accept_len": r"accept len:\s*([0-9.]+)",
    "gen_tokens_per_s": r"gen throughput \(token/s\):\s*([0-9.]+)",
}


def decode_periods(path: str | os.PathLike, counts: dict[str, int] | None = None) -> pl.DataFrame:
    """Per batch size (``#running-req``) of the log at ``path``: ``batch_size``, ``period_ns`` (the median over its
    lines of running_req × accept_len / gen_throughput) and ``lines``, sorted by batch size. Lines whose values no
    server reaches (``#running-req`` above :data:`~nvtx_hooks.capture.bounds.BATCH_MAX`, a throughput above
    :data:`~nvtx_hooks.capture.bounds.TOKENS_PER_S_MAX`, an accept length above the steps' bound) are left out,
    their number in ``counts["left_out"]``. InputError when the file cannot be read safely (a regular file of at
    most :data:`LOG_MAX_BYTES`) or has no decode line with a throughput."""
    p = Path(path)
    try:
        text = read_input(p, "--unprofiled-log", LOG_MAX_BYTES).decode("utf-8", "replace")
    except InputFileError as e:  # (a log that cannot be read: NOT_FOUND, as documented; a pipe, a device: NOT_A_FILE)
        raise InputError(str(e), "NOT_FOUND" if e.code in ("NO_FILE", "UNREADABLE") else e.code) from None
    lines = pl.DataFrame({"line": text.splitlines()}, schema={"line": pl.String})
    parts = (lines.filter(pl.col("line").str.contains("Decode batch", literal=True))
             .select(pl.col("line").str.extract(rx, 1).cast(pl.Float64, strict=False).alias(k)
                     for k, rx in PATTERNS.items())
             .filter(pl.col("running_req").is_not_null() & (pl.col("running_req") > 0)
                     & (pl.col("gen_tokens_per_s") > 0)))
    # what a server can do: a batch it can hold, a throughput a GPU reaches, an accept length within the steps
    physical = (pl.col("running_req").is_between(1, BATCH_MAX) & (pl.col("gen_tokens_per_s") <= TOKENS_PER_S_MAX)
                & pl.col("accept_len").fill_null(1.0).is_between(0.0, STEPS_MAX + 1.0))
    bad = parts.filter(~physical)
    if counts is not None:
        counts["left_out"] = bad.height
    parts = parts.filter(physical)
    if parts.height == 0:
        more = (f" ({bad.height} more left out: values no server reaches, #running-req above {BATCH_MAX:,} or "
                f"gen throughput above {TOKENS_PER_S_MAX:,.0f} token/s)") if bad.height else ""
        raise InputError(f"--unprofiled-log {path}: no decode log lines with '#running-req' and 'gen throughput "
                         f"(token/s)' (SGLang's 'Decode batch' lines){more}", "NO_DECODE_LOG")
    return (parts.with_columns(period_ns=pl.col("running_req") * pl.col("accept_len").fill_null(1.0)
                               / pl.col("gen_tokens_per_s") * 1e9)
            .group_by(batch_size=pl.col("running_req").cast(pl.Int64))
            .agg(pl.col("period_ns").median(), lines=pl.len().cast(pl.Int64))
            .sort("batch_size"))


def left_out_note(n: int, name: str) -> str:
    """The warning of :func:`decode_periods`' left-out lines (code ``DECODE_LOG_LINES``)."""
    return (f"DECODE_LOG_LINES: {n} decode log line{'s' if n > 1 else ''} of {name} left out: values no server "
            f"reaches (#running-req above {BATCH_MAX:,}, gen throughput above {TOKENS_PER_S_MAX:,.0f} token/s or an "
            f"accept length above {STEPS_MAX + 1})")
