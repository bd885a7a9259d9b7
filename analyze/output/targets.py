"""Where results may be written: never into an input (the same file by any name, hard links included, its
SQLite ``-wal``/``-journal``/``-shm``, or inside an input folder)."""

from __future__ import annotations

import os
from pathlib import Path

from ..model import InputError
from ..read.sqlite import sidecar


def _same(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return a.resolve() == b.resolve()


def refuse_input(target: str | os.PathLike, inputs, option: str) -> None:
    """Raise a one-line :class:`InputError` if writing ``target`` could write into one of ``inputs``."""
    t = Path(target)
    paths = [Path(i) for i in inputs if isinstance(i, str | os.PathLike)]
    paths += [q.with_suffix(".sqlite") for q in paths if q.suffix in (".nsys-rep", ".qdrep")]  # what is analysed
    for src in paths:
        if not src.exists():
            continue
        inside = src.is_dir() and (t.resolve() == src.resolve() or src.resolve() in t.resolve().parents)
        side = [sidecar(src, s) for s in ("-wal", "-journal", "-shm")]
        if inside or (t.exists() and _same(t, src)) or any(t.resolve() == s.resolve() for s in side):
            raise InputError(f"{t}: {option} must not be the input report {src} or in it (spectrace never writes "
                             "to its input)", "OUTPUT_IS_INPUT")


def os_error(e: OSError, path: str | os.PathLike, what: str) -> InputError:
    """A one-line error for a failed write of ``what`` to ``path``: the system's reason."""
    why = e.strerror or str(e)
    if isinstance(e, FileNotFoundError) and not Path(path).parent.is_dir():
        why = f"no folder {Path(path).parent}"
    return InputError(f"{path}: cannot write {what} ({why})", "BAD_OUTPUT")
