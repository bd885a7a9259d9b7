"""Opening a report's store: a cache that verifies is reused (:func:`existing_store`, :func:`open_store`), else one
is built under a temporary name (``.<name>.tmp-*``) and renamed into place, once, so a half-written cache is never
used; a temporary store for an analysis that keeps none (:func:`temporary_store`); a cache that cannot be read is
removed (:func:`discard`).

Installing, replacing and removing a cache happen under a lock on its folder, and a cache is replaced or removed
only while it is the very build (its id) that was found stale or unreadable: two processes never remove each
other's work. If the report changes while the cache is built, the new cache is thrown away. A cache that cannot be
written (permissions, a full disk, a file-size limit, a stale cache of another user, no valid place for it, a place
inside the input) raises :class:`~analyze.read.store.errors.CacheWriteError`: the analysis goes on without it
(:func:`analyze.read.source.open_source`)."""

from __future__ import annotations

import os
import tempfile
import uuid
from pathlib import Path

from ...model import InputError
from ..protocols import ShowProgress
from .build import build
from .columnar_build import take_built_rows
from .errors import CacheWriteError
from .fingerprint import fingerprint
from .folders import locked, removable, remove_stale_builds, remove_tree
from .layout import build_id, is_cache, problem, problem_and_meta
from .location import cache_dir_for, refuse_inside_input
from .reader import CacheError, Store

__all__ = ["discard", "existing_store", "open_store", "temporary_store"]


def discard(root: Path, build: str | None) -> None:
    """Remove the cache at ``root`` if it is still build ``build`` (one that cannot be read): a cache another
    process installed meanwhile is left alone."""
    old = None
    with locked(root.parent):
        if build is not None and is_cache(root) and build_id(root) == build:
            old = root.with_name(f".{root.name}.old-{uuid.uuid4().hex[:12]}")
            try:
                os.replace(root, old)
            except OSError:
                return
    if old is not None:
        remove_tree(old)


def _cache_write_error(reason, where: Path) -> CacheWriteError:
    return CacheWriteError(f"{where}: cannot write the cache ({reason}); set SPECTRACE_CACHE_DIR to a writable "
                           "folder to keep one", "CACHE_WRITE", reason=str(reason))


def _fingerprint(p: Path) -> dict:
    """The report's key (:func:`~analyze.read.store.fingerprint.fingerprint`); a file that is not a torch profiler
    trace must be a complete SQLite file (one line otherwise), a trace's reader checks its own."""
    # (not at the top: kineto keys and places its tables with the store's modules)
    from ..kineto import is_trace

    return fingerprint(p, check=not is_trace(p))


def _verified_store(root: Path, key: dict, broken: str | None, report) -> Store | None:
    """The cache at ``root`` when it verifies for ``key`` and is not build ``broken``; else None."""
    try:
        why, meta = problem_and_meta(root, key)
    except OSError:
        return None
    if why is None and (broken is None or meta.get("build") != broken):
        return Store(root, report=report, meta=meta)
    return None


def existing_store(report: str | os.PathLike, cache_dir: Path | None = None) -> Store | None:
    """The report's cache if one is there and verifies for the report; None otherwise: nothing is built or
    written, and a cache path that cannot be looked up (a name too long, no valid place) is no cache."""
    p = Path(report)
    try:
        if not p.exists():
            return None
        root = cache_dir or cache_dir_for(p)
        if not root.is_dir():
            return None
    except (OSError, CacheWriteError):
        return None
    return _verified_store(root, _fingerprint(p), None, report)


def open_store(report: str | os.PathLike, progress: ShowProgress | None = None, cache_dir: Path | None = None,
               broken: str | None = None) -> Store:
    """The cache of ``report``: reused when it verifies (:func:`analyze.read.store.layout.problem`), else (re)built
    atomically, once. ``progress``: a meter of the build (None: none shown).

    ``broken``: the build id of a cache whose files could not be read: that build is replaced, but a cache
    another process installed since is used. A folder in the way that is not a spectrace cache is never touched:
    a one-line error. A cache that cannot be written there (or not replaced: another user's) is a
    :class:`~analyze.read.store.errors.CacheWriteError`, with nothing left behind.
    """
    p = Path(report)
    key = _fingerprint(p)
    root = cache_dir or cache_dir_for(p)
    refuse_inside_input(root, p)
    found = _verified_store(root, key, broken, report)
    if found is not None:
        return found
    if (root.exists() or root.is_symlink()) and not is_cache(root):
        raise InputError(f"{root}: is in the way of the cache and is not a spectrace cache; spectrace will not "
                         "replace it: move it, or set SPECTRACE_CACHE_DIR", "CACHE_IN_THE_WAY")
    try:
        root.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise _cache_write_error(e.strerror or e, root.parent) from None
    remove_stale_builds(root)
    tmp = root.with_name(f".{root.name}.tmp-{uuid.uuid4().hex[:12]}")
    old = None
    try:  # whatever happens (errors, Ctrl-C, another process installing first), tmp and old do not outlive this
        try:
            build(p, tmp, progress)
        except CacheWriteError as e:
            raise _cache_write_error(e.reason, root) from None
        built = take_built_rows(tmp)
        if _fingerprint(p) != key:  # the report changed while we read it: do not keep what we read
            raise InputError(f"{p}: the report changed while it was read; try again", "CHANGED")
        mine = build_id(tmp)
        try:
            with locked(root.parent):
                found = _verified_store(root, key, broken, report)
                if found is not None:  # another process installed a good one meanwhile: ours is not needed
                    return found
                if root.exists() or root.is_symlink():
                    if not is_cache(root):
                        raise InputError(f"{root}: is in the way of the cache and is not a spectrace cache",
                                         "CACHE_IN_THE_WAY")
                    if not removable(root):
                        raise CacheWriteError(f"{root}: cannot replace the cache there (its folders are another "
                                              "user's, or read-only)", "CACHE_WRITE")
                    old = root.with_name(f".{root.name}.old-{uuid.uuid4().hex[:12]}")
                    os.replace(root, old)
                os.replace(tmp, root)
        except OSError as e:
            raise _cache_write_error(e.strerror or e, root) from None
    finally:
        take_built_rows(tmp)  # rows a failed build read go with it
        if tmp.exists():
            remove_tree(tmp)
        if old is not None:
            remove_tree(old)
    found = _verified_store(root, key, None, report)
    if found is None:  # not kept: a cache that does not verify is never used
        why = problem(root, key)
        discard(root, mine)
        raise CacheError(f"{root}: the cache does not verify right after it was built ({why}), so it was removed; "
                         "check the disk, or set SPECTRACE_CACHE_DIR to another place", "CACHE_BROKEN")
    if found.meta.get("build") == mine:  # the rows our build read are this cache's
        found.hand(built)
    return found


def temporary_store(report: str | os.PathLike, progress: ShowProgress | None = None) -> tuple[Store, Path]:
    """A store in a temporary directory (the caller removes it; removed here if the build fails or is interrupted):
    streaming without keeping a cache. One that cannot be written: a
    :class:`~analyze.read.store.errors.CacheWriteError` (code TMP_WRITE)."""
    try:
        tmp = Path(tempfile.mkdtemp(prefix="spectrace-"))
    except OSError as e:
        raise CacheWriteError(f"{tempfile.gettempdir()}: cannot create a temporary folder ({e.strerror}); set "
                              "TMPDIR to a writable folder", "TMP_WRITE", reason=e.strerror) from None
    try:
        try:
            build(report, tmp / "c", progress)
        except CacheWriteError as e:
            raise CacheWriteError(f"{tmp}: cannot write a temporary store ({e.reason}); set TMPDIR to a writable "
                                  "folder, or pass --no-store", "TMP_WRITE", reason=e.reason) from None
        s = Store(tmp / "c", kept=False, report=report)
        s.hand(take_built_rows(tmp / "c"))
        return s, tmp
    except BaseException:
        take_built_rows(tmp / "c")
        remove_tree(tmp)
        raise
