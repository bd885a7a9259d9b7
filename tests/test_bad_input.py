"""Bad input: one line on stderr, exit 2, no traceback, input unchanged."""

from __future__ import annotations

import hashlib
import shutil
import sqlite3
import subprocess
import sys

import pytest
from paths import EXTERNAL, PROBE, need
from synth import Synth


def run_cli(*args):
    p = subprocess.run([sys.executable, "-m", "analyze.cli", *map(str, args)], capture_output=True, text=True)
    return p.returncode, p.stdout, p.stderr


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
