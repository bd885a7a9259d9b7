"""Our folders on disk, handled safely: removing a build or a cache (:func:`remove_tree`: through further Ctrl-C
presses, its read-only folders made writable first), whether this process may remove one (:func:`removable`: not a
cache of another user), the lock on installing, replacing and removing the caches of a folder (:func:`locked`:
``flock`` on the folder itself, nothing created), and build folders left by processes that died
(:func:`remove_stale_builds`). Only a folder with the ``SPECTRACE_CACHE`` marker is ever removed as stale."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import stat
import time
from pathlib import Path

from .layout import MARKER

__all__ = ["remove_tree", "removable", "locked", "remove_stale_builds"]


_STALE_S = 24 * 3600  # a build folder this old, or left by a dead process on this host, is removed


def remove_tree(path: Path) -> None:
    """Remove a folder of ours (a build, a cache), even if Ctrl-C is pressed again meanwhile; its read-only
    folders are made writable first (a cache made read-only is still ours to replace)."""
    while True:
        try:
            _unlock_tree(path)
            shutil.rmtree(path, ignore_errors=True)
            return
        except KeyboardInterrupt:
            continue


def _unlock_tree(path: Path) -> None:
    """Every folder of a tree given read, write and search permission for its owner (where that is us): what
    removing its entries needs. Symbolic links are never followed."""
    def fix(d) -> None:
        with contextlib.suppress(OSError):
            mode = os.lstat(d).st_mode
            if stat.S_ISDIR(mode) and mode & 0o700 != 0o700:
                os.chmod(d, stat.S_IMODE(mode) | 0o700)

    fix(path)
    for top, dirs, _files in os.walk(path):  # top-down: each folder is fixed before it is listed
        for d in dirs:
            fix(os.path.join(top, d))


def removable(root: Path) -> bool:
    """Whether this process can remove the folder ``root``: rename it within its parent, and empty each of its
    folders (they are ours, or we may write them); a cache of another user is not."""
    me = os.geteuid()

    def ours(d) -> bool:
        try:
            return os.lstat(d).st_uid == me or os.access(d, os.R_OK | os.W_OK | os.X_OK)
        except OSError:
            return False

    if not os.access(root.parent, os.W_OK | os.X_OK) or not ours(root):
        return False
    return all(ours(os.path.join(top, d)) for top, dirs, _files in os.walk(root) for d in dirs)


@contextlib.contextmanager
def locked(folder: Path):
    """An exclusive lock, between spectrace processes, on installing, replacing and removing the caches of
    ``folder``: ``flock`` on the folder itself (nothing is created; where locks are not supported, none)."""
    try:
        import fcntl

        fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except (ImportError, OSError):
        yield
        return
    try:
        with contextlib.suppress(OSError):
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def _owner_alive(host: str, pid: int) -> bool:
    if host != socket.gethostname():
        return True  # cannot tell: only its age makes it stale
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        pass
    return True


def remove_stale_builds(root: Path) -> None:
    """Remove build folders of ``root`` (``.<name>.tmp-*``, ``.<name>.old-*``) that no live process owns."""
    try:
        found = [*root.parent.glob(f".{root.name}.tmp-*"), *root.parent.glob(f".{root.name}.old-*")]
    except OSError:
        return
    for d in found:
        try:
            if d.is_symlink() or not d.is_dir():
                continue
            age = time.time() - d.stat().st_mtime
            owner = json.loads((d / MARKER).read_text()) if (d / MARKER).is_file() else None
        except (OSError, ValueError):
            continue
        if owner is None:  # made, not yet marked (or never): only when empty and old
            if age > _STALE_S and not any(d.iterdir()):
                d.rmdir()
            continue
        if ".old-" in d.name or age > _STALE_S or not _owner_alive(owner.get("host", ""), int(owner.get("pid", 0))):
            remove_tree(d)
