"""The shape of sgl-project/sglang#31499 (open, "Extract the shared forward step and introduce
EagleWorkerContext") applied to SGLang source, for the hooks' tests.

What the PR describes, and what this makes of a 0.5.23 tree (AST rewrites; formatting and comments are lost):

- ``eagle_worker_common.eagle_forward_generation(worker, batch, on_publish=None, grammar_barrier=None,
  pp_proxy_tensors=None)``: the body of ``EAGLEWorkerV2.forward_batch_generation`` with ``self`` as ``worker``,
  its ``self.verify(batch, **kw)`` calling ``run_eagle_verify(batch, worker.ctx, topk=…, num_steps=…,
  num_draft_tokens=…, **kw)``;
- ``run_eagle_verify(batch, ctx, *, topk, num_steps, num_draft_tokens, <the other keywords>)``: the collaborators
  it took as keywords come from ``ctx`` (``target_worker = ctx.target_worker`` … at the top of its body);
- ``EAGLEWorkerV2.forward_batch_generation`` and ``MultiLayerEagleWorkerV2.forward_batch_generation`` delegate to
  the shared step; both workers' ``verify`` methods are gone; other methods' ``self.verify(...)`` calls become
  ``run_eagle_verify(..., self.ctx, ...)``.
"""

from __future__ import annotations

import ast
import copy
from pathlib import Path

__all__ = ["STEP_PARAMS", "verify_call", "shared_step", "refactor_common", "refactor_worker", "apply"]

STEP_PARAMS = ("batch", "on_publish", "grammar_barrier", "pp_proxy_tensors")
_KEEP = ("topk", "num_draft_tokens", "pp_proxy_tensors", "grammar_barrier")  # run_eagle_verify keywords kept
_WORKERS = ("EAGLEWorkerV2", "MultiLayerEagleWorkerV2")
_COMMON = "sglang/srt/speculative/eagle_worker_common.py"
_FILES = ("sglang/srt/speculative/eagle_worker_v2.py", "sglang/srt/speculative/multi_layer_eagle_worker_v2.py")


def _attr(obj: str, name: str) -> ast.Attribute:
    return ast.Attribute(ast.Name(obj, ast.Load()), name, ast.Load())


def verify_call(me: str, call: ast.Call) -> ast.Call:
    """``<me>.verify(batch, **kw)`` as ``run_eagle_verify(batch, <me>.ctx, topk=<me>.topk, num_steps=<me>
    .speculative_num_steps, num_draft_tokens=<me>.speculative_num_draft_tokens, **kw)``."""
    kws = [ast.keyword("topk", _attr(me, "topk")), ast.keyword("num_steps", _attr(me, "speculative_num_steps")),
           ast.keyword("num_draft_tokens", _attr(me, "speculative_num_draft_tokens"))]
    return ast.Call(ast.Name("run_eagle_verify", ast.Load()), [call.args[0], _attr(me, "ctx")], kws + call.keywords)


class _Rewrite(ast.NodeTransformer):
    """``self`` → ``worker`` (when ``rename``); ``<me>.verify(...)`` → ``run_eagle_verify(...)``."""

    def __init__(self, me: str, rename: bool):
        self.me, self.rename = me, rename

    def visit_Name(self, node: ast.Name) -> ast.AST:
        if self.rename and node.id == "self":
            return ast.copy_location(ast.Name(self.me, node.ctx), node)
        return node

    def visit_Call(self, node: ast.Call) -> ast.AST:
        self.generic_visit(node)
        f = node.func
        if isinstance(f, ast.Attribute) and f.attr == "verify" and isinstance(f.value, ast.Name) \
                and f.value.id == self.me and node.args:
            return ast.copy_location(verify_call(self.me, node), node)
        return node


def shared_step(fbg: ast.FunctionDef) -> ast.FunctionDef:
    """``eagle_forward_generation`` made from a worker's ``forward_batch_generation``."""
    fn = _Rewrite("worker", True).visit(copy.deepcopy(fbg))
    fn.name = "eagle_forward_generation"
    fn.decorator_list = []
    fn.returns = None
    args = [ast.arg("worker"), ast.arg("batch")] + [ast.arg(a) for a in STEP_PARAMS[1:]]
    fn.args = ast.arguments(posonlyargs=[], args=args, vararg=None, kwonlyargs=[], kw_defaults=[], kwarg=None,
                            defaults=[ast.Constant(None)] * (len(STEP_PARAMS) - 1))
    return ast.fix_missing_locations(fn)


def refactor_common(tree: ast.Module, step: ast.FunctionDef) -> ast.Module:
    """``run_eagle_verify(batch, ctx, *, topk, num_steps, num_draft_tokens, …)`` and the shared step appended."""
    for fn in tree.body:
        if isinstance(fn, ast.FunctionDef) and fn.name == "run_eagle_verify":
            a = fn.args
            kept = [k for k in a.kwonlyargs if k.arg in _KEEP]
            moved = [k.arg for k in a.kwonlyargs if k.arg not in _KEEP]
            defaults = {k.arg: d for k, d in zip(a.kwonlyargs, a.kw_defaults)}
            kwonly = [ast.arg("topk"), ast.arg("num_steps"), ast.arg("num_draft_tokens")]
            kwonly += [k for k in kept if k.arg not in ("topk", "num_draft_tokens")]
            fn.args = ast.arguments(posonlyargs=[], args=[ast.arg("batch"), ast.arg("ctx")], vararg=None,
                                    kwonlyargs=kwonly, kw_defaults=[defaults.get(k.arg) for k in kwonly],
                                    kwarg=None, defaults=[])
            doc = fn.body[:1] if isinstance(fn.body[0], ast.Expr) else []
            unpack = [ast.Assign([ast.Name(m, ast.Store())], _attr("ctx", m)) for m in moved]
            fn.body = doc + unpack + fn.body[len(doc):]
    tree.body.append(step)
    return ast.fix_missing_locations(tree)


def refactor_worker(tree: ast.Module) -> ast.Module:
    """The workers' ``forward_batch_generation`` delegates to the shared step; ``verify`` is gone."""
    tree.body.insert(0, ast.ImportFrom("sglang.srt.speculative.eagle_worker_common",
                                       [ast.alias("eagle_forward_generation"), ast.alias("run_eagle_verify")], 0))
    for cls in tree.body:
        if not (isinstance(cls, ast.ClassDef) and cls.name in _WORKERS):
            continue
        body = []
        for fn in cls.body:
            if isinstance(fn, ast.FunctionDef) and fn.name == "verify":
                continue
            if isinstance(fn, ast.FunctionDef) and fn.name == "forward_batch_generation":
                call = ast.Call(ast.Name("eagle_forward_generation", ast.Load()),
                                [ast.Name("self", ast.Load())] + [ast.Name(p, ast.Load()) for p in STEP_PARAMS], [])
                fn.body = [ast.Return(call)]
            elif isinstance(fn, ast.FunctionDef):
                fn = _Rewrite("self", False).visit(fn)
            body.append(fn)
        cls.body = body
    return ast.fix_missing_locations(tree)


def apply(root: Path) -> None:
    """Rewrite the 0.5.23 tree under ``root`` (a copy: its files are replaced) into the #31499 layout."""
    v2 = ast.parse((root / _FILES[0]).read_text())
    cls = next(c for c in v2.body if isinstance(c, ast.ClassDef) and c.name == "EAGLEWorkerV2")
    fbg = next(f for f in cls.body if isinstance(f, ast.FunctionDef) and f.name == "forward_batch_generation")
    common = root / _COMMON
    common.write_text(ast.unparse(refactor_common(ast.parse(common.read_text()), shared_step(fbg))) + "\n")
    for f in _FILES:
        p = root / f
        if p.is_file():
            p.write_text(ast.unparse(refactor_worker(ast.parse(p.read_text()))) + "\n")
