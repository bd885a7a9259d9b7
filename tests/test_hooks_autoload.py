"""Reaching every rank: the env-gated .pth autoload (in spawned children) and the SGLang plugin entry point."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
from importlib.metadata import entry_points
from pathlib import Path

import pytest

HERE = Path(__file__).parent
FAKE = HERE / "fake_sglang"
PTH = HERE.parent / "nvtx_hooks" / "spectrace_hooks.pth"

SPAWN = """
import multiprocessing as mp, sys
def child(q):
    import sglang.srt.speculative.eagle_worker_v2
    from nvtx_hooks import patch
    q.put(sorted(patch.patched()))
if __name__ == "__main__":
    {prelude}
    mp.set_start_method("spawn", force=True)
    q = mp.Queue(); p = mp.Process(target=child, args=(q,)); p.start(); print(q.get()); p.join()
"""


def _run(code: str, hooks: str | None, tmp_path: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPECTRACE")}
    env["PYTHONPATH"] = os.pathsep.join([str(FAKE), str(HERE.parent)])
    env["SPECTRACE_SGLANG_VERSION"] = "0.5.5"  # the fake SGLang has no package metadata
    if hooks is not None:
        env["SPECTRACE_HOOKS"] = hooks
    script = tmp_path / "main.py"
    script.write_text(code)
    return subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("hooks,expect", [("1", True), (None, False), ("0", False)])
def test_pth_line_reaches_spawned_child(tmp_path, hooks, expect):
    """The .pth line, processed by site in the parent *and* in a spawned child, arms the hooks only if =1."""
    site_dir = tmp_path / "site"
    site_dir.mkdir()
    (site_dir / PTH.name).write_text(PTH.read_text())
    # PYTHONPATH entries are not site dirs (their .pth are not read), so both processes add the dir explicitly.
    prelude = f"import site; site.addsitedir({str(site_dir)!r})"
    code = SPAWN.replace("{prelude}", prelude).replace(
        "def child(q):\n", f"def child(q):\n    import site; site.addsitedir({str(site_dir)!r})\n"
    )
    r = _run(code, hooks, tmp_path)
    assert r.returncode == 0, r.stderr
    patched = eval(r.stdout.strip().splitlines()[-1])
    if expect:
        assert "sglang.srt.speculative.eagle_worker_v2.EAGLEWorkerV2.verify" in patched
        assert "SGLang 0.5.5" in r.stderr  # the per-process log line
    else:
        assert patched == [] and "[spectrace]" not in r.stderr


def test_installed_pth_autoloads_in_spawned_child(tmp_path):
    """With spectrace installed (make install: editable), site-packages holds the .pth and it works."""
    purelib = Path(sysconfig.get_paths()["purelib"])
    if not (purelib / PTH.name).is_file():
        pytest.skip(f"spectrace is not installed in {purelib} (run make install)")
    assert (purelib / PTH.name).read_text() == PTH.read_text()
    r = _run(SPAWN.replace("{prelude}", "pass"), "1", tmp_path)
    assert r.returncode == 0, r.stderr
    assert "sglang.srt.speculative.eagle_worker_v2.EagleDraftWorker.draft" in r.stdout


def test_plugin_entry_point_declared():
    text = (HERE.parent / "pyproject.toml").read_text()
    assert '[project.entry-points."sglang.srt.plugins"]' in text
    assert 'spectrace = "nvtx_hooks.plugin:load"' in text
    eps = [e for e in entry_points(group="sglang.srt.plugins") if e.name == "spectrace"]
    if not eps:
        pytest.skip("spectrace not installed: entry point metadata absent")
    from nvtx_hooks import plugin

    assert eps[0].load() is plugin.load


def test_plugin_is_gated(monkeypatch):
    from nvtx_hooks import plugin

    for k in ("SPECTRACE_HOOKS", "SGLANG_PLUGINS"):
        monkeypatch.delenv(k, raising=False)
    assert not plugin.wanted()
    monkeypatch.setenv("SGLANG_PLUGINS", "other, spectrace")
    assert plugin.wanted()
    monkeypatch.delenv("SGLANG_PLUGINS")
    monkeypatch.setenv("SPECTRACE_HOOKS", "1")
    assert plugin.wanted()
