"""Outputs written safely (rules 1 and 2), against the CLI (a process of its own) on a real capture, several
inputs per rule.

Rule 1: every file spectrace writes is new, written under a temporary name and renamed into place, after checking
that it is no input by any name and not inside an input or the cache; outputs are regular files only; a folder
spectrace did not make is refused unless ``--force``; a failed run leaves the target as it was.
Rule 2: ``--db`` writes through SQLite (a transaction on the target, its own journal or WAL), the user's other
tables kept, a failed write leaving the target as it was. Every run: no traceback, one line on an error, the
input bytes unchanged, nothing left behind.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sqlite3
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from analyze.output.targets import PAGE_START
from nvtx_hooks.capture import samples
from tests.helpers import killed_writer

ROOT = Path(__file__).resolve().parents[1]
NODE = "tp1_node"
FAKE_NSYS = Path(__file__).parent / "data" / "fake_nsys.py"


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> Path:
    return samples.path(NODE, tmp_path_factory.mktemp("pristine"))


@pytest.fixture
def world(tmp_path, pristine):
    """``in/tp1_node.sqlite`` (a copy), ``out/`` for outputs, HOME and caches inside tmp_path."""
    (tmp_path / "in").mkdir()
    (tmp_path / "out").mkdir()
    p = tmp_path / "in" / f"{NODE}.sqlite"
    shutil.copy(pristine, p)
    return p


def env_for(tmp_path: Path, **extra: str) -> dict:
    env = {**os.environ, "HOME": str(tmp_path / "home"), "XDG_CACHE_HOME": str(tmp_path / "xdg"),
           "PYTHONPATH": str(ROOT), **extra}
    env.pop("SPECTRACE_CACHE_DIR", None)
    return env


def spectrace(tmp_path: Path, *args, env: dict | None = None, **kw) -> tuple[int, str, str]:
    # a file name that is not UTF-8 is printed as its bytes: read them back as the same str
    p = subprocess.run([sys.executable, "-m", "analyze.cli", *map(str, args)], capture_output=True, text=True,
                       errors="surrogateescape", env=env or env_for(tmp_path), cwd=tmp_path, timeout=300, **kw)
    return p.returncode, p.stdout, p.stderr


def digest(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def tree(d: Path) -> dict[str, tuple]:
    """Every entry under ``d``: its bytes (files), its type and its inode."""
    out = {}
    for f in sorted(d.rglob("*")):
        s = f.lstat()
        out[str(f.relative_to(d))] = (digest(f) if f.is_file() and not f.is_symlink() else None,
                                      stat.S_IFMT(s.st_mode), s.st_ino)
    return out


def settled(tmp_path: Path, rc: int, err: str, want_rc: int, needle: str = "") -> None:
    """The exit status; on an error exactly one line with ``needle``; never a traceback; nothing left."""
    assert "Traceback" not in err, err
    assert rc == want_rc, (rc, err)
    if rc == 2:
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("spectrace: error: ") and needle in lines[0], err
    left = [p for p in tmp_path.rglob("*") if ".tmp-" in p.name or ".old-" in p.name]
    assert not left, left


def page_is_ours(d: Path) -> None:
    assert (d / "index.html").read_bytes().startswith(PAGE_START)
    listed = json.loads((d / "SPECTRACE_REPORT").read_text())["files"]
    # beside the page: figures (PNG) of older reports, and the annotated timeline (trace-event JSON)
    assert all((d / f).read_bytes()[:4] == b"\x89PNG" or (f == "timeline.trace.json" and (d / f).read_bytes()
               .startswith(b'{"traceEvents":[')) for f in listed if f != "index.html")


def device(path: Path) -> Path:
    if os.geteuid() != 0:
        pytest.skip("making a device node needs root")
    os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, 3))
    return path


def file_size_limit(kb: int):
    import resource

    return lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (kb * 1000, kb * 1000))


# ---- rule 1: every output file new, written whole, a regular file, never an input ---------------------------


def r1_report_new(t, p):
    rc, _, err = spectrace(t, "report", p, "-o", t / "out" / "rep")
    settled(t, rc, err, 0)
    page_is_ours(t / "out" / "rep")


def r1_report_into_an_empty_folder(t, p):
    (t / "out" / "rep").mkdir()
    rc, _, err = spectrace(t, "report", p, "-o", t / "out" / "rep")
    settled(t, rc, err, 0)
    page_is_ours(t / "out" / "rep")


def r1_report_again_replaces_its_own_whole(t, p):
    d = t / "out" / "rep"
    assert spectrace(t, "report", p, "-o", d)[0] == 0
    first = tree(d)
    rc, _, err = spectrace(t, "report", p, "-o", d)
    settled(t, rc, err, 0)
    page_is_ours(d)
    assert set(tree(d)) == set(first) and all(tree(d)[k][2] != first[k][2] for k in first)  # new files, every one


def r1_report_of_before_markers_is_replaced(t, p):
    """A report folder spectrace wrote before it marked them (its page and figures only) is one of ours."""
    d = t / "out" / "rep"
    assert spectrace(t, "report", p, "-o", d)[0] == 0
    (d / "SPECTRACE_REPORT").unlink()
    rc, _, err = spectrace(t, "report", p, "-o", d)
    settled(t, rc, err, 0)
    page_is_ours(d)
    (d / "SPECTRACE_REPORT").unlink()
    (d / "notes.txt").write_text("mine\n")  # then no longer only ours
    rc, _, err = spectrace(t, "report", p, "-o", d)
    settled(t, rc, err, 2, "did not make")


def r1_report_refuses_a_users_folder(t, p):
    d = t / "out" / "rep"
    d.mkdir()
    (d / "index.html").write_text("mine\n")
    before = tree(d)
    rc, _, err = spectrace(t, "report", p, "-o", d)
    settled(t, rc, err, 2, "did not make")
    assert tree(d) == before
    (d / "notes.txt").write_text("kept\n")
    rc, _, err = spectrace(t, "report", p, "-o", d, "--force")  # asked for: files of ours replaced, others kept
    settled(t, rc, err, 0)
    page_is_ours(d)
    assert (d / "notes.txt").read_text() == "kept\n"


def r1_report_figures_linked_to_the_input(t, p):
    """Files named like an older report's figures, linked to the input: refused without --force; with it the
    page (figures inline, no figure files) is written and the user's files are kept, untouched."""
    d = t / "out" / "rep"
    d.mkdir()
    os.link(p, d / "per_cycle.png")
    (d / "budget.png").symlink_to(p)
    rc, _, err = spectrace(t, "report", p, "-o", d)
    settled(t, rc, err, 2, "did not make")
    rc, _, err = spectrace(t, "report", p, "-o", d, "--force")
    settled(t, rc, err, 0)
    assert (d / "index.html").read_bytes().startswith(PAGE_START)
    assert os.path.samefile(d / "per_cycle.png", p) and os.path.samefile(d / "budget.png", p)


def r1_report_into_the_input_folder(t, p):
    (t / "out" / "link").symlink_to(p.parent)
    for d in (p.parent, t / "out" / "link", t):  # the folder holding the input, by any name, or above it
        rc, _, err = spectrace(t, "report", p, "-o", d, "--force")
        settled(t, rc, err, 2, "must not be the input")
    assert sorted(q.name for q in p.parent.iterdir()) == [p.name]


def r1_report_in_a_folder_not_utf8(t, p):
    d = Path(os.fsdecode(b"out/r\xffp"))
    rc, _, err = spectrace(t, "report", p, "-o", d)
    settled(t, rc, err, 0)
    page_is_ours(t / d)


def r1_report_past_a_file_size_limit(t, p):
    d = t / "out" / "rep"
    mpl = {"MPLCONFIGDIR": str(t / "mpl")}  # matplotlib's font list built first: past the limit it could not save it
    subprocess.run([sys.executable, "-c", "import matplotlib.font_manager"], check=True, env={**os.environ, **mpl})
    rc, _, err = spectrace(t, "report", p, "-o", d, preexec_fn=file_size_limit(20), env=env_for(t, **mpl))
    settled(t, rc, err, 2, "File too large")
    assert not d.exists()


def r1_db_that_is_not_a_regular_file(t, p):
    (t / "out" / "folder").mkdir()
    os.mkfifo(t / "out" / "fifo")
    targets = [(t / "out" / "folder", "a folder"), (t / "out" / "fifo", "a named pipe")]
    if os.geteuid() == 0:
        targets.append((device(t / "out" / "null"), "a character device"))
        (t / "out" / "tonull").symlink_to(t / "out" / "null")
        targets.append((t / "out" / "tonull", "a character device"))
    for target, kind in targets:
        rc, _, err = spectrace(t, "analyze", p, "-q", "--db", target)
        settled(t, rc, err, 2, kind)
    assert stat.S_ISFIFO((t / "out" / "fifo").stat().st_mode)
    assert os.geteuid() != 0 or stat.S_ISCHR((t / "out" / "null").stat().st_mode)


def r1_outputs_inside_the_cache(t, p):
    assert spectrace(t, "analyze", p, "-q", "--cache")[0] == 0
    cache = p.with_name(p.name + ".spectrace")
    for args in (("analyze", p, "-q", "--db", cache / "r.db"), ("analyze", p, "-q", "--db", cache / "ops" / "r.db"),
                 ("report", p, "-o", cache / "rep"), ("report", p, "-o", cache, "--force")):
        rc, _, err = spectrace(t, *args)
        settled(t, rc, err, 2, "inside spectrace's cache")
    assert not (cache / "r.db").exists() and not (cache / "rep").exists()


def r1_trace_manifest(t, p):
    exe = t / "nsys"
    exe.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{FAKE_NSYS}" "$@"\n')
    exe.chmod(0o755)
    m = t / "out" / "run.manifest.json"
    m.write_text('{"mine": true}\n')
    cmd = ("trace", "--nsys", exe, "-o", t / "out" / "run", "--", sys.executable, "-c", "pass")
    rc, _, err = spectrace(t, *cmd)
    settled(t, rc, err, 2, "--force")
    assert m.read_text() == '{"mine": true}\n' and not (t / "out" / "run.nsys-rep").exists()
    rc, _, err = spectrace(t, *cmd[:5], "--force", *cmd[5:])
    settled(t, rc, err, 0)
    assert json.loads(m.read_text())["schema"].startswith("spectrace.trace-manifest")


def r1_scrub_onto_the_input(t, p):
    os.link(p, t / "out" / "hard.sqlite")
    (t / "out" / "soft.sqlite").symlink_to(p)
    for target in (p, t / "out" / "hard.sqlite", t / "out" / "soft.sqlite"):
        rc, _, err = spectrace(t, "scrub", p, "-o", target, "--force")
        settled(t, rc, err, 2, "must not be the input")
    rc, _, err = spectrace(t, "scrub", p, "-o", t / "out" / "new.sqlite")
    settled(t, rc, err, 0)


RULE1 = {f.__name__[3:]: f for f in (
    r1_report_new, r1_report_into_an_empty_folder, r1_report_again_replaces_its_own_whole,
    r1_report_of_before_markers_is_replaced,
    r1_report_refuses_a_users_folder, r1_report_figures_linked_to_the_input, r1_report_into_the_input_folder,
    r1_report_in_a_folder_not_utf8, r1_report_past_a_file_size_limit, r1_db_that_is_not_a_regular_file,
    r1_outputs_inside_the_cache, r1_trace_manifest, r1_scrub_onto_the_input)}


@pytest.mark.parametrize("case", RULE1)
def test_rule1_every_output_file_is_new_and_never_an_input(case, tmp_path, world):
    before = digest(world)
    RULE1[case](tmp_path, world)
    assert digest(world) == before


# ---- rule 2: --db through SQLite ------------------------------------------------------------------------


def users_db(db: Path, mode: str = "delete") -> None:
    con = sqlite3.connect(db)
    con.execute(f"PRAGMA journal_mode={mode}")
    con.execute("CREATE TABLE mine (x)")
    con.execute("INSERT INTO mine VALUES (42)")
    con.commit()
    con.close()


def sound(db: Path, mine: list | None = None, phases: int | None = None) -> None:
    """The database passes SQLite's integrity check, holds the user's table (``mine``: its rows) and (``phases``)
    our results."""
    con = sqlite3.connect(db)
    try:
        assert con.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        if mine:
            assert con.execute("SELECT x FROM mine").fetchall() == mine
        if phases is not None:
            assert con.execute("SELECT COUNT(*) FROM phases").fetchone()[0] == phases
            assert con.execute("SELECT COUNT(*) FROM meta").fetchone()[0] > 0
    finally:
        con.close()


def analyze_db(t: Path, p: Path, db, *opts, **kw) -> tuple[int, dict | None, str]:
    rc, out, err = spectrace(t, "analyze", p, "--format", "json", "-q", "--db", db, *opts, **kw)
    return rc, (json.loads(out) if out.strip() else None), err


def phases_rows(doc: dict) -> int:
    return len(doc["phases"]) + len(doc["phases_all_ranks"])


def r2_new(t, p):
    db = t / "out" / "r.db"
    rc, doc, err = analyze_db(t, p, db)
    settled(t, rc, err, 0)
    sound(db, phases=phases_rows(doc))
    assert sorted(q.name for q in db.parent.iterdir()) == ["r.db"]


def r2_keeps_the_users_tables(t, p):
    db = t / "out" / "r.db"
    users_db(db)
    db.chmod(0o640)
    rc, doc, err = analyze_db(t, p, db)
    settled(t, rc, err, 0)
    sound(db, [(42,)], phases_rows(doc))
    assert stat.S_IMODE(db.stat().st_mode) == 0o640 and sorted(q.name for q in db.parent.iterdir()) == ["r.db"]
    rc, doc, err = analyze_db(t, p, db)  # again: its own tables replaced, the user's kept
    settled(t, rc, err, 0)
    sound(db, [(42,)], phases_rows(doc))


def r2_wal_with_committed_frames(t, p):
    db = t / "out" / "r.db"
    users_db(db, "wal")
    killed_writer.wal_frames(db, t, "INSERT INTO mine VALUES (43)")  # committed, not yet checkpointed
    rc, doc, err = analyze_db(t, p, db)
    settled(t, rc, err, 0)
    sound(db, [(42,), (43,)], phases_rows(doc))
    con = sqlite3.connect(db)
    assert con.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    con.close()


def r2_hot_journal(t, p):
    db = t / "out" / "r.db"
    users_db(db)
    # what a writer killed here leaves: pages spilled into the file, and the journal
    killed_writer.hot_journal(db, t, "DELETE FROM mine", *killed_writer.SPILL)
    rc, doc, err = analyze_db(t, p, db)
    settled(t, rc, err, 0)
    sound(db, [(42,)], phases_rows(doc))
    assert not (t / "out" / "r.db-journal").exists()


def r2_held_by_another_writer(t, p):
    db = t / "out" / "r.db"
    users_db(db)
    code = (f"import sqlite3, time\ncon = sqlite3.connect({str(db)!r}, isolation_level=None)\n"
            "con.execute('BEGIN IMMEDIATE')\ncon.execute('INSERT INTO mine VALUES (99)')\nprint('ready', flush=True)\n"
            "time.sleep(60)\n")
    w = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert w.stdout.readline().strip() == "ready"
        t0 = time.monotonic()
        rc, doc, err = analyze_db(t, p, db)
        settled(t, rc, err, 2, "locked")
        assert doc is not None and time.monotonic() - t0 < 60  # the results on stdout all the same
    finally:
        w.kill()
        w.wait()
    sound(db, [(42,)])  # the writer's change rolled back, ours never made
    con = sqlite3.connect(db)
    assert con.execute("SELECT name FROM sqlite_master WHERE name = 'phases'").fetchall() == []
    con.close()


def r2_fails_midway_as_it_was(t, p):
    db = t / "out" / "r.db"
    users_db(db)
    con = sqlite3.connect(db)
    con.execute("CREATE TABLE pad (x)")
    con.execute("INSERT INTO pad SELECT randomblob(1000) FROM (WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL "
                "SELECT i + 1 FROM c WHERE i < 60) SELECT i FROM c)")
    con.commit()
    con.close()
    before = digest(db)
    rc, doc, err = analyze_db(t, p, db, preexec_fn=file_size_limit(db.stat().st_size // 1000 + 8))
    settled(t, rc, err, 2, "it is as it was")
    assert digest(db) == before and doc is not None
    sound(db, [(42,)])
    new = t / "out" / "new.db"
    rc, doc, err = analyze_db(t, p, new, preexec_fn=file_size_limit(8))
    settled(t, rc, err, 2, "cannot write the results database")
    assert not new.exists()


def r2_not_a_database(t, p):
    db = t / "out" / "r.db"
    db.write_text("text, not SQLite\n" * 400)
    before = digest(db)
    rc, doc, err = analyze_db(t, p, db)
    settled(t, rc, err, 2, "cannot write the results database")
    assert digest(db) == before


def r2_names_not_utf8(t, p):
    odd = p.with_name(os.fsdecode(b"r\xffn.sqlite"))
    shutil.copy(p, odd)
    db = Path(os.fsdecode(b"out/r\xfe.db"))
    rc, doc, err = analyze_db(t, odd, db)
    settled(t, rc, err, 0)
    sound(t / db, phases=phases_rows(doc))
    con = sqlite3.connect(t / db)
    assert any("r\ufffdn.sqlite" in v for (v,) in con.execute("SELECT value FROM meta"))
    con.close()
    odd.unlink()


RULE2 = {f.__name__[3:]: f for f in (
    r2_new, r2_keeps_the_users_tables, r2_wal_with_committed_frames, r2_hot_journal, r2_held_by_another_writer,
    r2_fails_midway_as_it_was, r2_not_a_database, r2_names_not_utf8)}


@pytest.mark.parametrize("case", RULE2)
def test_rule2_db_is_written_through_sqlite(case, tmp_path, world):
    before = digest(world)
    RULE2[case](tmp_path, world)
    assert digest(world) == before
