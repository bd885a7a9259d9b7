"""A store folder's own files and their checks: the ``SPECTRACE_CACHE`` marker (the folder is ours), ``meta.json``
(written last by :func:`write_meta`: the key, a build id, every parquet file with its row count, size, a CRC-32 of
its last 64 KiB and of the whole file, and a digest of itself), and :func:`problem`: why a folder cannot be used
(checked on every open: the key, the digest, each file's size, footer row count and tail CRC)."""

from __future__ import annotations

import hashlib
import json
import mmap
import os
import socket
import zlib
from pathlib import Path

from .errors import one_line, write_in_cache
from .fingerprint import CACHE_VERSION

__all__ = ["MARKER", "TAIL", "file_crc", "inventory", "problem", "problem_and_meta", "is_cache", "build_id",
           "mark_as_cache", "write_meta"]


MARKER = "SPECTRACE_CACHE"  # in every cache folder (and every folder a build writes): it is ours to replace
TAIL = 65536  # bytes of each file's end in its checksum: the parquet footer (row counts, offsets) and more


def file_crc(f: Path) -> tuple[int, int]:
    """Size and CRC-32 of a whole file (mapped, not copied: ~4 GB/s, the GIL released)."""
    with f.open("rb") as h:
        size = os.fstat(h.fileno()).st_size
        if size == 0:
            return 0, 0
        with mmap.mmap(h.fileno(), 0, access=mmap.ACCESS_READ) as m:
            return size, zlib.crc32(m)


def inventory(root: Path, full: bool = False) -> dict[str, list]:
    """Every parquet file under ``root``: ``relative path -> [rows, bytes, CRC-32 of its last 64 KiB, CRC-32 of
    the whole file]`` (the last one only when ``full``, else None: the first three are what an open checks)."""
    import pyarrow.parquet as pq

    out = {}
    for f in sorted(root.rglob("*.parquet")):
        with f.open("rb") as h:
            size = os.fstat(h.fileno()).st_size
            h.seek(max(0, size - TAIL))
            tail = zlib.crc32(h.read(TAIL))
        whole = file_crc(f)[1] if full else None
        out[f.relative_to(root).as_posix()] = [pq.read_metadata(f).num_rows, size, tail, whole]
    return out


def _digest(meta: dict) -> str:
    return hashlib.sha256(json.dumps({k: v for k, v in meta.items() if k != "check"}, sort_keys=True).encode()
                          ).hexdigest()


def problem(root: Path, key: dict | None = None) -> str | None:
    """Why the cache at ``root`` cannot be used for ``key`` (None: it can). ``"stale"``: built for another
    report, file state or format (rebuilt as usual); anything else: damaged."""
    return problem_and_meta(root, key)[0]


def problem_and_meta(root: Path, key: dict | None) -> tuple[str | None, dict]:
    """:func:`problem`, and the cache's meta.json (empty when it cannot be read)."""
    try:
        meta = json.loads((root / "meta.json").read_text())
    except FileNotFoundError:
        return "no meta.json", {}
    except (OSError, ValueError) as e:
        return f"meta.json unreadable ({e})", {}
    if not isinstance(meta, dict):
        return "stale", {}
    return _problem_of(root, key, meta), meta


def _problem_of(root: Path, key: dict | None, meta: dict) -> str | None:
    if key is not None and meta.get("key") != key:
        return "stale"
    if meta.get("check") != _digest(meta):
        return "meta.json does not match its digest (edited?)"
    if not all(isinstance(v, list) and len(v) == 4 for v in meta.get("files", {}).values()):
        return "stale"  # files listed in another layout
    try:
        if not (root / MARKER).is_file():
            return f"no {MARKER} marker"
        have = inventory(root)
    except Exception as e:  # OSError, or a file pyarrow cannot parse
        return f"a file cannot be read ({one_line(e)})"
    listed = {k: v[:3] for k, v in meta.get("files", {}).items()}
    have = {k: v[:3] for k, v in have.items()}
    if have != listed:
        diff = sorted(set(have) ^ set(listed)) or sorted(k for k in have if have[k] != listed[k])
        what = "missing" if diff[0] in listed and diff[0] not in have else "unlisted" if diff[0] not in listed \
            else "changed"
        return f"{diff[0]} {what}"
    for kind in ("ops", "api") if not meta.get("columnar") else ():
        rows: dict[str, int] = {}
        for rel, (n, _, _) in listed.items():
            if rel.startswith(kind + "/"):
                pid = rel.split("/")[1]
                rows[pid] = rows.get(pid, 0) + n
        if rows != {k: v for k, v in meta.get(f"{kind}_rows", {}).items() if v}:
            return f"{kind} row counts do not match the files"
    return None


def is_cache(root: Path) -> bool:
    """Whether ``root`` is a folder spectrace made (its marker; or meta.json of an older format)."""
    if root.is_symlink() or not root.is_dir():
        return False
    if (root / MARKER).is_file():
        return True
    try:
        return isinstance(json.loads((root / "meta.json").read_text())["key"]["cache_version"], int)
    except (OSError, ValueError, KeyError, TypeError):
        return False


def build_id(root: Path) -> str | None:
    """The build id in a cache's meta.json (None: none, or unreadable)."""
    try:
        meta = json.loads((root / "meta.json").read_text())
        return meta.get("build") if isinstance(meta, dict) else None
    except (OSError, ValueError):
        return None


def mark_as_cache(dest: Path) -> None:
    """The marker: this folder is a spectrace cache, being built by this process (host, pid) until renamed."""
    owner = {"spectrace_cache": CACHE_VERSION, "host": socket.gethostname(), "pid": os.getpid()}
    write_in_cache(dest / MARKER, lambda q: q.write_text(json.dumps(owner) + "\n"))


def write_meta(dest: Path, meta: dict) -> None:
    """``meta.json`` of a finished build, written last: ``meta`` with every parquet file (:func:`inventory`, whole
    CRCs) and a digest of itself (``check``)."""
    meta = {**meta, "files": inventory(dest, full=True)}
    meta["check"] = _digest(meta)
    write_in_cache(dest / "meta.json", lambda q: q.write_text(json.dumps(meta, indent=1)))
