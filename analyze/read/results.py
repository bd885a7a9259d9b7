"""The result cache: a report's analysis (the :class:`~analyze.model.Result` that ``merge`` takes) kept in its cache.

A second command on the same capture (any verb: ``analyze``, ``comm``, ``compare``, ``whatif``, ``report``) with
the same selection reads these small files instead of analysing the GPU operations again::

    <report>.spectrace/results/<key>/      (<key>: a hash of everything that changes the analysis, below)
      result.json                          the Result's fields; each frame as a reference to its file
      0.arrow 1.arrow ...                  the frames (Arrow IPC)

They live inside the parquet store (:mod:`analyze.read.store`), so they are only ever read from a store that
still verifies for the report (its path, and of each of its files size, mtime, inode, ctime and a content
hash; a SQLite file's ``-wal`` too): a changed input is a rebuilt store, and the rebuilt store has no results.
The key (:func:`result_key`) adds what the store does not know: the phase regex, the communication patterns,
the report's path as the caller spelled it (it is in the outputs), the capture's manifest (the cycles' tokens may
come from it), spectrace's version, a hash of the analysis
code (:func:`code_digest`: any change of the source is a new key), polars' version, the store's build id and
:data:`_RESULT_VERSION`. The cycle choice (``--skip-cycles``/``--window``) is applied to a result after it is read,
so it is not part of the key.

``result.json`` lists every frame file with its size and CRC-32 and carries a digest of itself; a result whose
files do not match is not used (the analysis runs again and writes it anew). Writes are atomic: a folder built
under a temporary name and renamed into place; one that cannot be written (a read-only cache, a full disk) is
skipped, the analysis goes on. Inside :func:`writing_behind` (the CLI's analysis verbs) :func:`save` writes the files
on a thread while the command goes on with its outputs: what is written is fixed when it is called (the result's
frames are never changed afterwards), and :func:`keep_derived` (every verb calls it when done), :func:`load` and
:func:`save` of the same folder, :func:`wait` and the end of :func:`writing_behind` wait for it and raise what the
writing raised (a failure that skips the cache still only skips it). A Ctrl-C meanwhile leaves the folder whole or
absent: the thread is not a daemon, so the process ends once it is written and renamed; a process killed meanwhile
leaves only a build folder (pruned as below). A store keeps the :data:`KEEP_RESULTS` most recently used results (:func:`prune`).
``rm -r <report>.spectrace`` (or the cache folder under ``SPECTRACE_CACHE_DIR``)
clears it with the store; ``rm -r <report>.spectrace/results`` only the results.

Only plain values are written (JSON, Arrow): nothing in a cache folder is ever executed (no pickle).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import io
import json
import os
import shutil
import threading
import time
import uuid
import zlib
from collections.abc import Callable, Hashable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

import polars as pl

from .. import __version__
from ..model import CommResult, CycleChoice, Diagnostic, Result, Trace, Window
from .source import OpsWindow

__all__ = ["KEEP_RESULTS", "STALE_S", "DICT_ROWS", "FOLDER", "KNOWN", "code_digest", "result_key", "derived", "load",
           "save", "prune", "keep_derived", "cacheable", "kept_key", "wait",
           "writing_behind", "known"]

_T = TypeVar("_T")
_RESULT_VERSION = 2  # 2: Result.host_windows
KEEP_RESULTS = 4  # result folders kept per store: the most recently used (other selections, older versions go)
STALE_S = 24 * 3600  # a build folder (``.<key>.tmp-*``) this old was left by a process that died
DICT_ROWS = 10_000  # string columns of frames this long are written dictionary-encoded
FOLDER = "results"
# The dataclasses a result may hold, by name: nothing else is ever built from a cache's JSON.
KNOWN = {c.__name__: c for c in (Result, Trace, Diagnostic, OpsWindow, CommResult, CycleChoice, Window)}


@functools.cache
def code_digest() -> str:
    """A hash of spectrace's analysis source (model, read, compute, and the phase names and payloads of
    ``nvtx_hooks/phases.py`` that compute reads): a change to any of it is a new result key."""
    base = Path(__file__).resolve().parents[1]
    h = hashlib.blake2b(digest_size=16)
    phases = base.parent / "nvtx_hooks" / "phases.py"
    for f in sorted([base / "model.py", base / "__init__.py", *(base / "read").glob("*.py"),
                     *(base / "compute").glob("*.py"), *([phases] if phases.is_file() else [])]):
        h.update(f.name.encode())
        h.update(f.read_bytes())
    return h.hexdigest()


def result_key(report: str, build: str | None, ranges: str | None, comm_patterns: Sequence[object] | None,
               manifest: dict[str, Any] | None = None) -> str:
    """The folder name of a result: a hash of everything that changes it (see the module docstring)."""
    patterns = None if comm_patterns is None else [
        dataclasses.astuple(p) if dataclasses.is_dataclass(p) and not isinstance(p, type) else repr(p)
        for p in comm_patterns]
    key = {"version": _RESULT_VERSION, "spectrace": __version__, "code": code_digest(), "polars": pl.__version__,
           "report": str(report), "build": build, "ranges": ranges, "comm_patterns": patterns, "manifest": manifest}
    return hashlib.sha256(json.dumps(key, sort_keys=True, default=repr).encode()).hexdigest()[:32]


def cacheable(cls):
    """Class decorator: a dataclass whose values a verb keeps beside a result (:func:`derived`), known by its name
    (its fields must be values the cache writes). Nothing but these classes is ever built from a cache's JSON."""
    KNOWN.setdefault(cls.__name__, cls)
    return cls


class _Unsupported(Exception):
    """A value the cache does not know how to write: the result is then not kept."""


def _encode(v: object, frames: list[pl.DataFrame | None]) -> Any:
    if v is None or isinstance(v, bool | int | float | str):
        return v
    if isinstance(v, pl.DataFrame):
        frames.append(v)
        return {"$frame": len(frames) - 1}
    if isinstance(v, pl.Series):
        frames.append(v.to_frame())
        return {"$series": len(frames) - 1}
    if isinstance(v, bytes):  # a report's figure (PNG): in an Arrow file, not in the JSON
        frames.append(pl.DataFrame({"b": [v]}, schema={"b": pl.Binary}))
        return {"$bytes": len(frames) - 1}
    if type(v).__module__ == "numpy":  # a what-if replay's arrays (numbers only), and numpy's scalars
        import numpy as np  # loaded already: v is one of its values

        if not isinstance(v, np.ndarray):
            if not isinstance(v, np.generic):
                raise _Unsupported(type(v).__name__)
            return _encode(v.item(), frames)
        if v.dtype.kind not in "biuf":
            raise _Unsupported(f"array of {v.dtype}")
        frames.append(pl.DataFrame({"a": v.ravel()}))
        return {"$array": len(frames) - 1, "shape": list(v.shape)}
    if isinstance(v, list):
        return [_encode(x, frames) for x in v]
    if isinstance(v, tuple):
        return {"$tuple": [_encode(x, frames) for x in v]}
    if isinstance(v, set | frozenset):
        return {"$set": [_encode(x, frames) for x in sorted(v, key=repr)]}
    if isinstance(v, dict):
        return {"$dict": [[_encode(k, frames), _encode(x, frames)] for k, x in v.items()]}
    cls = getattr(type(v), "_lazy_of", type(v))  # a value read from the cache is written as its plain class
    name = cls.__name__
    if dataclasses.is_dataclass(v) and KNOWN.get(name) is cls:
        return {"$class": name,  # the fields a copy carries (not a Result's derived tables: its ``memo``)
                "fields": {f.name: _encode(getattr(v, f.name), frames) for f in dataclasses.fields(v) if f.init}}
    raise _Unsupported(type(v).__name__)


class _Frame:
    """A frame's file content (verified against its CRC-32 when read), parsed on first use."""

    __slots__ = ("data", "frame", "strings")

    def __init__(self, data: bytes, strings: list[str]):
        self.data, self.strings = data, strings
        self.frame: pl.DataFrame | None = None

    def get(self) -> pl.DataFrame:
        if self.frame is None:
            df = pl.read_ipc(io.BytesIO(self.data))
            df = df.with_columns(pl.col(self.strings).cast(pl.String)) if self.strings else df
            self.frame, self.data = df, b""
            return df
        return self.frame


class _LazyField:
    """A dataclass field whose frame is parsed on first use (:func:`_lazy`): a command reads only the frames it
    uses (a second ``analyze`` with the headline tables kept needs few of them)."""

    def __init__(self, name: str):
        self.name = name

    def __get__(self, obj: object, owner: type | None = None) -> Any:
        if obj is None:
            return self
        v = obj.__dict__[self.name]
        if isinstance(v, _Frame):
            v = obj.__dict__[self.name] = v.get()
        return v

    def __set__(self, obj: object, value: object) -> None:
        obj.__dict__[self.name] = value


def _rebuild(cls: type[_T], kw: dict[str, Any]) -> _T:
    return cls(**kw)


@functools.cache
def _lazy(cls: type) -> type:
    """``cls`` with every field a :class:`_LazyField`; pickled and copied as a plain ``cls`` (every frame read)."""
    names = [f.name for f in dataclasses.fields(cls) if f.init]  # (the others are never read from the cache)
    ns: dict[str, object] = {n: _LazyField(n) for n in names}
    ns["__reduce__"] = lambda self: (_rebuild, (cls, {n: getattr(self, n) for n in names}))
    ns["_lazy_of"] = cls
    return type(cls.__name__, (cls,), ns)


def _decode(v: object, frames: list[_Frame], lazy: bool = False) -> Any:
    if isinstance(v, list):
        return [_decode(x, frames) for x in v]
    if not isinstance(v, dict):
        return v
    if "$frame" in v:
        return frames[v["$frame"]] if lazy else frames[v["$frame"]].get()
    if "$series" in v:
        return frames[v["$series"]].get().to_series()
    if "$bytes" in v:
        data = frames[v["$bytes"]].get()["b"][0]
        if not isinstance(data, bytes):
            raise TypeError("not bytes")
        return data
    if "$array" in v:
        return frames[v["$array"]].get().to_series().to_numpy().reshape(v["shape"]).copy()
    if "$tuple" in v:
        return tuple(_decode(x, frames) for x in v["$tuple"])
    if "$set" in v:
        return {_decode(x, frames) for x in v["$set"]}
    if "$dict" in v:
        return {_hashable(_decode(k, frames)): _decode(x, frames) for k, x in v["$dict"]}
    cls = KNOWN[v["$class"]]
    return _lazy(cls)(**{k: _decode(x, frames, lazy=True) for k, x in v["fields"].items()})


def _hashable(k: object) -> object:
    return tuple(k) if isinstance(k, list) else k


def _digest(doc: dict) -> str:
    return hashlib.sha256(json.dumps({k: v for k, v in doc.items() if k != "check"}, sort_keys=True).encode()
                          ).hexdigest()


def _crc(f: Path) -> list[int]:
    data = f.read_bytes()
    return [len(data), zlib.crc32(data)]


def _read_doc(folder: Path, key: str) -> tuple[object, list[_Frame]] | None:
    """What :func:`_write_doc` wrote in ``folder`` for ``key``: the encoded value and its frames (verified, parsed
    when used); None when it does not verify."""
    try:
        doc = json.loads((folder / "result.json").read_text())
        if not isinstance(doc, dict) or doc.get("check") != _digest(doc) or doc.get("key") != key:
            return None
        frames = []
        for i, want in enumerate(doc["files"]):
            data = (folder / f"{i}.arrow").read_bytes()
            if [len(data), zlib.crc32(data)] != want[:2]:
                return None
            frames.append(_Frame(data, want[2]))
        return doc["value"], frames
    except (OSError, ValueError, KeyError, TypeError, IndexError):
        return None


def _write_doc(parent: Path, name: str, key: str, body: object, frames: list[pl.DataFrame | None]) -> bool:
    """``body`` (from :func:`_encode`) and its frames as ``parent/name``, atomically: built beside and renamed into
    place (a folder another process put there first is kept). False when it could not be written. The largest
    frames are written first, and each one let go of (``frames[i] = None``) once written: a frame the caller lets go
    of meanwhile (a write behind, :func:`save`) is not held longer than it takes to write it."""
    tmp = parent / f".{name}.tmp-{uuid.uuid4().hex[:12]}"
    try:
        parent.mkdir(exist_ok=True)
        tmp.mkdir()
        files: list[list] = [[] for _ in frames]
        sizes = [0 if df is None else df.estimated_size() for df in frames]
        for i in sorted(range(len(frames)), key=lambda i: -sizes[i]):
            df, frames[i] = frames[i], None
            assert df is not None  # (each frame is written once)
            f = tmp / f"{i}.arrow"
            # Long string columns (names, phases, families: a few values repeated) dictionary-encoded on disk:
            # smaller and faster both ways than compressed strings; read back as strings (:class:`_Frame`).
            strings = [c for c, t in df.schema.items() if t == pl.String] if df.height >= DICT_ROWS else []
            (df.with_columns(pl.col(strings).cast(pl.Categorical)) if strings else df).write_ipc(f, compression="zstd")
            del df
            files[i] = [*_crc(f), strings]
        doc = {"key": key, "files": files, "value": body}
        doc["check"] = _digest(doc)
        (tmp / "result.json").write_text(json.dumps(doc))
        with contextlib.suppress(OSError):  # there already: another process's equal result stays
            os.replace(tmp, parent / name)
        return (parent / name).is_dir()
    except (OSError, ValueError, pl.exceptions.PolarsError):
        return False
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


@dataclasses.dataclass
class _Kept:
    """A result read from or written to the cache in this process (``Result.cached``: it lives and goes with that
    very object): where, the derived tables read with it (``derived``), and those computed for it since (``new``:
    what :func:`keep_derived` writes)."""

    folder: Path
    key: str
    derived: dict
    new: dict = dataclasses.field(default_factory=dict)
    writing: _Writing | None = None  # the result's own folder, while it is written behind (:func:`save`)


class _Writing:
    """A result folder being written on a thread (:func:`save` with ``behind``): :meth:`wait` gives whether it was
    written, and raises what the writing raised (once)."""

    def __init__(self, folder: Path, write: Callable[[], bool]):
        self.folder, self.ok = folder, False
        self.error: BaseException | None = None
        self._write = write
        self.thread = threading.Thread(target=self._run, name=f"spectrace result cache {folder.name[:8]}")

    def _run(self) -> None:
        try:
            self.ok = self._write()
        except BaseException as e:  # handed to the caller by wait(): never lost in the thread
            self.error = e
        finally:
            self._write = _no_write  # what it held (the frames) let go of

    def wait(self) -> bool:
        self.thread.join()
        if _WRITING.get(self.folder) is self:
            del _WRITING[self.folder]
        e, self.error = self.error, None
        if e is not None:
            raise e
        return self.ok


def _no_write() -> bool:
    return False


# result folder -> its write under way in this process (:func:`save` with ``behind``): what load, save and wait
# wait for first
_WRITING: dict[Path, _Writing] = {}


def _settle(folder: Path) -> None:
    """Wait for a write behind of ``folder`` under way (raising what it raised)."""
    w = _WRITING.get(folder)
    if w is not None:
        w.wait()


def wait(res: Result | None = None) -> bool:
    """Wait for the result cache's writes behind (:func:`save`): of ``res`` (True when it is written, or was read
    from the cache), else all of this process's; raises what a write raised."""
    if res is None:
        ok = True
        for w in list(_WRITING.values()):
            ok = w.wait() and ok
        return ok
    entry = _kept(res)
    if entry is None:
        return False
    if entry.writing is not None:
        w, entry.writing = entry.writing, None
        if not w.wait():  # not kept after all: nothing derived from it is kept either
            res.cached = None
            return False
    return True


def _track(res: Result, folder: Path, key: str, derived: dict) -> None:
    """Remember ``res`` as the cache's (on the object itself: a copy of it is not the cache's, and the entry, with
    the derived tables read, goes with the result)."""
    res.cached = _Kept(folder, key, derived)


def _kept(res: Result) -> _Kept | None:
    entry = res.cached
    return entry if isinstance(entry, _Kept) else None


def kept_key(res: Result) -> str | None:
    """The key of ``res`` in its report's result cache when the cache gave it (read or just kept), else None (a
    merge of several, a copy, ``cache=False``): what identifies an analysis in the key of a table derived from
    it together with another (a report's comparison with ``--vs``)."""
    entry = _kept(res)
    return None if entry is None else entry.key


def derived(res: Result, key: Hashable, compute: Callable[[], _T]) -> _T:
    """The table derived from ``res`` under ``key`` (a memo key): read with ``res`` from the cache, else
    ``compute()`` (remembered for :func:`keep_derived` when ``res`` came from the cache)."""
    entry = _kept(res)
    if entry is None:
        return compute()
    if key in entry.derived:
        body, frames = entry.derived[key]
        try:
            return _decode(body, frames)
        except (ValueError, KeyError, TypeError, IndexError, pl.exceptions.PolarsError):
            del entry.derived[key]  # unreadable after all: computed (and kept again)
    value = entry.new[key] = compute()
    return value


def known(res: Result, key: Hashable) -> bool:
    """Whether the cache has the value of ``res`` under ``key`` for :func:`derived` without computing it (read with
    ``res`` from the cache, or computed for it since)."""
    entry = _kept(res)
    return entry is not None and (key in entry.derived or key in entry.new)


def load(store_root: Path, key: str) -> Result | None:
    """The result kept under ``key`` in the store at ``store_root`` (and the derived tables kept beside it, for
    :func:`derived`), or None (none kept, or one that does not verify: its digest or a frame file's size or
    CRC-32 differ, or a file cannot be read). A derived-table folder that does not verify is left out. Frames
    are parsed when first used."""
    folder = store_root / FOLDER / key
    _settle(folder)
    doc = _read_doc(folder, key)
    try:
        res = _decode(*doc) if doc is not None else None
    except (ValueError, KeyError, TypeError, IndexError, pl.exceptions.PolarsError):
        return None
    if not isinstance(res, Result):
        return None
    kept: dict = {}
    with contextlib.suppress(OSError):
        for d in sorted(folder.glob("memo-*")):
            memo = _read_doc(d, key)
            if memo is None or not isinstance(memo[0], dict) or "$dict" not in memo[0]:
                continue
            with contextlib.suppress(ValueError, KeyError, TypeError, IndexError):
                for k, body in memo[0]["$dict"]:
                    kept[_hashable(_decode(k, []))] = (body, memo[1])
    _track(res, folder, key, kept)
    _used(folder)
    return res


def save(store_root: Path, key: str, res: Result, behind: bool | None = None) -> bool:
    """Keep ``res`` under ``key``. False when it could not be written or holds a value the cache cannot write.

    ``behind`` (default: inside :func:`writing_behind`): the files are written on a thread while the caller goes on
    (what is written is encoded now; the result's frames are never changed afterwards); True unless the result
    holds a value the cache cannot write. :func:`wait` (called by :func:`keep_derived`, :func:`load` and
    :func:`save` of the same folder, and on leaving :func:`writing_behind`) waits for it."""
    folder = store_root / FOLDER / key
    _settle(folder)
    frames: list[pl.DataFrame | None] = []
    try:
        body = _encode(res, frames)
    except _Unsupported:
        return False

    def write() -> bool:
        if not _write_doc(store_root / FOLDER, key, key, body, frames):
            return False
        prune(store_root / FOLDER, key)
        return True

    if not (behind or behind is None and _BEHIND):
        if not write():
            return False
        _track(res, folder, key, {})
        return True
    _track(res, folder, key, {})  # now: the tables derived meanwhile are remembered (kept once it is written)
    entry = _kept(res)
    assert entry is not None
    entry.writing = _WRITING[folder] = _Writing(folder, write)
    entry.writing.thread.start()
    return True


_BEHIND: list[bool] = []  # inside writing_behind(): the pipeline's saves are written behind


@contextlib.contextmanager
def writing_behind() -> Iterator[None]:
    """Within it, :func:`save` writes a result's files on a thread (``behind``) while the command goes on with its
    outputs (the CLI's analysis verbs run in it); on leaving it every write under way is waited for, and what one
    raised is raised here (leaving it by an exception, Ctrl-C included: not waited for here; the thread, not a
    daemon, finishes before the process ends)."""
    _BEHIND.append(True)
    try:
        yield
    finally:
        _BEHIND.pop()
    wait()


def prune(parent: Path, keep: str) -> None:
    """Remove the result folders of ``parent`` beyond the :data:`KEEP_RESULTS` most recently used (``keep`` is
    one of them), and build folders left by a process that died (older than :data:`STALE_S`). A folder is renamed
    away before it is removed: a process reading it meanwhile finds it whole or not at all (then analyses)."""
    try:
        entries = [(d, d.stat().st_mtime) for d in parent.iterdir() if d.is_dir() and not d.is_symlink()]
    except OSError:
        return
    now = time.time()
    kept = sorted((e for e in entries if not e[0].name.startswith(".") and e[0].name != keep),
                  key=lambda e: e[1], reverse=True)
    gone = [d for d, _ in kept[KEEP_RESULTS - 1:]]
    gone += [d for d, t in entries if d.name.startswith(".") and ".tmp-" in d.name and now - t > STALE_S]
    for d in gone:
        old = parent / f".{d.name.lstrip('.')}.old-{uuid.uuid4().hex[:12]}"
        with contextlib.suppress(OSError):
            os.replace(d, old)
            shutil.rmtree(old, ignore_errors=True)


def _used(folder: Path) -> None:
    """Mark a result folder as just used (its mtime: :func:`prune` keeps the most recently used)."""
    with contextlib.suppress(OSError):
        os.utime(folder)


def keep_derived(res: Result) -> bool:
    """Keep the tables derived from ``res`` since it was read or kept (the headline tables of each cycle choice,
    the cycle classes, a report's figures, ...: what :func:`derived` computed for it) beside it, so that the next
    command reads them too. A no-op for a result the cache did not give (a merge of several, a copy). True when something was kept."""
    if not wait(res):  # its own folder written first (behind, :func:`save`); not written: nothing kept
        return False
    entry = _kept(res)
    if entry is None or not entry.new:
        return False
    frames: list[pl.DataFrame | None] = []
    body = []
    for k, v in entry.new.items():
        mark = len(frames)
        try:
            body.append([_encode(k, frames), _encode(v, frames)])
        except _Unsupported:
            del frames[mark:]
    entry.new = {}
    if not body:
        return False
    return _write_doc(entry.folder, f"memo-{uuid.uuid4().hex[:12]}", entry.key, {"$dict": body}, frames)
