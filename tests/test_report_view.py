"""The report as a person sees it: every cycle on one chart, the timeline beside the page, a page that fits.

- The cycles chart's embedded data is ``analyze``'s cycles (``res.steady.cycles``), column for column; its budget
  pieces add up to each cycle's period; each finding and class names the cycles ``analyze`` says (the straggler
  every 4th cycle: its class's cycles). The page links the timeline file written beside it.
- Headless Chromium (Debian's ``chromium``; skipped without it) lays the page out 900 and 1400 px wide: nothing is
  wider than the window; every table column's right edge is in the window, or its table scrolls in a box with its
  key column pinned; the findings table fits without scrolling; no element clips its text; no word is split across
  lines. Clicking a finding's cycles link marks its cycles and draws the first one across ranks (a Gantt).
  Screenshots of both widths are written beside the report (and into ``$SPECTRACE_SCREENS`` when set).
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import polars as pl
import pytest

from analyze import analyze, report
from bench.inject import inject
from nvtx_hooks.capture import samples
from tests.helpers import page_fit
from tests.helpers import trace_events as te
from tests.helpers.paths import tp2


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """A TP2 straggler every 4th cycle (bench/inject.py on a real capture), reported against the capture it was
    built from (``--vs``: the comparison's tables are on the page too)."""
    d = tmp_path_factory.mktemp("view")
    src = tp2("tp2_s3_node", d)
    path = d / "every4.sqlite"
    inject(src, path, ["1:draft:4:0:500"])
    out = d / "every4_report"
    report(path, out, vs=src)
    return path, analyze(path), out


def chart_data(page: str) -> dict:
    m = re.search(r'<script type="application/json" id="spectrace-cycles">(.*?)</script>', page, re.S)
    assert m
    return json.loads(m.group(1).replace("<\\/", "</"))


def test_chart_data_is_analyzes_cycles(built):
    _, res, out = built
    page = (out / "index.html").read_text(encoding="utf-8")
    d = chart_data(page)
    cyc = res.steady.cycles
    assert cyc["kind"].unique().to_list() == ["cycle"]
    got = pl.DataFrame(d["cycles"], infer_schema_length=None)
    for col in ("rank", "key", "n", "period_ns", "i_last", "cycle_class", "segment", "slow", "steady", "why",
                "batch_size", "tokens"):
        assert got[col].to_list() == cyc[col].to_list(), col
    # the pieces of each cycle add up to its period, on every rank
    p = pl.DataFrame(d["pieces"]).group_by("rank", "key").agg(pl.col("ns").sum())
    per = cyc.filter(pl.col("period_ns").is_not_null()).select("rank", "key", "period_ns")
    j = per.join(p, on=["rank", "key"], how="left")
    assert j["ns"].null_count() == 0
    assert (j["ns"] - j["period_ns"]).abs().max() <= 8  # rounded to whole ns, piece by piece
    # the classes and findings name analyze's cycles
    every = next(c for c in res.steady.cycle_classes if c.kind == "every")
    want = sorted(cyc.filter((pl.col("cycle_class") == every.id) & pl.col("slow"))["key"].unique().to_list())
    assert next(c for c in d["classes"] if c["label"] == every.label)["keys"] == want
    codes = [f.code for f in res.steady.findings]
    assert [f["code"] for f in d["findings"]] == codes
    assert next(f for f in d["findings"] if f["code"] == "STRAGGLER_RANK")["keys"] == want
    assert [f["keys"] for f in d["findings"] if f["code"] == "GAP_HOST_BOUND"] == [[]]  # about every cycle


def test_page_links_its_timeline_and_loads_nothing(built):
    _, res, out = built
    page = (out / "index.html").read_text(encoding="utf-8")
    assert not re.search(r'(src|href)="(https?:)?//', page) and "<link" not in page and "url(" not in page
    assert 'href="timeline.trace.json"' in page
    n = sum(1 for f in res.steady.findings if f.code == "STRAGGLER_RANK")
    assert page.count('data-finding="') >= n >= 1
    tr = te.read(out / "timeline.trace.json")
    assert tr.meta["cycles_shown"] == res.steady.cycles["key"].n_unique()  # a small run: every cycle


SCREENS = os.environ.get("SPECTRACE_SCREENS")


@pytest.mark.skipif(page_fit.CHROMIUM is None, reason="needs Debian's chromium (apt-get install -y chromium)")
@pytest.mark.parametrize("width", [900, 1400])
@pytest.mark.parametrize("which", ["tp2_every4_vs", "tp1_gpumetrics"])
def test_page_fits_the_window(which, width, built, tmp_path_factory):
    if which == "tp2_every4_vs":
        page = built[2] / "index.html"
    else:
        d = tmp_path_factory.mktemp("gm")
        page = report(samples.path("tp1_gpumetrics_graph"), d / "rep")
    r = page_fit.measure(page, width)
    assert r["width"] == width and r["tables"] >= 10
    assert r["page"] <= width, f"the page is {r['page']} px wide in a {width} px window"
    hidden = [c for c in r["columns"] if not c["visible"] and not (c["scroll_box"] and c["pinned"])]
    assert not hidden, hidden
    assert all(c["visible"] for c in r["columns"] if c["section"] == "findings")
    assert not r["clipped"], r["clipped"]
    assert not r["split_words"], r["split_words"]
    shot = page_fit.screenshot(page, width, page.with_name(f"{which}_{width}.png"))
    assert shot.stat().st_size > 10_000
    if SCREENS:
        Path(SCREENS).mkdir(parents=True, exist_ok=True)
        shutil.copy(shot, Path(SCREENS) / shot.name)


@pytest.mark.skipif(page_fit.CHROMIUM is None, reason="needs Debian's chromium (apt-get install -y chromium)")
def test_finding_link_marks_its_cycles_and_draws_the_gantt(built):
    _, res, out = built
    js = """<script>window.addEventListener('load',()=>setTimeout(()=>{
      const a=[...document.querySelectorAll('a[data-finding]')].find(x=>x.closest('tr').textContent.includes('STRAGGLER_RANK'));
      a.click();
      const out={mark:document.getElementById('cycles-mark').textContent,
                 detail:document.getElementById('cycles-detail').textContent,
                 rows:document.querySelectorAll('#cycles-gantt svg text').length,
                 rects:document.querySelectorAll('#cycles-gantt rect').length,
                 rings:document.querySelectorAll('#cycles-chart circle[fill=none]').length};
      const p=document.createElement('pre');p.id='page-fit-result';p.textContent=JSON.stringify(out);
      document.body.appendChild(p)},300))</script>"""
    page = out / "index.html"
    probe = out / "click.html"
    probe.write_text(page.read_text(encoding="utf-8").replace("</body>", js + "</body>"), encoding="utf-8")
    p = page_fit._run(["--window-size=1200,1000", "--virtual-time-budget=5000", "--dump-dom", probe.as_uri()])
    probe.unlink()
    m = re.search(r'<pre id="page-fit-result">(.*?)</pre>', p.stdout, re.S)
    assert m, p.stderr[-500:]
    got = json.loads(m.group(1).replace("&quot;", '"').replace("&amp;", "&"))
    every = next(c for c in res.steady.cycle_classes if c.kind == "every")
    assert f"{every.affected} cycle(s) circled" in got["mark"]
    assert got["rings"] == 2 * every.affected  # one ring per rank's marker of each named cycle
    first = min(every.keys)
    assert got["detail"].startswith(f"cycle {first}") and "STRAGGLER_RANK" in got["detail"]
    assert "draft" in got["detail"] and "between cycles" in got["detail"]
    pieces = chart_data(page.read_text(encoding="utf-8"))["pieces"]
    n = sum(1 for k in pieces["key"] if k == first)
    assert got["rects"] == n  # the Gantt: one bar per piece of that cycle, on every rank
