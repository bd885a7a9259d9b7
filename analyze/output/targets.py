"""Where results may be written: the analysis side of :mod:`nvtx_hooks.capture.files` (every output file new,
written under a temporary name and renamed into place, regular files only, never an input by any name).

Here the inputs are the reports a verb reads (an ``.nsys-rep``'s export beside it included) and the fences
are spectrace's caches: those of the inputs (wherever :func:`analyze.read.store.location.cache_dir_for` puts them,
even before they exist) and any cache folder above the target, since a cache is deleted when it is
rebuilt. Errors are one-line :class:`~analyze.model.InputError`.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

from nvtx_hooks.capture import files
from nvtx_hooks.capture.files import NewFolder, OutputError

from ..model import InputError
from ..read.manifest import manifest_path
from ..read.store.layout import is_cache
from ..read.store.location import SUFFIX, cache_dir_for

__all__ = ["FIGURES", "TIMELINE_FILE", "PAGE_START", "inputs_of", "fences", "as_input_error", "check_file", "check_db",
           "report_folder", "check_report_folder"]

_REPORT_MARKER = "SPECTRACE_REPORT"  # in every report folder spectrace writes: the files it wrote (JSON)
# the figures a report may have, beside its index.html (analyze.output.html), and how every page begins
FIGURES = ("budget.png", "rank_phase.png", "phase_bars.png", "comm_split.png", "timeline.png", "distributions.png",
           "per_cycle.png", "whatif.png", "compare.png")
TIMELINE_FILE = "timeline.trace.json"  # the annotated timeline beside a report's page (analyze.output.timeline)
PAGE_START = b"<!doctype html><html><head><meta charset=utf-8><title>spectrace \xc2\xb7 "
_REP_SUFFIXES = (".nsys-rep", ".qdrep")


def inputs_of(inputs) -> list[Path]:
    """The paths never written: each input, the export beside an ``.nsys-rep`` (what is analysed), and each
    report's manifest (``NAME.manifest.json``: read by every verb)."""
    paths = [Path(os.fsdecode(i)) for i in inputs if isinstance(i, str | bytes | os.PathLike)]
    paths += [q.with_suffix(".sqlite") for q in paths if q.suffix in _REP_SUFFIXES]
    return paths + [manifest_path(q) for q in paths if q.suffix not in (".json", ".txt", ".log")]


def fences(target: str | os.PathLike, inputs) -> list[Path]:
    """Folders no output may be inside: the inputs' caches, and every spectrace cache folder above ``target``."""
    out = []
    for p in inputs_of(inputs):
        with contextlib.suppress(OSError, RuntimeError, ValueError, InputError):
            out.append(cache_dir_for(p))
    real = Path(os.path.realpath(target))
    out += [a for a in (real, *real.parents) if a.name.endswith(SUFFIX) and is_cache(a)]
    return out


@contextlib.contextmanager
def as_input_error() -> Iterator[None]:
    """:class:`OutputError` raised inside, as the one-line :class:`InputError` of the analysis verbs."""
    try:
        yield
    except OutputError as e:
        raise InputError(str(e), e.code) from None


def check_file(target: str | os.PathLike, inputs, option: str, **kw) -> Path:
    """The real path an output file ``target`` is written to, after :func:`nvtx_hooks.capture.files.check_file`
    (``kw``: ``replace``, ``sqlite``); a one-line InputError otherwise."""
    with as_input_error():
        return files.check_file(target, option=option, inputs=inputs_of(inputs), fences=fences(target, inputs), **kw)


def check_db(target: str | os.PathLike, inputs) -> Path:
    """``--db``: a new file or an existing regular file (written in place through SQLite), never an input, its
    SQLite sidecars or in a cache."""
    return check_file(target, inputs, "--db", replace=True, sqlite=True)


def _legacy_report(folder: Path) -> bool:
    """A report folder spectrace wrote without its marker: its ``index.html`` is ours and every other file one of
    the figures or the timeline it writes."""
    try:
        names = {p.name for p in folder.iterdir()}
        with open(folder / "index.html", "rb") as f:
            head = f.read(len(PAGE_START))
    except OSError:
        return False
    return head == PAGE_START and names <= {"index.html", TIMELINE_FILE, *FIGURES}


def report_folder(target: str | os.PathLike, inputs, force: bool = False) -> NewFolder:
    """``report -o DIR``: the folder built beside ``DIR`` and put in its place whole (see :class:`NewFolder`)."""
    return NewFolder(target, option="-o", marker=_REPORT_MARKER, inputs=inputs_of(inputs),
                     fences=fences(target, inputs), force=force, legacy=_legacy_report)


def check_report_folder(target: str | os.PathLike, inputs, force: bool = False) -> Path:
    """The checks of ``report -o DIR`` before the analysis (run again when the report is put in place)."""
    with as_input_error():
        return report_folder(target, inputs, force).check()
