"""Every analysis and output module says what it offers: ``__all__`` lists exactly its public top-level names
(what it defines without a leading underscore), each of which resolves; everything else is underscored."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOT_YET = {"pipeline"}  # checked with the read layer: tests/test_module_names.py
MODULES = sorted(p for pkg in ("compute", "output") for p in (ROOT / "analyze" / pkg).glob("*.py")
                 if p.stem != "__init__" and p.stem not in NOT_YET)


def top_level(tree: ast.Module) -> tuple[list[str], list[str] | None]:
    """The names a module defines at top level (functions, classes, assignments) and its ``__all__``."""
    names: list[str] = []
    declared = None
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.ClassDef):
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
    assert len(MODULES) >= 20 and {"windows", "findings", "text", "plots", "breakdown", "intervals"} <= {p.stem for p in MODULES}


@pytest.mark.parametrize("path", MODULES, ids=lambda p: f"{p.parent.name}.{p.stem}")
def test_all_lists_exactly_the_public_names(path):
    names, declared = top_level(ast.parse(path.read_text()))
    assert declared is not None, f"{path.name} has no __all__"
    assert len(declared) == len(set(declared)), "a name listed twice"
    assert sorted(declared) == sorted(n for n in names if not n.startswith("_"))
    module = importlib.import_module(f"analyze.{path.parent.name}.{path.stem}")
    assert [n for n in declared if not hasattr(module, n)] == []


def test_the_check_sees_a_missing_name():
    names, declared = top_level(ast.parse("__all__ = ['a']\ndef a(): ...\ndef b(): ...\n_c = 1\nX, _y = 1, 2\n"))
    assert declared == ["a"] and sorted(n for n in names if not n.startswith("_")) == ["X", "a", "b"]
