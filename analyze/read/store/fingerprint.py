"""What a cache is keyed by (:func:`fingerprint`): spectrace's cache format version, the report's absolute resolved
path, and of each of its files (the table files of a directory; a SQLite file's ``-wal`` too) the size, mtime,
inode, ctime and a hash of 8 blocks of its content (its first and last 64 KiB: SQLite's header with its change
counter and page count, the first and last pages; a parquet file's footer). A stat and 8 reads per report file.
:func:`file_keys` is that key without the format version: the converted tables of a torch profiler trace
(:mod:`analyze.read.kineto`) are keyed by it too, with their own version."""

from __future__ import annotations

import contextlib
import hashlib
import os
from pathlib import Path

from nvtx_hooks.capture.files import table_files

from ...model import InputError
from ..sqlite import check_file, sidecar

__all__ = ["CACHE_VERSION", "EDGE", "BLOCK", "BLOCKS", "fingerprint", "file_keys"]


CACHE_VERSION = 11  # 2: ranges have ``range_id`` and ``range``; 3: marks.parquet; 4: marker, files listed, checks;
# 5: only the API calls the analysis needs, and each process's first call (``api_first``); 6: op_keys.parquet;
# 7: ops carry their CUDA graph's id (``graph``); 8: the key has each file's inode, ctime and content hash, the
# report's path is absolute, a build id; 9: the session's end from nsys's own diagnostic (unclosed ranges);
# 10: a columnar export's store reads its rows from the export (``columnar``, lost.parquet); 11: read_warnings
# count kernel launches in an export without a kernel table
EDGE = 65536  # the key hashes each report file's first and last EDGE bytes (SQLite pages are at most 64 KiB)...
BLOCK, BLOCKS = 4096, 6  # ...and BLOCKS blocks of BLOCK bytes spread between them


def fingerprint(report: str | os.PathLike, check: bool = True) -> dict:
    """What the cache is keyed by: the format version and :func:`file_keys` (the report's absolute resolved path,
    and of each of its files ``[name, size, mtime, inode, ctime, content]``). ``check``: as for :func:`file_keys`
    (False for a torch profiler trace, whose reader checks it, and where the report's reader opened it already)."""
    return {"cache_version": CACHE_VERSION, **file_keys(report, check)}


def file_keys(report: str | os.PathLike, check: bool = True) -> dict:
    """The report's absolute resolved path and, of each of its files (a directory's table files, every file when it
    has none; a SQLite file and its ``-wal``; any other file alone), ``[name, size, mtime, inode, ctime, content]``
    (:func:`_file_key`; :func:`_content_hash`: a hash of 8 blocks). A copy of another capture over the report, even
    of the same size and mtime, changes its ctime (and inode when renamed into place) and, unless it has the same
    first, last and sampled bytes, its content hash. ``check``: a file must be a complete SQLite file (one line
    otherwise; a reader of another format checks its own)."""
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
    return [f.name, s.st_size, s.st_mtime_ns, s.st_ino, s.st_ctime_ns if ctime else None, _content_hash(f)]


def _content_hash(f: Path) -> str:
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
