"""The package's shape: no import cycles, dependencies pointing one way, no import-time work.

The import graph is read from the source with ``ast`` (imports inside functions included), so a cycle
hidden behind a function-level import fails here too.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("analyze", "nvtx_hooks")
# analyze's layers, bottom up: a module may import its own layer or those below, never above.
LAYERS = ("analyze.model", "analyze.read", "analyze.compute", "analyze.output", "analyze.api", "analyze.cli")


def modules() -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for f in (ROOT / pkg).rglob("*.py"):
            parts = list(f.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = f
    return out


def imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The project modules ``name`` imports, anywhere in its body."""
    is_pkg = path.name == "__init__.py"
    here = name if is_pkg else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = here.split(".")
                up = up[: len(up) - (node.level - 1)]
                base = ".".join(up + ([node.module] if node.module else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        else:
            continue
        for t in targets:
            while t and t not in known:  # `import a.b.c` of a non-module attribute: its module
                t = t.rpartition(".")[0]
            if t and t != name:
                found.add(t)
    return found


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    known = modules()
    return {m: imports(m, p, known) for m, p in known.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10_000)
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_graph_is_read(graph):
    assert "analyze.compute.pipeline" in graph and "nvtx_hooks.capture.nsys" in graph
    assert "analyze.read.source" in graph["analyze.compute.pipeline"]
    assert "nvtx_hooks.capture" in graph["nvtx_hooks.capture.nsys"]  # `from . import CaptureError`


def test_no_import_cycles(graph):
    assert cycles(graph) == []


def test_cycle_detector_finds_one():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_hooks_never_import_analyze(graph):
    bad = {m: sorted(d for d in deps if d.split(".")[0] == "analyze")
           for m, deps in graph.items() if m.startswith("nvtx_hooks")}
    assert {m: d for m, d in bad.items() if d} == {}


def _layer(mod: str) -> int | None:
    for i, prefix in enumerate(LAYERS):
        if mod == prefix or mod.startswith(prefix + "."):
            return i
    return None


def test_layers_point_down(graph):
    up = []
    for m, deps in graph.items():
        lm = _layer(m)
        for d in deps:
            ld = _layer(d)
            if lm is not None and ld is not None and ld > lm:
                up.append((m, d))
    assert up == []


def test_import_has_no_side_effects():
    """Importing the packages loads no polars, matplotlib or torch and changes no environment variable."""
    code = ("import os, sys; env = dict(os.environ); import analyze, analyze.cli, nvtx_hooks, nvtx_hooks.capture; "
            "print(sorted(m for m in ('polars', 'matplotlib', 'torch', 'sglang') if m in sys.modules), "
            "env == dict(os.environ))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True).stdout
    assert out.strip() == "[] True"


def test_dev_tools_are_not_in_the_wheel():
    assert not (ROOT / "analyze" / "bench.py").exists() and not (ROOT / "analyze" / "inflate.py").exists()
    assert (ROOT / "bench" / "inflate.py").exists()
