"""One build of a store into a new folder (:func:`build`): marked as ours first, then a SQLite export's rows copied
(:mod:`.copy_build`) or a columnar export's counted in place (:mod:`.columnar_build`), ``meta.json`` last. The
caller (:mod:`.install`) builds under a temporary name and renames the folder into place."""

from __future__ import annotations

import os
from pathlib import Path

from ..export import open_reader, read_meta
from ..exportdir import DirReader
from ..protocols import ShowProgress
from .columnar_build import build_columnar
from .copy_build import build_by_copy
from .errors import CacheWriteError, write_in_cache
from .layout import mark_as_cache
from .location import is_utf8

__all__ = ["COLUMNAR", "build"]


COLUMNAR = True  # a parquetdir/arrowdir export's store keeps no copy of its rows (build_columnar)


def build(report: str | os.PathLike, dest: Path, progress: ShowProgress | None = None) -> Path:
    """Parse ``report`` into a new cache directory ``dest`` (must not exist; removed by the caller on failure).
    A write that fails is a :class:`~analyze.read.store.errors.CacheWriteError`; a read that fails, the reader's
    one-line error. ``progress``: a meter of the rows a copy reads."""
    if not is_utf8(str(dest)):
        why = "not a UTF-8 path: polars writes only those"
        raise CacheWriteError(f"{ascii(os.fsencode(dest))[2:-1]}: cannot write it ({why})", reason=why)
    r = open_reader(report)
    try:
        m = read_meta(r)
        write_in_cache(dest, lambda q: q.mkdir(parents=True))
        mark_as_cache(dest)
        if COLUMNAR and isinstance(r, DirReader):  # a parquetdir/arrowdir: its rows stay where they are
            return build_columnar(r, report, dest, m)
        return build_by_copy(r, report, dest, m, progress)
    finally:
        r.close()
