"""The Python samples' frames (nsys --python-sampling, exported --include-blobs=true): the payload layout
(nvtx_hooks.capture.python_frames) on a hand-built blob, the polars decode (analyze.read.export.python_samples)
against the byte-by-byte one on a real H200 capture, the scrub keeping the names the frames use, and the host-gap
anatomy naming the busy function the workload injected (tests/data/h200_tp1/tp1_pyframes: its record is the truth)."""

from __future__ import annotations

import json
import sqlite3
import struct

import polars as pl
import pytest

import analyze
from analyze.compute import host_gaps
from analyze.read import export
from nvtx_hooks.capture import python_frames, samples
from nvtx_hooks.capture.scrub import scrub


def _blob(frames: list[tuple[int, int, int]], at: int = 32) -> bytes:
    head = struct.pack("<QQQQ", 1, (1 << 32) | 2, 16 + 24 * len(frames), at)[:at].ljust(at, b"\0")
    payload = struct.pack("<QII", 1, 1, len(frames)) + b"".join(struct.pack("<QQQ", *f) for f in frames)
    return head + payload


def test_the_layout_on_a_hand_built_blob():
    assert python_frames.frames(_blob([(7, 8, 100), (9, 8, 12)])) == [(7, 8, 100), (9, 8, 12)]
    assert python_frames.frames(_blob([(7, 8, 100)], at=40)) == [(7, 8, 100)]  # the payload where the header says
    assert python_frames.frames(_blob([(7, 8, 100), (9, 8, 12)])[:-8]) == []  # cut short: nothing, no error
    assert python_frames.frames(b"") == []


@pytest.fixture(scope="module")
def cap():
    return samples.path("tp1_pyframes")


def test_the_polars_decode_equals_the_byte_by_byte_one(cap):
    con = sqlite3.connect(cap)
    names = dict(con.execute("SELECT id, value FROM StringIds"))
    rows = con.execute("""SELECT start, binaryData FROM NVTX_EVENTS WHERE binaryData IS NOT NULL AND domainId IN
                          (SELECT domainId FROM NVTX_PAYLOAD_SCHEMAS WHERE name = 'Python Periodic Sampling')""").fetchall()
    gtids = [g for (g,) in con.execute("SELECT DISTINCT globalTid FROM NVTX_EVENTS WHERE binaryData IS NOT NULL")]
    con.close()
    want = {}
    for t, b in rows:
        fn, fl, line = python_frames.frames(b)[0]
        esc = names[fn].replace("&lt;", "<").replace("&gt;", ">")
        want[t] = f"{esc} ({names[fl].split('/')[-1].replace('&lt;', '<').replace('&gt;', '>')}:{line})"
    got = export.python_samples(cap, gtids)
    assert got is not None and got.height == len(rows) > 1000
    assert dict(zip(got["time"].to_list(), got["frame"].to_list(), strict=True)) == want


def test_the_scrub_keeps_the_names_the_frames_use(cap, tmp_path):
    out = tmp_path / "again.sqlite"
    scrub(cap, out)
    con = sqlite3.connect(out)
    assert con.execute("SELECT count(*) FROM StringIds WHERE value = 'spectrace_busy_python'").fetchone()[0] == 1
    con.close()


def test_the_busy_function_is_the_top_python_frame_of_its_scheduler_function(cap):
    truth = json.loads((samples.data_dir("tp1_pyframes") / "tp1_pyframes.manifest.json").read_text())
    sched = truth["program_output"][0]["scheduler"]
    hg = host_gaps.host_gaps(analyze.analyze(cap))
    item = f"scheduler.{sched['busy_in']}"
    py = hg.python_frames.filter(pl.col("item") == item).sort("samples", descending=True)
    assert py.height and py["frame"][0].startswith(sched["busy_function"] + " (")
    # its share of the item's Python samples: about its share of the function's own host time (busy 300 µs of
    # busy + the emulated 200 µs): within 0.15
    own = sched["us"][sched["busy_in"]]
    assert py["share"][0] == pytest.approx(sched["busy_us"] / (sched["busy_us"] + own), abs=0.15)
    # no Python sampling in the export: no Python frames, the native ones as before
    assert export.python_samples(samples.path("tp1_sched_hooks"), [1]) is None
