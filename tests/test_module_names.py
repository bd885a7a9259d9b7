"""The read layer, the model, the pipeline, the API, the CLI and the hooks say what they offer: ``__all__`` lists
exactly a module's public top-level names (what it defines without a leading underscore), and each resolves.

(``analyze/compute`` and ``analyze/output`` but the pipeline: tests/test_public_names.py.)"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MODULES = sorted(
    [p for p in (ROOT / "analyze" / "read").glob("*.py") if p.stem != "__init__"]
    + [ROOT / "analyze" / n for n in ("model.py", "api.py", "cli.py")]
    + [ROOT / "analyze" / "compute" / "pipeline.py"]
    + [p for p in (ROOT / "nvtx_hooks").rglob("*.py") if p.stem != "__init__"]
)
PACKAGES = ["analyze", "nvtx_hooks", "nvtx_hooks.capture"]
IMPORT_RUNS = {"nvtx_hooks.autoload"}  # importing it arms the hooks (the .pth hook): checked from the source only


def module_name(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts)


def definitions(source: str) -> tuple[list[str], list[str] | None]:
    """The names a module defines at top level (functions, classes, assignments) and its ``__all__``."""
    names: list[str] = []
    declared = None
    for node in ast.parse(source).body:
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


def test_the_modules_are_found():
    names = {module_name(p) for p in MODULES}
    assert {"analyze.read.export", "analyze.read.protocols", "analyze.read.store", "analyze.read.exportdir",
            "analyze.read.source", "analyze.compute.pipeline", "analyze.cli",
            "nvtx_hooks.phases", "nvtx_hooks.capture.nsys"} <= names
    assert len(names) >= 25


@pytest.mark.parametrize("path", MODULES, ids=module_name)
def test_all_lists_exactly_the_public_names(path):
    names, declared = definitions(path.read_text())
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
    names, declared = definitions("__all__ = ['a', 'X']\ndef a(): ...\ndef b(): ...\n_c = 1\nX, _y = 1, 2\n")
    assert declared == ["a", "X"] and sorted(n for n in names if not n.startswith("_")) == ["X", "a", "b"]
