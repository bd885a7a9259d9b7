"""spectrace report: one self-contained DIR/index.html, its figures inline (PNG data URIs)."""

from __future__ import annotations

import base64
import re

from analyze.cli import main
from tests.helpers import eagle_synth as es


def figures(page: str) -> dict[str, bytes]:
    """The page's figures: name (the img's title) → its PNG bytes, decoded from the data URI."""
    return {t: base64.b64decode(d) for d, t in
            re.findall(r'<img src="data:image/png;base64,([A-Za-z0-9+/=]+)" alt="[^"]*" title="([^"]+)">', page)}


def test_report_with_vs(tmp_path, capsys):
    e, b = es.eagle(tmp_path / "e.sqlite"), es.baseline(tmp_path / "b.sqlite")
    out = tmp_path / "rep"
    assert main(["report", str(e), "--vs", str(b), "-o", str(out)]) == 0
    # the page, and the annotated timeline it links to (tests/test_report_view.py)
    assert sorted(p.name for p in out.iterdir() if not p.name.startswith("SPECTRACE")) == ["index.html",
                                                                                            "timeline.trace.json"]
    page = (out / "index.html").read_text()
    figs = figures(page)
    assert {"phase_bars.png", "timeline.png", "distributions.png", "per_cycle.png", "whatif.png",
            "compare.png"} <= set(figs)
    assert len(figs) == page.count("<img ")
    assert all(png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 1000 for png in figs.values())
    assert not re.search(r'(src|href)="(https?:)?//', page)  # nothing loaded from elsewhere
    assert "<pre>" not in page  # no raw CLI text
    assert "6.00</b> tokens per cycle" in page and "Compared with b.sqlite" in page  # cycles 1..3: (4+6+8)/3
    # the comparison first: its verdict and chart before the steady state
    assert page.index('class="verdict"') < page.index('title="compare.png"') < page.index('id="summary"')
    # --vs is a run to compare with, not whatif's no-speculation baseline: no "not used for the verify slope"
    assert "verify slope" not in page and "not used" not in page
    assert "--baseline is now --vs" not in capsys.readouterr().err
    assert "best:" in page or "best within one step" in page
    # the budget's per-rank columns in µs: draft spans 1100 ns on rank 0 and 700 ns on rank 1 (eagle_synth)
    budget = page[page.index('id="budget"'):page.index('id="findings"')]
    row = re.search(r"<tr><td>draft</td>(.*?)</tr>", budget).group(1)
    cells = re.findall(r'<td class="n">([^<]*)</td>', row)
    assert cells[-2:] == ["1.1", "0.7"]


def test_report_baseline_is_a_deprecated_vs(tmp_path, capsys):
    e, b = es.eagle(tmp_path / "e.sqlite"), es.baseline(tmp_path / "b.sqlite")
    assert main(["report", str(e), "--baseline", str(b)]) == 0  # and -o defaults to e_report beside e.sqlite
    err = capsys.readouterr().err
    assert err.count("\n") == 2 and "note: report --baseline is now --vs" in err
    assert f"wrote {tmp_path / 'e_report' / 'index.html'}" in err
    assert "Compared with b.sqlite" in (tmp_path / "e_report" / "index.html").read_text()


def test_report_bad_output(tmp_path):
    e = es.eagle(tmp_path / "e.sqlite")
    f = tmp_path / "file"
    f.write_text("x")
    assert main(["report", str(e), "-o", str(f)]) == 2


def png_size(png: bytes) -> tuple[int, int]:
    head = png[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n"
    return int.from_bytes(head[16:20], "big"), int.from_bytes(head[20:24], "big")


def test_report_at_8_ranks(tmp_path):
    """The probe inflated to 8 ranks (bench/inflate.py): every figure at most 2400 px wide, findings, stragglers."""
    from bench.inflate import inflate
    from tests.helpers.paths import PROBE, need

    src = tmp_path / "tp8.sqlite"
    inflate(need(PROBE), src, 4, 1)
    out = tmp_path / "rep8"
    assert main(["report", str(src), "-o", str(out)]) == 0
    page = (out / "index.html").read_text()
    figs = figures(page)
    assert {"budget.png", "phase_bars.png", "rank_phase.png", "comm_split.png", "timeline.png"} <= set(figs)
    for i, png in figs.items():
        w, h = png_size(png)
        assert w <= 2400 and h <= 2400, (i, w, h)
    assert page.index('id="budget"') < page.index('id="findings"') < page.index('id="whole-run"')
    assert re.search(r"<code>GAP_HOST_BOUND</code>", page) and "<h3>Stragglers</h3>" in page
    assert 'id="comm-notes"' in page and 'id="parents"' in page and "eagle3.cycle" in page
    # the budget lists all 8 ranks; the stragglers table names draft and its last-arriving ranks
    assert all(f"rank {r} µs" in page for r in range(8))
    strag = page[page.index("<h3>Stragglers</h3>"):]
    assert "eagle3.draft" in strag[: strag.index("</table>")]


def test_report_of_several_reports(tmp_path):
    from test_scale import split_probe

    from tests.helpers.paths import PROBE, need

    need(PROBE)
    a, b = split_probe(tmp_path, 1412), split_probe(tmp_path, 1413)
    out = tmp_path / "two"
    assert main(["report", str(a), str(b), "-o", str(out), "-j", "1"]) == 0
    page = (out / "index.html").read_text()
    assert "probe_1412.sqlite, probe_1413.sqlite" in page and "rank 1 µs" in page
