"""Where a report's cache goes: ``<report>.spectrace`` beside the report when its folder is writable, else the user
cache folder (``$SPECTRACE_CACHE_DIR``, ``$XDG_CACHE_HOME/spectrace``, ``~/.cache/spectrace``), the name cut to
fit; never inside the input. The report itself is never touched."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from .errors import CacheWriteError

__all__ = ["SUFFIX", "cache_dir_for", "is_utf8", "refuse_inside_input"]


SUFFIX = ".spectrace"
_NAME_MAX = 255  # bytes in a file name (most file systems)
_BUILD_NAME = len("..tmp-") + 12  # what a build folder's name adds to the cache's (``.<name>.tmp-<12 hex>``)


def cache_dir_for(report: str | os.PathLike) -> Path:
    """Where the cache of ``report`` goes: ``<report>.spectrace`` beside it when its folder is writable, its path
    UTF-8 and its name short enough (for its build folder's name too, :data:`_NAME_MAX`); else in the user cache
    folder (:func:`_user_cache_base`) as ``<hash>_<name>.spectrace``, the name cut to fit. A
    :class:`~analyze.read.store.errors.CacheWriteError` when there is no valid place."""
    p = Path(report).resolve()
    env = os.environ.get("SPECTRACE_CACHE_DIR") or None
    if not env and _writable(p.parent) and is_utf8(str(p)) and _fits(p.name + SUFFIX):
        return p.parent / (p.name + SUFFIX)
    head = hashlib.sha1(os.fsencode(p)).hexdigest()[:16] + "_"
    room = _NAME_MAX - _BUILD_NAME - len(head) - len(SUFFIX)
    name = os.fsencode(p.name).decode(errors="replace").encode()[:room].decode(errors="ignore")
    return _user_cache_base() / (head + name + SUFFIX)


def _user_cache_base() -> Path:
    """``$SPECTRACE_CACHE_DIR``, else ``$XDG_CACHE_HOME/spectrace``, else ``$HOME/.cache/spectrace``, the
    variables checked: an empty one is unset; XDG_CACHE_HOME is ignored when relative (the XDG spec) or not UTF-8;
    a SPECTRACE_CACHE_DIR that is not UTF-8 (polars writes only UTF-8 paths), or a HOME that is empty, relative
    or not UTF-8 (never ``/.cache``), is no place: a :class:`~analyze.read.store.errors.CacheWriteError` (the cache
    is skipped)."""
    env = os.environ.get("SPECTRACE_CACHE_DIR") or ""
    if env:
        if not is_utf8(env):
            shown = ascii(os.fsencode(env))[2:-1]
            raise CacheWriteError(f"SPECTRACE_CACHE_DIR={shown}: not valid UTF-8, no cache written there; set "
                                  "it to a UTF-8 path")
        return Path(env).absolute()
    xdg = os.environ.get("XDG_CACHE_HOME") or ""
    if os.path.isabs(xdg) and is_utf8(xdg):
        return Path(xdg) / "spectrace"
    if "HOME" in os.environ:
        home = os.environ["HOME"]
    else:
        try:
            home = str(Path.home())  # the password database's entry
        except (KeyError, RuntimeError):
            home = ""
    if not (os.path.isabs(home) and is_utf8(home)):
        what = "empty" if not home else "not an absolute path" if not os.path.isabs(home) else "not valid UTF-8"
        raise CacheWriteError(f"no folder for the cache: HOME is {what}; set SPECTRACE_CACHE_DIR (or "
                              "XDG_CACHE_HOME) to a writable folder")
    return Path(home) / ".cache" / "spectrace"


def _fits(name: str) -> bool:
    return len(os.fsencode(name)) + _BUILD_NAME <= _NAME_MAX


def is_utf8(s: str) -> bool:
    try:
        s.encode()
        return True
    except UnicodeEncodeError:
        return False


def _writable(d: Path) -> bool:
    """Writable, and not marked read-only: root passes ``os.access`` on an ``r-x`` directory, we do not write there."""
    try:
        return os.access(d, os.W_OK) and bool(d.stat().st_mode & 0o222)
    except OSError:
        return False


def refuse_inside_input(root: Path, report: Path) -> None:
    """A cache is never written inside its input (a parquetdir/arrowdir export is a folder): a CacheWriteError."""
    rp = report.resolve()
    if rp.is_dir():
        rr = root.resolve()
        if rr == rp or rp in rr.parents:
            raise CacheWriteError(f"{root}: inside the input {report}; spectrace never writes into an input: set "
                                  "SPECTRACE_CACHE_DIR to a folder outside it to keep a cache", "CACHE_WRITE")
