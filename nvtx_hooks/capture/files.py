"""Output files written safely: every file spectrace writes is new, written whole, and never an input.

A file is written under a temporary name in its folder (``.NAME.tmp-XXXX``) and put in place by a rename
only once complete (:func:`new_file`, :func:`write_new`): an interrupted or failed write (Ctrl-C, a full
disk, a file-size limit) leaves the target as it was and nothing beside it. Before anything is written the
final path is checked (:func:`check_file`): it is not an input by any name (the same inode and device, so
hard and symbolic links included, nor an input's SQLite ``-wal``/``-journal``/``-shm``), not inside an
input folder nor inside a fenced folder (the analysis cache, deleted when it is rebuilt), and it is a
regular file or a new name, never a device, a pipe, a socket or a folder. A symbolic link is written
through: the regular file it points to is what is replaced. An existing file is replaced only when the
caller says so (``replace``: ``--force``, or a results database written in place through SQLite).

A folder of outputs (``spectrace report -o DIR``) is built beside its target and put in its place whole
(:class:`NewFolder`): a new name, an empty folder or a folder spectrace made (its marker file lists what it
wrote) is replaced; any other folder is refused unless ``force``, and then only the files of the same names
are replaced (each by a rename), the rest kept.

Text is written as UTF-8 whatever the locale (:func:`utf8`). Failures are :class:`OutputError`: one line
naming the path and the reason (the CLI prints it and exits 2). Imports only the standard library: the
capture verbs (``spectrace trace``'s manifest, ``scrub``) and the analysis (``--db``, ``report -o``) share it.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import socket
import stat
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from types import TracebackType
from typing import Any

__all__ = ["STALE_S", "TABLE_SUFFIXES", "INPUT_MAX_BYTES", "OutputError", "InputFileError", "clean", "utf8",
           "check_file", "new_file", "write_new", "NewFolder", "table_files", "read_input", "check_input"]

TABLE_SUFFIXES = (".parquet", ".arrow", ".arrows")  # the table files of an nsys parquetdir/arrowdir export
_SIDECARS = ("-wal", "-journal", "-shm")  # where SQLite keeps a database's journal, WAL and WAL index
INPUT_MAX_BYTES = 256 << 20  # a file read whole (a manifest, a patterns file, a decode log): at most 256 MiB
STALE_S = 24 * 3600  # a build folder of a target this old, or left by a dead process on this host, is removed


class OutputError(Exception):
    """An output cannot be written safely; ``str(e)`` says what and why in one line, ``code`` tags it."""

    def __init__(self, message: str, code: str = "BAD_OUTPUT"):
        super().__init__(message)
        self.code = code

    def __reduce__(self) -> tuple[type[OutputError], tuple[str, str]]:  # keeps the code when raised in a worker
        return (type(self), (str(self), self.code))


class InputFileError(OutputError):
    """An input file that cannot be read safely (not a regular file, too large, missing); one line."""


def check_input(path: str | os.PathLike, what: str) -> None:
    """InputFileError unless ``path`` (symbolic links followed) is a regular file: a named pipe, a device, a socket
    or a folder is refused at once (``stat`` only: nothing is opened, so a pipe without a writer never blocks)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise InputFileError(f"{what} {os.fsdecode(path)}: no such file", "NO_FILE") from None
    except OSError as e:
        raise InputFileError(f"{what} {os.fsdecode(path)}: cannot read it ({e.strerror or e})", "UNREADABLE") from None
    if not stat.S_ISREG(st.st_mode):
        kind = _KINDS.get(stat.S_IFMT(st.st_mode), "not a regular file")
        raise InputFileError(f"{what} {os.fsdecode(path)}: is {kind}; spectrace reads only regular files (a pipe or "
                             "a device would block or never end)", "NOT_A_FILE")


def read_input(path: str | os.PathLike, what: str, limit: int = INPUT_MAX_BYTES) -> bytes:
    """The bytes of an input file read whole: a regular file (opened without blocking, then checked on its
    descriptor, so that one swapped for a pipe meanwhile is refused too) of at most ``limit`` bytes;
    :class:`InputFileError` otherwise (``what`` names it: ``--comm-patterns-file``, ``the manifest``...)."""
    check_input(path, what)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        raise InputFileError(f"{what} {os.fsdecode(path)}: cannot read it ({e.strerror or e})", "UNREADABLE") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise InputFileError(f"{what} {os.fsdecode(path)}: is {_KINDS.get(stat.S_IFMT(st.st_mode), 'not a regular file')}; "
                                 "spectrace reads only regular files", "NOT_A_FILE")
        if st.st_size > limit:
            raise InputFileError(f"{what} {os.fsdecode(path)}: {st.st_size:,} bytes, more than the {limit:,} spectrace "
                                 "reads whole; is it the right file?", "TOO_LARGE")
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read(limit + 1)
    except OSError as e:
        raise InputFileError(f"{what} {os.fsdecode(path)}: cannot read it ({e.strerror or e})", "UNREADABLE") from None
    finally:
        os.close(fd)
    if len(data) > limit:
        raise InputFileError(f"{what} {os.fsdecode(path)}: more than the {limit:,} bytes spectrace reads whole",
                             "TOO_LARGE")
    return data


def clean(text: str) -> str:
    """``text`` with what UTF-8 cannot encode (the bytes of a file name that are not UTF-8, which Python keeps
    as lone surrogates) replaced by U+FFFD, as the reader does with such strings."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        try:
            return text.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
        except UnicodeEncodeError:
            return text.encode("utf-8", "replace").decode("utf-8")


def utf8(text: str) -> bytes:
    """``text`` as UTF-8 bytes, whatever the locale (:func:`clean` first)."""
    return clean(text).encode("utf-8")


def _os_error(e: OSError, path: str | os.PathLike, what: str) -> OutputError:
    """The one-line error of a failed write of ``what`` to ``path``: the system's reason."""
    why = e.strerror or str(e)
    if isinstance(e, FileNotFoundError) and not Path(path).parent.is_dir():
        why = f"no folder {Path(path).parent}"
    return OutputError(f"{path}: cannot write {what} ({why})", "BAD_OUTPUT")


def _real(p: str | os.PathLike) -> Path:
    """The absolute path with every symbolic link resolved (a dangling one: the path it names)."""
    return Path(os.path.realpath(p))


def _same(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except (OSError, ValueError):
        return False


def _within(p: Path, folder: Path) -> bool:
    return p == folder or folder in p.parents


_KINDS = {stat.S_IFCHR: "a character device", stat.S_IFBLK: "a block device", stat.S_IFIFO: "a named pipe",
         stat.S_IFSOCK: "a socket", stat.S_IFDIR: "a folder"}


def _kind(p: Path) -> str | None:
    """What ``p`` is when it exists and is not a regular file (symbolic links followed); None otherwise."""
    try:
        mode = p.stat().st_mode
    except (OSError, ValueError):
        return None
    return None if stat.S_ISREG(mode) else _KINDS.get(stat.S_IFMT(mode), "not a regular file")


def _inputs(inputs: Iterable) -> list[tuple[Path, Path]]:
    """``(as given, real path)`` of every input that is a path (other objects, e.g. loaded traces, have none)."""
    return [(Path(i), _real(i)) for i in inputs if isinstance(i, str | os.PathLike)]


def _refuse_input(path: str | os.PathLike, real: Path, inputs: list[tuple[Path, Path]], option: str,
                  folder: bool = False) -> None:
    """OutputError if ``real`` (the real path of ``path``) is an input, one of its sidecars, inside an input
    folder, or (``folder``) a folder holding an input."""
    for given, src in inputs:
        if not (src.exists() or src.is_symlink()):
            continue
        hit = real == src or _same(real, src) or (src.is_dir() and _within(real, src))
        hit = hit or any(real == src.with_name(src.name + s) or _same(real, src.with_name(src.name + s))
                         for s in _SIDECARS)
        if folder and _within(src, real):
            hit = True
        if hit:
            raise OutputError(f"{path}: {option} must not be the input report {given} or in it (spectrace never "
                              "writes to its input)", "OUTPUT_IS_INPUT")


def _refuse_fenced(path: str | os.PathLike, real: Path, fences: Iterable[Path], option: str) -> None:
    for f in fences:
        f = _real(f)
        if _within(real, f):
            raise OutputError(f"{path}: {option} must not be inside spectrace's cache {f} (it is deleted when the "
                              "cache is rebuilt): choose a place outside it", "OUTPUT_IN_CACHE")


def _named(path: str | os.PathLike, option: str) -> None:
    """OutputError for a target that names nothing: empty, or only spaces (it would be the current folder)."""
    if not os.fsdecode(path).strip():
        raise OutputError(f"{option} {os.fsdecode(path)!r} names no file: give a path", "BAD_OUTPUT")


def check_file(path: str | os.PathLike, *, option: str, inputs: Iterable = (), fences: Iterable[Path] = (),
               replace: bool = False, sqlite: bool = False, hint: str = "pass --force to replace it") -> Path:
    """The real path to write the output file ``path`` to (symbolic links resolved), after the checks of this
    module; :class:`OutputError` otherwise. ``inputs``: files and folders never written, by any name;
    ``fences``: folders nothing is written into; ``replace``: an existing regular file may be replaced (else it
    is refused, with ``hint``); ``sqlite``: the target's own ``-wal``/``-journal``/``-shm`` are checked too (a
    database written in place writes them)."""
    _named(path, option)
    real, ins = _real(path), _inputs(inputs)
    for p in [real, *([real.with_name(real.name + s) for s in _SIDECARS] if sqlite else [])]:
        _refuse_input(path, p, ins, option)
    _refuse_fenced(path, real, fences, option)
    kind = _kind(real)
    if kind is not None:
        raise OutputError(f"{path}: {option} is {kind}: spectrace writes only regular files (or new names), and "
                          "never replaces anything else", "NOT_A_FILE")
    if not replace and (real.exists() or Path(path).is_symlink()):
        raise OutputError(f"{path}: exists; {hint}", "EXISTS")
    return real


@contextlib.contextmanager
def new_file(path: str | os.PathLike, *, option: str, what: str = "the output", inputs: Iterable = (),
             fences: Iterable[Path] = (), replace: bool = False, hint: str = "pass --force to replace it",
             ) -> Iterator[Path]:
    """Write the output file ``path`` safely: yields a new empty temporary file beside its target (checked by
    :func:`check_file`) for the caller to fill; when the block ends without an error it is renamed into
    place (keeping the permissions of the file it replaces), else removed. Without ``replace``, a file
    that appears at the target meanwhile is not replaced either (an error)."""
    real = check_file(path, option=option, inputs=inputs, fences=fences, replace=replace, hint=hint)
    tmp = real.with_name(f".{real.name}.tmp-{uuid.uuid4().hex[:12]}")
    try:
        os.close(os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666))  # the umask applies, as for any file
    except OSError as e:
        raise _os_error(e, path, what) from None
    try:
        yield tmp
        check_file(path, option=option, inputs=inputs, fences=fences, replace=replace, hint=hint)  # still so
        _install(tmp, real, replace)
    except OSError as e:
        raise _os_error(e, path, what) from None
    finally:
        for f in (tmp, *(tmp.with_name(tmp.name + s) for s in _SIDECARS)):
            with contextlib.suppress(OSError):
                f.unlink()


def _install(tmp: Path, real: Path, replace: bool) -> None:
    """Put the complete file ``tmp`` at ``real``: a rename, or (not ``replace``) a link that fails if a file
    appeared there meanwhile."""
    if replace:
        with contextlib.suppress(OSError):
            shutil.copymode(real, tmp)
        os.replace(tmp, real)
        return
    try:
        os.link(tmp, real)
    except FileExistsError:
        raise OutputError(f"{real}: appeared while spectrace was writing it; not replaced", "EXISTS") from None
    except OSError as e:
        if e.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV, errno.EMLINK):
            raise
        if real.exists() or real.is_symlink():  # a file system without hard links: check, then rename
            raise OutputError(f"{real}: appeared while spectrace was writing it; not replaced", "EXISTS") from None
        os.rename(tmp, real)


def write_new(path: str | os.PathLike, data: bytes, **kw: Any) -> Path:
    """Write ``data`` to the output file ``path`` through :func:`new_file` (same keywords); its real path."""
    with new_file(path, **kw) as tmp:
        with open(tmp, "wb") as f:
            f.write(data)
    return _real(path)


# ---- folders of outputs -----------------------------------------------------------------------------------


def _owner() -> dict:
    return {"host": socket.gethostname(), "pid": os.getpid()}


def _alive(owner: dict) -> bool:
    if owner.get("host") != socket.gethostname():
        return True  # cannot tell: only its age makes it stale
    try:
        os.kill(int(owner.get("pid", 0)), 0)
    except ProcessLookupError:
        return False
    except (OSError, ValueError, OverflowError):
        pass
    return True


class NewFolder:
    """A folder of outputs (``spectrace report -o DIR``): built in a new folder beside ``target`` (``.DIR.tmp-*``,
    its files written by :meth:`write`), then put in the target's place whole when the ``with`` block ends
    without an error; removed otherwise, leaving the target as it was.

    The target may be a new name, an empty folder, or a folder spectrace made: ``marker`` in it lists the files
    written (or ``legacy(folder)`` says it is one of ours from before markers). Such a folder is replaced whole
    (renamed aside, the new one renamed in, the old one removed). Any other folder is refused unless ``force``;
    then the files of the same names are replaced one by one (a rename each), the folder's other files kept.
    ``inputs``/``fences``: as for :func:`check_file` (and no input may be inside the target).
    """

    def __init__(self, target: str | os.PathLike, *, option: str, marker: str, inputs: Iterable = (),
                 fences: Iterable[Path] = (), force: bool = False, legacy: Callable[[Path], bool] | None = None,
                 what: str = "the report"):
        self.target, self.option, self.marker, self.force = Path(target), option, marker, force
        self.target_text = os.fsdecode(target)  # as given ('' names nothing; Path('') would be '.')
        self.inputs, self.fences, self.legacy, self.what = list(inputs), list(fences), legacy, what
        self.real = _real(target)
        self.tmp: Path | None = None
        self.written: list[str] = []
        self._made: list[Path] = []

    # -- checks --

    def _listed(self, folder: Path) -> set[str] | None:
        """The names spectrace wrote into ``folder`` (its marker), or None when it is not ours."""
        try:
            files = json.loads((folder / self.marker).read_text(encoding="utf-8"))["files"]
            return {str(f) for f in files} | {self.marker}
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def state(self) -> str:
        """What the target is now: ``new``, ``empty``, ``ours`` (replaced whole) or ``foreign``."""
        if not (self.real.exists() or self.real.is_symlink()):
            return "new"
        if not self.real.is_dir():
            raise OutputError(f"{self.target}: {self.option} is {_kind(self.real) or 'a file'}, not a folder",
                              "BAD_OUTPUT")
        try:
            names = {p.name for p in self.real.iterdir()}
        except OSError as e:
            raise _os_error(e, self.target, self.what) from None
        if not names:
            return "empty"
        listed = self._listed(self.real)
        if listed is not None and names <= listed:
            return "ours"
        if listed is None and self.legacy is not None and self.legacy(self.real):
            return "ours"
        return "foreign"

    def check(self) -> Path:
        """The checks, before anything is written (also run again when the folder is put in place): the target's
        real path; :class:`OutputError` when it may not be written."""
        _named(self.target_text, self.option)
        ins = _inputs(self.inputs)
        _refuse_input(self.target, self.real, ins, self.option, folder=True)
        _refuse_fenced(self.target, self.real, self.fences, self.option)
        if self.state() == "foreign" and not self.force:
            raise OutputError(f"{self.target}: {self.option} is a folder spectrace did not make (it has files of its "
                              "own): pass --force to write into it (files of the same names are replaced, the "
                              "others kept), or choose a new folder", "FOREIGN_FOLDER")
        return self.real

    # -- building --

    def __enter__(self) -> NewFolder:
        self.check()
        parent = self.real.parent
        missing = [q for q in (parent, *parent.parents) if not q.exists()]
        try:
            for q in reversed(missing):
                q.mkdir()
                self._made.append(q)
            self._remove_stale()
            self.tmp = parent / f".{self.real.name}.tmp-{uuid.uuid4().hex[:12]}"
            self.tmp.mkdir()
            (self.tmp / ".owner").write_text(json.dumps(_owner()), encoding="utf-8")
        except OSError as e:
            self._discard()
            raise _os_error(e, self.target, self.what) from None
        except BaseException:
            self._discard()
            raise
        return self

    def write(self, name: str, data: bytes) -> Path:
        """Write the file ``name`` of the folder (a plain name, written once)."""
        if self.tmp is None or Path(name).name != name or name in (self.marker, ".owner") or name in self.written:
            raise ValueError(f"not a new file name of this folder: {name!r}")
        try:
            write_new(self.tmp / name, data, option=self.option, what=self.what)
        except OutputError as e:
            raise OutputError(str(e).replace(str(self.tmp), str(self.target)), e.code) from None
        self.written.append(name)
        return self.target / name

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
                 ) -> None:
        try:
            if kind is None:
                assert self.tmp is not None  # (made by __enter__)
                self._install(self.tmp)
        finally:
            self._discard(keep_made=kind is None)

    def _discard(self, keep_made: bool = False) -> None:
        if self.tmp is not None:
            _remove_tree(self.tmp)
        if not keep_made:
            for q in reversed(self._made):  # the parent folders made for it, if still empty
                with contextlib.suppress(OSError):
                    q.rmdir()

    def _install(self, tmp: Path) -> None:
        (tmp / ".owner").unlink()
        try:
            marker = json.dumps({"by": "spectrace", "files": sorted(self.written)}, indent=1) + "\n"
            (tmp / self.marker).write_bytes(marker.encode("utf-8"))
            self.check()
            state = self.state()
            if state in ("new", "empty"):
                try:
                    os.rename(tmp, self.real)  # replaces an empty folder; fails on anything else
                except OSError as e:
                    if e.errno in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR):
                        raise OutputError(f"{self.target}: appeared while spectrace was writing it; not replaced",
                                          "EXISTS") from None
                    raise
            elif state == "ours":
                self._swap(tmp)
            else:
                self._into(tmp)
        except OSError as e:
            raise _os_error(e, self.target, self.what) from None

    def _swap(self, tmp: Path) -> None:
        old = self.real.with_name(f".{self.real.name}.old-{uuid.uuid4().hex[:12]}")
        os.rename(self.real, old)
        try:
            os.rename(tmp, self.real)
        except BaseException:
            os.rename(old, self.real)
            raise
        _remove_tree(old)

    def _into(self, tmp: Path) -> None:
        """``--force`` onto a folder of someone else's: each file renamed into it (checked first, all of them)."""
        ins = _inputs(self.inputs)
        names = [*self.written, self.marker]
        for n in names:
            p = self.real / n
            _refuse_input(self.target / n, p, ins, self.option)
            if p.is_symlink() or _kind(p) is not None:
                raise OutputError(f"{self.target / n}: is {'a symbolic link' if p.is_symlink() else _kind(p)}; "
                                  "spectrace replaces only regular files", "NOT_A_FILE")
        listed = self._listed(self.real) or set()
        for n in names:
            if n == self.marker and listed:
                data = json.dumps({"by": "spectrace", "files": sorted((listed - {self.marker}) | set(self.written))},
                                  indent=1) + "\n"
                (tmp / n).write_bytes(data.encode("utf-8"))
            os.replace(tmp / n, self.real / n)

    def _remove_stale(self) -> None:
        """Build folders of this target (``.DIR.tmp-*``, ``.DIR.old-*``) that no live process owns."""
        found = [*self.real.parent.glob(f".{self.real.name}.tmp-*"), *self.real.parent.glob(f".{self.real.name}.old-*")]
        for d in found:
            try:
                if d.is_symlink() or not d.is_dir():
                    continue
                old = time.time() - d.stat().st_mtime > STALE_S
                if (d / ".owner").is_file():
                    if old or not _alive(json.loads((d / ".owner").read_text(encoding="utf-8"))):
                        _remove_tree(d)
                elif ".old-" in d.name and self._listed(d) is not None and old:
                    _remove_tree(d)
            except (OSError, ValueError, TypeError):
                continue


def _remove_tree(path: Path) -> None:
    """Remove a folder this process made, even if Ctrl-C is pressed again meanwhile."""
    while True:
        try:
            shutil.rmtree(path, ignore_errors=True)
            return
        except KeyboardInterrupt:
            continue


def table_files(path: Path) -> dict[str, Path]:
    """The table files of an nsys parquetdir/arrowdir export folder by table name (a file's stem; of two with one
    stem, the first by name): what the analysis reads (``analyze.read.exportdir``) and ``spectrace scrub`` copies."""
    out: dict[str, Path] = {}
    for f in sorted(path.iterdir()):
        if f.suffix in TABLE_SUFFIXES and f.is_file():
            out.setdefault(f.stem, f)
    return out
