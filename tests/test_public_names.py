"""Every module says what it offers: ``__all__`` lists exactly its public top-level names (what it defines without
a leading underscore), each of which resolves; everything else is underscored. Every module of ``analyze`` (its
layers, the model, the API, the CLI) and of ``nvtx_hooks``; the packages' lazily loaded names resolve too."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MODULES = sorted(p for pkg in ("analyze", "nvtx_hooks") for p in (ROOT / pkg).rglob("*.py")
                 if p.stem != "__init__" or p.parent.parent.name == "analyze")  # the layer packages: no names
PACKAGES = ["analyze", "nvtx_hooks", "nvtx_hooks.capture", "analyze.read.store"]  # their names must resolve
IMPORT_RUNS = {"nvtx_hooks.autoload"}  # importing it arms the hooks (the .pth hook): checked from the source only


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def top_level(tree: ast.Module) -> tuple[list[str], list[str] | None]:
    """The names a module defines at top level (functions, classes, assignments) and its ``__all__``."""
    names: list[str] = []
    declared = None
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.append(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                for t in target.elts if isinstance(target, ast.Tuple) else [target]:
                    if isinstance(t, ast.Name) and t.id == "__all__":
                        assert node.value is not None
                        declared = ast.literal_eval(node.value)
                    elif isinstance(t, ast.Name):
                        names.append(t.id)
    return names, declared


def test_every_module_is_checked():
    names = {module_name(p) for p in MODULES}
    assert {"analyze.compute.windows", "analyze.compute.pipeline", "analyze.compute.breakdown", "analyze.output.text",
            "analyze.read.store.install", "analyze.read.protocols", "analyze.read.server_log", "analyze.compute",
            "analyze.cli", "analyze.model", "nvtx_hooks.phases", "nvtx_hooks.capture.nsys"} <= names
    assert len(names) >= 60


@pytest.mark.parametrize("path", MODULES, ids=module_name)
def test_all_lists_exactly_the_public_names(path):
    names, declared = top_level(ast.parse(path.read_text()))
    assert declared is not None, f"{path.name} has no __all__"
    assert len(declared) == len(set(declared)), "a name listed twice"
    assert sorted(declared) == sorted(n for n in names if not n.startswith("_"))
    if module_name(path) not in IMPORT_RUNS:
        module = importlib.import_module(module_name(path))
        assert [n for n in declared if not hasattr(module, n)] == []


@pytest.mark.parametrize("name", PACKAGES)
def test_a_package_s_names_resolve(name):
    package = importlib.import_module(name)
    assert package.__all__ and [n for n in package.__all__ if getattr(package, n, None) is None] == []


def test_the_check_sees_what_is_missing_or_extra():
    names, declared = top_level(ast.parse("__all__ = ['a', 'X']\ndef a(): ...\ndef b(): ...\n_c = 1\nX, _y = 1, 2\n"))
    assert declared == ["a", "X"] and sorted(n for n in names if not n.startswith("_")) == ["X", "a", "b"]
