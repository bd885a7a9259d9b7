"""A package ``sglang`` whose EAGLE v2 decode step is the real code of a released wheel, runnable without SGLang.

:func:`build` copies, from the wheel's sources (``nvtx_hooks.check.fetch_sglang``), the real
``EAGLEWorkerV2.forward_batch_generation``, ``_forward_prefill_batch``, ``_forward_dp_spec_prefill_coordination``,
``activate_step_by_batch`` and ``verify``, the real adaptive ``AdaptiveController`` and
``AdaptiveSpeculativeParams``/``AdaptiveStepSlot`` (routing and policy), and ``run_eagle_verify``'s real signature
(its body a stub), into modules at the real module paths whose other names come from
:mod:`tests.helpers.sglang_stubs`. With ``shared=True`` the step is rewritten into sgl-project/sglang#31499's shape
(:mod:`tests.helpers.refactor_31499`). The hooks then patch it by the same import hook as a real server's.
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests.helpers import refactor_31499

__all__ = ["REAL_METHODS", "build"]

REAL_METHODS = ("forward_batch_generation", "_forward_prefill_batch", "_forward_dp_spec_prefill_coordination",
                "activate_step_by_batch", "verify")
_HEADER = ("from __future__ import annotations\n"
           "from tests.helpers.sglang_stubs import *  # noqa: F403\n"
           "from tests.helpers import sglang_stubs as _stubs\n")
_SPEC = "sglang/srt/speculative/"


def _top(tree: ast.Module, *names: str) -> list[ast.stmt]:
    """The module's top-level definitions (functions, classes, assignments) named ``names``, in file order."""
    out = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name in names:
            out.append(node)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id in names:
            out.append(node)
        elif isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id in names for t in node.targets):
            out.append(node)
    return out


def _stmt(src: str) -> ast.stmt:
    return ast.parse(src).body[0]


def build(wheel: Path, dest: Path, *, shared: bool = False) -> Path:
    """Write the package under ``dest`` (returned: the directory to put on sys.path)."""
    src = {n: ast.parse((wheel / _SPEC / f"{n}.py").read_text())
           for n in ("eagle_worker_v2", "eagle_worker_common", "adaptive_runtime_state", "adaptive_spec_params")}
    pkg = dest / "sglang"
    for d in (pkg, pkg / "srt", pkg / "srt" / "speculative"):
        d.mkdir(parents=True, exist_ok=True)
        (d / "__init__.py").write_text("")
    (pkg / "version.py").write_text('__version__ = "0.5.23"\n')
    spec = pkg / "srt" / "speculative"

    params = ast.Module(_top(src["adaptive_spec_params"], "DEFAULT_ADAPTIVE_CONFIG", "_load_adaptive_config",
                             "AdaptiveStepSlot", "AdaptiveSpeculativeParams"), [])
    (spec / "adaptive_spec_params.py").write_text(
        "from __future__ import annotations\nimport bisect, json, logging, math\n"
        "from functools import cached_property\nfrom tests.helpers.sglang_stubs import log_info_on_rank0\n"
        "logger = logging.getLogger(__name__)\n" + ast.unparse(params) + "\n")
    ctl = ast.Module(_top(src["adaptive_runtime_state"], "AdaptiveController"), [])
    (spec / "adaptive_runtime_state.py").write_text("from __future__ import annotations\n" + ast.unparse(ctl) + "\n")

    # run_eagle_verify: the real signature, a stub body
    (rev,) = _top(src["eagle_worker_common"], "run_eagle_verify")
    assert isinstance(rev, ast.FunctionDef)
    rev.body = [_stmt("return _stubs.verify_result(batch)")]
    common = ast.Module([rev], [])
    v2cls = next(c for c in src["eagle_worker_v2"].body if isinstance(c, ast.ClassDef) and c.name == "EAGLEWorkerV2")
    real = [f for f in v2cls.body if isinstance(f, ast.FunctionDef) and f.name in REAL_METHODS]
    if shared:
        fbg = next(f for f in real if f.name == "forward_batch_generation")
        common = refactor_31499.refactor_common(common, refactor_31499.shared_step(fbg))
        rev.body[-1] = _stmt("return _stubs.verify_result(batch, num_steps)")
    (spec / "eagle_worker_common.py").write_text(_HEADER + ast.unparse(ast.fix_missing_locations(common)) + "\n")

    draft = ast.ClassDef("EagleDraftWorker", [], [], [
        _stmt(f"{m} = _stubs.draft_worker_methods[{m!r}]") for m in
        ("__init__", "draft", "_draft_extend_for_decode", "_draft_extend_for_prefill")], [])
    stubs = [_stmt(f"{m} = _stubs.worker_methods[{m!r}]") for m in
             ("apply_runtime_state", "_build_trivial_verify_input", "_stub_skipped_draft_extend")]
    init = _stmt("def __init__(self, **kw):\n    _stubs._worker_init(self, EagleDraftWorker, **kw)")
    worker = ast.ClassDef("EAGLEWorkerV2", [], [], [init, *stubs, *real], [])
    mod = ast.Module([_stmt("from sglang.srt.speculative.eagle_worker_common import run_eagle_verify"), draft, worker],
                     [])
    if shared:
        mod = refactor_31499.refactor_worker(mod)
    (spec / "eagle_worker_v2.py").write_text(_HEADER + ast.unparse(ast.fix_missing_locations(mod)) + "\n")
    return dest
