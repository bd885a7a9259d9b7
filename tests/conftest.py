"""Fixtures shared by several test files. Helper modules (real and synthetic captures, the fake SGLang's
recorder) are in tests/helpers."""

from __future__ import annotations

import pytest

from tests.helpers.fake_hooks import record


@pytest.fixture
def rec(monkeypatch):
    """Fake SGLang on sys.path, hooks uninstalled after; the list of recorded NVTX calls."""
    yield from record(monkeypatch)
