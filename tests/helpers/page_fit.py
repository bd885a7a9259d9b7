"""Does a page fit a browser window? Headless Chromium (Debian's ``chromium``) lays it out at a width, a small script
measures the elements' boxes and writes what it found into the DOM, and ``--dump-dom`` hands that back.

What it measures (:data:`MEASURE`): the page's own width against the window (nothing off-screen sideways); every
table column's header: its right edge inside the window, or the table inside a box that scrolls sideways with its
key column pinned (``position: sticky``); elements that clip their text (``overflow: hidden`` narrower than their
content; the charts' SVGs excepted: they are drawn to their box); words split across lines (a word's range with two
line boxes: text cut mid-word). :func:`screenshot` takes a full-page PNG at the same width.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync", "--hide-scrollbars"]

MEASURE = r"""
<script>
window.addEventListener('load', () => setTimeout(() => {
  const W = document.documentElement.clientWidth, out = {width: W, page: document.documentElement.scrollWidth,
    columns: [], clipped: [], split_words: [], tables: 0};
  const scroller = el => { for (let p = el.parentElement; p; p = p.parentElement) {
    const s = getComputedStyle(p); if ((s.overflowX === 'auto' || s.overflowX === 'scroll') && p.scrollWidth > p.clientWidth + 1) return p; }
    return null; };
  const where = el => { const s = el.closest('section'); return s ? s.id : '?'; };
  document.querySelectorAll('table').forEach(t => {
    out.tables++;
    const head = t.rows[0]; if (!head) return;
    const box = scroller(t);
    const pinned = box ? Array.from(t.rows).every(r => r.cells[0] && getComputedStyle(r.cells[0]).position === 'sticky') : false;
    Array.from(head.cells).forEach(c => { const r = c.getBoundingClientRect();
      const visible = r.left >= -0.5 && r.right <= W + 0.5;
      out.columns.push({section: where(t), column: c.textContent.trim().slice(0, 40), right: Math.round(r.right),
                        visible: visible, scroll_box: !!box, pinned: pinned}); });
  });
  document.querySelectorAll('body *').forEach(el => {
    if (el.closest('svg') || el.closest('.chart')) return;
    const s = getComputedStyle(el);
    if ((s.overflowX === 'hidden' || s.overflowX === 'clip' || s.textOverflow === 'ellipsis') && el.scrollWidth > el.clientWidth + 1)
      out.clipped.push({section: where(el), tag: el.tagName, text: el.textContent.trim().slice(0, 60)});
  });
  const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
  for (let n = walker.nextNode(); n; n = walker.nextNode()) {
    const p = n.parentElement; if (!p || p.closest('script,style,svg,.chart,pre')) continue;
    const re = /[A-Za-z][A-Za-z'’]{3,}/g; let m;
    while ((m = re.exec(n.data))) {
      const r = document.createRange(); r.setStart(n, m.index); r.setEnd(n, m.index + m[0].length);
      const tops = new Set(Array.from(r.getClientRects()).filter(b => b.width > 0).map(b => Math.round(b.top)));
      if (tops.size > 1) out.split_words.push({section: where(p), word: m[0]});
    }
  }
  const pre = document.createElement('pre'); pre.id = 'page-fit-result'; pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
}, 300));
</script>
"""


def _run(args: list[str], timeout: int = 180) -> subprocess.CompletedProcess:
    with tempfile.TemporaryDirectory(prefix="chromium-") as profile:
        return subprocess.run([CHROMIUM, *FLAGS, f"--user-data-dir={profile}", *args], capture_output=True, text=True,
                              timeout=timeout)


def measure(page: Path, width: int, height: int = 1000) -> dict:
    """Lay ``page`` out ``width`` px wide and return what :data:`MEASURE` found."""
    assert CHROMIUM
    text = page.read_text(encoding="utf-8")
    probe = page.with_name(page.stem + f".fit{width}.html")
    probe.write_text(text.replace("</body>", MEASURE + "</body>"), encoding="utf-8")
    try:
        p = _run([f"--window-size={width},{height}", "--virtual-time-budget=5000", "--dump-dom", probe.as_uri()])
    finally:
        probe.unlink()
    m = re.search(r'<pre id="page-fit-result">(.*?)</pre>', p.stdout, re.S)
    assert m, f"no measurement came back (chromium exit {p.returncode}: {p.stderr[-500:]})"
    return json.loads(m.group(1).replace("&quot;", '"').replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&"))


def screenshot(page: Path, width: int, out: Path, height: int | None = None) -> Path:
    """A PNG of ``page`` ``width`` px wide (``height``: default tall enough for the whole page)."""
    assert CHROMIUM
    h = height or measure_height(page, width)
    _run([f"--window-size={width},{h}", "--virtual-time-budget=5000", f"--screenshot={out}", page.as_uri()])
    return out


def measure_height(page: Path, width: int) -> int:
    text = page.read_text(encoding="utf-8")
    probe = page.with_name(page.stem + f".h{width}.html")
    js = ("<script>window.addEventListener('load',()=>setTimeout(()=>{const p=document.createElement('pre');"
          "p.id='h';p.textContent=document.documentElement.scrollHeight;document.body.appendChild(p)},300))</script>")
    probe.write_text(text.replace("</body>", js + "</body>"), encoding="utf-8")
    try:
        p = _run([f"--window-size={width},1000", "--virtual-time-budget=5000", "--dump-dom", probe.as_uri()])
    finally:
        probe.unlink()
    m = re.search(r'<pre id="h">(\d+)</pre>', p.stdout)
    return min(int(m.group(1)) + 20, 16000) if m else 8000
