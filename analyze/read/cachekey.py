"""Where a cache of a report goes and what it is keyed by: shared by the parquet store (:mod:`analyze.read.store`)
and the tables of a torch profiler trace (:mod:`analyze.read.kineto`), which sit below and beside it.

:func:`cache_dir_for` puts ``<report>.spectrace`` beside the report, or in the user cache folder; :func:`file_keys`
is the report's files as a cache of it is keyed (each cache adds its own format version); :class:`CacheWriteError`
says a cache cannot be written (the analysis goes on without it).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from pathlib import Path

from nvtx_hooks.capture.files import table_files

from ..model import InputError
from .sqlite import check_file, sidecar

__all__ = ["SUFFIX", "MARKER", "EDGE", "BLOCK", "BLOCKS", "CacheWriteError", "file_keys", "cache_dir_for", "utf8"]

SUFFIX = ".spectrace"
MARKER = "SPECTRACE_CACHE"  # in every cache folder (and every folder a build writes): it is ours to replace
EDGE = 65536  # the key hashes each report file's first and last EDGE bytes (SQLite pages are at most 64 KiB)...
BLOCK, BLOCKS = 4096, 6  # ...and BLOCKS blocks of BLOCK bytes spread between them
_NAME_MAX = 255  # bytes in a file name (most file systems)
_BUILD_NAME = len("..tmp-") + 12  # what a build folder's name adds to the cache's (``.<name>.tmp-<12 hex>``)


class CacheWriteError(InputError):
    """A cache (or a temporary store) that cannot be written: a permission, a full disk, a file-size limit, a
    stale cache of another user, no valid place for it (an environment variable that is not valid), a place
    inside the input. Not a fault of the input: the analysis goes on without the cache. ``reason``: the cause
    alone."""

    def __init__(self, message: str, code: str = "CACHE_WRITE", reason: str | None = None):
        super().__init__(message, code)
        self.reason = reason or message


def file_keys(report: str | os.PathLike, check: bool = True) -> dict:
    """The report's absolute resolved path and, of each of its files (a directory's table files, every file when it
    has none; a SQLite file and its ``-wal``; any other file alone), ``[name, size, mtime, inode, ctime, content]``
    (:func:`_file_key`; :func:`_content`: a hash of 8 blocks): what a cache of it is keyed by. A copy of another
    capture over the report, even of the same size and mtime, changes its ctime (and inode when renamed into place)
    and, unless it has the same first, last and sampled bytes, its content hash. ``check``: a file must be a
    complete SQLite file (one line otherwise; a reader of another format checks its own)."""
    if check and not Path(report).is_dir():
        check_file(report)  # one line for a missing, unreadable, non-regular or non-SQLite file
    p = Path(report).resolve()
    try:
        if p.is_dir():  # the table files the export is read from (every file when there are none)
            tables = sorted(table_files(p).values())
            files = [_file_key(f) for f in tables or sorted(p.iterdir()) if f.is_file()]
        else:
            files = [_file_key(p)]
            with contextlib.suppress(FileNotFoundError):
                files.append(_file_key(sidecar(p, "-wal"), ctime=False))
    except OSError as e:
        raise InputError(f"{report}: cannot read it ({e.strerror})", "UNREADABLE") from None
    if not files:
        raise InputError(f"{report}: no such file", "NO_FILE")
    return {"path": str(p), "files": files}


def _file_key(f: Path, ctime: bool = True) -> list:
    """``[name, size, mtime, inode, ctime, content]``; no ctime for a ``-wal``: SQLite running as root gives the
    file its owner again on every open (``fchown``), which moves its ctime (its content hash covers the last
    frames, whose checksums are cumulative)."""
    s = f.stat()
    return [f.name, s.st_size, s.st_mtime_ns, s.st_ino, s.st_ctime_ns if ctime else None, _content(f)]


def _content(f: Path) -> str:
    """A hash of a file's first and last :data:`EDGE` bytes and of :data:`BLOCKS` blocks spread between them (the
    whole file when it is small): 8 reads whatever its size, no hash of a whole GB file."""
    h = hashlib.blake2b(digest_size=16)
    fd = os.open(f, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        if size <= 2 * EDGE + BLOCKS * BLOCK:
            spots = [(0, size)]
        else:
            between = [(size * i // (BLOCKS + 1), BLOCK) for i in range(1, BLOCKS + 1)]
            spots = [(0, EDGE), *between, (size - EDGE, EDGE)]
        for at, n in spots:
            h.update(os.pread(fd, n, at))
    finally:
        os.close(fd)
    return h.hexdigest()


def cache_dir_for(report: str | os.PathLike) -> Path:
    """Where the cache of ``report`` goes: ``<report>.spectrace`` beside it when its folder is writable, its path
    UTF-8 and its name short enough (for its build folder's name too, :data:`_NAME_MAX`); else in the user cache
    folder (:func:`_user_cache_base`) as ``<hash>_<name>.spectrace``, the name cut to fit. A
    :class:`CacheWriteError` when there is no valid place."""
    p = Path(report).resolve()
    env = os.environ.get("SPECTRACE_CACHE_DIR") or None
    if not env and _writable(p.parent) and utf8(str(p)) and _fits(p.name + SUFFIX):
        return p.parent / (p.name + SUFFIX)
    head = hashlib.sha1(os.fsencode(p)).hexdigest()[:16] + "_"
    room = _NAME_MAX - _BUILD_NAME - len(head) - len(SUFFIX)
    name = os.fsencode(p.name).decode(errors="replace").encode()[:room].decode(errors="ignore")
    return _user_cache_base() / (head + name + SUFFIX)


def _user_cache_base() -> Path:
    """``$SPECTRACE_CACHE_DIR``, else ``$XDG_CACHE_HOME/spectrace``, else ``$HOME/.cache/spectrace``, the
    variables checked: an empty one is unset; XDG_CACHE_HOME is ignored when relative (the XDG spec) or not UTF-8;
    a SPECTRACE_CACHE_DIR that is not UTF-8 (polars writes only UTF-8 paths), or a HOME that is empty, relative
    or not UTF-8 (never ``/.cache``), is no place: a :class:`CacheWriteError` (the cache is skipped)."""
    env = os.environ.get("SPECTRACE_CACHE_DIR") or ""
    if env:
        if not utf8(env):
            shown = ascii(os.fsencode(env))[2:-1]
            raise CacheWriteError(f"SPECTRACE_CACHE_DIR={shown}: not valid UTF-8, no cache written there; set "
                                  "it to a UTF-8 path")
        return Path(env).absolute()
    xdg = os.environ.get("XDG_CACHE_HOME") or ""
    if os.path.isabs(xdg) and utf8(xdg):
        return Path(xdg) / "spectrace"
    if "HOME" in os.environ:
        home = os.environ["HOME"]
    else:
        try:
            home = str(Path.home())  # the password database's entry
        except (KeyError, RuntimeError):
            home = ""
    if not (os.path.isabs(home) and utf8(home)):
        what = "empty" if not home else "not an absolute path" if not os.path.isabs(home) else "not valid UTF-8"
        raise CacheWriteError(f"no folder for the cache: HOME is {what}; set SPECTRACE_CACHE_DIR (or "
                              "XDG_CACHE_HOME) to a writable folder")
    return Path(home) / ".cache" / "spectrace"


def _fits(name: str) -> bool:
    return len(os.fsencode(name)) + _BUILD_NAME <= _NAME_MAX


def utf8(s: str) -> bool:
    """Whether ``s`` encodes as UTF-8 (a path of bytes that are not is kept as lone surrogates)."""
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
