"""The fake SGLang of tests/fake_sglang for the hooks' tests: put it on the path, record the NVTX calls."""

from __future__ import annotations

import sys
import types
from pathlib import Path

from nvtx_hooks import patch, ranges

FAKE = str(Path(__file__).parents[1] / "fake_sglang")


def purge() -> None:
    """Forget every imported (fake) sglang module."""
    for m in [m for m in sys.modules if m == "sglang" or m.startswith("sglang.")]:
        del sys.modules[m]


def record(monkeypatch, path: str = FAKE):
    """Fake SGLang (or the package at ``path``) on sys.path, hooks uninstalled after; yields the list of recorded
    NVTX calls (``("push", name, payload)``, ``("pop",)``, ``("mark", name, payload)`` in the spectrace domain;
    ``("hpush", name, None)``, ``("hpop",)`` in the host domain). For a fixture: ``yield from``."""
    events: list[tuple] = []
    monkeypatch.syspath_prepend(str(path))
    monkeypatch.setattr(ranges, "push", lambda name, payload=None: events.append(("push", name, payload)))
    monkeypatch.setattr(ranges, "pop", lambda: events.append(("pop",)))
    monkeypatch.setattr(ranges, "mark", lambda name, payload=None: events.append(("mark", name, payload)))
    host = types.SimpleNamespace(push=lambda name, payload=None: events.append(("hpush", name, payload)),
                                 pop=lambda: events.append(("hpop",)))
    monkeypatch.setattr(ranges, "host", host)
    monkeypatch.setattr(ranges, "_on", True)  # emit as if nsys were attached
    purge()
    patch.uninstall()
    yield events
    patch.uninstall()
    purge()


def shape(events: list[tuple], hosts: bool = False) -> list[str]:
    """Events as an indented outline (payload dropped), to assert nesting; marks as ``!name`` at their depth.
    The host domain's ranges (``scheduler.*``) are left out (and do not indent) unless ``hosts``; each domain's
    pops close that domain's ranges."""
    out, open_ = [], []  # open_: per open range, (its domain, whether it is shown)
    for e in events:
        depth = sum(shown for _, shown in open_)
        if e[0] in ("push", "hpush"):
            shown = hosts or e[0] == "push"
            if shown:
                out.append("  " * depth + e[1])
            open_.append(("h" if e[0] == "hpush" else "s", shown))
        elif e[0] == "mark":
            out.append("  " * depth + "!" + e[1])
        else:
            dom = "h" if e[0] == "hpop" else "s"
            k = max((i for i, (d, _) in enumerate(open_) if d == dom), default=None)
            assert k is not None, "pop without push"
            assert k == len(open_) - 1, "ranges of the two domains do not nest"
            open_.pop()
    assert not open_, "unbalanced ranges"
    return out
