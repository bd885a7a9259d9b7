"""Fixtures shared by several test files. Helper modules (real and synthetic captures, the fake SGLang's
recorder) are in tests/helpers.

No test depends on the machine's Nsight Systems: for every test, ``nsys`` on PATH is a stand-in that fails
(one line on stderr, exit 2) and ``$NSYS`` is unset, so a test that reaches for "the nsys on PATH" fails the
same way on every machine instead of passing or failing with the version installed there. A test gives itself
a fake (tests/data/fake_nsys.py; tests/test_trace_wrapper.py's ``nsys`` fixture) or, where a real nsys is
what it tests, says so with ``@pytest.mark.real_nsys``: it then sees the machine's PATH and is skipped, with
the reason, where no nsys is there."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from tests.helpers.fake_hooks import record

if os.environ.get("PYTEST_XDIST_WORKER"):
    # One of `make test`'s worker processes (pytest-xdist), as many as cores: torch's OpenMP pool one thread
    # (set before torch is imported), or its threads spin on cores the other worker is using and a test that
    # times a gap (the workload's) stalls behind them. The tests' own processes inherit it.
    os.environ.setdefault("OMP_NUM_THREADS", "1")

NO_NSYS = "tests: this test ran the nsys on PATH; give it a fake (tests/data/fake_nsys.py) or mark it real_nsys"


@pytest.fixture(scope="session")
def _no_nsys_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("no_nsys")
    exe = d / "nsys"
    exe.write_text(f"#!/bin/sh\necho '{NO_NSYS}' >&2\nexit 2\n")
    exe.chmod(0o755)
    return d


@pytest.fixture(autouse=True)
def _machine_nsys(request, monkeypatch):
    """The guard above: the stand-in first on PATH and no $NSYS, unless the test is marked real_nsys."""
    if request.node.get_closest_marker("real_nsys"):
        if not (os.environ.get("NSYS") or shutil.which("nsys")):
            pytest.skip("needs a real nsys (Nsight Systems) on PATH or in $NSYS")
        return
    d = request.getfixturevalue("_no_nsys_dir")
    monkeypatch.setenv("PATH", f"{d}{os.pathsep}{os.environ.get('PATH', '')}")
    monkeypatch.delenv("NSYS", raising=False)


@pytest.fixture
def rec(monkeypatch):
    """Fake SGLang on sys.path, hooks uninstalled after; the list of recorded NVTX calls."""
    yield from record(monkeypatch)


def pytest_configure(config):
    """A suite started in the background by a non-interactive shell (``make test &``) inherits SIGINT ignored, and
    so would every process it starts: the Ctrl-C tests would then see no Ctrl-C. Python's own handler, as in a
    terminal (a child process gets SIGINT's default action back at exec)."""
    import signal

    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
