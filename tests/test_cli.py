"""The CLI's formats against the library's numbers."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import polars as pl
import sqlite_utils

from tests.helpers.paths import PROBE, need


def cli(*args):
    p = subprocess.run([sys.executable, "-m", "analyze.cli", *map(str, args)], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    return p.stdout, p.stderr


def test_json_keys_and_identity():
    out, err = cli("analyze", need(PROBE), "--format", "json")
    d = json.loads(out)
    assert d["nsys_version"] == "2025.3.2.0"
    assert [(r["rank"], r["pid"], r["device"]) for r in d["ranks"]] == [(0, 1412, 0), (1, 1413, 1)]
    for p in d["phases"]:
        assert {"rank", "phase", "instances", "span_ns", "busy_ns", "compute_ns", "comm_ns", "idle_ns",
                "kernel_ns", "ops"} <= set(p)
        assert p["span_ns"] == p["compute_ns"] + p["comm_ns"] + p["idle_ns"]
        assert not p["phase"].startswith(":")
    for r in d["ranges"]:
        assert {"rank", "range", "instances", "proj_span_ns", "ops"} <= set(r)
    for s in d["seams"]:
        assert {"rank", "from", "to", "instances", "idle_ns"} <= set(s)
    assert {"level", "code", "message"} <= set(d["diagnostics"][0])
    assert {"gpu_ns", "attributed_ns"} <= set(d["coverage"])
    assert err == ""  # a complete capture: no warning (nsys's "not all events" is a note in the JSON)
    assert [d["level"] for d in d["diagnostics"] if d["code"] == "INCOMPLETE_COLLECTION"] == ["info"]


def test_csv_and_db_agree_with_json(tmp_path):
    out, _ = cli("analyze", need(PROBE), "--format", "json", "-q")
    phases = pl.DataFrame(json.loads(out)["phases"])
    csv_out, _ = cli("analyze", need(PROBE), "--format", "csv", "-q")
    csv = pl.read_csv(csv_out.encode()).filter(pl.col("rank").is_not_null())
    key = ["rank", "phase"]
    assert csv.sort(key)["span_ns"].to_list() == phases.sort(key)["span_ns"].to_list()
    db = tmp_path / "r.db"
    cli("analyze", need(PROBE), "--db", db, "-q")
    rows = list(sqlite_utils.Database(db).query("select sum(idle_ns) s from phases where rank is not null"))
    assert rows[0]["s"] == phases["idle_ns"].sum()
    assert {"phases", "ranges", "seams", "ranks", "coverage", "instances", "diagnostics", "meta"} <= set(
        sqlite_utils.Database(db).table_names())


def test_table_is_readable():
    out, _ = cli("analyze", need(PROBE), "--ranges", r"^eagle3\.")
    assert "All ranks (2)" in out and "Rank 1 (pid 1413" in out
    assert "eagle3.draft → eagle3.verify" in out
    assert "Diagnostics" in out


def _parsers(p):
    """Every parser under the ``spectrace`` parser (subcommands, nested)."""
    import argparse

    yield p
    for a in p._actions:
        if isinstance(a, argparse._SubParsersAction):
            for sub in a.choices.values():
                yield from _parsers(sub)


def test_every_option_has_help():
    from analyze.cli import build_parser

    missing = [(p.prog, a.dest) for p in _parsers(build_parser()) for a in p._actions
               if a.help is None and a.dest not in ("help",) and not a.dest.endswith("command")]
    assert missing == []


def test_nsys_rep_uses_the_export_beside_it(tmp_path, capsys):
    import shutil

    from analyze.cli import main

    rep = tmp_path / "run.nsys-rep"
    rep.write_bytes(b"NSYS report, not SQLite")
    assert main(["analyze", str(rep), "-q"]) == 2
    assert "export it first" in capsys.readouterr().err
    shutil.copy(need(PROBE), tmp_path / "run.sqlite")  # exported after the capture: a note
    assert main(["analyze", str(rep), "--format", "json"]) == 0
    out = capsys.readouterr()
    d = json.loads(out.out)
    assert d["report"] == str(tmp_path / "run.sqlite") and "REPORT_EXPORT" not in out.err
    assert [x["level"] for x in d["diagnostics"] if x["code"] == "REPORT_EXPORT"] == ["info"]
    os.utime(tmp_path / "run.sqlite", (1, 1))  # older than the .nsys-rep: a warning
    assert main(["analyze", str(rep), "--format", "json"]) == 0
    assert "warning: REPORT_EXPORT" in capsys.readouterr().err


def test_samples_outside_a_checkout(tmp_path):
    """An installed copy has no tests/data: one line and exit 2 (and --help works)."""
    import shutil
    from pathlib import Path

    src = Path(__file__).resolve().parents[1] / "nvtx_hooks" / "capture" / "samples.py"
    pkg = tmp_path / "site" / "nvtx_hooks" / "capture"
    pkg.mkdir(parents=True)
    (pkg.parent / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    shutil.copy(src, pkg / "samples.py")
    env = {"PYTHONPATH": str(tmp_path / "site"), "PATH": "/usr/bin:/bin"}
    p = subprocess.run([sys.executable, "-m", "nvtx_hooks.capture.samples"], capture_output=True, text=True,
                       env=env, cwd=tmp_path)
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and "source checkout" in p.stderr and not p.stdout
    p = subprocess.run([sys.executable, "-m", "nvtx_hooks.capture.samples", "--help"], capture_output=True,
                       text=True, env=env, cwd=tmp_path)
    assert p.returncode == 0 and "usage:" in p.stdout


# ---- one option set, one meaning per flag ---------------------------------------------------------------

CAPTURE_VERBS = {"analyze": "csv", "comm": "json", "report": "html", "compare": "json", "whatif": "json"}


def test_every_capture_verb_takes_the_common_options():
    from analyze.cli import build_parser

    parser = build_parser()
    for verb, fmt in CAPTURE_VERBS.items():
        for steady in (["--skip-cycles", "2"], ["--window", "1:5"]):
            a = parser.parse_args([verb, "a.sqlite", "b.sqlite", "-q", "--format", fmt, "--ranges", "draft|verify",
                                   "--comm-pattern", "ar=^ncclX", "--comm-patterns-file", "p.txt", *steady])
            assert (a.quiet, a.format, a.ranges, a.comm_pattern, a.comm_patterns_file) == \
                (True, fmt, "draft|verify", ["ar=^ncclX"], ["p.txt"]), verb
            assert (a.skip_cycles, a.window) == ((2, None) if steady[0] == "--skip-cycles" else (None, "1:5"))


def test_did_you_mean_for_verbs_and_options(capsys):
    from analyze.cli import main

    for argv, says in ((["analyse", "x.sqlite"], "did you mean 'analyze'?"),
                       (["hooks", "chek"], "did you mean 'check'?"),
                       (["comm", "x.sqlite", "--skip-cycels", "3"], "did you mean --skip-cycles?"),
                       (["whatif", "x.sqlite", "--acceptence", "0.5"], "did you mean --acceptance?"),
                       (["compare", "a", "b", "--windw", "1:2", "--formt", "json"],
                        "did you mean --window (for --windw), --format (for --formt)?")):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.rstrip().endswith(says), err
    assert main(["analyze", "x.sqlite", "--zzzzzz"]) == 2  # nothing close: no guess
    assert "did you mean" not in capsys.readouterr().err


def test_a_path_without_its_suffix_gets_a_hint(tmp_path, capsys):
    import shutil

    from analyze.cli import main
    from tests.helpers import eagle_synth as es

    run = es.eagle(tmp_path / "run.sqlite")
    assert main(["analyze", str(tmp_path / "run"), "-q"]) == 2
    assert capsys.readouterr().err == f"spectrace: error: {tmp_path / 'run'}: no such file; did you mean {run}?\n"
    assert main(["comm", str(tmp_path / "nothing"), "-q"]) == 2
    assert "`nsys export --type sqlite NAME.nsys-rep`" in capsys.readouterr().err
    shutil.move(run, tmp_path / "run.nsys-rep")
    assert main(["whatif", str(tmp_path / "run"), "-q"]) == 2
    assert f"did you mean {tmp_path / 'run.nsys-rep'}?" in capsys.readouterr().err


def test_compare_and_whatif_take_q(tmp_path, capsys):
    from analyze.cli import main
    from tests.helpers import eagle_synth as es

    a, b = es.eagle(tmp_path / "a.sqlite"), es.eagle(tmp_path / "b.sqlite")
    assert main(["compare", str(a), str(b), "-q", "--format", "json", "--skip-cycles", "1"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["verdict"] and err == ""
    assert main(["whatif", str(a), "-q", "--steps-now", "3", "--window", "1:3"]) == 0
    assert capsys.readouterr().err == ""
