"""The result cache: a second command on the same capture reads the analysis instead of redoing it,
and a stale result is never served.

Every test analyses a bundled real TP=2 capture through its cache (``cache=True``) and checks, by making the
analysis itself fail (``pipeline._run`` replaced), whether a result came from the cache; outputs from the cache
are compared with those of a fresh analysis with no cache at all.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import pickle
import shutil
import sqlite3
from pathlib import Path

import pytest

from analyze import api
from analyze.compute import pipeline
from analyze.compute.comm_patterns import PATTERNS
from analyze.compute.whatif import to_dict
from analyze.model import CycleChoice
from analyze.output import data, text
from analyze.read import results
from analyze.read.store import cache_dir_for
from tests.helpers.paths import tp2


@pytest.fixture(scope="module")
def capture(tmp_path_factory):
    return tp2("tp2_s3_node", tmp_path_factory.mktemp("rc"))


@pytest.fixture
def report(capture, tmp_path):
    """A private copy of the capture and its manifest (each test has its own cache)."""
    dst = tmp_path / capture.name
    shutil.copyfile(capture, dst)
    shutil.copyfile(capture.with_name("tp2_s3_node.manifest.json"), tmp_path / "tp2_s3_node.manifest.json")
    return dst


class Fresh(Exception):
    pass


@pytest.fixture
def no_analysis(monkeypatch):
    """Make the analysis proper fail: whatever still works came from the result cache."""
    def fail(*a, **k):
        raise Fresh

    def on():
        monkeypatch.setattr(pipeline, "_run", fail)
    return on


def outputs(res) -> tuple[str, str, str]:
    from analyze.compute.findings import find

    return data.to_json(res), data.to_csv(res, "phases"), text.analyze_table(res, find(res))


def results_dir(report):
    return cache_dir_for(report) / results.FOLDER


def test_second_analysis_reads_the_result_and_outputs_are_identical(report, no_analysis):
    fresh = outputs(api.analyze(report, cache=False))
    first = api.analyze(report, cache=True)
    assert outputs(first) == fresh
    api.keep_derived(first)  # the headline tables the outputs computed, kept beside the result
    kept = sorted(p.name for p in (results_dir(report)).iterdir())
    assert len(kept) == 1 and sorted(q.name.split("-")[0] for q in (results_dir(report) / kept[0]).glob("memo-*")) \
        == ["memo"]
    no_analysis()
    second = api.analyze(report, cache=True)
    assert outputs(second) == fresh
    third = api.analyze(report)  # the default (cache=None) reuses it too
    assert outputs(third) == fresh
    # another cycle choice: its headline tables are computed from the kept result, equal to a fresh analysis's
    skip = api.analyze(report, skip_cycles=5)
    assert results._kept(skip) is not None


def test_skip_cycles_from_the_cache_equal_a_fresh_analysis(report):
    fresh = outputs(api.analyze(report, cache=False, skip_cycles=5))
    api.keep_derived(api.analyze(report, cache=True))  # default choice kept first
    assert outputs(api.analyze(report, cache=True, skip_cycles=5)) == fresh
    again = api.analyze(report, cache=True, skip_cycles=5)
    assert outputs(again) == fresh


def test_every_verb_equals_a_fresh_run(report, tmp_path, no_analysis):
    want_comm = api.comm(report, cache=False).to_dict()
    want_whatif = data.doc_json(to_dict(api.whatif(report, 3, cache=False), 10))
    want_cmp = api.compare(report, report, cache=False)
    api.comm(report, cache=True)
    api.whatif(report, 3, cache=True)
    no_analysis()
    assert api.comm(report, cache=True).to_dict().keys() == want_comm.keys()
    assert data.doc_json(api.comm(report, cache=True).to_dict()) == data.doc_json(want_comm)
    assert data.doc_json(to_dict(api.whatif(report, 3, cache=True), 10)) == want_whatif
    assert data.doc_json(api.compare(report, report, cache=True).to_dict()) == data.doc_json(want_cmp.to_dict())


@pytest.mark.parametrize("change", ["ranges", "comm_patterns", "version", "code", "manifest", "report_path"])
def test_a_change_of_what_the_result_depends_on_is_a_fresh_analysis(report, monkeypatch, no_analysis, change):
    api.analyze(report, cache=True)
    kw: dict = {}
    if change == "ranges":
        kw["ranges"] = "cycle|verify"
    elif change == "comm_patterns":
        kw["comm_patterns"] = list(PATTERNS)[:1]
    elif change == "version":
        monkeypatch.setattr(results, "__version__", "99.0")
    elif change == "code":
        monkeypatch.setattr(results, "code_digest", lambda: "another build of spectrace")
    elif change == "manifest":
        man = report.with_name("tp2_s3_node.manifest.json")
        doc = json.loads(man.read_text())
        doc["note"] = "edited"
        man.write_text(json.dumps(doc))
    no_analysis()
    target = f"./{report.name}" if change == "report_path" else report
    if change == "report_path":
        monkeypatch.chdir(report.parent)
    with pytest.raises(Fresh):
        api.analyze(target, cache=True, **kw)


def test_a_changed_input_is_never_served_the_old_result(report, no_analysis):
    before = api.analyze(report, cache=True)
    con = sqlite3.connect(report)  # one more NVTX range: the file's size, mtime and content change
    con.execute("INSERT INTO NVTX_EVENTS (start, end, eventType, globalTid, text) "
                "SELECT start + 1, end + 1, eventType, globalTid, 'extra' FROM NVTX_EVENTS LIMIT 1")
    con.commit()
    con.close()
    no_analysis()
    with pytest.raises(Fresh):
        api.analyze(report, cache=True)
    assert before.instances.height > 0


def test_a_damaged_result_is_analysed_again(report):
    first = outputs(api.analyze(report, cache=True))
    folder = next(results_dir(report).iterdir())
    big = max(folder.glob("*.arrow"), key=lambda f: f.stat().st_size)
    raw = bytearray(big.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    big.write_bytes(bytes(raw))
    assert results.load(folder.parent.parent, folder.name) is None
    assert outputs(api.analyze(report, cache=True)) == first
    (folder / "result.json").write_text((folder / "result.json").read_text().replace('"rank"', '"rnak"', 1))
    assert results.load(folder.parent.parent, folder.name) is None


def test_keep_ops_and_no_cache_never_use_it(report, no_analysis):
    api.analyze(report, cache=True)
    no_analysis()
    with pytest.raises(Fresh):
        api.analyze(report, cache=True, keep_ops=True)
    with pytest.raises(Fresh):
        api.analyze(report, cache=False)


def test_a_cached_result_pickles_as_a_plain_result_and_copies_keep_nothing(report):
    api.analyze(report, cache=True)
    res = api.analyze(report, cache=True)
    assert results._kept(res) is not None
    back = pickle.loads(pickle.dumps(res))
    assert type(back) is type(res).__mro__[1] and back.instances.equals(res.instances)
    copy = dataclasses.replace(res, cycle_choice=CycleChoice(skip_cycles=1))
    assert results._kept(copy) is None and not results.keep_derived(copy)


def test_an_unwritable_cache_still_analyses(report, monkeypatch):
    monkeypatch.setattr(results, "_write_doc", lambda *a, **k: False)
    assert outputs(api.analyze(report, cache=True)) == outputs(api.analyze(report, cache=False))


def test_frames_round_trip_exactly_with_long_string_columns_dictionary_encoded(tmp_path):
    """Frames of every dtype the results hold come back equal, long string columns (written as dictionaries)
    as strings again, nulls kept; a short frame is written as it is."""
    import polars as pl

    n = results.DICT_ROWS + 7
    long = pl.DataFrame({"name": [None if i % 5 == 0 else f"k{i % 3}" for i in range(n)],
                         "x": pl.Series(range(n), dtype=pl.Int64), "cat": pl.Series(["a", "b"] * (n // 2) + ["a"] * (n % 2),
                                                                                    dtype=pl.Categorical),
                         "u": pl.Series(range(n), dtype=pl.UInt32), "f": [i / 3 for i in range(n)],
                         "b": [i % 2 == 0 for i in range(n)]})
    short = long.head(3)
    frames: list = []
    body = results._encode({"long": long, ("t", "1"): (short, 2.5, None), "s": long["name"]}, frames)
    assert results._write_doc(tmp_path, "k", "key", body, frames)
    doc = json.loads((tmp_path / "k" / "result.json").read_text())
    assert [f[2] for f in doc["files"]] == [["name"], [], ["name"]]
    back = results._decode(*results._read_doc(tmp_path / "k", "key"))
    assert back["long"].schema == long.schema and back["long"].equals(long)
    assert back[("t", "1")][0].equals(short) and back[("t", "1")][1:] == (2.5, None)
    assert back["s"].equals(long["name"])
    assert results._read_doc(tmp_path / "k", "another key") is None


def test_values_read_from_the_cache_can_be_kept_again(report):
    """comm's matching holds the kept result's diagnostics (read from the cache): it is kept all the same, and
    the next comm reads it (no matching) with the same document."""
    from analyze.compute import collectives

    want = data.doc_json(api.comm(report, cache=False).to_dict())
    api.analyze(report, cache=True)
    assert data.doc_json(api.comm(report, cache=True).to_dict()) == want  # result read, matching computed, kept
    res = api.analyze(report, cache=True)
    assert ("comm_document", "[]") in results._kept(res).derived
    frames: list = []
    assert results._encode(res.diagnostics, frames)[0]["$class"] == "Diagnostic"

    def no_matching(*a, **k):
        raise AssertionError("matched again")

    orig = collectives.cross_rank
    collectives.cross_rank = no_matching
    try:
        assert data.doc_json(api.comm(report, cache=True).to_dict()) == want
    finally:
        collectives.cross_rank = orig


def test_a_result_that_is_gone_leaves_nothing_behind(report):
    """What the cache remembers of a result (its folder, the derived tables read) lives on the result and goes
    with it: nothing else holds the result or its entry."""
    import gc
    import weakref

    api.analyze(report, cache=True)
    res = api.analyze(report, cache=True)
    entry = results._kept(res)
    assert entry is not None and entry.derived is not None
    gone, gone_entry = weakref.ref(res), weakref.ref(entry)
    del res, entry
    gc.collect()
    assert gone() is None and gone_entry() is None


def test_a_store_keeps_the_most_recently_used_results_and_removes_dead_builds(tmp_path):
    import os
    import time

    parent = tmp_path / "results"
    parent.mkdir()
    now = time.time()
    for i in range(7):  # r0 oldest ... r6 newest
        (parent / f"r{i}").mkdir()
        (parent / f"r{i}" / "result.json").write_text("{}")
        os.utime(parent / f"r{i}", (now - 100 + i, now - 100 + i))
    dead, alive = parent / ".r9.tmp-aaaaaaaaaaaa", parent / ".r8.tmp-bbbbbbbbbbbb"
    dead.mkdir()
    alive.mkdir()
    os.utime(dead, (now - results.STALE_S - 10, now - results.STALE_S - 10))
    results.prune(parent, "r1")  # the one just written stays, whatever its age
    assert sorted(p.name for p in parent.iterdir()) == sorted(["r1", "r4", "r5", "r6", alive.name])
    assert results.KEEP_RESULTS == 4


def test_reading_a_result_marks_it_used(report):
    import os

    api.analyze(report, cache=True)
    folder = next(results_dir(report).iterdir())
    os.utime(folder, (1, 1))
    api.analyze(report, cache=True)
    assert folder.stat().st_mtime > 1e9


def test_the_code_digest_covers_the_phase_definitions_compute_reads():
    """nvtx_hooks/phases.py (phase names, payload encoding) changes what compute makes of a trace: it is in the
    digest, as are every module of analyze's model, read and compute layers."""
    import analyze
    import nvtx_hooks.phases

    root = Path(analyze.__file__).resolve().parent
    want = sorted([root / "model.py", root / "__init__.py", *(root / "read").glob("*.py"),
                   *(root / "compute").glob("*.py"), Path(nvtx_hooks.phases.__file__).resolve()])
    h = hashlib.blake2b(digest_size=16)
    for f in want:
        h.update(f.name.encode())
        h.update(f.read_bytes())
    assert results.code_digest() == h.hexdigest()


def test_the_whatif_model_and_findings_are_kept_and_read_back_per_option(report, monkeypatch, no_analysis):
    """whatif's fitted model (with its per-batch-size models and replays) and the default findings are kept with the
    result: a second command reads them (fit and rules made to fail) and its outputs equal a fresh run's; other
    options (steps, acceptance, as traced, the cycle choice) are a model of their own, fitted afresh."""
    from analyze.compute import findings, whatif, whatif_fit

    want = {(s, a): data.doc_json(to_dict(api.whatif(report, s, acceptance=a, cache=False), 10))
            for s, a in ((3, None), (2, None), (3, 0.5))}
    want_json = data.to_json(api.analyze(report, cache=False))
    first = api.analyze(report, cache=True)
    assert data.to_json(first) == want_json
    api.keep_derived(first)
    assert data.doc_json(to_dict(api.whatif(report, 3, cache=True), 10)) == want[(3, None)]
    no_analysis()
    fits = []
    real_fit = whatif_fit.fit
    monkeypatch.setattr(whatif, "fit", lambda *a, **k: (fits.append(a[1:]), real_fit(*a, **k))[1])
    monkeypatch.setattr(findings, "_find", lambda *a: (_ for _ in ()).throw(AssertionError("rules run again")))
    second = api.analyze(report, cache=True)
    assert data.to_json(second) == want_json  # the findings read back (the rules would fail)
    m = api.whatif(report, 3, cache=True)
    assert type(m).__name__ == "Model" and m._runs  # read back with its replays
    assert data.doc_json(to_dict(m, 10)) == want[(3, None)]
    assert fits == []  # nothing fitted: read
    assert data.doc_json(to_dict(api.whatif(report, 2, cache=True), 10)) == want[(2, None)]
    assert data.doc_json(to_dict(api.whatif(report, 3, acceptance=0.5, cache=True), 10)) == want[(3, 0.5)]
    assert len(fits) == 2  # another step count and another acceptance: fitted, not served the kept one


def test_numpy_arrays_round_trip_exactly(tmp_path):
    import numpy as np

    v = {"f": np.array([[1.5, np.nan], [np.inf, -0.0]]), "i": np.arange(6, dtype=np.int64).reshape(2, 3),
         "b": np.array([True, False]), "s": np.float64(2.5), "n": np.int64(7)}
    frames: list = []
    body = results._encode(v, frames)
    assert results._write_doc(tmp_path, "k", "k", body, frames)
    back = results._decode(*results._read_doc(tmp_path / "k", "k"))
    for k in ("f", "i", "b"):
        assert back[k].dtype == v[k].dtype and back[k].shape == v[k].shape
        assert np.array_equal(back[k], v[k], equal_nan=k == "f") and back[k].flags.writeable
    assert back["s"] == 2.5 and back["n"] == 7 and type(back["n"]) is int
    with pytest.raises(results._Unsupported):
        results._encode(np.array(["a"], dtype=object), [])


@pytest.mark.slow  # the heaviest test (about 20 CPU-s: eleven reports drawn); make test-all (CI) runs it
def test_a_second_report_reads_its_figures_and_a_changed_option_or_output_code_draws_them(report, tmp_path,
                                                                                           monkeypatch, no_analysis):
    """The report's figures are kept with the result: the same page again reads them (drawing made to fail) and is
    byte-identical to a fresh run's; another --steps-now, cycle choice, --vs, output code or matplotlib version is
    drawn afresh (and equal to a fresh run's)."""
    from analyze.output import html

    def page(name: str, **kw) -> bytes:
        return api.report(report, tmp_path / name, **kw).read_bytes()

    fresh = page("fresh", steps_now=3, cache=False)
    assert page("first", steps_now=3, cache=True) == fresh  # analysed, drawn, figures kept
    no_analysis()
    drawn: list[str] = []
    real = html._plots
    monkeypatch.setattr(html, "_plots", lambda: (_ for _ in ()).throw(AssertionError("drawn again")))
    assert page("second", steps_now=3, cache=True) == fresh  # nothing analysed, nothing drawn
    assert page("third", steps_now=3) == fresh  # the default (cache=None) reads them too
    monkeypatch.setattr(html, "_plots", lambda: (drawn.append("x"), real())[1])
    skip = page("skip", steps_now=3, cache=True, skip_cycles=5)
    assert drawn and skip != fresh  # another cycle choice: other figures
    monkeypatch.undo()
    want = {"steps": page("fresh_steps", steps_now=2, cache=False),
            "vs": page("fresh_vs", steps_now=3, vs=report, cache=False)}
    for change in ("steps", "vs", "output", "matplotlib"):
        no_analysis()
        drawn.clear()
        monkeypatch.setattr(html, "_plots", lambda: (drawn.append("x"), real())[1])
        kw: dict = {"steps_now": 2 if change == "steps" else 3, "vs": report if change == "vs" else None}
        if change == "output":
            monkeypatch.setattr(html, "output_digest", lambda: "another page code")
        if change == "matplotlib":
            monkeypatch.setattr(html.importlib.metadata, "version", lambda name: "0.1")
            monkeypatch.setattr(html, "output_digest", html.output_digest.__wrapped__)
        assert page(f"changed_{change}", cache=True, **kw) == want.get(change, fresh)
        assert drawn, change  # drawn afresh, not served the kept figures
        monkeypatch.undo()


def test_bytes_round_trip_exactly_outside_the_json(tmp_path):
    v = {"png": b"\x89PNG\r\n\x1a\n\x00\xff" * 100, "empty": b""}
    frames: list = []
    body = results._encode(v, frames)
    assert b"PNG".decode() not in json.dumps(body) and len(frames) == 2
    assert results._write_doc(tmp_path, "k", "k", body, frames)
    assert results._decode(*results._read_doc(tmp_path / "k", "k")) == v


def test_a_result_written_behind_is_waited_for_and_its_failures_surface(report, monkeypatch, no_analysis):
    """Inside writing_behind (the CLI's analysis verbs), the result's files are written on a thread while the
    outputs are made: the outputs equal a fresh analysis's, keep_derived and a second analysis of the same report
    wait for the write (the second reads it: nothing analysed), leaving the context waits for every write; an
    unexpected failure of the writing is raised where it is waited for, an expected one (a read-only cache) only
    leaves the result unkept."""
    fresh = outputs(api.analyze(report, cache=False))
    with results.writing_behind():
        first = api.analyze(report, cache=True)
        entry = results._kept(first)
        assert entry is not None and entry.writing is not None  # under way, or done and not yet waited for
        assert outputs(first) == fresh
        assert results.keep_derived(first)  # its own folder first, then the derived tables beside it
        assert entry.writing is None and not results._WRITING
    folder = next(results_dir(report).iterdir())
    assert (folder / "result.json").is_file() and list(folder.glob("memo-*"))
    shutil.rmtree(results_dir(report))
    with results.writing_behind():
        api.analyze(report, cache=True)
        with monkeypatch.context() as m:
            m.setattr(pipeline, "_run", lambda *a, **k: (_ for _ in ()).throw(Fresh()))
            assert outputs(api.analyze(report, cache=True)) == fresh  # waited for the write, then read it
    assert not results._WRITING

    def broken(*a, **k):
        raise RuntimeError("a bug in the writing")

    shutil.rmtree(results_dir(report))
    monkeypatch.setattr(results, "_write_doc", broken)
    with pytest.raises(RuntimeError, match="a bug in the writing"):
        with results.writing_behind():
            res = api.analyze(report, cache=True)
            results.keep_derived(res)
    with pytest.raises(RuntimeError, match="a bug in the writing"), results.writing_behind():
        res = api.analyze(report, cache=True)  # never waited for by the caller: leaving the context raises it
    assert results._kept(res) is not None and not results._WRITING
    monkeypatch.setattr(results, "_write_doc", lambda *a, **k: False)
    with results.writing_behind():
        res = api.analyze(report, cache=True)
        assert outputs(res) == fresh and not results.keep_derived(res) and results._kept(res) is None
    assert not results_dir(report).exists() or not list(results_dir(report).iterdir())


def test_the_cli_writes_the_result_before_it_exits(report, tmp_path, capsys):
    from analyze import cli

    assert cli.main(["analyze", str(report), "--cache", "--format", "json", "-q"]) == 0
    folder = next(results_dir(report).iterdir())
    assert (folder / "result.json").is_file() and list(folder.glob("memo-*")) and not results._WRITING
    assert json.loads(capsys.readouterr().out)["phases"]


def test_a_ctrl_c_while_written_behind_leaves_the_result_whole(report, monkeypatch):
    """A Ctrl-C while the result is written behind: the context does not wait for it (the interrupt goes on at
    once); the write, on a thread that is not a daemon, finishes and renames its folder into place: whole, never
    half-written (what the process does before it ends)."""
    import threading

    release = threading.Event()
    real = results._write_doc

    def slow(*a, **k):
        release.wait(10)
        return real(*a, **k)

    monkeypatch.setattr(results, "_write_doc", slow)
    with pytest.raises(KeyboardInterrupt), results.writing_behind():
        res = api.analyze(report, cache=True)
        writing = results._kept(res).writing
        assert writing is not None and not writing.thread.daemon and writing.thread.is_alive()
        raise KeyboardInterrupt
    assert writing.thread.is_alive() and not any(results_dir(report).glob("[!.]*"))  # nothing renamed yet
    release.set()
    assert results.wait()
    folder = next(p for p in results_dir(report).iterdir() if not p.name.startswith("."))
    assert results.load(folder.parent.parent, folder.name) is not None
    assert not [p for p in results_dir(report).iterdir() if p.name.startswith(".")]  # no build folder left
