"""Bad input, faults and a hostile user: one line on stderr and exit 2 (130 on Ctrl-C), never a
traceback, never a write to the input, nothing left behind, and correct numbers whenever there is an answer.

The first tests are the original ones (the shared probe capture). :data:`CASES` is the case list: each row is
a recipe (it prepares the inputs from a bundled capture, ``tests/data/h200_tp1``, and returns the command
line) and what must come of it: the exit status, the one error line (or a warning), the numbers (those of
the clean capture, or of an equivalent input built another way), the input bytes unchanged, no temporary
file or folder left, and a later clean run giving the clean numbers. Most rows run ``spectrace`` in this
process (fast); those that need a process of their own (signals, another user, ``/dev/full``) spawn one.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import io
import json
import os
import re
import shutil
import signal
import sqlite3
import stat
import subprocess
import sys
import tempfile
import threading
import time
import zlib
from collections.abc import Callable
from pathlib import Path

import pytest

from analyze import cli
from analyze.model import InputError
from analyze.read.store import copy_build, install, layout, location
from analyze.read.store.fingerprint import fingerprint
from nvtx_hooks.capture import samples
from tests.helpers import killed_writer
from tests.helpers.paths import EXTERNAL, PROBE, need
from tests.helpers.synth import Synth


def run_cli(*args):
    """``spectrace ARGS`` in this process (as the case rows run it): its exit status, standard output and error.
    An exception that escaped would fail the test here, as its traceback on stderr would in a process of its own."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = cli.main([str(a) for a in args])
    return rc, out.getvalue(), err.getvalue()


def assert_clean_error(args, needle):
    rc, out, err = run_cli("analyze", *args)
    assert rc == 2, (rc, out, err)
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("spectrace: error:"), err
    assert needle in lines[0]


def digest(p):
    return hashlib.sha256(p.read_bytes()).hexdigest()


def test_missing_file(tmp_path):
    assert_clean_error([tmp_path / "nope.sqlite"], "no such file")


def test_not_sqlite(tmp_path):
    f = tmp_path / "x.nsys-rep"
    f.write_bytes(b"\x00NSYS" * 100)
    assert_clean_error([f], "nsys export --type sqlite")


@pytest.mark.parametrize("tool", ["xz", "gzip"])
def test_compressed_export_says_how_to_decompress(tmp_path, tool):
    """The bundled captures are .sqlite.xz: passing one as it is names the tool that decompresses it."""
    import gzip
    import lzma

    f = tmp_path / f"run.sqlite.{'xz' if tool == 'xz' else 'gz'}"
    f.write_bytes((lzma if tool == "xz" else gzip).compress(b"SQLite format 3\x00" + b"\x00" * 4000))
    assert_clean_error([f], f"it is {tool}-compressed: decompress it first ({tool} -dk")


def test_sqlite_but_not_nsys(tmp_path):
    f = tmp_path / "other.sqlite"
    con = sqlite3.connect(f)
    con.execute("CREATE TABLE t (a)")
    con.commit()
    con.close()
    before = digest(f)
    assert_clean_error([f], "not an nsys export")
    assert digest(f) == before


def test_truncated(tmp_path):
    f = tmp_path / "cut.sqlite"
    data = need(PROBE).read_bytes()
    f.write_bytes(data[: len(data) // 2])
    assert_clean_error([f], "truncated")


def test_corrupt(tmp_path):
    f = tmp_path / "bad.sqlite"
    shutil.copy(need(PROBE), f)
    with f.open("r+b") as fh:  # keep the header, smash pages after it
        fh.seek(4096)
        fh.write(b"\xff" * 200_000)
    assert_clean_error([f], "corrupt")


def test_no_nvtx():
    assert_clean_error([need(EXTERNAL / "nsys-ai" / "mock.sqlite")], "no NVTX ranges")


def test_no_cuda():
    assert_clean_error([need(EXTERNAL / "nsys-versions" / "c2024.sqlite")], "no CUDA trace")


def test_unknown_future_schema(tmp_path):
    s = Synth(tmp_path / "future.sqlite", schema="4.0.0")
    assert_clean_error([s.save()], "newer than spectrace knows")


def test_no_selected_ranges_names_candidates():
    assert_clean_error([need(PROBE), "--ranges", "^nothing$"], "eagle3.")


def test_bad_regex():
    assert_clean_error([need(PROBE), "--ranges", "("], "bad regex")


def test_db_must_not_be_the_input(tmp_path):
    f = tmp_path / "p.sqlite"
    shutil.copy(need(PROBE), f)
    before = digest(f)
    assert_clean_error([f, "--db", f], "must not be the input")
    assert digest(f) == before


@pytest.mark.parametrize("fmt", ["table", "json", "csv"])
def test_input_never_written(tmp_path, fmt):
    f = tmp_path / "p.sqlite"
    shutil.copy(need(PROBE), f)
    f.chmod(0o444)
    before, mtime = digest(f), f.stat().st_mtime_ns
    rc, out, err = run_cli("analyze", f, "--format", fmt)
    assert rc == 0, err
    assert digest(f) == before and f.stat().st_mtime_ns == mtime
    assert not list(tmp_path.glob("p.sqlite-*"))  # no journal or WAL beside it


# ---- the case list -------------------------------------------------------------------------------------

NODE = "tp1_node"  # the bundled capture most rows start from (65 EAGLE cycles, 6,927 kernels, one rank)
KERNEL, NVTX, RUNTIME = "CUPTI_ACTIVITY_KIND_KERNEL", "NVTX_EVENTS", "CUPTI_ACTIVITY_KIND_RUNTIME"
NUMBERS = ("ranks", "phases", "phases_all_ranks", "ranges", "ranges_all_ranks", "seams", "seams_all_ranks")
NOBODY = 65534
ODD = os.fsdecode(b"we ird?#%\xff.sqlite")  # URI characters, a space, a byte that is not UTF-8


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> Callable[[str], Path]:
    """The decompressed bundled captures (read-only copies, never an input themselves)."""
    d = tmp_path_factory.mktemp("pristine")
    return lambda name=NODE: samples.path(name, d)


@dataclasses.dataclass
class Env:
    """One case's world: the input folder, HOME, XDG cache, TMPDIR and working directory, all fresh."""

    root: Path
    inp: Path
    tmp: Path
    home: Path
    pristine: Callable[[str], Path]
    mp: pytest.MonkeyPatch
    env: dict[str, str] = dataclasses.field(default_factory=dict)
    cleanup: list[Callable[[], None]] = dataclasses.field(default_factory=list)
    writer: subprocess.Popen | None = None

    def setenv(self, name: str, value: str) -> None:
        """For this process and the case's own processes."""
        self.env[name] = value
        self.mp.setenv(name, value)

    def copy(self, name: str = NODE, as_: str | None = None) -> Path:
        dst = self.inp / (as_ or f"{name}.sqlite")
        shutil.copy(self.pristine(name), dst)
        return dst

    def other(self, name: str = "x") -> Path:
        """A folder for equivalent inputs and outputs, outside the input folder."""
        d = self.root / "other" / name
        d.mkdir(parents=True, exist_ok=True)
        return d


@pytest.fixture
def env(monkeypatch, pristine):
    # Under /tmp with open permissions: some rows run as another user (nobody).
    root = Path(tempfile.mkdtemp(prefix="spectrace-faults-", dir="/tmp"))
    root.chmod(0o755)
    e = Env(root, root / "in", root / "tmp", root / "home", pristine, monkeypatch)
    for d in (e.inp, e.tmp, e.home, root / "cwd", root / "xdg"):
        d.mkdir()
        d.chmod(0o777)
    e.env = {"HOME": str(e.home), "XDG_CACHE_HOME": str(root / "xdg"), "TMPDIR": str(e.tmp)}
    for k, v in e.env.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("SPECTRACE_CACHE_DIR", raising=False)
    monkeypatch.setattr(tempfile, "tempdir", str(e.tmp))
    monkeypatch.chdir(root / "cwd")
    yield e
    for f in e.cleanup:
        f()
    for d in root.rglob("*"):  # read-only folders made by a recipe
        if d.is_dir() and not d.is_symlink():
            d.chmod(0o755)
    shutil.rmtree(root, ignore_errors=True)


def sql(path: Path, *statements: str) -> Path:
    """Edit a copy (never an input under test: recipes edit before the run)."""
    con = sqlite3.connect(path)
    for s in statements:
        con.execute(s)
    con.commit()
    con.close()
    return path


def run_here(argv: list[str], capsys) -> tuple[int, str, str]:
    capsys.readouterr()
    rc = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


def run_proc(argv: list[str], e: Env, user: int | None = None, **kw) -> tuple[int, str, str]:
    cmd = [sys.executable, "-m", "analyze.cli", *map(str, argv)]
    if user is not None and os.geteuid() == 0:  # root passes every permission check: run as ``user``
        cmd = [shutil.which("setpriv") or pytest.skip("no setpriv"), f"--reuid={user}", f"--regid={user}",
               "--clear-groups", *cmd]
    env = {**os.environ, **e.env, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    env.pop("SPECTRACE_CACHE_DIR", None)
    env.update(kw.pop("env", {}))
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=e.root / "cwd", timeout=120, **kw)
    return p.returncode, p.stdout, p.stderr


def numbers(out: str) -> dict:
    d = json.loads(out)
    return {k: d[k] for k in NUMBERS} | {"coverage": d["coverage"]["per_rank"]}


def numbers_of(path: Path) -> dict:
    """The numbers of an input analysed in memory (the clean capture, or an equivalent input built another way)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = cli.main(["analyze", str(path), "--format", "json", "--no-store", "--no-cache", "-q"])
    assert rc == 0, err.getvalue()
    return numbers(out.getvalue())


@pytest.fixture(scope="module")
def clean(pristine) -> dict:
    return numbers_of(pristine(NODE))


def snapshot(root: Path) -> dict[str, tuple]:
    """Every file under ``root`` (spectrace's own marked caches aside): bytes, size, mtime, type."""
    out = {}
    caches = [d for d in root.rglob("*") if layout.is_cache(d)]
    for f in sorted(root.rglob("*")):
        if any(c == f or c in f.parents for c in caches):
            continue
        s = f.lstat()
        out[str(f.relative_to(root))] = (_sha256(f) if f.is_file() else None, s.st_size, s.st_mtime_ns,
                                         stat.S_IFMT(s.st_mode))
    return out


def _sha256(f: Path) -> str:
    try:
        return hashlib.sha256(f.read_bytes()).hexdigest()
    except PermissionError:  # made unreadable by a recipe (the tests run as a user without privileges)
        return "unreadable"


def leftovers(e: Env) -> list[str]:
    """Temporary files and folders that outlived the run: build folders anywhere, anything in TMPDIR."""
    found = [str(p) for p in e.root.rglob("*") if ".tmp-" in p.name or ".old-" in p.name]
    return found + [str(p) for p in e.tmp.iterdir()]


@dataclasses.dataclass
class Case:
    """A recipe and what must come of it.

    ``make(env) -> argv``; ``rc``: exit status; ``says``: in the one error line (rc 2) or in stderr (rc 0,
    e.g. a warning code); ``expect``: ``"clean"`` (the clean capture's numbers) or ``make_equivalent(env) ->
    path`` (an input that must give the same numbers); ``check(env)``: more assertions; ``later``: what a
    later run of the same command gives (``"clean"`` or an equivalent input), after ``fix(env)`` (what the
    error line told the user to do); ``keeps``: new names the run may leave in the input folder (its cache);
    ``proc``: run in a process of its own (``argv, env -> (rc, stdout, stderr)``).
    """

    name: str
    make: Callable[[Env], list]
    rc: int = 2
    says: str = ""
    expect: str | Callable[[Env], Path] | None = None
    check: Callable[[Env], None] | None = None
    later: str | Callable[[Env], Path] | None = None
    fix: Callable[[Env], None] | None = None
    keeps: tuple[str, ...] = ()
    proc: Callable | None = None


def cached(e: Env, *opts: str) -> Path:
    """A copy with its cache built (``--cache``)."""
    p = e.copy()
    assert cli.main(["analyze", str(p), "--cache", "-q", "--format", "json", *opts]) == 0
    return p


def cache_of(p: Path) -> Path:
    return p.with_name(p.name + location.SUFFIX)


def one_ops_file(p: Path) -> Path:
    return sorted((cache_of(p) / "ops").rglob("*.parquet"))[0]


# -- recipes: live and WAL SQLite --


def wal_pair(e: Env, base: Path) -> None:
    """Turn ``base`` into a WAL-mode file whose ``-wal`` holds a committed delete of every third kernel."""
    sql(base, "PRAGMA journal_mode=WAL")  # the header now says WAL; no -wal left after close
    killed_writer.wal_frames(base, e.other("wal"), f"DELETE FROM {KERNEL} WHERE rowid % 3 = 0")  # writer open


def third_deleted(e: Env) -> Path:
    return sql(shutil.copy(e.pristine(NODE), e.other("eq") / "eq.sqlite"), f"DELETE FROM {KERNEL} WHERE rowid % 3 = 0")


def make_wal(e: Env, *opts) -> list:
    p = e.copy()
    wal_pair(e, p)
    return ["analyze", p, "--format", "json", *opts]


def make_wal_after_cache(e: Env) -> list:
    p = e.copy()
    sql(p, "PRAGMA journal_mode=WAL")
    assert cli.main(["analyze", str(p), "--cache", "-q", "--format", "json"]) == 0  # cached: all kernels
    killed_writer.wal_frames(p, e.other("wal"), f"DELETE FROM {KERNEL} WHERE rowid % 3 = 0")
    return ["analyze", p, "--format", "json", "--cache"]


def make_hot_journal(e: Env) -> list:
    """What a writer killed mid-transaction leaves: pages already spilled into the file and a hot journal."""
    p = shutil.copy(e.pristine(NODE), e.inp / f"{NODE}.sqlite")
    # a cache of 5 pages: changed pages spill into the file before the commit
    killed_writer.hot_journal(p, e.other("w"), f"DELETE FROM {KERNEL} WHERE rowid % 2 = 0", cache_size=5)
    assert p.read_bytes() != e.pristine(NODE).read_bytes()  # half-written: reading it would be wrong
    return ["analyze", p, "--format", "json"]


def fix_hot_journal(e: Env) -> None:
    """What the error line says to do: open it once with sqlite3 (which rolls the journal back)."""
    p = e.inp / f"{NODE}.sqlite"
    con = sqlite3.connect(p)
    con.execute("SELECT COUNT(*) FROM sqlite_master").fetchall()
    con.close()
    assert not p.with_name(p.name + "-journal").exists()


def hold(e: Env, path: Path, script: str) -> None:
    """A writer in another process, running ``script`` on ``path`` until the case ends."""
    code = f"import sqlite3, sys, time\ncon = sqlite3.connect({str(path)!r}, isolation_level=None)\n{script}\n" \
           "print('ready', flush=True)\ntime.sleep(120)\n"
    w = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    e.cleanup.append(lambda: (w.kill(), w.wait()))
    assert w.stdout.readline().strip() == "ready"
    e.writer = w


def make_live_writer(e: Env) -> list:
    p = e.copy()
    hold(e, p, "con.execute('PRAGMA journal_mode=MEMORY')\ncon.execute('BEGIN IMMEDIATE')\n"
               f"con.execute('DELETE FROM {KERNEL} WHERE rowid % 2 = 0')")
    return ["analyze", p, "--format", "json"]


def make_live_wal(e: Env) -> list:
    p = e.copy()
    hold(e, p, "con.execute('PRAGMA journal_mode=WAL')\ncon.execute('PRAGMA wal_autocheckpoint=0')\n"
               f"con.execute('DELETE FROM {KERNEL} WHERE rowid % 2 = 0')")
    return ["analyze", p, "--format", "json"]


def stop_writer(e: Env) -> None:
    """The writer ends (killed: the uncommitted change is lost; a WAL's committed one stays in the -wal)."""
    e.writer.kill()
    e.writer.wait()


# -- recipes: the cache --


def make_cache_fault(fault: Callable[[Path], None], *opts: str) -> Callable[[Env], list]:
    def make(e: Env) -> list:
        p = cached(e, *opts)
        fault(p)
        return ["analyze", p, "--format", "json", "--cache", *opts]
    return make


def drop_pid_from_meta(p: Path) -> None:
    m = cache_of(p) / "meta.json"
    meta = json.loads(m.read_text())
    meta["ops_rows"] = {}
    m.write_text(json.dumps(meta))


def truncate(f: Path) -> None:
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def make_user_folder(e: Env) -> list:
    p = e.copy()
    d = cache_of(p)
    d.mkdir()
    (d / "notes.txt").write_text("my notes, not a cache\n")
    (d / "meta.json").write_text('{"mine": true}\n')
    return ["analyze", p, "--cache", "--format", "json"]


def make_user_file(e: Env) -> list:
    p = e.copy()
    cache_of(p).write_text("a file of mine\n")
    return ["analyze", p, "--cache", "--format", "json"]


def make_stale_build(e: Env) -> list:
    """A build folder left by a process that died (its pid is gone) and an old, empty one."""
    p = e.copy()
    dead = subprocess.Popen(["true"])
    dead.wait()
    d = p.parent / f".{p.name}{location.SUFFIX}.tmp-deadbeef"
    (d / "ops" / "1").mkdir(parents=True)
    (d / "ops" / "1" / "00000-00000.parquet").write_bytes(b"PAR1" * 1000)
    (d / layout.MARKER).write_text(json.dumps({"host": os.uname().nodename, "pid": dead.pid}))
    return ["analyze", p, "--cache", "--format", "json"]


# -- recipes: the cache knows what it caches --

LONG = "x" * 239 + ".sqlite"  # a name of 246 characters: "<name>.spectrace" would not fit in a file name


def smash_early(p: Path) -> None:
    """Overwrite bytes near the start of the largest ops file of ``p``'s cache (data pages, far from the last
    64 KiB every open checks): the cache verifies when opened and fails when its rows are read (rebuilt)."""
    f = max((cache_of(p) / "ops").rglob("*.parquet"), key=lambda q: q.stat().st_size)
    data = bytearray(f.read_bytes())
    assert len(data) > layout.TAIL + 1400
    data[1000:1400] = b"\xa5" * 400
    f.write_bytes(bytes(data))


def make_cached_from_its_folder(other: str | None, damage: bool = True) -> Callable[[Env], list]:
    """A cache built from the report's own folder (a relative path), then a run from another folder through a
    relative path (``../in/...``); there, a file of the same name holds ``other`` (another capture; None:
    nothing)."""
    def make(e: Env) -> list:
        p = e.copy()
        e.mp.chdir(e.inp)
        assert cli.main(["analyze", p.name, "--cache", "-q", "--format", "json"]) == 0
        e.mp.chdir(e.root / "cwd")
        if other is not None:
            shutil.copy(e.pristine(other), e.root / "cwd" / p.name)
        if damage:
            smash_early(p)
        return ["analyze", os.path.relpath(p), "--format", "json", "--cache"]
    return make


def make_manifest_beside(e: Env) -> list:
    shutil.copy(samples.data_dir(NODE) / f"{NODE}.manifest.json", e.inp)
    return make_cached_from_its_folder(None, damage=False)(e)


def json_of(argv: list) -> str:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        assert cli.main([str(a) for a in argv]) == 0, err.getvalue()
    return out.getvalue()


def check_same_json_as_without_cache(e: Env) -> None:
    """The same bytes from the cache as from the export itself: the report path as given, its manifest found."""
    rel = os.path.relpath(e.inp / f"{NODE}.sqlite")
    cached_json = json_of(["analyze", rel, "--format", "json", "--cache", "-q"])
    assert json.loads(cached_json)["tokens"]["steps"] == 3  # the manifest's speculative settings were read
    assert cached_json == json_of(["analyze", rel, "--format", "json", "--no-cache", "--no-store", "-q"])


def longer_kernels(e: Env, name: str) -> Path:
    """Another capture of the same size: the pristine one with a third of its kernels 5 us longer."""
    q = sql(shutil.copy(e.pristine(NODE), e.other("eq") / name), f'UPDATE {KERNEL} SET "end" = "end" + 5000 '
                                                                  "WHERE rowid % 3 = 0")
    assert q.stat().st_size == e.pristine(NODE).stat().st_size
    return q


def make_replaced_same_size_and_mtime(how: str) -> Callable[[Env], list]:
    """The cached report replaced by another capture of the same size, its mtime set back: ``copy`` (in place,
    the same inode) or ``rename`` (a new inode)."""
    def make(e: Env) -> list:
        p = cached(e)
        was = p.stat()
        new = longer_kernels(e, "new.sqlite")
        if how == "copy":
            shutil.copyfile(new, p)
        else:
            os.utime(new, ns=(was.st_atime_ns, was.st_mtime_ns))
            os.replace(new, p)
        os.utime(p, ns=(was.st_atime_ns, was.st_mtime_ns))
        s = p.stat()
        assert (s.st_size, s.st_mtime_ns) == (was.st_size, was.st_mtime_ns)
        return ["analyze", p, "--format", "json", "--cache"]
    return make


def proc_two_builders(argv, e: Env):
    """Two analyses at once (threads A and B) on a cache that fails when its rows are read, both rebuilding it, in
    the order that broke before: B builds while A installs its cache; A reads its cache just as B installs (or
    finds) one; A's reads end before B goes on. Returns A's JSON, or the first error line."""
    from analyze import api
    from analyze.compute import pipeline
    from analyze.output import data

    p = Path(argv[1])
    smash_early(p)
    ev = {k: threading.Event() for k in ("b_building", "a_installed", "b_moved", "a_done")}
    calls = {"A": 0, "B": 0}
    build, run, remove = install.build, pipeline._run, install.remove_tree

    def who() -> str:
        return threading.current_thread().name

    def ordered_build(*a, **k):
        if who() == "B":
            ev["b_building"].set()
            ev["a_installed"].wait(60)
        elif who() == "A":
            ev["b_building"].wait(60)
        return build(*a, **k)

    def ordered_run(*a, **k):
        me = who()
        calls[me] = calls.get(me, 0) + 1
        if calls[me] == 2 and me == "A":  # A reads the cache it built...
            ev["a_installed"].set()
            ev["b_moved"].wait(60)  # ...once B installs its own (or finds A's)
            try:
                return run(*a, **k)
            finally:
                ev["a_done"].set()
        if calls[me] == 2 and me == "B":
            ev["b_moved"].set()
        return run(*a, **k)

    def ordered_remove(path):
        if who() == "B" and not ev["b_moved"].is_set():
            ev["b_moved"].set()
            ev["a_done"].wait(60)
        return remove(path)

    e.mp.setattr(install, "build", ordered_build)
    e.mp.setattr(pipeline, "_run", ordered_run)
    e.mp.setattr(install, "remove_tree", ordered_remove)
    results: dict[str, object] = {}

    def one() -> None:
        try:
            results[who()] = data.to_json(api.analyze(str(p), cache=True))
        except InputError as err:
            results[who()] = err

    threads = [threading.Thread(target=one, name=n) for n in ("B", "A")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    e.mp.undo()
    errors = [r for r in results.values() if isinstance(r, InputError)]
    if errors:
        return 2, "", f"spectrace: error: {errors[0]}\n"
    assert set(results) == {"A", "B"} and results["A"] == results["B"]
    assert layout.problem(cache_of(p), fingerprint(p)) is None  # the cache left is good
    return 0, results["A"], ""


def make_read_only_stale_cache(e: Env) -> list:
    """A cache of the user running spectrace (nobody), made read-only (``chmod -R a-w``), then stale."""
    p = e.copy()
    rc, out, err = run_proc(["analyze", p, "--cache", "-q", "--format", "json"], e, user=NOBODY)
    assert rc == 0 and layout.is_cache(cache_of(p)), err
    for d in [cache_of(p), *cache_of(p).rglob("*")]:
        d.chmod(0o555 if d.is_dir() else 0o444)
    os.utime(p)  # a new mtime: the cache is stale
    return ["analyze", p, "--format", "json", "--cache"]


def make_stale_cache_of_another_user(e: Env) -> list:
    """A stale cache that root built, in a folder anyone may write: nobody can neither remove nor use it."""
    if os.geteuid() != 0:
        pytest.skip("needs root (a cache of another user)")
    p = cached(e)
    os.utime(p)
    return ["analyze", p, "--format", "json", "--cache"]


def make_cache_dir_in_the_parquetdir(e: Env) -> list:
    from bench.export_dir import write_export_dir

    d = write_export_dir(e.pristine(NODE), e.inp / "n_pqtdir", "parquet")
    e.setenv("SPECTRACE_CACHE_DIR", str(d / "cache"))
    return ["analyze", d, "--cache", "--format", "json"]


def check_parquetdir_unchanged(e: Env) -> None:
    d = e.inp / "n_pqtdir"
    assert all(f.is_file() and f.suffix == ".parquet" for f in d.iterdir()), sorted(os.listdir(d))


def make_empty_home(e: Env) -> list:
    p = e.copy()
    e.inp.chmod(0o555)  # the report folder is read-only: the cache would go to the user's cache folder
    e.setenv("XDG_CACHE_HOME", "")
    e.setenv("HOME", "")
    return ["analyze", p, "--cache", "--format", "json"]


def not_utf8_dir(e: Env) -> Path:
    return Path(os.fsdecode(os.fsencode(str(e.root)) + b"/cache\xff"))


def check_nothing_in_the_not_utf8_dir(e: Env) -> None:
    assert not os.path.lexists(not_utf8_dir(e))


def make_cache_dir_not_utf8(e: Env) -> list:
    e.setenv("SPECTRACE_CACHE_DIR", str(not_utf8_dir(e)))
    return ["analyze", e.copy(), "--cache", "--format", "json"]


def proc_file_size_limit_64k(argv, e: Env):
    """Under a file-size limit (``ulimit -f``): a write past 64 KiB fails with EFBIG (Python ignores SIGXFSZ)."""
    import resource

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (65536, 65536))

    return run_proc(argv, e, preexec_fn=limit)


def make_disk_full(e: Env) -> list:
    """A disk that fills up as the GPU operations are written (what polars raises then), a partial file left."""
    import polars as pl

    write = pl.DataFrame.write_parquet

    def full(self, file, *a, **k):
        if "/ops/" in str(file):
            Path(file).write_bytes(b"PAR1" + b"\0" * 100)
            raise pl.exceptions.ComputeError("parquet: File out of specification: underlying IO error: No space "
                                             "left on device (os error 28)")
        return write(self, file, *a, **k)

    e.mp.setattr(pl.DataFrame, "write_parquet", full)
    return ["analyze", e.copy(), "--cache", "--format", "json"]


def check_long_name_cache(e: Env) -> None:
    caches = list((e.root / "xdg" / "spectrace").glob(f"*{location.SUFFIX}"))
    assert len(caches) == 1 and layout.is_cache(caches[0]) and len(os.fsencode(caches[0].name)) <= 255 - 18


# -- recipes: strings, rows, regexes, files --


def make_nonutf8(string_id: int, *opts: str) -> Callable[[Env], list]:
    def make(e: Env) -> list:
        p = e.copy()
        sql(p, f"UPDATE StringIds SET value = CAST(X'{bad_bytes(e, string_id).hex()}' AS TEXT) WHERE id = {string_id}")
        return ["analyze", p, "--format", "json", *opts]
    return make


def bad_bytes(e: Env, string_id: int) -> bytes:
    con = sqlite3.connect(e.pristine(NODE))
    value = con.execute("SELECT value FROM StringIds WHERE id = ?", (string_id,)).fetchone()[0]
    con.close()
    return value[:5].encode() + b"\xff\xfe" + value[5:].encode()


def lossy_equivalent(string_id: int) -> Callable[[Env], Path]:
    def make(e: Env) -> Path:
        q = shutil.copy(e.pristine(NODE), e.other("eq") / "eq.sqlite")
        con = sqlite3.connect(q)
        con.execute("UPDATE StringIds SET value = ? WHERE id = ?",
                    (bad_bytes(e, string_id).decode(errors="replace"), string_id))
        con.commit()
        con.close()
        return q
    return make


def make_two_reports(e: Env, *opts: str) -> list:
    a = e.copy(NODE, "a.sqlite")
    b = e.copy(NODE, "b.sqlite")
    sql(a, f"UPDATE StringIds SET value = CAST(X'{bad_bytes(e, 37).hex()}' AS TEXT) WHERE id = 37")
    return ["analyze", a, b, "--format", "json", *opts]


def edited(*statements: str) -> Callable[[Env], Path]:
    """An equivalent input: the pristine capture with ``statements`` applied."""
    return lambda e: sql(shutil.copy(e.pristine(NODE), e.other("eq") / "eq.sqlite"), *statements)


def make_edit(*statements: str, opts: tuple = ()) -> Callable[[Env], list]:
    def make(e: Env) -> list:
        return ["analyze", sql(e.copy(), *statements), "--format", "json", *opts]
    return make


def make_no_stringids(e: Env) -> list:
    from bench.export_dir import write_export_dir

    d = write_export_dir(e.pristine(NODE), e.inp / "n_pqtdir", "parquet")
    (d / "StringIds.parquet").unlink()
    return ["analyze", d]


def make_corrupt_table(*opts: str) -> Callable[[Env], list]:
    """The kernel table's root page smashed: the file opens, reading the table fails (during the store build)."""
    def make(e: Env) -> list:
        p = e.copy()
        con = sqlite3.connect(p)
        root = con.execute(f"SELECT rootpage FROM sqlite_master WHERE name = '{KERNEL}'").fetchone()[0]
        size = con.execute("PRAGMA page_size").fetchone()[0]
        con.close()
        with p.open("r+b") as f:
            f.seek((root - 1) * size)
            f.write(b"\xff" * 64)
        return ["analyze", p, *opts]
    return make


def make_corrupt_header(e: Env) -> list:
    p = e.copy()
    with p.open("r+b") as f:
        f.seek(16)
        f.write(b"\x12\x34")  # page size: not a power of two
    return ["analyze", p]


def make_mixed_versions(e: Env) -> list:
    a = e.copy(NODE, "a.sqlite")
    b = e.copy("tp1_steps2", "b.sqlite")
    sql(b, "UPDATE META_DATA_EXPORT SET value = '2024.6.1.90' WHERE name = 'EXPORT_PRODUCT_VERSION'")
    return ["analyze", a, b, "-j", "1", "--format", "json"]


def make_patterns(content: bytes | None) -> Callable[[Env], list]:
    def make(e: Env) -> list:
        f = e.other("pat") / "patterns.txt"
        if content is None:
            f.mkdir()
        else:
            f.write_bytes(content)
        return ["analyze", e.copy(), "--comm-patterns-file", f]
    return make


# -- recipes: outputs --


def make_db(where: Callable[[Env, Path], Path], fmt: str = "json") -> Callable[[Env], list]:
    def make(e: Env) -> list:
        p = e.copy()
        return ["analyze", p, "--format", fmt, "--db", where(e, p)]
    return make


def _rep_beside(p: Path) -> Path:
    """``NAME.nsys-rep`` beside ``NAME.sqlite`` (what spectrace then analyses)."""
    rep = p.with_suffix(".nsys-rep")
    rep.write_bytes(b"\x00NSYS")
    return rep


def hard_link(e: Env, p: Path) -> Path:
    q = e.other("links") / "results.db"
    os.link(p, q)
    return q


def symlink(e: Env, p: Path) -> Path:
    q = e.other("links") / "results.db"
    q.symlink_to(p)
    return q


def readonly_dir(e: Env, name: str) -> Path:
    d = e.other(name)
    d.chmod(0o555)
    return d


def make_report_o(where: Callable[[Env, Path], Path]) -> Callable[[Env], list]:
    def make(e: Env) -> list:
        p = e.copy()
        return ["report", p, "-o", where(e, p)]
    return make


# -- recipes: outputs written safely (a new file renamed into place, never over an input) --

FAKE_NSYS = Path(__file__).parent / "data" / "fake_nsys.py"
USERS_PAGE = "<html><body>my own page</body></html>\n"


def out_dir(e: Env) -> Path:
    """The report folder of these rows (outside the input folder; not made)."""
    return e.other("out") / "rep"


def make_report_into(prepare: Callable[[Env, Path, Path], None] | None, *opts: str) -> Callable[[Env], list]:
    """``report INPUT -o DIR`` after ``prepare(env, input, DIR)``; what DIR holds then is kept in ``env.kept``."""
    def make(e: Env) -> list:
        p, d = e.copy(), out_dir(e)
        if prepare is not None:
            prepare(e, p, d)
        e.kept = snapshot(d) if d.exists() else None
        return ["report", p, "-o", d, *opts]
    return make


def figure_hard_link(e: Env, p: Path, d: Path) -> None:
    d.mkdir()
    os.link(p, d / "per_cycle.png")


def figure_symlink(e: Env, p: Path, d: Path) -> None:
    d.mkdir()
    (d / "budget.png").symlink_to(p)


def users_folder(e: Env, p: Path, d: Path) -> None:
    d.mkdir()
    (d / "index.html").write_text(USERS_PAGE)
    (d / "notes.txt").write_text("my notes\n")


def own_report(e: Env, p: Path, d: Path) -> None:
    """An earlier report of ours, of another capture (its figures differ from this one's)."""
    b = shutil.copy(e.pristine("tp1_baseline"), e.other("b") / "b.sqlite")
    assert cli.main(["report", str(b), "-o", str(d)]) == 0


def own_report_with_a_linked_figure(e: Env, p: Path, d: Path) -> None:
    """As if an earlier report of ours (when figures were files beside the page) had a figure linked to the input."""
    own_report(e, p, d)
    os.link(p, d / "per_cycle.png")
    m = d / "SPECTRACE_REPORT"
    m.write_text(json.dumps({"by": "spectrace", "files": [*json.loads(m.read_text())["files"], "per_cycle.png"]}))


def own_report_with_a_figure_not_made_now(e: Env, p: Path, d: Path) -> None:
    """As if the earlier report had had a figure file (figures are inline now, so none is made)."""
    own_report(e, p, d)
    (d / "rank_phase.png").write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(100))
    m = d / "SPECTRACE_REPORT"
    m.write_text(json.dumps({"by": "spectrace", "files": [*json.loads(m.read_text())["files"], "rank_phase.png"]}))


def interrupted_figure(e: Env) -> None:
    """Ctrl-C while the report is written (its fifth figure)."""
    from analyze.output import plots

    def interrupt(res):
        raise KeyboardInterrupt
    e.mp.setattr(plots, "per_cycle", interrupt)


def make_interrupted_report(prepare) -> Callable[[Env], list]:
    def make(e: Env) -> list:
        argv = make_report_into(prepare)(e)
        interrupted_figure(e)
        return argv
    return make


def as_it_was(e: Env) -> None:
    """The report folder exactly as before the run (or still absent)."""
    d = out_dir(e)
    assert (snapshot(d) if d.exists() else None) == e.kept
    assert not list(d.parent.glob(".rep.*"))


def page_is_ours(e: Env) -> None:
    from analyze.output.targets import PAGE_START

    d = out_dir(e)
    assert (d / "index.html").read_bytes().startswith(PAGE_START)
    listed = json.loads((d / "SPECTRACE_REPORT").read_text())["files"]
    # beside the page: figures (PNG) of older reports, and the annotated timeline (trace-event JSON)
    assert "index.html" in listed and all((d / f).read_bytes()[:4] == b"\x89PNG" or (
        f == "timeline.trace.json" and (d / f).read_bytes().startswith(b'{"traceEvents":[')) for f in listed
        if f != "index.html")


def check_users_folder_kept_with_force(e: Env) -> None:
    page_is_ours(e)
    assert (out_dir(e) / "notes.txt").read_text() == "my notes\n"


def check_replaced_whole(e: Env) -> None:
    page_is_ours(e)
    assert not (out_dir(e) / "rank_phase.png").exists()


def check_linked_figure_replaced(e: Env) -> None:
    page_is_ours(e)
    assert not (out_dir(e) / "per_cycle.png").exists()  # replaced whole: the old figure file is gone


def check_link_kept(name: str) -> Callable[[Env], None]:
    def check(e: Env) -> None:
        as_it_was(e)
        assert os.path.samefile(out_dir(e) / name, e.inp / f"{NODE}.sqlite")
    return check


def check_link_kept_and_page_written(e: Env) -> None:
    page_is_ours(e)
    assert os.path.samefile(out_dir(e) / "per_cycle.png", e.inp / f"{NODE}.sqlite")


def check_utf8_page(e: Env) -> None:
    page = (out_dir(e) / "index.html").read_bytes().decode("utf-8")  # UTF-8, whatever the locale
    assert "<title>spectrace · " in page and "µs" in page


def check_odd_name_page(e: Env) -> None:
    page = (out_dir(e) / "index.html").read_bytes().decode("utf-8")
    assert "<title>spectrace · we ird?#%\ufffd.sqlite</title>" in page


def proc_ascii_locale(argv, e: Env):
    """An ASCII-only locale: no UTF-8 mode, no locale coercion, Latin-1 standard streams."""
    return run_proc(argv, e, env={"LC_ALL": "C", "LANG": "C", "PYTHONUTF8": "0", "PYTHONCOERCECLOCALE": "0",
                                  "PYTHONIOENCODING": "latin-1"})


def proc_file_size_limit(argv, e: Env):
    """Files may not grow past 20 kB (``ulimit -f``): writes fail with EFBIG, as on a full disk. (matplotlib's font
    list is built first, without the limit: it would otherwise fail to save it, with a warning of its own.)"""
    import resource

    mpl = {"MPLCONFIGDIR": str(e.other("mpl"))}
    subprocess.run([sys.executable, "-c", "import matplotlib.font_manager"], env={**os.environ, **mpl}, check=True)

    def limit():
        resource.setrlimit(resource.RLIMIT_FSIZE, (20_000, 20_000))
    return run_proc(argv, e, preexec_fn=limit, env=mpl)


DOLLAR_NAMES = (r"draft $\frac{x}{$", "host $5 and $6")


def make_dollar_names(e: Env) -> list:
    p = sql(e.copy(), f"UPDATE StringIds SET value = '{DOLLAR_NAMES[0]}' WHERE id = 34",
            f"UPDATE StringIds SET value = '{DOLLAR_NAMES[1]}' WHERE id = 37")
    return ["report", p, "-o", out_dir(e)]


def check_no_mathtext(e: Env) -> None:
    """Every text of every figure drawn literally: no mathtext, the names as they are."""
    from matplotlib.text import Text

    from analyze import api
    from analyze.output import plots

    assert (out_dir(e) / "index.html").is_file()
    res = api.analyze(e.inp / f"{NODE}.sqlite", store=False, cache=False)
    shown = set()
    for fig in (plots.phase_bars(res), plots.budget(res), plots.timeline(res), plots.distributions(res),
                plots.per_cycle(res)):
        fig.savefig(io.BytesIO(), format="png")  # drawn: tick labels made
        for t in fig.findobj(Text):
            text, math = t._preprocess_math(t.get_text())
            if "draft" in text or "host" in text:  # (log axes' tick labels are matplotlib's own mathtext)
                assert not math, t.get_text()
                shown.add(text)
    assert set(DOLLAR_NAMES) <= shown


def make_db_at(prepare: Callable[[Env, Path, Path], None], fmt: str = "json") -> Callable[[Env], list]:
    """``analyze INPUT --db DB`` after ``prepare(env, input, DB)``."""
    def make(e: Env) -> list:
        p, db = e.copy(), e.other("db") / "r.db"
        prepare(e, p, db)
        return ["analyze", p, "--format", fmt, "--db", db]
    return make


def db_wal_frames(e: Env, p: Path, db: Path) -> None:
    """A WAL-mode database whose user table exists only in committed frames of its ``-wal`` (a writer still
    has it open, or was killed)."""
    sql(db, "PRAGMA journal_mode=WAL", "CREATE TABLE first (x)")
    killed_writer.wal_frames(db, e.other("twin"), "CREATE TABLE mine (x)", "INSERT INTO mine VALUES (42)")


def db_hot_journal(e: Env, p: Path, db: Path) -> None:
    """A database a writer was killed in the middle of changing: pages spilled into it, and its hot journal."""
    sql(db, "CREATE TABLE mine (x)", "INSERT INTO mine VALUES (7)")
    killed_writer.hot_journal(db, e.other("twin"), "DELETE FROM mine", *killed_writer.SPILL)


def db_wal_linked_to_the_input(e: Env, p: Path, db: Path) -> None:
    sql(db, "PRAGMA journal_mode=WAL", "CREATE TABLE mine (x)")
    os.link(p, db.with_name("r.db-wal"))


def check_users_table(rows: list) -> Callable[[Env], None]:
    """The user's table as it was last committed, the database sound, and the results in it."""
    def check(e: Env) -> None:
        con = sqlite3.connect(e.other("db") / "r.db")
        assert con.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        assert con.execute("SELECT x FROM mine").fetchall() == rows
        assert con.execute("SELECT COUNT(*) FROM phases").fetchone()[0] > 0
        con.close()
    return check


def device(path: Path) -> Path:
    """A character device node like /dev/null (only root can make one)."""
    if os.geteuid() != 0:
        pytest.skip("making a device node needs root")
    os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, 3))
    return path


def check_still_a_device(path: Callable[[Env], Path]) -> Callable[[Env], None]:
    def check(e: Env) -> None:
        assert stat.S_ISCHR(path(e).stat().st_mode), f"{path(e)} was replaced"
    return check


def make_db_in_cache(e: Env) -> list:
    p = cached(e)
    return ["analyze", p, "--format", "json", "--db", cache_of(p) / "r.db"]


def make_db_in_cache_dir(e: Env) -> list:
    e.setenv("SPECTRACE_CACHE_DIR", str(e.other("cachedir")))
    p = cached(e)
    return ["analyze", p, "--format", "json", "--db", location.cache_dir_for(p) / "r.db"]


def make_report_in_cache(e: Env) -> list:
    p = cached(e)
    return ["report", p, "-o", cache_of(p) / "rep"]


def fake_nsys(e: Env, report: bool = True) -> Path:
    """An nsys for ``spectrace trace`` (tests/data/fake_nsys.py), or one whose profile makes no report."""
    exe = e.other("bin") / "nsys"
    if report:
        exe.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{FAKE_NSYS}" "$@"\n')
    else:
        exe.write_text('#!/bin/sh\nif [ "$1" = --version ]; then echo "NVIDIA Nsight Systems version 2025.3.1.90"; '
                       "exit 0; fi\necho 'nsys: cannot profile' >&2\nexit 1\n")
    exe.chmod(0o755)
    return exe


def manifest_of(e: Env) -> Path:
    return e.other("cap") / "run.manifest.json"


def make_trace(report: bool = True, prepare: Callable[[Path], None] | None = None, *opts: str) -> Callable[[Env], list]:
    def make(e: Env) -> list:
        exe = fake_nsys(e, report)
        if prepare is not None:
            prepare(manifest_of(e))
        return ["trace", "--nsys", exe, "-o", e.other("cap") / "run", *opts, "--", sys.executable, "-c", "pass"]
    return make


def check_users_manifest(e: Env) -> None:
    assert manifest_of(e).read_text() == '{"mine": true}\n'
    assert not (e.other("cap") / "run.nsys-rep").exists()


def make_cache_dir_under_file(e: Env) -> list:
    f = e.other("cfg") / "a_file"
    f.write_text("x")
    e.setenv("SPECTRACE_CACHE_DIR", str(f / "cache"))
    return ["analyze", e.copy(), "--cache", "--format", "json"]


def make_nowhere_to_cache(e: Env) -> list:
    p = e.copy()
    e.inp.chmod(0o555)
    e.home.chmod(0o555)
    e.setenv("XDG_CACHE_HOME", "")
    return ["analyze", p, "--cache", "--format", "json"]


def make_empty_xdg(e: Env) -> list:
    p = e.copy()
    e.inp.chmod(0o555)  # the report folder is read-only: the cache goes to the user's cache folder
    e.setenv("XDG_CACHE_HOME", "")
    return ["analyze", p, "--cache", "--format", "json"]


def make_unreadable(e: Env) -> list:
    p = e.copy()
    p.chmod(0)
    return ["analyze", p]


def check_empty_xdg(e: Env) -> None:
    assert not (e.root / "cwd" / "spectrace").exists()  # not ./spectrace: the empty variable is ignored
    caches = list((e.home / ".cache" / "spectrace").glob(f"*{location.SUFFIX}"))
    assert len(caches) == 1 and (caches[0] / layout.MARKER).is_file()


# -- recipes: processes of their own --


def proc_as_nobody(argv, e: Env):
    """As a user without privileges: nobody when the tests run as root, else the user running them."""
    return run_proc(argv, e, user=NOBODY)


def proc_stdin_file(argv, e: Env):
    with open(argv[1], "rb") as f:
        return run_proc([argv[0], "/dev/stdin", *argv[2:]], e, stdin=f)


def proc_stdin_pipe(argv, e: Env):
    p = subprocess.Popen(["cat", str(argv[1])], stdout=subprocess.PIPE)
    try:
        return run_proc([argv[0], "/dev/stdin", *argv[2:]], e, stdin=p.stdout)
    finally:
        p.stdout.close()
        p.wait()


def proc_full_disk(argv, e: Env):
    with open("/dev/full", "w") as full:
        env = {**os.environ, **e.env}
        p = subprocess.run([sys.executable, "-m", "analyze.cli", *map(str, argv)], stdout=full,
                           stderr=subprocess.PIPE, text=True, env=env, cwd=e.root / "cwd")
    return p.returncode, "", p.stderr


def proc_kill_worker(argv, e: Env):
    """Kill one of the worker processes (SIGKILL, as the OOM killer would) as soon as it exists."""
    env = {**os.environ, **e.env}
    p = subprocess.Popen([sys.executable, "-m", "analyze.cli", *map(str, argv)], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env=env, cwd=e.root / "cwd")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and p.poll() is None:
        kids = [c for c in _children(p.pid) if "spawn_main" in _cmdline(c)]
        if kids:
            os.kill(kids[0], signal.SIGKILL)
            break
        time.sleep(0.005)
    out, err = p.communicate(timeout=60)
    return p.returncode, out, err


def _children(pid: int) -> list[int]:
    try:
        return [int(c) for t in os.listdir(f"/proc/{pid}/task")
                for c in Path(f"/proc/{pid}/task/{t}/children").read_text().split()]
    except OSError:
        return []


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return ""


def make_plain(verb: str = "analyze", *opts: str) -> Callable[[Env], list]:
    return lambda e: [verb, e.copy(), *opts]


# -- recipes: inputs are data, bounded arguments --

SHIFT = 10**15  # ns (11.6 days): the capture's clock given another origin
TIME_COLS = ("start", "end", "timestamp", "startTime", "stopTime")
CYC_FIELD = "16777215 << 16"  # the payload's 24-bit cycle index (nvtx_hooks.phases)
CONTROLS = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")  # but tab and newline
ESCAPES = "\x1b]0;owned\x07\x1b[2J\x9b31m\u202e"  # retitle, clear the screen, 8-bit CSI, right-to-left override
TREE = Path(__file__).parent / "fake_sglang"


def shift_clock(p: Path, k: int = SHIFT) -> Path:
    """Every timestamp of the capture moved by ``k``: the same capture on a clock with another origin
    (``ANALYSIS_DETAILS.duration`` is a length: unchanged)."""
    con = sqlite3.connect(p)
    for (t,) in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall():
        cols = [r[1] for r in con.execute(f"PRAGMA table_info('{t}')")]
        sets = [f'"{c}" = "{c}" + {k}' for c in cols if c in TIME_COLS]
        if sets:
            con.execute(f"UPDATE {t} SET {', '.join(sets)}")
    con.commit()
    con.close()
    return p


UNCLOSE = f'UPDATE {NVTX} SET "end" = NULL WHERE rowid IN (SELECT rowid FROM {NVTX} WHERE eventType = 59 ' \
          "ORDER BY start DESC LIMIT 2)"  # the last two push/pop ranges: never popped


def make_shifted(name: str, *statements: str) -> Callable[[Env], list]:
    """``name`` edited by ``statements``, then shifted (:func:`shift_clock`); the same edit on the original clock
    is kept in ``other/origin`` (the equivalent)."""
    def make(e: Env) -> list:
        p = sql(e.copy(name), *statements) if statements else e.copy(name)
        shutil.copy(p, e.other("origin") / p.name)
        return ["analyze", shift_clock(p), "--format", "json"]
    return make


def unshifted(name: str) -> Callable[[Env], Path]:
    return lambda e: e.other("origin") / f"{name}.sqlite"


def doc_of(path: Path, *opts: str) -> dict:
    """The JSON document of an input analysed in this process."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = cli.main(["analyze", str(path), "--format", "json", "--no-store", "--no-cache", "-q", *opts])
    assert rc == 0, err.getvalue()
    return json.loads(out.getvalue())


def proc_clock_back(argv, e: Env):
    """In this process; the ranks' capture windows given back on the original clock (the one thing a clock's
    origin may change in the numbers)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = cli.main([str(a) for a in argv])
    d = json.loads(out.getvalue())
    for r in d["ranks"]:
        for c in ("window_start_ns", "window_end_ns", "ranges_start_ns", "ranges_end_ns"):
            r[c] = None if r[c] is None else r[c] - SHIFT
    return rc, json.dumps(d), err.getvalue()


def same_diagnostics(name: str) -> Callable[[Env], None]:
    """The shifted capture's diagnostics are the original clock's: no false UNCLOSED_RANGE, none lost."""
    def check(e: Env) -> None:
        def codes(p: Path) -> list:
            return sorted((d["code"], d["message"]) for d in doc_of(p)["diagnostics"] if d["code"] != "WINDOW_CUT"
                          and d["code"] != "UNPAIRED_INSTANCES")  # these two name times on the clock
        assert codes(e.inp / f"{name}.sqlite") == codes(unshifted(name)(e))
    return check


def same_cycle_index(name: str, ranks_offset: int | None = None) -> Callable[[Env], list]:
    """Every payload of ``name`` carrying cycle index 5; with ``ranks_offset``, the indices unchanged but those
    of the odd thread ids (one rank of two) moved by that much: ranks running together under disjoint indices."""
    def make(e: Env) -> list:
        p = e.copy(name)
        for col in ("int64Value", "uint64Value"):
            new = (f"{col} + ({ranks_offset} << 16)" if ranks_offset else f"({col} & ~({CYC_FIELD})) | (5 << 16)")
            where = f"({col} >> 60) = 1" + (" AND globalTid % 2 = 1" if ranks_offset else "")
            sql(p, f"UPDATE {NVTX} SET {col} = {new} WHERE {where}")
        return ["analyze", p, "--format", "json"]
    return make


def no_payload(name: str) -> Callable[[Env], Path]:
    """The equivalent: ``name`` without any range payload (marks keep theirs)."""
    return lambda e: sql(shutil.copy(e.pristine(name), e.other("eq") / "eq.sqlite"),
                         f"UPDATE {NVTX} SET int64Value = NULL, uint64Value = NULL WHERE eventType != 34")


def same_headline(name: str, tokens: bool = True) -> Callable[[Env], None]:
    """The steady cycles, their period and (``tokens``) tokens per cycle are the pristine capture's; without
    ``tokens``, tokens per cycle are unknown (an accept length is never joined on a meaningless index)."""
    def check(e: Env) -> None:
        got, want = (doc_of(p)["tokens"] for p in (e.inp / f"{name}.sqlite", e.pristine(name)))
        assert (got["steady_cycles"], got["period_ns"]) == (want["steady_cycles"], want["period_ns"])
        assert got["tokens_per_cycle"] == (want["tokens_per_cycle"] if tokens else None)
    return check


def make_twice(how: str) -> Callable[[Env], list]:
    """One capture given twice: a hard link to it, or a byte-identical copy."""
    def make(e: Env) -> list:
        p = e.copy()
        q = e.inp / "again.sqlite"
        os.link(p, q) if how == "link" else shutil.copy(p, q)
        return ["analyze", p, q, "--format", "json", "-j", "1"]
    return make


def proc_closed(fd: int) -> Callable:
    """The command with descriptor ``fd`` closed by the caller (``>&-``, ``2>&-``)."""
    return lambda argv, e: run_proc(argv, e, preexec_fn=lambda: os.close(fd))


def _spawn(argv, e: Env, env: dict, **kw) -> subprocess.Popen:
    base = {**os.environ, **e.env, "PYTHONPATH": str(Path(__file__).resolve().parents[1]), **env}
    for k in ("SPECTRACE_CACHE_DIR", "PYTHONIOENCODING", "PYTHONUTF8", "LC_ALL", "LANG"):
        if k not in env:
            base.pop(k, None)
    return subprocess.Popen([sys.executable, "-m", "analyze.cli", *map(str, argv)], env=base, cwd=e.root / "cwd",
                            stderr=subprocess.PIPE, **kw)


def proc_encoding(env: dict, encoding: str, stand_in: bytes) -> Callable:
    """Standard output a pipe under ``env`` (an ASCII-only locale, ``PYTHONIOENCODING``): what comes out is
    ``encoding`` and holds ``stand_in``."""
    def run(argv, e: Env):
        p = _spawn(argv, e, env, stdout=subprocess.PIPE)
        out, err = p.communicate(timeout=120)
        assert stand_in in out, out[:300]
        return p.returncode, out.decode(encoding), err.decode()
    return run


def proc_ascii_terminal(argv, e: Env):
    """Standard output a terminal (a pty) under an ASCII-only locale: every byte ASCII, the stand-ins there."""
    import pty

    m, s = pty.openpty()
    p = _spawn(argv, e, {"LC_ALL": "C", "PYTHONUTF8": "0"}, stdout=s)
    os.close(s)
    out = b""
    while True:
        try:
            chunk = os.read(m, 1 << 16)
        except OSError:  # EIO: the other side closed
            break
        if not chunk:
            break
        out += chunk
    os.close(m)
    err = p.stderr.read()
    p.wait(timeout=120)
    assert out and max(out) < 128 and b"Cycle period" in out and b" us " in out, out[:300]
    return p.returncode, out.decode(), err.decode()


def proc_timeout(argv, e: Env):
    """In a process of its own, ended after 60 s (a run that does not end is a failure, not a hang)."""
    p = _spawn(argv, e, {}, stdout=subprocess.PIPE, start_new_session=True)
    try:
        out, err = p.communicate(timeout=60)
    except subprocess.TimeoutExpired:  # ended with what it started (a stuck nsys...), and the row fails
        os.killpg(p.pid, signal.SIGKILL)
        p.communicate()
        return 124, "", "spectrace: error: still running after 60 s (killed)\n"
    return p.returncode, out.decode(), err.decode()


def proc_strict_json(argv, e: Env):
    """In this process; the output must be JSON as the standard has it (no NaN, no Infinity)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = cli.main([str(a) for a in argv])

    def reject(c):
        raise AssertionError(f"{c} is not JSON")
    json.loads(out.getvalue(), parse_constant=reject)
    return rc, out.getvalue(), err.getvalue()


def proc_no_controls(argv, e: Env):
    """In this process; nothing printed on standard output or error holds a control character (but tab and
    newline) or a bidirectional override."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = cli.main([str(a) for a in argv])
    for text in (out.getvalue(), err.getvalue()):
        assert not CONTROLS.search(text), repr(CONTROLS.search(text))
    assert "owned" in out.getvalue() + err.getvalue()  # the name is there, without its controls
    return rc, out.getvalue(), err.getvalue()


def make_escapes(*args: str) -> Callable[[Env], list]:
    """A range name (host_overhead) and a kernel name carrying terminal control sequences."""
    def make(e: Env) -> list:
        p = e.copy()
        con = sqlite3.connect(p)
        for sid in (37, 116):
            con.execute("UPDATE StringIds SET value = ? || value || ? WHERE id = ?", (ESCAPES, "\r\x1b[0m", sid))
        con.commit()
        con.close()
        return [args[0], p, *args[1:]]
    return make


def make_tree(tail: bytes) -> Callable[[Env], list]:
    """An SGLang source tree (the fake one) whose eagle_worker.py ends with ``tail``."""
    def make(e: Env) -> list:
        root = e.inp / "sglang_tree"
        shutil.copytree(TREE, root)
        with (root / "sglang/srt/speculative/eagle_worker.py").open("ab") as f:
            f.write(tail)
        return ["hooks", "check", "--sglang-root", root]
    return make


def make_timing(*opts: str) -> Callable[[Env], list]:
    return lambda e: ["analyze", e.copy("tp1_s3_node"), "--timing", e.copy("tp1_s3_graph"), *opts]


CASES = [
    # Live and WAL SQLite: what is analysed is what SQLite returns, or one line.
    Case("wal_committed_changes_are_read", make_wal, rc=0, expect=third_deleted),
    Case("wal_committed_changes_are_read_through_the_store", lambda e: make_wal(e, "--store", "--cache"), rc=0,
         expect=third_deleted, keeps=(f"{NODE}.sqlite{location.SUFFIX}",)),
    Case("wal_appearing_after_the_cache_invalidates_it", make_wal_after_cache, rc=0, expect=third_deleted,
         keeps=(f"{NODE}.sqlite{location.SUFFIX}",)),
    Case("hot_journal_is_refused", make_hot_journal, says="unfinished write", later="clean", fix=fix_hot_journal),
    Case("live_writer_is_refused", make_live_writer, says="another process is writing it", later="clean",
         fix=stop_writer),
    Case("live_wal_connection_is_refused", make_live_wal, says="open in WAL mode", fix=stop_writer,
         later=edited(f"DELETE FROM {KERNEL} WHERE rowid % 2 = 0")),
    # A verified cache: damaged caches are rebuilt and give the clean numbers.
    Case("cache_ops_file_deleted", make_cache_fault(lambda p: one_ops_file(p).unlink()), rc=0, expect="clean",
         later="clean", keeps=(f"{NODE}.sqlite{location.SUFFIX}",)),
    Case("cache_ranges_deleted", make_cache_fault(lambda p: (cache_of(p) / "ranges.parquet").unlink()), rc=0,
         expect="clean", later="clean", keeps=(f"{NODE}.sqlite{location.SUFFIX}",)),
    Case("cache_file_truncated", make_cache_fault(lambda p: truncate(one_ops_file(p))), rc=0, expect="clean",
         later="clean", keeps=(f"{NODE}.sqlite{location.SUFFIX}",)),
    Case("cache_names_truncated", make_cache_fault(lambda p: truncate(cache_of(p) / "names.parquet")), rc=0,
         expect="clean", later="clean", keeps=(f"{NODE}.sqlite{location.SUFFIX}",)),
    Case("cache_pid_removed_from_meta", make_cache_fault(drop_pid_from_meta), rc=0, expect="clean", later="clean",
         keeps=(f"{NODE}.sqlite{location.SUFFIX}",)),
    Case("cache_meta_garbage", make_cache_fault(lambda p: (cache_of(p) / "meta.json").write_text("{")), rc=0,
         expect="clean", later="clean", keeps=(f"{NODE}.sqlite{location.SUFFIX}",)),
    Case("cache_marker_removed", make_cache_fault(lambda p: (cache_of(p) / layout.MARKER).unlink()), rc=0,
         expect="clean", later="clean", keeps=(f"{NODE}.sqlite{location.SUFFIX}",)),
    Case("stale_build_folder_is_removed", make_stale_build, rc=0, expect="clean",
         keeps=(f"{NODE}.sqlite{location.SUFFIX}",)),
    # Never destructive.
    Case("user_folder_at_the_cache_path", make_user_folder, says="not a spectrace cache"),
    Case("input_is_a_folder_of_other_files", lambda e: (_write(e.inp / "notes" / "a.txt", "mine\n"),
                                                        ["analyze", e.inp / "notes"])[1],
         says="not an nsys parquetdir/arrowdir export"),
    Case("user_file_at_the_cache_path", make_user_file, says="not a spectrace cache"),
    Case("db_hard_link_to_the_input", make_db(hard_link), says="must not be the input"),
    Case("db_symlink_to_the_input", make_db(symlink), says="must not be the input"),
    Case("db_is_the_input_wal", make_db(lambda e, p: p.with_name(p.name + "-wal")), says="must not be the input"),
    Case("db_is_the_export_of_the_nsys_rep", lambda e: ["analyze", _rep_beside(e.copy()), "--db", e.inp / f"{NODE}.sqlite"],
         says="must not be the input"),
    Case("report_o_is_the_input", make_report_o(lambda e, p: p), says="must not be the input"),
    Case("report_o_hard_link_to_the_input", make_report_o(hard_link), says="must not be the input"),
    Case("report_o_is_the_vs", lambda e: ["report", e.copy(), "--vs", e.copy("tp1_baseline"), "-o",
                                                e.inp / "tp1_baseline.sqlite"], says="must not be the input"),
    # One line, exit 2, instead of a traceback.
    Case("nonutf8_range_name", make_nonutf8(37), rc=0, says="NON_UTF8_STRINGS", expect=lossy_equivalent(37)),
    Case("nonutf8_range_name_streamed", make_nonutf8(37, "--store", "--no-cache"), rc=0, says="NON_UTF8_STRINGS",
         expect=lossy_equivalent(37)),
    Case("nonutf8_range_name_in_one_of_two_reports", lambda e: make_two_reports(e, "-j", "2"), rc=0,
         says="NON_UTF8_STRINGS", proc=lambda argv, e: run_proc(argv, e)),
    Case("nonutf8_kernel_name_streamed_and_cached", make_nonutf8(116, "--store", "--cache"), rc=0,
         says="NON_UTF8_STRINGS", expect=lossy_equivalent(116), keeps=(f"{NODE}.sqlite{location.SUFFIX}",)),
    Case("unreadable_report", make_unreadable, says="Permission denied", proc=proc_as_nobody),
    Case("ranges_look_ahead", make_plain("analyze", "--ranges", "(?=cycle)cyc"), says="bad regex"),
    Case("ranges_back_reference", make_plain("analyze", "--ranges", r"(c)\1"), says="bad regex"),
    Case("ranges_huge", make_plain("analyze", "--ranges", "(?:a{1000}){1000}"), says="bad regex"),
    Case("comm_pattern_look_behind", make_plain("analyze", "--comm-pattern", "x=(?<=a)b"), says="bad regex"),
    Case("comm_patterns_file_is_a_folder", make_patterns(None), says="is a directory"),
    Case("comm_patterns_file_not_utf8", make_patterns(b"nccl=\xff\xfe\n"), says="not UTF-8"),
    # (--db: the results are on stdout before the one line: ``expect`` checks them)
    Case("db_in_a_missing_folder", make_db(lambda e, p: e.root / "nowhere" / "r.db"), says="no folder",
         expect="clean"),
    Case("db_in_a_read_only_folder", make_db(lambda e, p: readonly_dir(e, "ro") / "r.db"),
         says="Permission denied", proc=proc_as_nobody, expect="clean"),
    Case("db_not_a_database", make_db(lambda e, p: (e.other("t") / "r.db", (e.other("t") / "r.db").write_text(
        "text, not SQLite\n" * 400))[0]), says="cannot write the results database", expect="clean"),
    Case("report_o_in_a_read_only_folder", make_report_o(lambda e, p: readonly_dir(e, "ro") / "rep"),
         says="Permission denied", proc=proc_as_nobody),
    Case("report_o_under_a_file", make_report_o(lambda e, p: p / "rep"), says="Not a directory"),
    Case("cache_dir_under_a_file", make_cache_dir_under_file, rc=0, says="CACHE_NOT_WRITTEN", expect="clean"),
    Case("no_writable_cache_location", make_nowhere_to_cache, rc=0, says="Permission denied", expect="clean",
         proc=proc_as_nobody),
    Case("null_global_pid_in_memory", make_edit(f"UPDATE {KERNEL} SET globalPid = NULL WHERE rowid % 50 = 0"), rc=0,
         says="DROPPED_OPS", expect=edited(f"DELETE FROM {KERNEL} WHERE rowid % 50 = 0")),
    Case("null_global_pid_streamed", make_edit(f"UPDATE {KERNEL} SET globalPid = NULL WHERE rowid % 50 = 0",
                                               opts=("--store", "--no-cache")), rc=0, says="DROPPED_OPS",
         expect=edited(f"DELETE FROM {KERNEL} WHERE rowid % 50 = 0")),
    Case("null_global_tid_api_streamed", make_edit(f"UPDATE {RUNTIME} SET globalTid = NULL WHERE rowid % 50 = 0",
                                                   opts=("--store", "--no-cache")), rc=0,
         says="API_WITHOUT_PROCESS", expect=edited(f"DELETE FROM {RUNTIME} WHERE rowid % 50 = 0")),
    Case("parquet_dir_without_stringids", make_no_stringids, says="no StringIds"),
    Case("odd_file_name", lambda e: ["analyze", e.copy(NODE, ODD), "--format", "json"], rc=0, expect="clean"),
    Case("odd_file_name_cached", lambda e: ["analyze", e.copy(NODE, ODD), "--format", "json", "--cache"], rc=0,
         expect="clean", later="clean"),
    Case("dev_stdin_redirected_from_the_file", make_plain("analyze", "--cache", "--format", "json"), rc=0,
         expect="clean", proc=proc_stdin_file, keeps=(f"{NODE}.sqlite{location.SUFFIX}",)),
    Case("dev_stdin_a_pipe", make_plain("analyze", "--cache"), says="not a regular file", proc=proc_stdin_pipe),
    Case("stdout_on_a_full_disk", make_plain("analyze", "--format", "json"), says="cannot write to standard output",
         proc=proc_full_disk),
    Case("worker_process_killed", lambda e: ["analyze", e.copy(NODE, "a.sqlite"), e.copy("tp1_clean", "b.sqlite"),
                                             "-j", "2"], says="worker process", proc=proc_kill_worker),
    # Leaks: nothing left in TMPDIR on errors (checked for every row).
    Case("store_no_cache_error_after_the_build", make_plain("analyze", "--store", "--no-cache", "--ranges", "^no$"),
         says="no NVTX ranges selected"),
    Case("store_no_cache_error_during_the_build", make_corrupt_table("--store", "--no-cache"), says="corrupt"),
    Case("cache_build_error_keeps_no_cache", make_corrupt_table("--cache"), says="corrupt"),
    # Minor.
    Case("empty_xdg_cache_home", make_empty_xdg, rc=0, expect="clean", check=check_empty_xdg),
    Case("corrupt_header_is_not_truncated", make_corrupt_header, says="corrupt SQLite header"),
    Case("mixed_nsys_versions", make_mixed_versions, rc=0, says="MIXED_NSYS_VERSIONS"),
    Case("duplicated_kernel_rows", make_edit(f"INSERT INTO {KERNEL} SELECT * FROM {KERNEL} WHERE rowid <= 40"),
         rc=0, says="DUPLICATE_OPS"),
    Case("ranges_ending_before_they_start", make_edit(f'UPDATE {NVTX} SET "end" = start - 5 WHERE rowid % 40 = 7'),
         rc=0, says="RANGE_END_BEFORE_START", expect=edited(f"DELETE FROM {NVTX} WHERE rowid % 40 = 7")),
    Case("kernel_with_an_absurd_end", make_edit(f'UPDATE {KERNEL} SET "end" = 4611686018427387904 WHERE rowid = 9'),
         rc=0, says="DROPPED_OPS", expect=edited(f"DELETE FROM {KERNEL} WHERE rowid = 9")),
    Case("range_with_an_absurd_end", make_edit(f'UPDATE {NVTX} SET "end" = 4611686018427387904 WHERE rowid = 3'),
         rc=0, says="RANGE_LONGER_THAN_SESSION",
         expect=edited(f'UPDATE {NVTX} SET "end" = (SELECT MAX(duration) FROM ANALYSIS_DETAILS) WHERE rowid = 3')),
    Case("missing_range_name_string", make_edit("DELETE FROM StringIds WHERE id = 37"), rc=0,
         says="MISSING_STRINGS",
         expect=edited(f"UPDATE {NVTX} SET textId = NULL, text = '' WHERE textId = 37")),
    # ---- outputs written safely (a new file renamed into place, never over an input)
    # (a) a figure's name in DIR that is the input: never written through
    Case("report_o_figure_hard_link_to_the_input", make_report_into(figure_hard_link), says="did not make",
         check=check_link_kept("per_cycle.png")),
    Case("report_o_figure_symlink_to_the_input", make_report_into(figure_symlink), says="did not make",
         check=check_link_kept("budget.png")),
    Case("report_o_force_figure_hard_link_to_the_input", make_report_into(figure_hard_link, "--force"), rc=0,
         check=check_link_kept_and_page_written),  # figures are inline: the user's file is not written
    Case("report_o_own_report_with_a_figure_linked_to_the_input", make_report_into(own_report_with_a_linked_figure),
         rc=0, check=check_linked_figure_replaced),
    # (b) --db through SQLite: the user's tables kept, whatever the journal or WAL holds
    Case("db_wal_with_committed_frames", make_db_at(db_wal_frames), rc=0, expect="clean",
         check=check_users_table([(42,)])),
    Case("db_with_a_hot_journal", make_db_at(db_hot_journal), rc=0, expect="clean", check=check_users_table([(7,)])),
    Case("db_wal_hard_link_to_the_input", make_db_at(db_wal_linked_to_the_input), says="must not be the input"),
    # (c) regular files only
    Case("db_is_a_character_device", make_db(lambda e, p: device(e.other("dev") / "r.db")), says="character device",
         check=check_still_a_device(lambda e: e.other("dev") / "r.db")),
    Case("db_symlink_to_a_character_device", make_db(lambda e, p: (
        e.other("dev") / "r.db", (e.other("dev") / "r.db").symlink_to(device(e.other("dev") / "null")))[0]),
         says="character device", check=check_still_a_device(lambda e: e.other("dev") / "null")),
    Case("db_is_a_named_pipe", make_db(lambda e, p: (e.other("dev") / "r.db", os.mkfifo(e.other("dev") / "r.db"))[0]),
         says="only regular files"),
    # (d) a folder we did not make is refused; a failed or interrupted report leaves the target as it was
    Case("report_o_onto_a_users_folder", make_report_into(users_folder), says="did not make", check=as_it_was),
    Case("report_o_force_keeps_the_users_other_files", make_report_into(users_folder, "--force"), rc=0,
         check=check_users_folder_kept_with_force),
    Case("report_o_replaces_its_own_report_whole", make_report_into(own_report_with_a_figure_not_made_now), rc=0,
         check=check_replaced_whole),
    Case("report_o_interrupted_keeps_the_old_report", make_interrupted_report(own_report), rc=130,
         says="interrupted", check=as_it_was),
    Case("report_o_interrupted_leaves_no_folder", make_interrupted_report(None), rc=130, says="interrupted",
         check=as_it_was),
    Case("report_o_file_size_limit_keeps_the_old_report", make_report_into(own_report), says="File too large",
         check=as_it_was, proc=proc_file_size_limit),
    Case("report_o_in_an_ascii_locale", make_report_into(None), rc=0, check=check_utf8_page, proc=proc_ascii_locale),
    Case("report_of_a_report_named_in_bytes_not_utf8", lambda e: ["report", e.copy(NODE, ODD), "-o", out_dir(e)],
         rc=0, check=check_odd_name_page),
    Case("db_of_a_report_named_in_bytes_not_utf8", lambda e: ["analyze", e.copy(NODE, ODD), "--format", "json",
                                                              "--db", e.other("db") / "r.db"], rc=0, expect="clean"),
    Case("report_with_dollar_range_names", make_dollar_names, rc=0, check=check_no_mathtext),
    # (e) never inside the cache (it is deleted when rebuilt)
    Case("db_inside_the_cache", make_db_in_cache, says="inside spectrace's cache", keeps=(f"{NODE}.sqlite{location.SUFFIX}",)),
    Case("db_inside_the_cache_not_built_yet", make_db(lambda e, p: cache_of(p) / "r.db"), says="inside spectrace's cache"),
    Case("db_inside_a_cache_in_the_cache_dir", make_db_in_cache_dir, says="inside spectrace's cache"),
    Case("report_o_inside_the_cache", make_report_in_cache, says="inside spectrace's cache",
         keeps=(f"{NODE}.sqlite{location.SUFFIX}",)),
    # (f) trace: no manifest without a report, a user's manifest kept without --force
    Case("trace_without_a_report_writes_no_manifest", make_trace(report=False), rc=1, says="no manifest written",
         check=lambda e: not manifest_of(e).exists() or pytest.fail("a manifest of nothing")),
    Case("trace_keeps_the_users_manifest", make_trace(True, lambda m: m.write_text('{"mine": true}\n')),
         says="--force", check=check_users_manifest),
    Case("trace_manifest_onto_a_device_with_force", make_trace(True, device, "--force"), says="character device",
         check=check_still_a_device(manifest_of)),
    # ---- the cache knows what it caches
    # The report's path: absolute in the cache, the one the user gave in the analysis (and its manifest).
    Case("cache_rebuilt_from_another_folder_reads_the_same_report", make_cached_from_its_folder("tp1_baseline"),
         rc=0, expect="clean", later="clean", keeps=(f"{NODE}.sqlite{location.SUFFIX}",)),
    Case("cache_rebuilt_from_another_folder_without_a_namesake", make_cached_from_its_folder(None), rc=0,
         expect="clean", later="clean", keeps=(f"{NODE}.sqlite{location.SUFFIX}",)),
    Case("cache_gives_the_json_of_the_export_manifest_included", make_manifest_beside, rc=0, expect="clean",
         check=check_same_json_as_without_cache, keeps=(f"{NODE}.sqlite{location.SUFFIX}",)),
    # The key: inode, ctime and a content hash besides size and mtime.
    Case("report_copied_over_same_size_and_mtime", make_replaced_same_size_and_mtime("copy"), rc=0,
         expect=lambda e: longer_kernels(e, "eq.sqlite"), keeps=(f"{NODE}.sqlite{location.SUFFIX}",)),
    Case("report_renamed_over_same_size_and_mtime", make_replaced_same_size_and_mtime("rename"), rc=0,
         expect=lambda e: longer_kernels(e, "eq.sqlite"), keeps=(f"{NODE}.sqlite{location.SUFFIX}",)),
    # Concurrent builders keep each other's work.
    Case("two_builders_on_a_damaged_cache", lambda e: ["analyze", cached(e), "--cache", "--format", "json"], rc=0,
         expect="clean", proc=proc_two_builders, keeps=(f"{NODE}.sqlite{location.SUFFIX}",)),
    # Where the cache goes: names that fit, valid variables, never inside the input.
    Case("report_name_of_246_characters", lambda e: ["analyze", e.copy(NODE, LONG), "--format", "json"], rc=0,
         expect="clean"),
    Case("report_name_of_246_characters_cached", lambda e: ["analyze", e.copy(NODE, LONG), "--format", "json",
                                                            "--cache"], rc=0, expect="clean", later="clean",
         check=check_long_name_cache),
    Case("cache_dir_inside_the_input_parquetdir", make_cache_dir_in_the_parquetdir, rc=0,
         says="CACHE_NOT_WRITTEN", expect=lambda e: e.inp / "n_pqtdir", check=check_parquetdir_unchanged),
    Case("empty_home", make_empty_home, rc=0, says="HOME is empty", expect="clean", proc=proc_as_nobody),
    Case("cache_dir_not_utf8", make_cache_dir_not_utf8, rc=0, says="not valid UTF-8", expect="clean",
         check=check_nothing_in_the_not_utf8_dir),
    # A cache that cannot be written is skipped with one line (nothing left behind): read-only, full, too large.
    Case("read_only_stale_cache_is_replaced", make_read_only_stale_cache, rc=0, expect="clean",
         proc=proc_as_nobody, keeps=(f"{NODE}.sqlite{location.SUFFIX}",)),
    Case("stale_cache_of_another_user_is_skipped", make_stale_cache_of_another_user, rc=0,
         says="CACHE_NOT_WRITTEN", expect="clean", proc=proc_as_nobody, keeps=(f"{NODE}.sqlite{location.SUFFIX}",)),
    Case("cache_build_over_the_file_size_limit", make_plain("analyze", "--cache", "--format", "json"), rc=0,
         says="File too large", expect="clean", proc=proc_file_size_limit_64k),
    Case("store_no_cache_over_the_file_size_limit", make_plain("analyze", "--store", "--no-cache"),
         says="cannot write a temporary store (File too large)", proc=proc_file_size_limit_64k),
    Case("cache_build_on_a_full_disk", make_disk_full, rc=0, says="No space left on device", expect="clean"),
    # ---- inputs are data, bounded arguments
    # Payloads: a cycle index that cannot identify cycles is ignored (paired as without one), with a warning.
    Case("payload_cycle_index_the_same_everywhere", same_cycle_index("tp2_straggler"), rc=0,
         says="PAYLOAD_CYCLE_INDEX", expect=no_payload("tp2_straggler"), check=same_headline("tp2_straggler")),
    Case("payload_cycle_index_the_same_with_accept_marks", same_cycle_index("tp2_v2"), rc=0,
         says="PAYLOAD_CYCLE_INDEX", expect=no_payload("tp2_v2"), check=same_headline("tp2_v2", tokens=False)),
    Case("payload_cycle_index_disjoint_across_ranks", same_cycle_index("tp2_all", ranks_offset=1000), rc=0,
         says="PAYLOAD_CYCLE_INDEX", expect=no_payload("tp2_all"), check=same_headline("tp2_all")),
    # The clock's origin: the same ranges (unclosed ones kept, no false UNCLOSED_RANGE), the same numbers.
    Case("time_origin_shifted_with_unclosed_ranges", make_shifted(NODE, UNCLOSE), rc=0, says="UNCLOSED_RANGE",
         expect=unshifted(NODE), check=same_diagnostics(NODE), proc=proc_clock_back),
    # (its unclosed ranges count in no number: info, not on stderr; its one warning is WINDOW_CUT)
    Case("time_origin_shifted_nsys_unclosed", make_shifted("tp2_rank0_window"), rc=0, says="warning: WINDOW_CUT",
         expect=unshifted("tp2_rank0_window"), check=same_diagnostics("tp2_rank0_window"), proc=proc_clock_back),
    # One capture given twice.
    Case("same_capture_twice_hard_link", make_twice("link"), says="are the same file"),
    Case("same_capture_twice_byte_identical", make_twice("copy"), says="byte-identical copies"),
    # Standard output and error: closed, an ASCII-only locale, control characters in names.
    Case("stdout_closed", make_plain("analyze", "--format", "json"), says="cannot write to standard output",
         proc=proc_closed(1)),
    Case("stderr_closed", make_plain("analyze", "--format", "json"), rc=0, expect="clean", proc=proc_closed(2)),
    Case("ascii_locale_terminal", make_plain("analyze"), rc=0, proc=proc_ascii_terminal),
    Case("ascii_locale_pipe_is_utf8", make_plain("analyze"), rc=0,
         proc=proc_encoding({"LC_ALL": "C", "PYTHONUTF8": "0"}, "utf-8", "µs".encode())),
    Case("pythonioencoding_latin1", make_plain("analyze"), rc=0,
         proc=proc_encoding({"PYTHONIOENCODING": "latin-1"}, "latin-1", b"draft -> verify")),
    Case("control_characters_in_names_table", make_escapes("analyze"), rc=0, proc=proc_no_controls),
    Case("control_characters_in_names_csv", make_escapes("analyze", "--format", "csv", "--table", "kernels"), rc=0,
         proc=proc_no_controls),
    Case("control_characters_in_names_whatif", make_escapes("whatif", "--steps-now", "3"), rc=0,
         proc=proc_no_controls),
    Case("control_characters_in_names_error_line", make_escapes("analyze", "--ranges", "^nothing$"),
         says="no NVTX ranges selected", proc=proc_no_controls),
    Case("json_nan_is_null", make_edit(f'UPDATE {KERNEL} SET "end" = start'), rc=0, proc=proc_strict_json),
    # Numeric options, every verb: range, NaN, infinity, values too large.
    Case("top_negative", make_plain("analyze", "--table", "kernels", "--top", "-1"), says="argument --top"),
    Case("top_huge", make_plain("analyze", "--table", "kernels", "--top", "99999999999999999999"),
         says="argument --top"),
    Case("whatif_max_steps_huge", make_plain("whatif", "--steps-now", "3", "--max-steps", "100000000"),
         says="argument --max-steps", proc=proc_timeout),
    Case("report_steps_now_negative", lambda e: ["report", e.copy(), "-o", e.other("rep") / "r", "--steps-now", "-1"],
         says="argument --steps-now"),
    Case("comm_jobs_zero", make_plain("comm", "-j", "0"), says="argument -j/--jobs"),
    Case("unprofiled_cycles_per_s_nan", make_timing("--unprofiled-cycles-per-s", "nan"),
         says="argument --unprofiled-cycles-per-s"),
    Case("trace_delay_nan", lambda e: ["trace", "-o", e.other("t") / "run", "--delay", "nan", "-n", "--", "true"],
         says="argument --delay"),
    Case("trace_nsys_arg_lone_quote", lambda e: ["trace", "-o", e.other("t") / "run", '--nsys-arg="oops', "-n", "--",
                                                 "true"], says="cannot be split into arguments"),
    # Environment variables: checked before polars loads.
    Case("polars_max_threads_zero", make_plain("analyze"), says="POLARS_MAX_THREADS",
         proc=lambda argv, e: run_proc(argv, e, env={"POLARS_MAX_THREADS": "0"})),
    # hooks check: a file that is not Python is bad input (exit 2), not a failed check (exit 1).
    Case("hooks_check_syntax_error", make_tree(b"\ndef (:\n"), says="cannot be parsed as Python"),
    Case("hooks_check_nul_byte", make_tree(b"\nx = 1\0\n"), says="cannot be parsed as Python"),
]


# -- recipes: issue 43 (never destructive, never silently wrong: third round) --

ADAPTIVE = "tp1_adaptive_node"  # segments per batch size: what --sglang-config writes from
CONFIG = '{"mine": true}\n'


def with_manifest(e: Env, name: str = NODE, edit: Callable[[dict], object] | None = None,
                  text: str | None = None) -> Path:
    """A copy of ``name`` and its manifest beside it (``edit``ed, or replaced by ``text``)."""
    p = e.copy(name)
    m = p.with_name(f"{name}.manifest.json")
    if text is not None:
        m.write_text(text)
    else:
        doc = json.loads((samples.data_dir(name) / m.name).read_text())
        if edit is not None:
            edit(doc)
        m.write_text(json.dumps(doc))
    return p


def users_config(e: Env) -> Path:
    f = e.other("cfg") / "adaptive.json"
    f.write_text(CONFIG)
    return f


def check_users_config(e: Env) -> None:
    assert (e.other("cfg") / "adaptive.json").read_text() == CONFIG


def make_whatif_config(where: str) -> Callable[[Env], list]:
    def make(e: Env) -> list:
        p = with_manifest(e, ADAPTIVE)
        if where == "existing":
            return ["whatif", p, "--sglang-config", users_config(e)]
        if where == "manifest":
            return ["whatif", p, "--sglang-config", p.with_name(f"{ADAPTIVE}.manifest.json")]
        pat = e.inp / "patterns.txt"
        pat.write_text("mine=^my_allreduce\n")
        return ["whatif", p, "--comm-patterns-file", pat, "--sglang-config", pat]
    return make


def users_gpu_metrics(e: Env, p: Path, db: Path) -> None:
    sql(db, "CREATE TABLE gpu_metrics (x)", "INSERT INTO gpu_metrics VALUES (42)")


def check_users_gpu_metrics(e: Env) -> None:
    con = sqlite3.connect(e.other("db") / "r.db")
    assert con.execute("SELECT x FROM gpu_metrics").fetchall() == [(42,)]
    con.close()


NULL_END = (f"CREATE TABLE k2 AS SELECT * FROM {KERNEL}", f"DROP TABLE {KERNEL}",  # (no NOT NULL: as other tools
            f"ALTER TABLE k2 RENAME TO {KERNEL}",  # and nsys versions write it)
            f'UPDATE {KERNEL} SET "end" = NULL WHERE rowid % 50 = 0')


def make_parquetdir_of(*statements: str) -> Callable[[Env], list]:
    """The capture edited by ``statements``, exported as a parquetdir (the columnar path)."""
    def make(e: Env) -> list:
        from bench.export_dir import write_export_dir

        q = sql(shutil.copy(e.pristine(NODE), e.other("src") / "src.sqlite"), *statements)
        return ["analyze", write_export_dir(q, e.inp / "n_pqtdir", "parquet"), "--format", "json"]
    return make


CROSS = (f"UPDATE {NVTX} SET eventType = 60, endGlobalTid = globalTid + 1 WHERE eventType = 59 "
         "AND textId = (SELECT id FROM StringIds WHERE value = 'cycle')")
SAME_THREAD = (f"UPDATE {NVTX} SET eventType = 60, endGlobalTid = globalTid WHERE eventType = 59 "
               "AND textId = (SELECT id FROM StringIds WHERE value = 'cycle')")


def same_period_as(eq: Callable[[Env], Path]) -> Callable[[Env], None]:
    def check(e: Env) -> None:
        got, want = (doc_of(p)["tokens"] for p in (e.inp / f"{NODE}.sqlite", eq(e)))
        assert (got["steady_cycles"], got["period_ns"]) == (want["steady_cycles"], want["period_ns"])
    return check


def make_accept_length(value: int) -> Callable[[Env], list]:
    """One cycle's payload claims ``value`` accepted tokens (batch 4, 3 steps: at most 4 x 4 = 16)."""
    def make(e: Env) -> list:
        from nvtx_hooks import phases as ph

        p = e.copy()
        con = sqlite3.connect(p)
        rows = con.execute(f"SELECT rowid, int64Value FROM {NVTX} WHERE (int64Value >> 60) = 1").fetchall()
        for rowid, v in rows:
            d = ph.decode_payload(v)
            if d and d.get("accept_length") is not None and d["cycle_index"] == 20:
                new = ph.encode_payload(d["batch_size"], d["cycle_index"], value)
                con.execute(f"UPDATE {NVTX} SET int64Value = ? WHERE rowid = ?", (new - (1 << 64) if new >= 1 << 63
                                                                                    else new, rowid))
        con.commit()
        con.close()
        return ["analyze", p, "--format", "json"]
    return make


def check_tokens_plausible(e: Env) -> None:
    got, want = (doc_of(p)["tokens"] for p in (e.inp / f"{NODE}.sqlite", e.pristine(NODE)))
    assert got["tokens_per_s"] < 1.2 * want["tokens_per_s"], (got, want)


def few_cycles(e: Env, name: str, keep: int, slower: bool = False) -> Path:
    """``name`` with only its first ``keep`` cycles' ranges (and, ``slower``, every kernel 50 % longer)."""
    p = e.copy(NODE, name)
    con = sqlite3.connect(p)
    cyc = con.execute(f"SELECT start FROM {NVTX} WHERE textId = (SELECT id FROM StringIds WHERE value = 'cycle') "
                      "ORDER BY start").fetchall()
    con.close()
    cut = cyc[keep][0]
    sql(p, f"DELETE FROM {NVTX} WHERE eventType = 59 AND start >= {cut}")
    if slower:
        sql(p, f'UPDATE {KERNEL} SET "end" = "end" + ("end" - start) / 2')
    return p


def make_gate(few: str) -> Callable[[Env], list]:
    def make(e: Env) -> list:
        a = e.copy(NODE, "a.sqlite") if few == "b" else few_cycles(e, "a.sqlite", 2)
        b = few_cycles(e, "b.sqlite", 2, slower=True) if few == "b" else e.copy(NODE, "b.sqlite")
        return ["compare", a, b, "--fail-if-slower", "1"]
    return make


def spec(**kw) -> Callable[[dict], None]:
    return lambda d: d.setdefault("speculative", {}).update(kw)


def decode_log(e: Env, lines: list[str]) -> Path:
    f = e.inp / "decode.log"
    f.write_text("".join(f"[2026-01-01 00:00:{i:02d}] Decode batch, {ln}\n" for i, ln in enumerate(lines)))
    return f


OK_LINES = [f"#running-req: {b}, #token: 900, token usage: 0.01, accept len: 2.40, accept rate: 0.47, cuda graph: "
            f"True, gen throughput (token/s): {t}, #queue-req: 0" for b, t in ((1, 1200.0), (2, 2300.0), (4, 4300.0))]


def make_unprofiled_log(bad: str) -> Callable[[Env], list]:
    def make(e: Env) -> list:
        p = with_manifest(e, ADAPTIVE)
        return ["whatif", p, "--unprofiled-log", decode_log(e, [*OK_LINES, bad]), "--format", "json"]
    return make


def proc_api(call: str) -> Callable:
    """In this process: ``call`` (a Python expression over ``api``, ``p`` the report) as the API's user would make
    it; an InputError is the one line (exit 2), a JSON document of the result on standard output."""
    def run(argv, e: Env):
        from analyze import api
        from analyze.output import data

        p = Path(argv[1])
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                res = eval(call, {"api": api, "p": p, "os": os})
            except InputError as x:
                return 2, "", err.getvalue() + f"spectrace: error: {x}\n"
        return 0, data.to_json(res), err.getvalue()
    return run


def make_dup(table: str) -> Callable[[Env], list]:
    return make_edit(f"INSERT INTO {table} SELECT * FROM {table}")


def make_dup_stringids(e: Env) -> list:
    """StringIds without its primary key and every row twice (an export appended twice)."""
    p = e.copy()
    sql(p, "CREATE TABLE s2 AS SELECT * FROM StringIds", "DROP TABLE StringIds",
        "CREATE TABLE StringIds (id INTEGER NOT NULL, value TEXT NOT NULL)",
        "INSERT INTO StringIds SELECT * FROM s2", "INSERT INTO StringIds SELECT * FROM s2", "DROP TABLE s2")
    return ["analyze", p, "--format", "json"]


def one_cycle(e: Env, name: str = f"{NODE}.sqlite") -> Path:
    return few_cycles(e, name, 1)


def no_cycle_ranges(e: Env, name: str) -> Path:
    return sql(e.copy(NODE, name), f"DELETE FROM {NVTX} WHERE textId = (SELECT id FROM StringIds WHERE value = 'cycle')")


def fifo(path: Path) -> Path:
    os.mkfifo(path)
    return path


def make_manifest_fifo(e: Env) -> list:
    p = e.copy()
    fifo(p.with_name(f"{NODE}.manifest.json"))
    return ["analyze", p, "--format", "json"]


def make_many_phase_names(n: int) -> Callable[[Env], list]:
    """``n`` more range names: copies of the host_overhead ranges, each copy of its own name."""
    def make(e: Env) -> list:
        p = e.copy()
        con = sqlite3.connect(p)
        cols = [r[1] for r in con.execute(f"PRAGMA table_info({NVTX})")]
        base = con.execute(f"SELECT rowid FROM {NVTX} WHERE textId = 37 ORDER BY start").fetchall()
        k = 0
        while k < n:
            for (rowid,) in base:
                if k == n:
                    break
                sid = 2_000_000 + k
                con.execute("INSERT INTO StringIds (id, value) VALUES (?, ?)", (sid, f"zz_phase_{k:05d}"))
                sel = ", ".join("?" if c == "textId" else c for c in cols)
                con.execute(f"INSERT INTO {NVTX} ({', '.join(cols)}) SELECT {sel} FROM {NVTX} WHERE rowid = ?",
                            (sid, rowid))
                k += 1
        con.commit()
        con.close()
        return ["report", p, "-o", out_dir(e), "--ranges", "^(zz_phase_|cycle)"]
    return make


def make_drop_column(table: str, *columns: str, verb: str = "analyze") -> Callable[[Env], list]:
    return make_edit(*(f'ALTER TABLE {table} DROP COLUMN "{c}"' for c in columns)) if verb == "analyze" else \
        lambda e: ["report", sql(e.copy(), *(f'ALTER TABLE {table} DROP COLUMN "{c}"' for c in columns)), "-o",
                   out_dir(e)]


def make_long_path(e: Env) -> list:
    d = e.inp
    for i in range(3):
        d = d / (f"{i}" * 200)
    d.mkdir(parents=True)
    p = d / f"{NODE}.sqlite"
    shutil.copy(e.pristine(NODE), p)
    assert len(os.fsencode(str(p))) > 512
    return ["analyze", p, "--format", "json"]


def make_rewritten_while_read(e: Env) -> list:
    """The export rewritten in place while the analysis reads it (after its schema was read)."""
    from analyze.read import sqlite as sq

    p = shutil.copy(e.pristine(NODE), e.other("live") / f"{NODE}.sqlite")
    frame = sq.Reader.frame
    done = []

    def rewriting(self, *a, **k):
        if not done:
            done.append(1)
            size = p.stat().st_size  # its middle rewritten (a copy in place, a writer): the pages read next are
            with open(p, "r+b") as f:  # not the ones SQLite expects
                f.seek(size // 4)
                f.write(b"\xa5" * (size // 2))
        return frame(self, *a, **k)

    e.mp.setattr(sq.Reader, "frame", rewriting)
    return ["analyze", p, "--format", "json", "--no-store", "--no-cache"]


def proc_hooks_switch(value: str) -> Callable:
    """``SPECTRACE_HOOKS=value``: does the plugin want the hooks (exit 0 and 'on'/'off'), or one line."""
    def run(argv, e: Env):
        code = ("import sys\nfrom nvtx_hooks import plugin\nprint('on' if plugin.wanted() else 'off')\n")
        env = {**os.environ, "SPECTRACE_HOOKS": value, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
        env.pop("SGLANG_PLUGINS", None)
        q = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
        return q.returncode, q.stdout, q.stderr
    return run


def check_stdout(want: str) -> Callable:
    def wrap(proc: Callable) -> Callable:
        def run(argv, e: Env):
            rc, out, err = proc(argv, e)
            assert out.strip() == want, (out, err)
            return rc, out, err
        return run
    return wrap


def make_trace_o(name: str) -> Callable[[Env], list]:
    return lambda e: ["trace", "--nsys", fake_nsys(e), "-o", name, "--", sys.executable, "-c", "pass"]


def stuck_nsys(e: Env) -> Path:
    exe = e.other("bin") / "nsys"
    exe.write_text("#!/bin/sh\nexec sleep 600\n")
    exe.chmod(0o755)
    return exe


def make_two_table_files(e: Env) -> list:
    from bench.export_dir import write_export_dir

    d = write_export_dir(e.pristine(NODE), e.inp / "n_pqtdir", "parquet")
    shutil.copy(d / f"{KERNEL}.parquet", d / f"{KERNEL}.arrow")
    return ["analyze", d, "--format", "json"]


ISSUE_43 = [
    # 1. every file written is an output: never an existing file without --force, never an input by any name
    Case("whatif_sglang_config_over_an_existing_file", make_whatif_config("existing"), says="exists",
         check=check_users_config),
    Case("whatif_sglang_config_onto_the_manifest", make_whatif_config("manifest"), says="must not be the input"),
    Case("whatif_sglang_config_onto_the_comm_patterns_file", make_whatif_config("patterns"),
         says="must not be the input"),
    Case("db_keeps_a_users_table_of_a_result_name", make_db_at(users_gpu_metrics), says="spectrace did not make",
         expect="clean", check=check_users_gpu_metrics),
    Case("trace_o_empty", make_trace_o(""), says="-o"),
    Case("trace_o_dot", make_trace_o("."), says="-o"),
    Case("trace_o_root", make_trace_o("/"), says="-o"),
    Case("trace_nsys_version_never_answers", lambda e: ["trace", "--nsys", stuck_nsys(e), "-o", e.other("t") / "run",
                                                        "--", sys.executable, "-c", "pass"],
         says="did not answer", proc=proc_timeout),
    # 2. every input validated before it is used (CLI and API): regular files, bounded, shaped, physical
    Case("manifest_is_a_named_pipe", make_manifest_fifo, says="named pipe", proc=proc_timeout),
    Case("comm_patterns_file_is_a_named_pipe", lambda e: ["analyze", e.copy(), "--comm-patterns-file",
                                                          fifo(e.other("p") / "pat")], says="named pipe",
         proc=proc_timeout),
    Case("unprofiled_log_is_a_named_pipe", lambda e: ["whatif", with_manifest(e, ADAPTIVE), "--unprofiled-log",
                                                      fifo(e.other("p") / "log")], says="named pipe",
         proc=proc_timeout),
    Case("manifest_is_a_json_list", lambda e: ["analyze", with_manifest(e, text="[1, 2]"), "--format", "json"],
         says="not a JSON object"),
    Case("manifest_is_a_json_scalar", lambda e: ["analyze", with_manifest(e, text="3"), "--format", "json"],
         says="not a JSON object"),
    Case("manifest_speculative_not_an_object", lambda e: ["analyze", with_manifest(
        e, edit=lambda d: d.update(speculative=[3])), "--format", "json"], says="speculative"),
    Case("manifest_integer_of_1e21", lambda e: ["whatif", with_manifest(e, edit=spec(steps=10**21))],
         says="speculative.steps"),
    Case("manifest_nested_100k_lists", lambda e: ["analyze", with_manifest(e, text="[" * 100_000 + "]" * 100_000),
                                                  "--format", "json"], says="nested"),
    Case("manifest_steps_100000", lambda e: ["whatif", with_manifest(e, edit=spec(steps=100_000))],
         says="speculative.steps"),
    Case("api_steps_now_1e6", make_plain("whatif"), says="steps_now", proc=proc_api("api.whatif(p, 10**6)")),
    Case("api_skip_cycles_2_5", make_plain("analyze"), says="skip_cycles", proc=proc_api("api.analyze(p, skip_cycles=2.5)")),
    Case("api_bytes_path", make_plain("analyze"), rc=0, expect="clean",
         proc=proc_api("api.analyze(os.fsencode(p), store=False, cache=False)")),
    Case("api_pattern_strings", make_plain("analyze"), says="comm_patterns",
         proc=proc_api("api.analyze(p, comm_patterns='nccl')")),
    Case("api_window_of_three", make_plain("analyze"), says="window", proc=proc_api("api.analyze(p, window=(1, 5, 9))")),
    Case("payload_accept_length_beyond_batch_times_steps", make_accept_length(1000), rc=0,
         says="PAYLOAD_ACCEPT_LENGTH", check=check_tokens_plausible),
    Case("decode_log_throughput_no_gpu_reaches", make_unprofiled_log(
        "#running-req: 4, #token: 900, accept len: 2.40, gen throughput (token/s): 100000000.0"), rc=0,
         says="DECODE_LOG_LINES"),
    Case("decode_log_1e23_running_requests", make_unprofiled_log(
        "#running-req: 100000000000000000000000, accept len: 2.40, gen throughput (token/s): 4000.0"), rc=0,
         says="DECODE_LOG_LINES"),
    Case("spectrace_hooks_true_means_on", make_plain(), rc=0, proc=check_stdout("on")(proc_hooks_switch("true"))),
    Case("invalid_mplbackend", make_report_into(None), rc=0, check=page_is_ours,
         proc=lambda argv, e: run_proc(argv, e, env={"MPLBACKEND": "no_such_backend"})),
    # 3. an export that breaks an assumption is said, with the same numbers through every path
    Case("null_end_kernels_in_memory", make_edit(*NULL_END, opts=("--no-store",)), rc=0, says="DROPPED_OPS",
         expect=edited(f"DELETE FROM {KERNEL} WHERE rowid % 50 = 0")),
    Case("null_end_kernels_streamed", make_edit(*NULL_END, opts=("--store", "--no-cache")), rc=0, says="DROPPED_OPS",
         expect=edited(f"DELETE FROM {KERNEL} WHERE rowid % 50 = 0")),
    Case("null_end_kernels_columnar", make_parquetdir_of(*NULL_END), rc=0, says="DROPPED_OPS",
         expect=edited(f"DELETE FROM {KERNEL} WHERE rowid % 50 = 0")),
    Case("ranges_ended_on_another_thread", make_edit(CROSS), rc=0, says="CROSS_THREAD_RANGE",
         expect=edited(SAME_THREAD), check=same_period_as(edited(SAME_THREAD))),
    Case("runtime_rows_twice", make_dup(RUNTIME), rc=0, says="DUPLICATE_ROWS", expect="clean"),
    Case("nvtx_rows_twice", make_dup(NVTX), rc=0, says="DUPLICATE_ROWS", expect="clean"),
    Case("stringids_ids_twice", make_dup_stringids, says="StringIds holds 340 ids more than once", proc=proc_timeout),
    Case("nvtx_without_globaltid", make_drop_column(NVTX, "globalTid"), says="NVTX_EVENTS has no column globalTid"),
    Case("kernel_without_deviceid", make_drop_column(KERNEL, "deviceId"), says=f"{KERNEL} has no column deviceId"),
    Case("kernel_without_streamid", make_drop_column(KERNEL, "streamId"), says=f"{KERNEL} has no column streamId"),
    Case("kernel_without_name_columns", make_drop_column(KERNEL, "shortName", "demangledName"),
         says=f"{KERNEL} has no column"),
    Case("runtime_without_nameid", make_drop_column(RUNTIME, "nameId"), says=f"{RUNTIME} has no column nameId"),
    Case("report_without_api_rows", lambda e: ["report", sql(e.copy(), f"DELETE FROM {RUNTIME}"), "-o", out_dir(e)],
         says="CUDA API"),
    Case("report_without_api_table", lambda e: ["report", sql(e.copy(), f"DROP TABLE {RUNTIME}"), "-o", out_dir(e)],
         says="CUDA API"),
    Case("path_past_sqlites_limit", make_long_path, says="past the 511 that SQLite opens"),
    Case("input_rewritten_while_read", make_rewritten_while_read, says="changed while it was read"),
    # 4. the gate never passes what it cannot judge
    Case("compare_gate_with_too_few_cycles_in_b", make_gate("b"), rc=1, says="too few"),
    # 5. degenerate runs and odd arguments: an answer or one line, in bounded time
    Case("one_cycle_analyze", lambda e: ["analyze", one_cycle(e), "--format", "json"], rc=0),
    Case("one_cycle_comm", lambda e: ["comm", one_cycle(e)], rc=0),
    Case("one_cycle_report", lambda e: ["report", one_cycle(e), "-o", out_dir(e)], rc=0, check=page_is_ours),
    Case("one_cycle_compare", lambda e: ["compare", e.copy(NODE, "a.sqlite"), one_cycle(e, "b.sqlite")], rc=0),
    Case("one_cycle_whatif", lambda e: ["whatif", one_cycle(e), "--steps-now", "3"], says="cycle"),
    Case("compare_runs_without_cycles", lambda e: ["compare", no_cycle_ranges(e, "a.sqlite"),
                                                   no_cycle_ranges(e, "b.sqlite")], rc=0),
    Case("report_vs_runs_without_cycles", lambda e: ["report", no_cycle_ranges(e, "b.sqlite"), "--vs",
                                                     no_cycle_ranges(e, "a.sqlite"), "-o", out_dir(e)], rc=0),
    Case("report_ranges_matching_1688_names", make_many_phase_names(1688), rc=0, proc=proc_timeout),
]

# Written after the fix, one per rule: each holds too.
ISSUE_43_NEW = [
    Case("db_is_the_manifest_of_the_input", lambda e: ["analyze", with_manifest(e), "--db",
                                                       e.inp / f"{NODE}.manifest.json"], says="must not be the input"),
    Case("comm_patterns_file_links_to_a_device", lambda e: ["analyze", e.copy(), "--comm-patterns-file", (
        e.other("p") / "pat", (e.other("p") / "pat").symlink_to("/dev/zero"))[0]], says="character device",
         proc=proc_timeout),
    Case("parquetdir_with_two_files_for_one_table", make_two_table_files, says="two files"),
    Case("compare_gate_with_too_few_cycles_in_a", make_gate("a"), rc=1, says="too few"),
    Case("report_o_empty", lambda e: ["report", e.copy(), "-o", ""], says="-o"),
]

CASES += ISSUE_43 + ISSUE_43_NEW


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_case(case: Case, env: Env, capsys, clean):
    argv = case.make(env)
    before = snapshot(env.inp)
    rc, out, err = case.proc(argv, env) if case.proc else run_here(argv, capsys)
    assert "Traceback" not in err and "panicked" not in err, err
    assert rc == case.rc, (rc, err)
    lines = err.strip().splitlines()
    if rc == 2:
        assert len(lines) == 1 and lines[0].startswith("spectrace: error: "), err
        assert case.says in lines[0], err
    else:
        assert case.says in err, err
    after = snapshot(env.inp)
    for name, was in before.items():  # the inputs' bytes (and mtimes) unchanged, nothing removed
        assert after.get(name) == was, name
    new = set(after) - set(before)
    assert not new, new
    made = {p.name for p in env.inp.iterdir()} - {Path(n).parts[0] for n in before}
    assert made <= set(case.keeps), made
    assert not leftovers(env), leftovers(env)
    if case.expect is not None:
        want = clean if case.expect == "clean" else numbers_of(case.expect(env))
        assert numbers(out) == want
    if case.check:
        case.check(env)
    if case.fix:
        case.fix(env)
    if case.later is not None:  # a later run of the same command gives the right numbers
        rc, out, err = run_here(argv, capsys)
        assert rc == 0, err
        assert numbers(out) == (clean if case.later == "clean" else numbers_of(case.later(env)))
        assert not leftovers(env), leftovers(env)


# ---- Ctrl-C, at any moment -------------------------------------------------------------------------------


def _interrupt_in_build(monkeypatch, after: float = 0.3) -> list[threading.Thread]:
    """Ctrl-C (a real SIGINT to the main thread) while the store's reader threads write, and a reader that goes
    on writing for ``after`` s: what the threads do after the interrupt is what a cleanup must wait for."""
    seen: list[threading.Thread] = []
    flush = copy_build._Spill.flush

    def slow_flush(self):
        seen.append(threading.current_thread())
        if len(seen) == 1:
            signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)
            time.sleep(after)
        flush(self)

    monkeypatch.setattr(copy_build._Spill, "flush", slow_flush)
    return seen


@pytest.mark.parametrize("opts", [("--cache",), ("--store", "--no-cache")], ids=["cache", "store_no_cache"])
def test_ctrl_c_during_the_store_build_leaves_nothing(env, capsys, monkeypatch, clean, opts):
    p = env.copy()
    before = snapshot(env.inp)
    seen = _interrupt_in_build(monkeypatch)
    rc, out, err = run_here(["analyze", p, "--format", "json", *opts], capsys)
    assert rc == 130 and err.strip().splitlines() == ["spectrace: interrupted"], err
    assert seen and not any(t.is_alive() for t in seen)  # the reader threads ended before the cleanup
    time.sleep(0.1)
    assert snapshot(env.inp) == before and {q.name for q in env.inp.iterdir()} == {p.name}
    assert not leftovers(env), leftovers(env)
    monkeypatch.undo()
    rc, out, err = run_here(["analyze", p, "--format", "json", *opts], capsys)  # a later run: the clean numbers
    assert rc == 0 and numbers(out) == clean


@pytest.mark.parametrize("delay", [0.0, 0.05, 0.15])
def test_ctrl_c_in_the_first_moments(env, delay):
    """Ctrl-C while polars loads (the first ~0.2 s): exit 130, one line, never a traceback. (Timed from the
    moment polars' library is mapped: before that, only the interpreter's own start, ~20 ms, is not ours.)"""
    p = subprocess.Popen([sys.executable, "-m", "analyze.cli", "analyze", env.copy(), "--format", "json"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, **env.env})
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and p.poll() is None and "polars" not in _maps(p.pid):
        time.sleep(0.001)
    time.sleep(delay)
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 130 and err.strip().splitlines() == ["spectrace: interrupted"], (p.returncode, err)
    assert not leftovers(env)


def _maps(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return ""


def test_ctrl_c_with_worker_processes_building_caches(env):
    """Ctrl-C (SIGINT to the whole process group, as a terminal sends it) while two workers build caches."""
    a, b = env.copy(NODE, "a.sqlite"), env.copy("tp1_clean", "b.sqlite")
    p = subprocess.Popen([sys.executable, "-m", "analyze.cli", "analyze", a, b, "-j", "2", "--cache", "-q"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, **env.env},
                         start_new_session=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and p.poll() is None and not list(env.inp.glob(".*.tmp-*")):
        time.sleep(0.002)
    os.killpg(p.pid, signal.SIGINT)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 130 and "Traceback" not in err, err
    assert err.strip().splitlines()[-1:] == ["spectrace: interrupted"] and len(err.strip().splitlines()) == 1, err
    assert not leftovers(env), leftovers(env)


# ---- every verb: one line and exit 2 (130 on Ctrl-C) -------------------------------------------------------

VERBS = {
    "analyze": lambda p, e: ["analyze", p],
    "comm": lambda p, e: ["comm", p],
    "report": lambda p, e: ["report", p, "-o", e.other("rep")],
    "compare": lambda p, e: ["compare", p, p],
    "whatif": lambda p, e: ["whatif", p],
}


@pytest.mark.parametrize("verb", VERBS)
@pytest.mark.parametrize("fault", ["missing", "regex", "unreadable", "ctrl_c"])
def test_every_verb_one_line(verb, fault, env, capsys, monkeypatch):
    p = env.copy()
    argv = VERBS[verb](env.inp / "nope.sqlite" if fault == "missing" else p, env)
    if fault == "regex":
        argv += ["--ranges", "(?<=x)cycle"]
    if fault == "unreadable":  # an I/O error anywhere in the run (here: reading the export's pages)
        from analyze.read import sqlite as sq

        def broken(self, *a, **k):
            raise PermissionError(13, "Permission denied", str(self.path))
        monkeypatch.setattr(sq.Reader, "frame", broken)
    if fault == "ctrl_c":
        from analyze.compute import pipeline

        def interrupted(*a, **k):
            raise KeyboardInterrupt
        monkeypatch.setattr(pipeline, "open_source", interrupted)
    rc, out, err = run_here(argv, capsys)
    lines = err.strip().splitlines()
    assert "Traceback" not in err and len(lines) == 1, err
    if fault == "ctrl_c":
        assert rc == 130 and lines == ["spectrace: interrupted"]
    else:
        assert rc == 2 and lines[0].startswith("spectrace: error: "), err
        assert {"missing": "no such file", "regex": "bad regex", "unreadable": "Permission denied"}[fault] in lines[0]
    assert not leftovers(env)


# ---- the cache: read errors during the analysis -------------------------------------------------------------


def _smash_middle(f: Path) -> None:
    """Overwrite the middle of a parquet file (its data pages), keeping its size and its last bytes."""
    data = bytearray(f.read_bytes())
    mid = len(data) // 2
    data[mid - 200: mid + 200] = b"\xa5" * 400
    f.write_bytes(bytes(data))


def test_cache_read_error_rebuilds_once(env, capsys, monkeypatch, clean):
    """A cache whose checksum still holds (only the tail is checked) but cannot be read: rebuilt once, clean numbers."""
    monkeypatch.setattr(layout, "TAIL", 16)  # the open-time check covers the last 16 bytes: a smashed middle passes it
    p = cached(env, "--store")
    shutil.rmtree(cache_of(p) / "results")  # the kept result would answer without reading the ops (result cache)
    f = max((cache_of(p) / "ops").rglob("*.parquet"), key=lambda q: q.stat().st_size)
    _smash_middle(f)
    assert layout.problem(cache_of(p), fingerprint(p)) is None  # verified on open...
    builds = []
    build = install.build
    monkeypatch.setattr(install, "build", lambda *a, **k: (builds.append(a), build(*a, **k))[1])
    rc, out, err = run_here(["analyze", p, "--format", "json", "--cache", "--store"], capsys)
    assert rc == 0 and numbers(out) == clean, err  # ...unreadable when read: rebuilt
    assert len(builds) == 1
    assert not leftovers(env)


def test_cache_unreadable_after_a_rebuild_is_one_line_naming_it(env, capsys, monkeypatch):
    """A disk that damages what is written: rebuilt once, then one line naming the folder, which is removed."""
    monkeypatch.setattr(layout, "TAIL", 16)
    build = install.build

    def damaging_build(report, dest, progress=None):
        build(report, dest, progress)
        for f in (dest / "ops").rglob("*.parquet"):
            _smash_middle(f)
        return dest

    monkeypatch.setattr(install, "build", damaging_build)
    p = env.copy()
    rc, out, err = run_here(["analyze", p, "--format", "json", "--cache", "--store"], capsys)
    lines = err.strip().splitlines()
    assert rc == 2 and len(lines) == 1 and "cannot be read even after a rebuild" in lines[0], err
    assert str(cache_of(p)) in lines[0]
    assert not cache_of(p).exists() and not leftovers(env)


def test_cache_that_does_not_verify_after_its_build(env, capsys, monkeypatch):
    build = install.build

    def losing_build(report, dest, progress=None):
        build(report, dest, progress)
        (dest / "names.parquet").unlink()
        return dest

    monkeypatch.setattr(install, "build", losing_build)
    p = env.copy()
    rc, out, err = run_here(["analyze", p, "--format", "json", "--cache"], capsys)
    lines = err.strip().splitlines()
    assert rc == 2 and len(lines) == 1 and "does not verify right after it was built" in lines[0], err
    assert str(cache_of(p)) in lines[0] and "names.parquet missing" in lines[0]
    assert not cache_of(p).exists() and not leftovers(env)


def test_cache_lists_every_file_with_rows_size_and_checksum(env):
    p = cached(env, "--store")
    meta = json.loads((cache_of(p) / "meta.json").read_text())
    files = {str(f.relative_to(cache_of(p))) for f in cache_of(p).rglob("*.parquet")}
    assert set(meta["files"]) == files and "ranges.parquet" in files
    import polars as pl

    for rel, (rows, size, tail, whole) in meta["files"].items():
        f = cache_of(p) / rel
        data = f.read_bytes()
        assert rows == pl.read_parquet(f).height and size == len(data)
        assert tail == zlib.crc32(data[-layout.TAIL:]) and whole == zlib.crc32(data)
    assert sum(meta["ops_rows"].values()) == sum(v[0] for k, v in meta["files"].items() if k.startswith("ops/"))
    assert json.loads((cache_of(p) / layout.MARKER).read_text())["pid"] == os.getpid()


def test_concurrent_runs_build_one_cache(env, clean):
    """Two runs building the same cache at once: both give the clean numbers, one cache, nothing else left."""
    p = env.copy()
    cmd = [sys.executable, "-m", "analyze.cli", "analyze", str(p), "--cache", "--format", "json", "-q"]
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env={**os.environ, **env.env}) for _ in range(2)]
    for q in procs:
        out, err = q.communicate(timeout=120)
        assert q.returncode == 0 and not err, err
        assert numbers(out) == clean
    assert {q.name for q in env.inp.iterdir()} == {p.name, p.name + location.SUFFIX}
    assert layout.problem(cache_of(p), fingerprint(p)) is None and not leftovers(env)


def test_a_live_build_folder_is_not_removed(env, capsys):
    p = env.copy()
    d = p.parent / f".{p.name}{location.SUFFIX}.tmp-alive"
    d.mkdir()
    (d / layout.MARKER).write_text(json.dumps({"host": os.uname().nodename, "pid": os.getpid()}))  # us: alive
    rc, out, err = run_here(["analyze", p, "--cache", "-q"], capsys)
    assert rc == 0 and d.is_dir()


# ---- determinism and the rest ------------------------------------------------------------------------------


def with_ties(p: Path) -> Path:
    """Three more range names on copies of every host_overhead range: four ranges whose every sum ties."""
    con = sqlite3.connect(p)
    for i in range(3):
        sid = 900_000 + i
        con.execute("INSERT INTO StringIds (id, value) VALUES (?, ?)", (sid, f"host_overhead_copy{i}"))
        cols = [r[1] for r in con.execute(f"PRAGMA table_info({NVTX})")]
        sel = ", ".join("?" if c == "textId" else c for c in cols)
        con.execute(f"INSERT INTO {NVTX} ({', '.join(cols)}) SELECT {sel} FROM {NVTX} WHERE textId = 37", (sid,))
    con.commit()
    con.close()
    return p


def test_identical_input_gives_byte_identical_json(env):
    """Two runs in two processes (hash seeds, thread timing differ): the same bytes, for every JSON verb; also
    on an input where four ranges tie in every sum (rows of equal sort keys)."""
    a, b = env.copy(NODE), env.copy("tp1_baseline")
    t = with_ties(env.copy(NODE, "ties.sqlite"))
    runs = {
        "ties": ["analyze", t, "--format", "json", "-q", "--ranges", "host_overhead"],
        "analyze": ["analyze", a, "--format", "json", "-q"],
        "comm": ["comm", a, "--format", "json", "-q"],
        "whatif": ["whatif", a, "--format", "json", "--steps-now", "3"],
        "compare": ["compare", b, a, "--format", "json"],
    }
    script = ("import sys, io, contextlib, json\nfrom analyze import cli\nout = {}\n"
              "for name, argv in json.loads(sys.argv[1]).items():\n"
              "    buf = io.StringIO()\n"
              "    with contextlib.redirect_stdout(buf):\n"
              "        assert cli.main(argv) == 0\n"
              "    out[name] = buf.getvalue()\n"
              "print(json.dumps(out))\n")
    arg = json.dumps({k: [str(x) for x in v] for k, v in runs.items()})
    outs = [subprocess.run([sys.executable, "-c", script, arg], capture_output=True, text=True, check=True,
                           env={**os.environ, **env.env}).stdout for _ in range(2)]
    first, second = (json.loads(o) for o in outs)
    for name in runs:
        assert first[name] == second[name], name
        json.loads(first[name])


def test_input_error_keeps_its_code_across_processes():
    import pickle

    from analyze.model import InputError

    e = pickle.loads(pickle.dumps(InputError("x: broken", "NO_STRINGS")))
    assert str(e) == "x: broken" and e.code == "NO_STRINGS"


def test_db_keeps_its_other_tables_and_is_replaced_whole(env, capsys, clean):
    db = env.other("db") / "r.db"
    sql(db, "CREATE TABLE mine (x)", "INSERT INTO mine VALUES (42)")
    db.chmod(0o640)
    rc, out, err = run_here(["analyze", env.copy(), "--format", "json", "-q", "--db", db], capsys)
    assert rc == 0 and numbers(out) == clean
    con = sqlite3.connect(db)
    assert con.execute("SELECT x FROM mine").fetchall() == [(42,)]
    assert con.execute("SELECT COUNT(*) FROM phases WHERE rank IS NOT NULL").fetchone()[0] == len(clean["phases"])
    con.close()
    assert stat.S_IMODE(db.stat().st_mode) == 0o640 and [q.name for q in db.parent.iterdir()] == ["r.db"]
