"""Static verification of the hook targets against SGLang sources (AST only).

Never imports SGLang or torch: it parses the ``.py`` files of an SGLang tree
(an installed package, an unpacked wheel, or a wheel fetched from PyPI into a
cache by :func:`fetch_sglang`) and checks, for each target row that applies to
the version and to the tree's layout (:func:`detect_layout`: where the v2 decode
step lives, as released or as refactored by sgl-project/sglang#31499), that the
module, class and method (or module function) exist, that the leading
parameters match, that the body still calls what the range must enclose
(the CUDA-graph replay, the target forward, the step activation), and, for the
``accept`` mark, that the body still stores the accepted-draft count the hook
reads on its result (and whether it stores the per-request list the
``accept_histogram`` marks come from).
"""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

from .targets import (
    ACCEPT,
    ANY,
    CHECK,
    COMMON,
    ENTRY,
    LAYOUT_SHARED,
    LAYOUT_WORKER,
    LAYOUTS,
    MIXED,
    STAGE,
    STANDALONE,
    Target,
    parse_version,
    supported,
    targets_for,
)

__all__ = ["Finding", "Report", "detect_version", "detect_layout", "check_tree", "cache_dir", "FetchError",
           "fetch_sglang"]

_OK, _ABSENT_OPTIONAL = "ok", "absent (optional)"


@dataclass
class Finding:
    """The verdict on one target (or one standalone subclass) in one source tree."""

    what: str  # module.Class.method
    status: str  # "ok", "absent (optional)", or what is wrong
    detail: str = ""
    line: int | None = None

    @property
    def failed(self) -> bool:
        """True if this finding makes the check fail."""
        return self.status not in (_OK, _ABSENT_OPTIONAL)


@dataclass
class Report:
    """All findings for one SGLang tree."""

    version: str
    root: Path
    findings: list[Finding] = field(default_factory=list)
    unsupported: bool = False
    layout: str = LAYOUT_WORKER  # where the v2 decode step lives (nvtx_hooks.targets.LAYOUTS)

    @property
    def ok(self) -> bool:
        """True if every target is present and unchanged."""
        return not self.unsupported and not any(f.failed for f in self.findings)

    def lines(self) -> list[str]:
        """Human-readable report lines."""
        out = [f"SGLang {self.version} at {self.root}", f"  layout: {self.layout} — {LAYOUTS[self.layout]}"]
        if self.unsupported:
            out.append("  UNSUPPORTED version: the hooks would warn once and patch nothing")
        for f in self.findings:
            where = f":{f.line}" if f.line else ""
            mark = "FAIL" if f.failed else "ok  "
            extra = f" — {f.detail}" if f.detail else ""
            out.append(f"  {mark} {f.what}{where} [{f.status}]{extra}")
        n_fail = sum(f.failed for f in self.findings)
        out.append(f"  {len(self.findings) - n_fail}/{len(self.findings)} ok" + (" — FAILED" if not self.ok else ""))
        return out


def _package_root(path: Path) -> Path:
    """The directory that contains ``sglang/`` (accepts that directory or ``.../sglang`` itself)."""
    path = Path(path)
    if (path / "sglang" / "srt").is_dir():
        return path
    if (path / "srt").is_dir() and path.name == "sglang":
        return path.parent
    if (path / "python" / "sglang" / "srt").is_dir():  # a git checkout of sgl-project/sglang
        return path / "python"
    raise FileNotFoundError(f"{path}: no sglang/srt package below it")


def detect_version(root: Path) -> str | None:
    """The SGLang version of a source tree, read from its files (None if not stated)."""
    root = _package_root(root)
    pat = re.compile(r"""^__version__\s*(?::[^=]*)?=\s*(?:version\s*=\s*)?['"]([^'"]+)['"]""", re.M)
    for name in ("version.py", "_version.py"):
        p = root / "sglang" / name
        if p.is_file():
            m = pat.search(p.read_text(errors="replace"))
            if m:
                return m.group(1)
    for meta in sorted(root.glob("sglang-*.dist-info/METADATA")):
        m = re.search(r"^Version:\s*(\S+)", meta.read_text(errors="replace"), re.M)
        if m:
            return m.group(1)
    stamp = root / "SGLANG_VERSION"
    return stamp.read_text().strip() if stamp.is_file() else None


def detect_layout(root: Path) -> str:
    """The tree's layout (:data:`nvtx_hooks.targets.LAYOUTS`): shared-step when ``eagle_worker_common`` defines a
    top-level ``eagle_forward_generation`` (sgl-project/sglang#31499), else worker-step (as released)."""
    p = _module_file(_package_root(root), COMMON)
    if not p.is_file():
        return LAYOUT_WORKER
    try:
        tree = ast.parse(p.read_text(errors="replace"), str(p))
    except (SyntaxError, ValueError):
        return LAYOUT_WORKER  # the check of that module's rows says what is wrong with it
    return LAYOUT_SHARED if "eagle_forward_generation" in _functions(tree) else LAYOUT_WORKER


def _module_file(root: Path, module: str) -> Path:
    """Source file of a dotted module under ``root``."""
    return root.joinpath(*module.split(".")).with_suffix(".py")


def _classes(tree: ast.Module) -> dict[str, ast.ClassDef]:
    """Top-level classes of a module by name."""
    return {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}


def _methods(cls: ast.ClassDef | ast.Module) -> dict[str, ast.FunctionDef | ast.AsyncFunctionDef]:
    """Methods defined in a class body (not inherited), or a module's top-level functions."""
    return {n.name: n for n in cls.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}


_functions = _methods


def _calls(fn: ast.AST) -> set[str]:
    """Names of everything called in a function body (``a.b.replay(...)`` gives ``replay``)."""
    out: set[str] = set()
    for node in ast.walk(fn):
        if isinstance(node, ast.Call):
            f = node.func
            if isinstance(f, ast.Attribute):
                out.add(f.attr)
            elif isinstance(f, ast.Name):
                out.add(f.id)
    return out


def _assigned(fn: ast.AST, obj: str) -> set[str]:
    """Attributes stored on the name ``obj`` in a function body (``obj.x = …``, ``obj.x += …``)."""
    out: set[str] = set()
    for node in ast.walk(fn):
        targets = node.targets if isinstance(node, ast.Assign) else (
            [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else [])
        for t in targets:
            for sub in ast.walk(t):  # tuple targets too: ``a.x, b = …``
                if isinstance(sub, ast.Attribute) and isinstance(sub.value, ast.Name) and sub.value.id == obj:
                    out.add(sub.attr)
    return out


def _check_params(fn: ast.FunctionDef | ast.AsyncFunctionDef, want: tuple[tuple[str, ...], ...]) -> str:
    """Empty if the leading positional parameters match ``want``, else what differs."""
    names = [a.arg for a in fn.args.posonlyargs + fn.args.args]
    for i, allowed in enumerate(want):
        if i >= len(names):
            return f"has {len(names)} positional parameters, expected ≥ {len(want)} ({_fmt(want)})"
        if ANY not in allowed and names[i] not in allowed:
            return f"parameter {i} is {names[i]!r}, expected {' or '.join(map(repr, allowed))} ({_fmt(want)})"
    return ""


def _fmt(want: tuple[tuple[str, ...], ...]) -> str:
    return "(" + ", ".join("|".join(a) for a in want) + ", …)"


class _Trees:
    """Parsed modules of one source tree, cached."""

    def __init__(self, root: Path):
        self.root = root
        self._cache: dict[str, ast.Module | None] = {}

    def get(self, module: str) -> ast.Module | None:
        """The module's syntax tree; None when it has no file; ValueError when the file is not Python (a syntax
        error, a NUL byte): bad input, not a failed check."""
        if module not in self._cache:
            p = _module_file(self.root, module)
            try:
                self._cache[module] = ast.parse(p.read_text(errors="replace"), str(p)) if p.is_file() else None
            except (SyntaxError, ValueError) as e:
                line = getattr(e, "lineno", None)  # (a SyntaxError's)
                where = f", line {line}" if line else ""
                msg = getattr(e, "msg", None) or str(e)
                raise ValueError(f"{p}: cannot be parsed as Python ({msg}{where}); is this an SGLang source tree "
                                 "as released?") from None
        return self._cache[module]


def _check_target(trees: _Trees, t: Target) -> Finding:
    """The finding for one target row."""
    tree = trees.get(t.module)
    if tree is None:
        return Finding(t.qualname, _ABSENT_OPTIONAL if t.optional else "missing module",
                       str(_module_file(Path(""), t.module)))
    owner: ast.ClassDef | ast.Module | None = _classes(tree).get(t.cls) if t.cls else tree
    if owner is None:
        return Finding(t.qualname, _ABSENT_OPTIONAL if t.optional else "missing class")
    methods = _methods(owner)
    name = next((m for m in t.methods if m in methods), None)
    if name is None:
        alts = " / ".join(t.methods)
        return Finding(t.qualname, _ABSENT_OPTIONAL if t.optional else ("missing function" if not t.cls else
                                                                         "missing method"), f"none of {alts}")
    fn = methods[name]
    what = ".".join(x for x in (t.module, t.cls, name) if x)
    bad = _check_params(fn, t.params)
    if bad:
        return Finding(what, "changed signature", bad, fn.lineno)
    if t.encloses and not (_calls(fn) & set(t.encloses)):
        return Finding(what, "changed body", f"calls none of {', '.join(t.encloses)}", fn.lineno)
    if t.assigns:
        obj = [a.arg for a in fn.args.posonlyargs + fn.args.args][1]
        if not (_assigned(fn, obj) & set(t.assigns)):
            return Finding(what, "changed body", f"assigns none of {obj}.{' / '.join(t.assigns)}", fn.lineno)
    if t.kind == ACCEPT:
        obj = [a.arg for a in fn.args.posonlyargs + fn.args.args][1]
        per = sorted(_assigned(fn, obj) & set(t.per_request))
        hist = f", accept_histogram from {per[0]}" if per else " (no per-request list: no accept_histogram)"
        return Finding(what, _OK, f"mark {t.phase} reads {t.assigns[0]}{hist}", fn.lineno)
    if t.kind == CHECK:
        return Finding(what, _OK, f"calls {' / '.join(t.encloses)} (relied on, not patched)", fn.lineno)
    if t.kind == STAGE:
        return Finding(what, _OK, f"host range {t.phase}", fn.lineno)
    if t.kind == ENTRY:
        steps = "the adaptive route of the batch size" if t.routes_steps else "the worker's speculative_num_steps"
        return Finding(what, _OK, f"range cycle|prefill, steps: {steps}", fn.lineno)
    if t.kind == MIXED:
        return Finding(what, _OK, "range cycle|prefill inside a prefill-classified batch (DP coordination)",
                       fn.lineno)
    return Finding(what, _OK, f"range {t.phase}", fn.lineno)


def _check_standalone(trees: _Trees, targets: list[Target]) -> list[Finding]:
    """Standalone subclasses must not override patched methods (else they escape the hooks)."""
    out = []
    for module, sub, base in STANDALONE:
        tree = trees.get(module)
        cls = _classes(tree).get(sub) if tree else None
        if cls is None:
            continue
        patched = {m for t in targets if t.cls == base for m in t.methods}
        over = sorted(patched & set(_methods(cls)))
        what = f"{module}.{sub}"
        if over:
            out.append(Finding(what, "overrides patched method", ", ".join(over), cls.lineno))
        else:
            out.append(Finding(what, _OK, f"inherits the {base} patches", cls.lineno))
    return out


def check_tree(root: Path, version: str | None = None) -> Report:
    """Verify every target that applies to the SGLang tree at ``root``."""
    root = _package_root(root)
    version = version or detect_version(root)
    if not version:
        raise ValueError(f"{root}: cannot tell the SGLang version; pass --version")
    v = parse_version(version)
    rep = Report(version, root, layout=detect_layout(root))
    if not supported(v):
        rep.unsupported = True
        return rep
    trees = _Trees(root)
    targets = targets_for(v, rep.layout)
    rep.findings = [_check_target(trees, t) for t in targets] + _check_standalone(trees, targets)
    return rep


# --- fetching real sources -------------------------------------------------------------------

_WANT = re.compile(
    r"^(sglang/(version|_version)\.py|sglang/srt/speculative/[^/]+\.py|sglang/srt/managers/tp_worker\.py"
    r"|sglang/srt/managers/scheduler_output_processor_mixin\.py|sglang/srt/managers/scheduler\.py"
    r"|sglang/srt/managers/scheduler_components/[^/]+\.py"
    r"|sglang-[^/]+\.dist-info/METADATA)$"
)
# Bumped whenever _WANT grows: a cached tree unpacked with another file set is fetched again.
_FILESET = "3"
_STAMP = "SPECTRACE_FILESET"


def cache_dir() -> Path:
    """Where fetched SGLang sources live: ``$SPECTRACE_CACHE_DIR`` or ``~/.cache/spectrace``, ``/sglang``."""
    base = os.environ.get("SPECTRACE_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "spectrace"
    )
    return Path(base) / "sglang"


class FetchError(RuntimeError):
    """The SGLang wheel could not be downloaded (offline, unknown version)."""


def fetch_sglang(version: str, cache: Path | None = None, timeout: float = 120) -> Path:
    """Download ``sglang==version`` (wheel, no deps) once and unpack only the files the check reads."""
    dest = (cache or cache_dir()) / version
    if _fresh(dest):
        return dest
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [
            sys.executable, "-m", "pip", "download", f"sglang=={version}", "--no-deps",
            "--only-binary=:all:", "--python-version", "3.11", "--implementation", "cp",
            "--platform", "manylinux_2_34_x86_64", "--platform", "any",
            "--disable-pip-version-check", "-q", "-d", tmp,
        ]
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        except (subprocess.TimeoutExpired, OSError) as e:
            raise FetchError(f"pip download sglang=={version}: {e}") from e
        wheels = list(Path(tmp).glob("sglang-*.whl"))
        if r.returncode or not wheels:
            tail = (r.stderr or r.stdout).strip().splitlines()[-1:] or ["no wheel"]
            raise FetchError(f"pip download sglang=={version} failed: {tail[0]}")
        part = dest.with_name(dest.name + ".part")
        part.mkdir(parents=True, exist_ok=True)
        with zipfile.ZipFile(wheels[0]) as z:
            for n in z.namelist():
                if _WANT.match(n):
                    z.extract(n, part)
        (part / "SGLANG_VERSION").write_text(version + "\n")
        (part / _STAMP).write_text(_FILESET + "\n")
        if _fresh(dest):  # another process won the race
            shutil.rmtree(part, ignore_errors=True)
            return dest
        if dest.exists():  # unpacked by an older spectrace with fewer files: replace it
            old = dest.with_name(f"{dest.name}.old-{os.getpid()}")
            dest.rename(old)
            shutil.rmtree(old, ignore_errors=True)
        part.rename(dest)
    return dest


def _fresh(dest: Path) -> bool:
    """True if ``dest`` is a complete unpacked tree with the current file set."""
    stamp = dest / _STAMP
    return (dest / "SGLANG_VERSION").is_file() and stamp.is_file() and stamp.read_text().strip() == _FILESET
