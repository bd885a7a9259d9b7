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

from ..model import InputError

__all__ = ["decode_periods", "PATTERNS"]

# What a decode log line's parts look like (matched anywhere in a line that contains "Decode batch").
PATTERNS = {
    "running_req": r"#running-req:\s*(\d+)",
    "accept_len": r"accept len:\s*([0-9.]+)",
    "gen_tokens_per_s": r"gen throughput \(token/s\):\s*([0-9.]+)",
}


def decode_periods(path: str | os.PathLike) -> pl.DataFrame:
    """Per batch size (``#running-req``) of the log at ``path``: ``batch_size``, ``period_ns`` (the median over its
    lines of running_req × accept_len / gen_throughput) and ``lines``, sorted by batch size. InputError when the
    file cannot be read or has no decode line with a throughput."""
    p = Path(path)
    try:
        text = p.read_text(errors="replace")
    except OSError as e:
        raise InputError(f"--unprofiled-log {path}: cannot read it ({e.strerror or e})", "NOT_FOUND") from None
    lines = pl.DataFrame({"line": text.splitlines()}, schema={"line": pl.String})
    parts = (lines.filter(pl.col("line").str.contains("Decode batch", literal=True))
             .select(pl.col("line").str.extract(rx, 1).cast(pl.Float64, strict=False).alias(k)
                     for k, rx in PATTERNS.items())
             .filter(pl.col("running_req").is_not_null() & (pl.col("running_req") > 0)
                     & (pl.col("gen_tokens_per_s") > 0)))
    if parts.height == 0:
        raise InputError(f"--unprofiled-log {path}: no decode log lines with '#running-req' and 'gen throughput "
                         "(token/s)' (SGLang's 'Decode batch' lines)", "NO_DECODE_LOG")
    return (parts.with_columns(period_ns=pl.col("running_req") * pl.col("accept_len").fill_null(1.0)
                               / pl.col("gen_tokens_per_s") * 1e9)
            .group_by(batch_size=pl.col("running_req").cast(pl.Int64))
            .agg(pl.col("period_ns").median(), lines=pl.len().cast(pl.Int64))
            .sort("batch_size"))
