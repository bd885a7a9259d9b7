"""Outputs byte-identical to another revision: every verb on the given reports, with this checkout and with ``--base``.

    .venv/bin/python -m bench.identical --base /tmp/base REPORT [REPORT ...]

``--base``: a checkout of the revision to compare with (``git archive 902f655 | tar -x -C /tmp/base``). Each
verb runs in its own process with that checkout first on ``PYTHONPATH``, on a private copy of each report (so
neither side sees the other's cache); each command runs twice (the second run finds the first's cache: cached
results must equal fresh ones). Output files: ``analyze`` in table/json/csv and ``--table kernels``, ``comm`` table
and json, ``compare`` of the report with itself, ``whatif`` json, ``report``'s ``index.html``. Prints one line per
difference and exits 1 when there is any. A dev tool, not shipped in the wheel.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

VERBS: dict[str, list[str]] = {
    "analyze_table": ["analyze", "{r}"],
    "analyze_json": ["analyze", "{r}", "--format", "json", "-q"],
    "analyze_csv": ["analyze", "{r}", "--format", "csv", "-q"],
    "analyze_kernels": ["analyze", "{r}", "--table", "kernels", "-q"],
    "analyze_skip": ["analyze", "{r}", "--format", "json", "-q", "--skip-cycles", "3"],
    "comm_table": ["comm", "{r}"],
    "comm_json": ["comm", "{r}", "--format", "json", "-q"],
    "compare_json": ["compare", "{r}", "{r}", "--format", "json"],
    "whatif_json": ["whatif", "{r}", "--steps-now", "3", "--format", "json"],
    "report_html": ["report", "{r}", "--steps-now", "3", "-o", "{out}"],
    # through the cache (a small export is otherwise analysed in memory and keeps none)
    "cache_analyze_table": ["analyze", "{r}", "--cache"],
    "cache_analyze_json": ["analyze", "{r}", "--format", "json", "-q", "--cache"],
    "cache_comm_json": ["comm", "{r}", "--format", "json", "-q", "--cache"],
    "cache_whatif_json": ["whatif", "{r}", "--steps-now", "3", "--format", "json", "--cache"],
    "cache_report_html": ["report", "{r}", "--steps-now", "3", "-o", "{out}", "--cache"],
}


def run_all(code: Path, report: Path, work: Path, verbs: list[str]) -> dict[str, bytes]:
    """Each verb's stdout (the HTML page for ``report``), twice: ``name`` and ``name#2``."""
    work.mkdir(parents=True)
    copy = work / report.name
    if report.is_dir():
        shutil.copytree(report, copy)
    else:
        shutil.copy2(report, copy)
        man = report.with_suffix(".manifest.json")
        if man.exists():
            shutil.copy2(man, work / man.name)
    env = {**os.environ, "PYTHONPATH": str(code), "SPECTRACE_CACHE_DIR": str(work / "user_cache")}
    out: dict[str, bytes] = {}
    for name in verbs:
        for again in ("", "#2"):
            page = work / f"page_{name}{again.strip('#')}"
            argv = [a.format(r=copy, out=page) for a in VERBS[name]]
            p = subprocess.run([sys.executable, "-m", "analyze.cli", *argv], capture_output=True, env=env, cwd=work)
            text = p.stdout
            if p.returncode != 0:  # the error line is part of what must be identical
                text += p.stderr[-2000:]
            elif name.endswith("report_html"):
                text = (page / "index.html").read_bytes()
            out[name + again] = f"rc={p.returncode}\n".encode() + text.replace(str(work).encode(), b"WORK")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.identical", description=__doc__.splitlines()[0])
    ap.add_argument("reports", nargs="+", type=Path)
    ap.add_argument("--base", type=Path, required=True, help="a checkout of the revision to compare with")
    ap.add_argument("--verbs", nargs="+", default=list(VERBS), choices=list(VERBS))
    ap.add_argument("--keep", type=Path, help="keep the outputs here (default: a temporary folder, removed)")
    a = ap.parse_args(argv)
    tmp = a.keep or Path(tempfile.mkdtemp(prefix="spectrace_identical_"))
    bad = 0
    try:
        for i, rep in enumerate(a.reports):
            base = run_all(a.base.resolve(), rep.resolve(), tmp / f"{i}_base", a.verbs)
            mine = run_all(ROOT, rep.resolve(), tmp / f"{i}_mine", a.verbs)
            for k in base:
                same = base[k] == mine[k]
                bad += not same
                print(f"{'same' if same else 'DIFFERENT'}  {rep.name}  {k}  ({len(base[k]):,} bytes)", flush=True)
    finally:
        if a.keep is None:
            shutil.rmtree(tmp, ignore_errors=True)
    print(f"{bad} difference(s)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
