"""Patch SGLang's EAGLE workers and scheduler with spectrace ranges, at import time.

:func:`install` reads the SGLang version (package metadata, never importing
SGLang), picks the target rows for it, patches the target modules already
imported and registers a ``sys.meta_path`` finder that patches the others
right after they are first imported (SGLang imports its workers lazily).
Unknown versions: one warning, nothing patched. :func:`uninstall` restores
the original functions. Wrappers push/pop through :mod:`nvtx_hooks.ranges`,
always pop (also on exceptions), never touch the device, do nothing while
``torch.compiler.is_compiling()``, and swallow their own errors.

What each range carries (payload version 2, :mod:`nvtx_hooks.phases`): a decode ``cycle`` its batch size,
cycle index and step count (:func:`_route_steps`: the count SGLang's adaptive controller routes the batch
size to, the same pure lookup ``activate_step_by_batch`` makes right after; else the worker's
``speculative_num_steps``); ``draft``/``verify``/``draft_extend`` the same with the step count read from the
worker when they open (``verify``'s is read after SGLang activated it: the authority), ``next_round`` on a
draft that runs after this cycle's verify (pipeline parallel), ``in_prefill_batch`` inside a DP-attention
batch classified as prefill. One kind (``ACCEPT``) opens no range: after SGLang's v2 result processing has
put a decode batch's accept lengths on the host, it emits an ``accept`` mark whose cycle index the entry
wrapper attached to that result object (:data:`TAG`), then ``accept_histogram`` marks from SGLang's
per-request host list (v1: right after ``verify``, from its host list). ``STAGE`` rows put
``scheduler.<method>`` host ranges (their own NVTX domain, ``spectrace.host``) around the scheduler's loop
methods, only while it serves (after a
``get_next_batch_to_run`` that returned a batch: an idle loop spins through them thousands of times a
second), never while SGLang's own ``SGLANG_ENABLE_NVTX_SCHEDULER`` ranges are on, and not at all with
``SPECTRACE_SCHEDULER_RANGES=0``.
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
from .phases import encode_accept_histogram, encode_payload, histogram_of
from .targets import (
    ACCEPT,
    CHECK,
    COMMON,
    DRAFT,
    ENTRY,
    IN_PREFILL,
    LAYOUT_SHARED,
    LAYOUT_WORKER,
    MIXED,
    PHASE,
    PREFILL,
    STAGE,
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

__all__ = ["log", "TAG", "SCHEDULER_ENV", "sglang_version", "layout", "install", "uninstall", "patched",
           "installed"]

log = logging.getLogger("spectrace.hooks")

SCHEDULER_ENV = "SPECTRACE_SCHEDULER_RANGES"  # "0": no scheduler.* host ranges (the STAGE rows are not armed)
_NVTX_UTILS = "sglang.srt.utils.nvtx_utils"  # SGLang's own NVTX gates (0.5.14 …): NVTX_SCHEDULER_ENABLED

_lock = threading.RLock()
_installed = False
_version: str | None = None
_pending: dict[str, list[Target]] = {}  # module -> targets not yet applied
_applied: dict[tuple[str, str, str], tuple[object, object]] = {}  # (module, cls, method) -> (owner, original)
_finder: _Finder | None = None
_warned = False
_reported: set[str] = set()
_mixed = [False]  # a MIXED row is patched: the entry leaves DP-coordinated batches to it


class _State(threading.local):
    """Per-thread stack of open spectrace ranges and the current cycle's numbers."""

    def __init__(self) -> None:
        self.stack: list[str] = []
        self.batch_size = 0
        self.accept: int | None = None
        self.steps: int | None = None  # the cycle's step count (verify's once it ran)
        self.verified = False  # this cycle's verify ran (a draft after it drafts the next round)
        self.in_prefill_batch = False  # this cycle runs inside a batch classified as prefill (DP attention)
        self.busy = False  # the scheduler's last get_next_batch_to_run returned a batch (STAGE ranges on)
        self.hosts: list[str] = []  # open scheduler host ranges (their own NVTX domain, their own stack)


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
    return _extends(b)


def _extends(b: Any) -> bool:
    """This rank's own batch is an extend (prefill) batch (``forward_mode.is_extend()``)."""
    fm = getattr(b, "forward_mode", None)
    return bool(fm is not None and fm.is_extend())


def _dp_coordinated(w: Any, b: Any) -> bool:
    """SGLang will take its DP-attention prefill-coordination branch (0.5.22 …) for this prefill-classified batch,
    where this rank may decode: the MIXED row's wrapper opens the range then (when one is patched)."""
    return (_mixed[0] and getattr(b, "is_extend_in_batch", False) is True
            and getattr(w, "enable_dp_spec_prefill_coordination", False) is True)


def _arg(args: tuple, kwargs: dict, i: int, name: str) -> Any:
    """Parameter ``i`` (after self, i >= 1) of a method call, positional or by keyword."""
    return args[i] if len(args) > i else kwargs.get(name)


def _int(v: Any) -> int | None:
    """``v`` if it is a host int (not a bool, never a tensor read), else None."""
    return v if type(v) is int else None


def _route_steps(w: Any, b: Any) -> int | None:
    """The step count this decode batch runs with, read before SGLang's step activates it: the adaptive
    controller's route for the batch size (``params.get_steps_for_batch``: the pure lookup
    ``activate_step_by_batch(batch.seq_lens.shape[0])`` makes), else the worker's ``speculative_num_steps``."""
    ctl = getattr(w, "adaptive_controller", None)
    if ctl is None:
        return _int(getattr(w, "speculative_num_steps", None))
    try:
        sl = getattr(b, "seq_lens", None)
        shape = getattr(sl, "shape", None)
        n = int(shape[0]) if shape else _batch_size(b)
        return _int(ctl.params.get_steps_for_batch(n))
    except Exception as e:  # a changed controller: the step count is unknown, the range still opens
        _report_error("adaptive step route", e)
        return None


def _accepted(result: Any, attrs: tuple[str, ...]) -> int:
    """The accepted-draft count SGLang's own call stored on ``result`` (a host int; never a tensor read)."""
    for a in attrs:
        v = getattr(result, a, None)
        if type(v) is int:
            return v
    raise TypeError(f"{type(result).__name__} has no int {' / '.join(attrs)} after the call")


def _host_list(obj: Any, attrs: tuple[str, ...]) -> list[int] | None:
    """The first of ``attrs`` on ``obj`` that is a host list of ints ≥ 0 (accepted drafts per request), or None."""
    for a in attrs:
        v = getattr(obj, a, None)
        if type(v) is list and all(type(x) is int and x >= 0 for x in v):
            return v
    return None


def _verify_accepts(result: Any) -> list[int] | None:
    """Accepted draft tokens per request if v1's verify already put them on the host (a list), else None."""
    if isinstance(result, tuple) and len(result) >= 2:
        return _host_list(result[1], ("accept_length_per_req_cpu",))
    return None


def _histogram_marks(cycle: int, per_request: list[int], accepted: int) -> None:
    """The ``accept_histogram`` marks of one cycle from its per-request accepted drafts (when they sum to the
    batch's accepted count: else reported once, none emitted)."""
    if sum(per_request) != accepted:
        raise ValueError(f"per-request accepted drafts sum to {sum(per_request)}, the batch's count is {accepted}")
    for v in encode_accept_histogram(cycle, histogram_of(per_request)):
        ranges.mark("accept_histogram", v)


# --- the wrapper ------------------------------------------------------------------------------


def _report_error(where: str, e: BaseException) -> None:
    """Log a hook failure once per site; the server carries on."""
    if where not in _reported:
        _reported.add(where)
        log.warning("spectrace hooks: error in %s (ignored, further ones silent): %r", where, e)


def _begin(name: str, w: Any, b: Any, routes: bool, in_prefill_batch: bool) -> int:
    """Start a ``cycle`` (advance the index, note its numbers) or a ``prefill``; returns the range's payload."""
    tls = _tls
    tls.in_prefill_batch = in_prefill_batch
    bs = _batch_size(b)
    if name != "cycle":
        return encode_payload(bs, _cycle[0], in_prefill_batch=in_prefill_batch)
    _cycle[0] += 1
    tls.batch_size, tls.accept, tls.verified = bs, None, False
    tls.steps = _route_steps(w, b) if routes else _int(getattr(w, "speculative_num_steps", None))
    return encode_payload(bs, _cycle[0], None, tls.steps, in_prefill_batch=in_prefill_batch)


def _make_wrapper(orig: Callable[..., Any], t: Target) -> Callable[..., Any]:
    """A function that runs ``orig`` inside the range ``t`` describes."""
    phase, kind, site, tags, routes = t.phase, t.kind, t.qualname, t.tags_result, t.routes_steps

    def _open(args: tuple, kwargs: dict) -> tuple[bool, int | None]:
        """Push the range; returns (pushed, tag): pushed means it must be popped, tag is the cycle
        index to attach to the result (an entry that opened a decode cycle, ``tags_result`` rows)."""
        if _compiling():
            return False, None
        tls = _tls
        st = tls.stack
        top = st[-1] if st else None
        tag = None
        payload: int | None
        if kind == IN_PREFILL:
            if top != "prefill":
                return False, None
            name, payload = phase, None
        elif kind in (ENTRY, MIXED):
            w, b = args[0], _batch_arg(args, kwargs)
            if kind == MIXED:  # DP coordination: this rank decodes inside a prefill-classified batch, or prefills
                name = "prefill" if _extends(b) else "cycle"
            elif _is_prefill(b):
                if _dp_coordinated(w, b):
                    return False, None  # the MIXED or PREFILL row opens the range
                name = "prefill"
            else:
                name = "cycle"
            if top == name:  # a subclass override calling super(): one range, one index
                return False, None
            payload = _begin(name, w, b, routes, kind == MIXED)
            if name == "cycle" and tags:
                tag = _cycle[0]
        elif kind == PREFILL:
            if top == "prefill":
                return False, None
            name = "prefill"
            payload = _begin(name, args[0], _batch_arg(args, kwargs), False, False)
        else:  # DRAFT, VERIFY, DRAFT_EXTEND
            name = phase
            if top == name:  # a subclass override calling super(): one range
                return False, None
            try:
                payload = _phase_payload(args, kwargs, top == "cycle")
            except Exception as e:  # the range still opens, without its numbers (said once)
                _report_error(site + " (payload)", e)
                payload = None
        ranges.push(name, payload)
        st.append(name)
        return True, tag

    def _phase_payload(args: tuple, kwargs: dict, in_cycle: bool) -> int:
        """The payload of a draft, verify or draft_extend range (see the module doc)."""
        tls = _tls
        flag = tls.in_prefill_batch
        if kind == DRAFT:  # inside a cycle the cycle's batch; else (DP coordination's idle draft) its own
            steps = _int(getattr(args[0], "speculative_num_steps", None))
            bs = tls.batch_size if in_cycle else _batch_size(_batch_arg(args, kwargs))
            return encode_payload(bs, _cycle[0], None, steps, next_round=tls.verified, in_prefill_batch=flag)
        if kind == VERIFY:
            steps = _int(kwargs.get(t.steps_kwarg) if t.steps_kwarg else getattr(args[0], "speculative_num_steps",
                                                                                 None))
            if steps is not None:
                if tls.steps is not None and steps != tls.steps:
                    _report_error(site + " (steps)", ValueError(
                        f"the cycle's step count {tls.steps} is not the one verify runs with, {steps}: "
                        "verify's payload carries the one that ran"))
                tls.steps = steps
            tls.verified = True
            return encode_payload(tls.batch_size, _cycle[0], None, tls.steps, in_prefill_batch=flag)
        return encode_payload(tls.batch_size, _cycle[0], tls.accept, tls.steps, in_prefill_batch=flag)

    def _close() -> None:
        try:
            _tls.stack.pop()
        finally:
            ranges.pop()

    r = ranges
    tls = _tls

    if kind == ACCEPT:  # no range: marks after SGLang's own call put the accept lengths on the host
        attrs, per_req = t.assigns, t.per_request

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
                    lst = _host_list(result, per_req) if per_req else None
                    if lst is not None:
                        _histogram_marks(cyc, lst, acc)
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

    elif kind == STAGE:  # a scheduler method: a host range (own domain) while the scheduler serves, no payload
        gated = phase not in ("scheduler.run_batch", "scheduler.process_batch_result")  # those always have a batch
        schedules = phase == "scheduler.get_next_batch_to_run"
        hr = r.host

        @functools.wraps(orig)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if not r._on:
                return orig(*args, **kwargs)
            hs = tls.hosts
            try:
                on = not ((gated and not tls.busy) or (hs and hs[-1] == phase) or _compiling())
                if on:
                    hr.push(phase)
                    hs.append(phase)
            except Exception as e:  # never break the server
                _report_error(site, e)
                on = False
            try:
                out = orig(*args, **kwargs)
            finally:
                if on:
                    try:
                        hs.pop()
                        hr.pop()
                    except Exception as e:
                        _report_error(site + " (pop)", e)
            if schedules:  # 0.5.18+: a plan whose batch_to_run is the batch; before: the batch or None
                try:
                    tls.busy = getattr(out, "batch_to_run", out) is not None
                except Exception as e:
                    _report_error(site + " (batch)", e)
            return out

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
                    lst = _verify_accepts(result)
                    tls.accept = None if lst is None else sum(lst)
                    if lst is not None:
                        _histogram_marks(_cycle[0], lst, sum(lst))
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


def layout() -> str:
    """The layout of the SGLang imported here (:data:`nvtx_hooks.targets.LAYOUTS`): shared-step when
    ``eagle_worker_common`` defines ``eagle_forward_generation`` (sgl-project/sglang#31499), else worker-step."""
    common = sys.modules.get(COMMON)
    return LAYOUT_SHARED if callable(getattr(common, "eagle_forward_generation", None)) else LAYOUT_WORKER


def _sglang_scheduler_nvtx() -> bool:
    """SGLang's own scheduler NVTX ranges are on in this process (``SGLANG_ENABLE_NVTX_SCHEDULER`` and nvtx
    importable, as SGLang itself decides at import: ``nvtx_utils.NVTX_SCHEDULER_ENABLED``, 0.5.14 …)."""
    return getattr(sys.modules.get(_NVTX_UTILS), "NVTX_SCHEDULER_ENABLED", False) is True


def _apply_module(module: ModuleType, targets: list[Target]) -> list[str]:
    """Patch the targets of one imported module; returns ``Class.method`` names patched."""
    done = []
    here = layout()
    for t in targets:
        try:
            if t.layout is not None and t.layout != here:
                continue
            if t.kind == STAGE and _sglang_scheduler_nvtx():
                if "sglang-nvtx" not in _reported:
                    _reported.add("sglang-nvtx")
                    log.info("spectrace hooks: SGLang's own scheduler NVTX ranges are on "
                             "(SGLANG_ENABLE_NVTX_SCHEDULER): no scheduler.* ranges from the hooks")
                continue
            owner: object = module
            if t.cls:
                owner = getattr(module, t.cls, None)
                if not isinstance(owner, type):
                    if not t.optional:
                        log.warning("spectrace hooks: %s.%s not found; not patched", t.module, t.cls)
                    continue
            space = vars(owner)
            name = next((m for m in t.methods if m in space), None)
            if name is None or not callable(space[name]):
                if not t.optional:
                    log.warning("spectrace hooks: %s has none of %s; not patched", ".".join(
                        x for x in (t.module, t.cls) if x), t.methods)
                continue
            key = (t.module, t.cls, name)
            if key in _applied:
                continue
            orig = space[name]
            if getattr(orig, "__spectrace_wrapped__", None) is not None:
                continue
            setattr(owner, name, _make_wrapper(orig, t))
            _applied[key] = (owner, orig)
            if t.kind == MIXED:
                _mixed[0] = True
            label = {ENTRY: "cycle|prefill", MIXED: "cycle|prefill (DP)", ACCEPT: f"{t.phase} (mark)"}.get(
                t.kind, t.phase)
            done.append(f"{t.cls or t.module.rsplit('.', 1)[1]}.{name}→{label}")
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


def _switch(name: str, default: bool = True) -> bool:
    """An environment switch of the hooks (:func:`nvtx_hooks.capture.bounds.switch`: 1/0, true/false, ...); a value
    not understood is said on stderr and taken as ``default``."""
    from .capture.bounds import switch

    on, problem = switch(name, default)
    if problem:
        print(f"spectrace hooks: {problem}", file=sys.stderr)
    return on


def _setup_logging() -> None:
    """Give the hooks logger its own stderr handler (SGLang may not have configured logging yet)."""
    if not log.handlers and _switch("SPECTRACE_HOOKS_LOG"):
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
        stages = _switch(SCHEDULER_ENV)
        for t in targets_for(v):
            if t.kind == CHECK or (t.kind == STAGE and not stages):
                continue
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
        for (_mod, _cls, name), (owner, orig) in _applied.items():
            try:
                setattr(owner, name, orig)
            except Exception as e:
                _report_error(f"restoring {_cls or _mod}.{name}", e)
        _applied.clear()
        _pending.clear()
        if _finder is not None and _finder in sys.meta_path:
            sys.meta_path.remove(_finder)
        _finder = None
        _installed = False
        _warned = False
        _tls.stack.clear()
        _tls.hosts.clear()
        _reported.clear()  # a later install reports its own errors again
        _tls.busy = _tls.verified = _tls.in_prefill_batch = False
        _tls.steps = None
        _cycle[0] = 0
        _mixed[0] = False


def patched() -> list[str]:
    """``module.Class.method`` (``module.function``) of everything currently patched."""
    return [".".join(x for x in (m, c, n) if x) for (m, c, n) in _applied]


def installed() -> bool:
    """True between :func:`install` (on a supported version) and :func:`uninstall`."""
    return _installed
