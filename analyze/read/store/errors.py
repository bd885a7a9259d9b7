"""What a failed write into a store raises (:class:`CacheWriteError`), and the one way every write is made
(:func:`write_in_cache`): an OS or polars error becomes a CacheWriteError with its reason on one line. (A failed
read of a store: :class:`analyze.read.store.reader.CacheError`.)"""

from __future__ import annotations

import os
import re
from pathlib import Path

from polars.exceptions import PanicException

from ...model import InputError

__all__ = ["CacheWriteError", "write_in_cache", "one_line"]


class CacheWriteError(InputError):
    """A cache (or a temporary store) that cannot be written: a permission, a full disk, a file-size limit, a
    stale cache of another user, no valid place for it (an environment variable that is not valid), a place
    inside the input. Not a fault of the input: the analysis goes on without the cache. ``reason``: the cause
    alone."""

    def __init__(self, message: str, code: str = "CACHE_WRITE", reason: str | None = None):
        super().__init__(message, code)
        self.reason = reason or message


def write_in_cache(path: Path, fn) -> None:
    """``fn(path)``: a write into a store; any failure (an OSError, or polars' error for one) is a
    :class:`CacheWriteError` with the reason (``File too large``, ``No space left on device``, ...)."""
    try:
        fn(path)
    except (Exception, PanicException) as e:
        if isinstance(e, InputError):
            raise
        why = _reason(e)
        raise CacheWriteError(f"{path}: cannot write it ({why})", "CACHE_WRITE", reason=why) from None


def _reason(e: BaseException) -> str:
    """An OS error's reason (also inside polars' messages: ``(os error 28)``), else the message on one line."""
    if isinstance(e, OSError) and e.strerror:
        return e.strerror
    m = re.search(r"\(os error (\d+)\)", str(e))
    return os.strerror(int(m.group(1))) if m else one_line(e)


def one_line(e: BaseException) -> str:
    return " ".join(str(e).split()) or type(e).__name__
