"""spectrace report: a self-contained DIR/index.html with its figures beside it."""

from __future__ import annotations

import re

import eagle_synth as es

from analyze.cli import main


def test_report_with_baseline(tmp_path):
    e, b = es.eagle(tmp_path / "e.sqlite"), es.baseline(tmp_path / "b.sqlite")
    out = tmp_path / "rep"
    assert main(["report", str(e), "--baseline", str(b), "-o", str(out)]) == 0
    page = (out / "index.html").read_text()
    imgs = re.findall(r'<img src="([^"]+)"', page)
    assert {"phase_bars.png", "timeline.png", "distributions.png", "per_cycle.png", "whatif.png"} <= set(imgs)
    assert all((out / i).stat().st_size > 1000 for i in imgs)
    assert not re.search(r'(src|href)="(https?:)?//', page)  # nothing loaded from elsewhere
    assert "5.00</b> tokens per cycle" in page and "Compared with the baseline" in page
    assert "best:" in page


def test_report_bad_output(tmp_path):
    e = es.eagle(tmp_path / "e.sqlite")
    f = tmp_path / "file"
    f.write_text("x")
    assert main(["report", str(e), "-o", str(f)]) == 2
