"""Emit spectrace NVTX ranges: push/pop/phase_range/mark in the ``spectrace`` domain, ``host.push``/``host.pop``
in the ``spectrace.host`` domain (the scheduler's host ranges).

Cheap by construction: the domain handle, one registered string and one
prebuilt ``EventAttributes`` per name are made once (first use of a name);
a call with no payload is one dict lookup plus one Cython call into NVTX.
A payload (an int from :func:`nvtx_hooks.phases.encode_payload`) is set on a
second, per-name attributes object that is reused (not thread-safe across
threads pushing the same name at the same instant; SGLang's scheduler pushes
from one thread).

Everything is a silent no-op when the ``nvtx`` package is missing, when no
NVTX tool (nsys) is attached to the process, when ``NVTX_DISABLE`` is set,
or when ``SPECTRACE_NVTX=0``. :func:`set_enabled` toggles emission at run time
(for on/off comparisons). Names are phase names from :mod:`nvtx_hooks.phases`;
marks (``accept``) come from ``phases.MARKS``; other names work too (registered
on first use, grey).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any, Literal

from .phases import DOMAIN, EMITTED, HOST_DOMAIN, SCHEDULER_RANGES

__all__ = ["push", "pop", "mark", "phase_range", "host", "enabled", "available", "set_enabled"]

_GREY = 0xFF999999


def _unbound(*args: object) -> Any:
    raise RuntimeError("NVTX is not loaded")  # never called: every call is behind _on, set only once _load bound them


_nvtx_push: Callable[..., object] = _unbound  # nvtx._lib.lib.push_range(attrs, domain_handle)
_nvtx_pop: Callable[..., object] = _unbound  # nvtx._lib.lib.pop_range(domain_handle)
_nvtx_mark: Callable[..., object] = _unbound
_handle = None  # nvtx DomainHandle for DOMAIN
_host_handle = None  # and for HOST_DOMAIN
_make_attrs: Callable[[str], Any] = _unbound  # name -> EventAttributes factory
_make_host_attrs: Callable[[str], Any] = _unbound
_host_attrs: dict = {}  # name -> EventAttributes of HOST_DOMAIN
_attrs: dict = {}  # name -> EventAttributes without payload
_pattrs: dict = {}  # name -> EventAttributes reused for payload calls
_available = False  # nvtx importable and a tool is attached
_on = False  # emission switched on (available and not disabled)


def _load(force: bool = False) -> bool:
    """Bind the NVTX C entry points; True if ranges would reach a tool (or ``force``)."""
    global _nvtx_push, _nvtx_pop, _nvtx_mark, _handle, _host_handle, _make_attrs, _make_host_attrs, _available
    try:
        from nvtx._lib import lib as _lib
    except Exception:  # nvtx missing or broken: stay a no-op
        return False
    handle = _lib.DomainHandle(DOMAIN)
    if not (force or handle.enabled()):
        return False
    host_handle = _lib.DomainHandle(HOST_DOMAIN)
    host_colors = {p.name: p.color for p in SCHEDULER_RANGES}

    def make(name: str) -> Any:
        phase = EMITTED.get(name)
        color = phase.color if phase else _GREY
        msg = _lib.RegisteredString(handle, name)
        return _lib.EventAttributes(handle, msg, color, None, None)

    def make_host(name: str) -> Any:
        msg = _lib.RegisteredString(host_handle, name)
        return _lib.EventAttributes(host_handle, msg, host_colors.get(name, _GREY), None, None)

    _nvtx_push, _nvtx_pop, _nvtx_mark = _lib.push_range, _lib.pop_range, _lib.mark
    _handle, _host_handle, _make_attrs, _make_host_attrs = handle, host_handle, make, make_host
    _attrs.clear()
    _pattrs.clear()
    _host_attrs.clear()
    for name in EMITTED:  # pre-register the phase and mark vocabulary
        _attrs[name] = make(name)
    for name in host_colors:  # and the scheduler's host ranges
        _host_attrs[name] = make_host(name)
    _available = True
    return True


def _env_disabled() -> bool:
    """True if the environment switches ranges off."""
    from .capture.bounds import switch

    on, problem = switch("SPECTRACE_NVTX", default=True)
    if problem:
        print(f"spectrace hooks: {problem}", file=sys.stderr)
    return bool(os.environ.get("NVTX_DISABLE")) or not on


def _attrs_for(name: str, payload: int | None) -> Any:
    """The reusable attributes for ``name`` (registering it on first use), with ``payload`` set."""
    if payload is None:
        a = _attrs.get(name)
        if a is None:
            a = _attrs[name] = _make_attrs(name)
        return a
    a = _pattrs.get(name)
    if a is None:
        a = _pattrs[name] = _make_attrs(name)
    a.payload = int(payload)
    return a


def push(name: str, payload: int | None = None) -> None:
    """Open a range named ``name`` (a phase name) on this thread; ``payload`` is an encoded int."""
    if not _on:
        return
    a = _attrs.get(name) if payload is None else None
    if a is None:
        a = _attrs_for(name, payload)
    _nvtx_push(a, _handle)


def pop() -> None:
    """Close the innermost range this thread opened in the spectrace domain."""
    if _on:
        _nvtx_pop(_handle)


def mark(name: str, payload: int | None = None) -> None:
    """An instantaneous event named ``name`` with an optional encoded payload."""
    if _on:
        _nvtx_mark(_attrs_for(name, payload), _handle)


class _Host:
    """``host.push(name)`` / ``host.pop()``: ranges in the ``spectrace.host`` domain (the scheduler's host ranges,
    :data:`nvtx_hooks.phases.SCHEDULER_RANGES`; other names work too, registered on first use), no payload."""

    __slots__ = ()

    @staticmethod
    def push(name: str, payload: int | None = None) -> None:
        if _on:
            a = _host_attrs.get(name)
            if a is None:
                a = _host_attrs[name] = _make_host_attrs(name)
            _nvtx_push(a, _host_handle)

    @staticmethod
    def pop() -> None:
        if _on:
            _nvtx_pop(_host_handle)

    @staticmethod
    def mark(name: str, payload: int | None = None) -> None:
        return None


host = _Host()


class phase_range:  # noqa: N801 - used like a function
    """``with phase_range("verify"):`` — push on entry, pop on exit, also on exceptions."""

    __slots__ = ("name", "payload")

    def __init__(self, name: str, payload: int | None = None):
        self.name, self.payload = name, payload

    def __enter__(self) -> None:
        push(self.name, self.payload)

    def __exit__(self, *exc: object) -> Literal[False]:
        pop()
        return False


def enabled() -> bool:
    """True if ranges are being emitted (nvtx importable, a tool attached, not switched off)."""
    return _on


def available() -> bool:
    """True if nvtx is importable and an NVTX tool (nsys) is attached to this process."""
    return _available


def set_enabled(flag: bool, *, force: bool = False) -> bool:
    """Switch emission on or off at run time; returns :func:`enabled`.

    ``force=True`` binds the real NVTX calls even with no tool attached (the C
    calls are then NVTX's own no-ops): used by the overhead benchmark.
    """
    global _on
    if flag and (force or not _available):
        _load(force=force)
    _on = bool(flag) and _available
    return _on


if not _env_disabled():
    _on = _load()
