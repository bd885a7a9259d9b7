"""Patch SGLang's EAGLE workers with spectrace ranges, at import time.

:func:`install` reads the SGLang version (package metadata, never importing
SGLang), picks the target rows for it, patches the target modules already
imported and registers a ``sys.meta_path`` finder that patches the others
right after they are first imported (SGLang imports its workers lazily).
Unknown versions: one warning, nothing patched. :func:`uninstall` restores
the original functions. Wrappers push/pop through :mod:`nvtx_hooks.ranges`,
always pop (also on exceptions), never touch the device, do nothing while
``torch.compiler.is_compiling()``, and swallow their own errors. One kind
(``ACCEPT``) opens no range: after SGLang's v2 result processing has put a
decode batch's accept lengths on the host, it emits an ``accept`` mark whose
cycle index the entry wrapper attached to that result object (:data:`TAG`).
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.metadata
import logging
import os
import sys
import threading
from typing import TYPE_CHECKING, Any

from . import ranges
from .phases import encode_payload
from .targets import (
    ACCEPT,
    DRAFT_EXTEND,
    ENTRY,
    IN_PREFILL,
    PHASE,
    VERIFY,
    Target,
    parse_version,
    supported,
    targets_for,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from importlib.machinery import ModuleSpec
    from types import ModuleType

__all__ = ["log", "TAG", "sglang_version", "install", "uninstall", "patched", "installed"]

log = logging.getLogger("spectrace.hooks")

_lock = threading.RLock()
_installed = False
_version: str | None = None
_pending: dict[str, list[Target]] = {}  # module -> targets not yet applied
_applied: dict[tuple[str, str, str], tuple[type, object]] = {}  # (module, cls, method) -> (class, original)
_finder: _Finder | None = None
_warned = False
_reported: set[str] = set()


class _State(threading.local):
    """Per-thread stack of open spectrace phases and the current cycle's numbers."""

    def __init__(self) -> None:
        self.stack: list[str] = []
        self.batch_size = 0
        self.accept: int | None = None


_tls = _State()
_cycle = [0]  # per-process decode-cycle counter (shared by threads)
# Attribute the v2 entry wrapper sets on the result object of a decode cycle: that cycle's index. SGLang
# queues the same object and processes it later (overlap: after the next cycle started), so the ``accept``
# mark names the cycle whose accept lengths it carries, not the one running when it is emitted.
TAG = "_spectrace_cycle"


# --- torch.compile guard, resolved lazily (never imports torch) -------------------------------

_is_compiling = None


def _compiling() -> bool:
    """True while torch.compile traces (NVTX calls would break Dynamo); torch is not imported here."""
    global _is_compiling
    f = _is_compiling
    if f is None:
        torch = sys.modules.get("torch")
        if torch is None:
            return False
        try:
            f = torch.compiler.is_compiling
        except AttributeError:  # old torch
            f = getattr(getattr(torch, "_dynamo", None), "is_compiling", None) or (lambda: False)
        _is_compiling = f
    return f()


# --- reading the batch (host-side attributes only) --------------------------------------------


def _batch_arg(args: tuple, kwargs: dict) -> Any:
    """The batch passed to a worker method (positional after self, or by keyword)."""
    if len(args) > 1:
        return args[1]
    return kwargs.get("batch", kwargs.get("model_worker_batch"))


def _batch_size(b: Any) -> int:
    """Requests in a ScheduleBatch/ModelWorkerBatch: ``len(reqs)`` or the seq_lens shape, never a sync."""
    reqs = getattr(b, "reqs", None)
    if reqs is not None:
        return len(reqs)
    sl = getattr(b, "seq_lens", None)
    if sl is None:
        return 0
    shape = getattr(sl, "shape", None)
    return int(shape[0]) if shape else len(sl)


def _is_prefill(b: Any) -> bool:
    """True for an extend (prefill) batch, as SGLang's own worker branches decide."""
    if getattr(b, "is_extend_in_batch", False):
        return True
    fm = getattr(b, "forward_mode", None)
    return bool(fm is not None and fm.is_extend())


def _arg(args: tuple, kwargs: dict, i: int, name: str) -> Any:
    """Parameter ``i`` (after self, i >= 1) of a method call, positional or by keyword."""
    return args[i] if len(args) > i else kwargs.get(name)


def _accepted(result: Any, attrs: tuple[str, ...]) -> int:
    """The accepted-draft count SGLang's own call stored on ``result`` (a host int; never a tensor read)."""
    for a in attrs:
        v = getattr(result, a, None)
        if type(v) is int:
            return v
    raise TypeError(f"{type(result).__name__} has no int {' / '.join(attrs)} after the call")


def _accept_from_verify(result: Any) -> int | None:
    """Sum of accepted draft tokens if verify already put them on the host (v1: a list)."""
    if isinstance(result, tuple) and len(result) >= 2:
        acc = getattr(result[1], "accept_length_per_req_cpu", None)
        if isinstance(acc, list):
            return sum(acc)
    return None


# --- the wrapper ------------------------------------------------------------------------------


def _report_error(where: str, e: BaseException) -> None:
    """Log a hook failure once per site; the server carries on."""
    if where not in _reported:
        _reported.add(where)
        log.warning("spectrace hooks: error in %s (ignored, further ones silent): %r", where, e)


def _make_wrapper(orig: Callable[..., Any], t: Target) -> Callable[..., Any]:
    """A function that runs ``orig`` inside the range ``t`` describes."""
    phase, kind, site, tags = t.phase, t.kind, t.qualname, t.tags_result

    def _open(args: tuple, kwargs: dict) -> tuple[bool, int | None]:
        """Push the range; returns (pushed, tag): pushed means it must be popped, tag is the cycle
        index to attach to the result (an entry that opened a decode cycle, ``tags_result`` rows)."""
        if _compiling():
            return False, None
        st = _tls.stack
        top = st[-1] if st else None
        tag = None
        if kind == IN_PREFILL:
            if top != "prefill":
                return False, None
            name, payload = phase, None
        elif kind == ENTRY:
            b = _batch_arg(args, kwargs)
            name = "prefill" if _is_prefill(b) else "cycle"
            if top == name:  # a subclass override calling super(): one range, one index
                return False, None
            if name == "cycle":
                _cycle[0] += 1
                if tags:
                    tag = _cycle[0]
            bs = _tls.batch_size = _batch_size(b)
            _tls.accept = None
            payload = encode_payload(bs, _cycle[0])
        else:
            name = phase
            if top == name:  # a subclass override calling super(): one range
                return False, None
            payload = None
            if kind == DRAFT_EXTEND:
                payload = encode_payload(_tls.batch_size, _cycle[0], _tls.accept)
        ranges.push(name, payload)
        st.append(name)
        return True, tag

    def _close() -> None:
        try:
            _tls.stack.pop()
        finally:
            ranges.pop()

    r = ranges
    tls = _tls

    if kind == ACCEPT:  # no range: one mark after SGLang's own call put the accept lengths on the host
        attrs = t.assigns

        @functools.wraps(orig)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            out = orig(*args, **kwargs)  # raises through: nothing was opened
            if not r._on:
                return out
            try:
                result = _arg(args, kwargs, 1, "result")
                cyc = getattr(result, TAG, None)
                if cyc is not None and not _compiling():  # None: not a cycle spectrace opened (prefill, ngram…)
                    acc = _accepted(result, attrs)
                    bs = _batch_size(_arg(args, kwargs, 2, "batch"))
                    r.mark(phase, encode_payload(bs, cyc, acc))
            except Exception as e:  # never break the server
                _report_error(site, e)
            return out

    elif kind == PHASE:  # the common case, kept short: fixed name, no payload

        @functools.wraps(orig)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if not r._on:  # ranges off (no NVTX tool attached, or switched off): just the call
                return orig(*args, **kwargs)
            st = tls.stack
            try:
                if (st and st[-1] == phase) or _compiling():
                    return orig(*args, **kwargs)
                r.push(phase)
                st.append(phase)
            except Exception as e:  # never break the server
                _report_error(site, e)
                return orig(*args, **kwargs)
            try:
                return orig(*args, **kwargs)
            finally:
                try:
                    st.pop()
                    r.pop()
                except Exception as e:
                    _report_error(site + " (pop)", e)

    else:

        @functools.wraps(orig)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if not r._on:
                return orig(*args, **kwargs)
            try:
                pushed, tag = _open(args, kwargs)
            except Exception as e:  # never break the server
                _report_error(site, e)
                pushed, tag = False, None
            if not pushed:
                return orig(*args, **kwargs)
            try:
                result = orig(*args, **kwargs)
            finally:
                try:
                    _close()
                except Exception as e:
                    _report_error(site + " (pop)", e)
            if kind == VERIFY:
                try:
                    tls.accept = _accept_from_verify(result)
                except Exception as e:
                    _report_error(site + " (accept)", e)
            elif tag is not None:
                try:
                    setattr(result, TAG, tag)  # SGLang sets attributes on this dataclass itself (copy_done)
                except Exception as e:
                    _report_error(site + " (tag)", e)
            return result

    # what was wrapped, and by which target (uninstall puts the original back): attributes of the function object
    wrapper.__dict__.update(__spectrace_wrapped__=orig, __spectrace_target__=t)
    return wrapper


# --- applying targets -------------------------------------------------------------------------


def _apply_module(module: ModuleType, targets: list[Target]) -> list[str]:
    """Patch the targets of one imported module; returns ``Class.method`` names patched."""
    done = []
    for t in targets:
        try:
            cls = getattr(module, t.cls, None)
            if not isinstance(cls, type):
                if not t.optional:
                    log.warning("spectrace hooks: %s.%s not found; not patched", t.module, t.cls)
                continue
            name = next((m for m in t.methods if m in cls.__dict__), None)
            if name is None:
                if not t.optional:
                    log.warning("spectrace hooks: %s.%s has none of %s; not patched", t.module, t.cls, t.methods)
                continue
            key = (t.module, t.cls, name)
            if key in _applied:
                continue
            orig = cls.__dict__[name]
            if getattr(orig, "__spectrace_wrapped__", None) is not None:
                continue
            setattr(cls, name, _make_wrapper(orig, t))
            _applied[key] = (cls, orig)
            label = {ENTRY: "cycle|prefill", ACCEPT: f"{t.phase} (mark)"}.get(t.kind, t.phase)
            done.append(f"{t.cls}.{name}→{label}")
        except Exception as e:
            _report_error(f"patching {t.qualname}", e)
    return done


def _on_import(fullname: str, module: ModuleType) -> None:
    """Called right after a target module finished executing."""
    with _lock:
        targets = _pending.pop(fullname, None)
        if not targets:
            return
        done = _apply_module(module, targets)
    if done:
        log.info("spectrace hooks: pid %d SGLang %s patched %s: %s", os.getpid(), _version, fullname,
                 ", ".join(done))


class _Loader(importlib.abc.Loader):
    """Delegates to the real loader, then patches the freshly executed module."""

    def __init__(self, inner: importlib.abc.Loader, fullname: str) -> None:
        self._inner, self._fullname = inner, fullname

    def create_module(self, spec: ModuleSpec) -> ModuleType | None:
        return self._inner.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._inner.exec_module(module)
        try:
            _on_import(self._fullname, module)
        except Exception as e:
            _report_error(f"import hook {self._fullname}", e)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class _Finder(importlib.abc.MetaPathFinder):
    """Meta-path finder that wraps the loader of target modules (others pass through)."""

    def __init__(self) -> None:
        self._busy = threading.local()

    def find_spec(self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
                  ) -> ModuleSpec | None:
        if fullname not in _pending or getattr(self._busy, "on", False):
            return None
        self._busy.on = True
        try:
            for finder in sys.meta_path:
                if finder is self or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(fullname, path, target)
                if spec is not None:
                    break
            else:
                return None
        finally:
            self._busy.on = False
        if spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = _Loader(spec.loader, fullname)
        return spec


# --- public API -------------------------------------------------------------------------------


def sglang_version() -> str | None:
    """The installed SGLang version from package metadata (does not import SGLang)."""
    try:
        return importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        mod = sys.modules.get("sglang.version")
        return getattr(mod, "__version__", None)


def _setup_logging() -> None:
    """Give the hooks logger its own stderr handler (SGLang may not have configured logging yet)."""
    if not log.handlers and os.environ.get("SPECTRACE_HOOKS_LOG", "1") != "0":
        h = logging.StreamHandler(sys.stderr)
        h.setFormatter(logging.Formatter("[spectrace] %(message)s"))
        log.addHandler(h)
        log.setLevel(logging.INFO)
        log.propagate = False


def install(version: str | None = None) -> list[str]:
    """Patch SGLang for ``version`` (default: the installed one); idempotent.

    Returns the target modules armed. An unsupported or unknown version logs
    one warning and patches nothing (set ``SPECTRACE_SGLANG_VERSION`` to force
    the table of a known version onto a build whose version string is odd).
    """
    global _installed, _version, _finder, _warned
    _setup_logging()
    with _lock:
        if _installed:
            return list(_pending) + sorted({k[0] for k in _applied})
        version = version or os.environ.get("SPECTRACE_SGLANG_VERSION") or sglang_version()
        v = parse_version(version or "")
        if not supported(v):
            if not _warned:
                _warned = True
                log.warning("spectrace hooks: SGLang version %s is not in the target table; no patching "
                            "(the server runs untouched)", version)
            return []
        _version = version
        _pending.clear()
        for t in targets_for(v):
            _pending.setdefault(t.module, []).append(t)
        modules = list(_pending)
        _finder = _Finder()
        sys.meta_path.insert(0, _finder)
        _installed = True
        already = [m for m in modules if m in sys.modules]
    for m in already:
        _on_import(m, sys.modules[m])
    log.info("spectrace hooks: pid %d SGLang %s, ranges %s, watching %s", os.getpid(), version,
             "on" if ranges.enabled() else "off (no NVTX tool attached)", ", ".join(modules))
    return modules


def uninstall() -> None:
    """Restore every patched method and remove the import hook."""
    global _installed, _finder, _warned
    with _lock:
        for (_mod, _cls, name), (cls, orig) in _applied.items():
            try:
                setattr(cls, name, orig)
            except Exception as e:
                _report_error(f"restoring {_cls}.{name}", e)
        _applied.clear()
        _pending.clear()
        if _finder is not None and _finder in sys.meta_path:
            sys.meta_path.remove(_finder)
        _finder = None
        _installed = False
        _warned = False
        _tls.stack.clear()
        _cycle[0] = 0


def patched() -> list[str]:
    """``module.Class.method`` of every method currently patched."""
    return [f"{m}.{c}.{n}" for (m, c, n) in _applied]


def installed() -> bool:
    """True between :func:`install` (on a supported version) and :func:`uninstall`."""
    return _installed
