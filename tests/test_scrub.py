"""scrub: the launch environment and the machine's process list leave; the input is never touched."""

from __future__ import annotations

import hashlib
import sqlite3

import pytest

from analyze.cli import main
from nvtx_hooks.capture.scrub import find_strings, profiled_pids, scrub

ENV = ["HOME=/home/alice", "PATH=/usr/bin:/home/alice/bin", "HF_TOKEN=hf_secret123", "NCCL_DEBUG=INFO"]
BLOB = "\x00".join(ENV) + "\x00"
G = 1 << 24  # globalTid / globalPid: pid in bits 24..47


def make_export(path):
    """A small export with the tables nsys fills with the environment and other processes."""
    con = sqlite3.connect(path)
    con.executescript("""
        CREATE TABLE StringIds(id INTEGER PRIMARY KEY, value TEXT NOT NULL);
        CREATE TABLE META_DATA_CAPTURE(name TEXT NOT NULL, value TEXT);
        CREATE TABLE TARGET_INFO_SYSTEM_ENV(globalVid INTEGER, devStateName TEXT NOT NULL, name TEXT NOT NULL,
                                            nameEnum INTEGER NOT NULL, value TEXT NOT NULL);
        CREATE TABLE PROCESSES(globalPid INTEGER, pid INTEGER, name TEXT);
        CREATE TABLE ThreadNames(nameId INTEGER NOT NULL, priority INTEGER, globalTid INTEGER);
        CREATE TABLE ProcessStreams(globalPid INTEGER NOT NULL, filenameId INTEGER NOT NULL,
                                    contentId INTEGER NOT NULL);
        CREATE TABLE NVTX_EVENTS(start INTEGER, end INTEGER, eventType INTEGER, text TEXT, globalTid INTEGER,
                                 textId INTEGER);
        CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL(start INTEGER, end INTEGER, globalPid INTEGER,
                                                correlationId INTEGER);
    """)
    con.executemany("INSERT INTO StringIds VALUES (?, ?)", [
        (1, "verify"), (2, BLOB), (3, "/tmp/nvidia/streams/pid_520_stdout.log"), (4, "program output"),
        (5, "HF_TOKEN=hf_secret123"), (6, "python3"), (7, "kworker")])
    con.executemany("INSERT INTO META_DATA_CAPTURE VALUES (?, ?)", [
        ("PROCESS_0:COMMAND", "python3"), ("PROCESS_0:WORKING_DIR", "/home/alice/work"),
        *[("PROCESS_0:ENVIRONMENT_VARIABLE", e) for e in ENV], ("PROCESS_0:CUDA_GRAPH_TRACE_OPTIONS:MODE", "Node")])
    con.executemany("INSERT INTO TARGET_INFO_SYSTEM_ENV VALUES (?, ?, ?, ?, ?)", [
        (1, "Local", "CpuCores", 1, "16"), (1, "Local", "DeviceEnvironment", 9, BLOB)])
    con.executemany("INSERT INTO PROCESSES VALUES (?, ?, ?)", [
        (520 * G, 520, "python3"), (521 * G, 521, "python3"), (77 * G, 77, "kworker"), (9 * G, 9, "sshd")])
    con.executemany("INSERT INTO ThreadNames VALUES (?, ?, ?)", [(6, 0, 520 * G + 520), (7, 0, 77 * G + 77)])
    con.execute("INSERT INTO ProcessStreams VALUES (?, 3, 4)", (520 * G,))
    con.execute("INSERT INTO NVTX_EVENTS VALUES (1, 2, 59, NULL, ?, 1)", (520 * G + 520,))
    con.execute("INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES (1, 2, ?, 1)", (521 * G,))
    con.commit()
    con.close()


def test_scrub_removes_environment_and_other_processes(tmp_path):
    src, dst = tmp_path / "in.sqlite", tmp_path / "out.sqlite"
    make_export(src)
    before = hashlib.sha256(src.read_bytes()).hexdigest()
    needles = ["HOME=", "PATH=", "hf_secret123", "NCCL_DEBUG", "/home/alice", "sshd", "kworker",
               "/tmp/nvidia/streams", "program output"]
    assert set(find_strings(src, needles)) == set(needles)
    stats = scrub(src, dst)
    assert hashlib.sha256(src.read_bytes()).hexdigest() == before  # input untouched
    assert find_strings(dst, needles) == {}
    assert stats["meta_env_rows"] == 4 and stats["processes_dropped"] == 2
    con = sqlite3.connect(dst)
    assert sorted(r[0] for r in con.execute("SELECT pid FROM PROCESSES")) == [520, 521]
    assert con.execute("SELECT value FROM StringIds WHERE id = 1").fetchone() == ("verify",)
    assert con.execute("SELECT count(*) FROM StringIds").fetchone() == (7,)  # ids kept, values blanked
    assert con.execute("SELECT value FROM TARGET_INFO_SYSTEM_ENV").fetchall() == [("16",)]
    assert con.execute("SELECT value FROM META_DATA_CAPTURE WHERE name LIKE '%MODE'").fetchone() == ("Node",)
    assert con.execute("SELECT count(*) FROM ProcessStreams").fetchone() == (0,)
    con.close()


def test_profiled_pids(tmp_path):
    make_export(tmp_path / "x.sqlite")
    con = sqlite3.connect(tmp_path / "x.sqlite")
    assert profiled_pids(con) == {520, 521}  # ThreadNames (every process) does not count
    con.close()


def test_scrub_refuses_to_overwrite(tmp_path):
    src = tmp_path / "in.sqlite"
    make_export(src)
    with pytest.raises(ValueError):
        scrub(src, src)
    (tmp_path / "out.sqlite").write_text("x")
    with pytest.raises(FileExistsError):
        scrub(src, tmp_path / "out.sqlite")
    scrub(src, tmp_path / "out.sqlite", force=True)


def test_scrub_cli(tmp_path, capsys):
    src = tmp_path / "in.sqlite"
    make_export(src)
    assert main(["scrub", str(src), "-o", str(tmp_path / "o.sqlite"), "--check", "HOME=", "--check",
                 "hf_secret"]) == 0
    assert "processes_dropped=2" in capsys.readouterr().out
    assert main(["scrub", str(src), "-o", str(tmp_path / "o.sqlite")]) == 2
    assert main(["scrub", str(tmp_path / "missing.sqlite"), "-o", str(tmp_path / "p.sqlite")]) == 2
    assert main(["scrub", str(src), "-o", str(tmp_path / "q.sqlite"), "--check", "verify"]) == 1


def test_bundled_captures_hold_no_other_process_names(tmp_path):
    """Every bundled export keeps only strings some row uses (no thread names of other processes)."""
    import lzma
    from pathlib import Path

    data = Path(__file__).parent / "data" / "h200_tp1"
    files = sorted(data.glob("*.sqlite.xz"))
    assert files
    for f in files:
        db = tmp_path / f.stem
        db.write_bytes(lzma.decompress(f.read_bytes()))
        con = sqlite3.connect(db)
        leaked = con.execute("SELECT value FROM StringIds WHERE value LIKE 'kworker%' OR value LIKE 'irq/%' "
                             "OR value LIKE '%HOME=%' OR value LIKE '%PATH=%'").fetchall()
        con.close()
        assert leaked == [], (f.name, leaked[:3])


@pytest.mark.parametrize("fmt", ["parquet", "arrow"])
def test_scrub_a_folder_export_as_its_sqlite(tmp_path, fmt, capsys):
    """A parquetdir/arrowdir export (what `spectrace trace` writes beside the SQLite by default) loses what its
    SQLite loses: the same rows of every table, the same strings blanked; the input folder untouched."""
    import polars as pl

    from bench.export_dir import write_export_dir

    src = tmp_path / "in.sqlite"
    make_export(src)
    folder = write_export_dir(src, tmp_path / "in_dir", fmt)
    before = {f.name: hashlib.sha256(f.read_bytes()).hexdigest() for f in folder.iterdir()}
    needles = ["HOME=", "PATH=", "hf_secret123", "NCCL_DEBUG", "/home/alice", "sshd", "kworker",
               "/tmp/nvidia/streams", "program output"]
    assert set(find_strings(folder, needles)) == set(needles)
    stats = scrub(folder, tmp_path / "out_dir")
    assert {f.name: hashlib.sha256(f.read_bytes()).hexdigest() for f in folder.iterdir()} == before
    assert find_strings(tmp_path / "out_dir", needles) == {}
    assert stats == scrub(src, tmp_path / "out.sqlite")  # the same counts as the SQLite's own scrub
    con = sqlite3.connect(tmp_path / "out.sqlite")
    def read(f):  # an arrowdir's files are IPC streams, as nsys writes them
        return pl.read_parquet(f) if fmt == "parquet" else pl.read_ipc_stream(f)

    for t in ("StringIds", "PROCESSES", "ThreadNames", "META_DATA_CAPTURE", "TARGET_INFO_SYSTEM_ENV",
              "ProcessStreams", "NVTX_EVENTS"):
        cur = con.execute(f'SELECT * FROM "{t}"')
        rows = sorted(map(tuple, cur.fetchall()))
        got = read(tmp_path / "out_dir" / f"{t}.{fmt}")
        assert sorted(tuple(int(v) if isinstance(v, int) else v for v in r) for r in got.iter_rows()) == rows, t
        assert got.schema == read(folder / f"{t}.{fmt}").schema, t  # the export's own types kept
    con.close()
    untouched = folder / f"CUPTI_ACTIVITY_KIND_KERNEL.{fmt}"
    assert (tmp_path / "out_dir" / untouched.name).read_bytes() == untouched.read_bytes()
    with pytest.raises(FileExistsError):
        scrub(folder, tmp_path / "out_dir")
    assert main(["scrub", str(folder), "-o", str(tmp_path / "cli_dir"), "--check", "hf_secret"]) == 0
    assert "processes_dropped=2" in capsys.readouterr().out
    assert main(["scrub", str(folder), "-o", str(folder / "inside")]) == 2  # never into the input
