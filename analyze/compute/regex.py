"""Regexes from the user (``--ranges``, ``--comm-pattern``) are checked by the engine that runs them: polars
(Rust's regex crate: no look-around or back-references, a compiled-size limit), not Python's ``re``."""

from __future__ import annotations

import polars as pl

from ..model import InputError

__all__ = ["check_regex"]


def check_regex(regex: str, where: str) -> None:
    """Raise a one-line :class:`InputError` unless polars accepts ``regex``."""
    try:
        pl.select(pl.lit("").str.contains(regex))
    except pl.exceptions.PolarsError as e:
        lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
        why = next((ln[len("error:"):].strip() for ln in lines if ln.startswith("error:")), None)
        if why is None:  # e.g. "regex error: Compiled regex exceeds size limit of 10485760 bytes."
            why = lines[0].removeprefix("regex error:").strip() if lines else type(e).__name__
        raise InputError(f"{where}: bad regex {regex!r}: {why}", "BAD_REGEX") from None
