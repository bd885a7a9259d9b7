"""No output depends on the export's row order (issue 38, item 5).

nsys ≥ 2025.6 no longer promises row order in its exports, timestamps included. Every table of a bundled capture is
copied with its rows in a scrambled order (a fixed permutation of the rowids: the same every run), as SQLite and as a
parquetdir (:mod:`bench.export_dir`, rows shuffled per file), and ``analyze`` (JSON and text) and ``whatif`` (JSON)
must print byte for byte what they print for the export as nsys wrote it (the paths aside). ``make test`` checks two
captures (the adaptive schedule: payload v2, accept and histogram marks, five segments, the what-if per batch size;
and TP2 with NCCL: collectives matched across ranks); the sweep over every bundled capture is marked slow (CI).
"""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

import polars as pl
import pytest

from analyze.cli import main
from analyze.read.manifest import manifest_path
from bench.export_dir import write_export_dir
from nvtx_hooks.capture import samples

_SCRAMBLE = "((rowid * 2654435761) % 4294967291)"  # a fixed permutation of the rowids (a prime modulus)


def scrambled_sqlite(src: Path, dst: Path) -> Path:
    """``src`` with every table's rows inserted in a scrambled order (so that their rowids, and any scan, follow
    it): the same schema, the same rows. Tables whose rowid is their primary key keep their order (it is the key)."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    con = sqlite3.connect(dst)
    con.execute("ATTACH DATABASE ? AS o", (str(src),))
    objs = con.execute("SELECT type, name, sql FROM o.sqlite_master WHERE sql IS NOT NULL AND name NOT LIKE "
                       "'sqlite_%' ORDER BY type = 'table' DESC, rowid").fetchall()
    for kind, name, sql in objs:
        if kind == "table":
            con.execute(sql)
            con.execute(f'INSERT INTO main."{name}" SELECT * FROM o."{name}" ORDER BY {_SCRAMBLE}')
    for kind, _, sql in objs:
        if kind in ("index", "view"):
            con.execute(sql)
    con.commit()
    con.execute("DETACH DATABASE o")
    con.close()
    return dst


def scrambled_parquetdir(src: Path, dst: Path) -> Path:
    """``src`` written as a parquetdir (:func:`bench.export_dir.write_export_dir`), each file's rows shuffled
    (seeded)."""
    write_export_dir(src, dst)
    for f in sorted(dst.glob("*.parquet")):
        df = pl.read_parquet(f)
        df.sample(fraction=1.0, shuffle=True, seed=38).write_parquet(f)
    return dst


def outputs(report: Path, capsys) -> list[str]:
    """What ``analyze`` (JSON, text) and ``whatif`` (JSON) print for ``report``, its folder written as ``<dir>``."""
    out = []
    for args in (["analyze", "--format", "json"], ["analyze"], ["whatif", "--format", "json"]):
        code = main([*args, str(report), "-q"])
        text = capsys.readouterr().out
        assert code in (0, 2), (args, code)
        out.append(f"exit {code}\n" + text.replace(str(report.parent), "<dir>"))
    return out


def _with_manifest(name: str, report: Path) -> Path:
    """``report`` with the bundled capture's manifest beside it (the steps, the batch size: what the outputs read
    from it)."""
    m = samples.data_dir(name) / f"{name}.manifest.json"
    if m.exists():
        shutil.copyfile(m, manifest_path(report))
    return report


def _same(name: str, tmp_path: Path, capsys) -> None:
    src = samples.path(name)
    plain = tmp_path / "plain" / src.name
    plain.parent.mkdir()
    plain.symlink_to(src)
    ref = outputs(_with_manifest(name, plain), capsys)
    shuffled = scrambled_sqlite(src, tmp_path / "scrambled" / src.name)
    assert outputs(_with_manifest(name, shuffled), capsys) == ref
    # parquetdir: the same export written as one, with and without its rows shuffled
    pq = tmp_path / "pq" / (src.stem + ".parquetdir")
    write_export_dir(src, pq)
    ref_pq = outputs(_with_manifest(name, pq), capsys)
    spq = scrambled_parquetdir(src, tmp_path / "spq" / (src.stem + ".parquetdir"))
    assert outputs(_with_manifest(name, spq), capsys) == ref_pq


def test_the_scramble_moves_rows(tmp_path):
    src = samples.path("tp1_adaptive_node")
    dst = scrambled_sqlite(src, tmp_path / "s.sqlite")
    q = "SELECT start FROM CUPTI_ACTIVITY_KIND_KERNEL ORDER BY rowid"
    a = [r[0] for r in sqlite3.connect(src).execute(q)]
    b = [r[0] for r in sqlite3.connect(dst).execute(q)]
    assert sorted(a) == sorted(b) and a == sorted(a) and b != sorted(b)  # the same rows, no longer in time order


@pytest.mark.parametrize("name", ["tp1_adaptive_node", "tp2_s3_node"])
def test_shuffled_exports_give_identical_outputs(name, tmp_path, capsys):
    _same(name, tmp_path, capsys)


_REST = [n for n in samples.names() if n not in ("tp1_adaptive_node", "tp2_s3_node")]


@pytest.mark.slow  # every other bundled capture: ~2.5 CPU-s each, SQLite and parquetdir (CI: make test-all)
@pytest.mark.parametrize("name", _REST)
def test_every_bundled_capture_shuffled(name, tmp_path, capsys):
    _same(name, tmp_path, capsys)
