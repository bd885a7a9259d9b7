"""The tables derived from a :class:`~analyze.model.Result` under one cycle choice: declared once, made once.

Every table the headline numbers, the findings, the what-if and the outputs derive from a Result (the cycles,
the steady-state phases, the budget, the stragglers, the cycle classes, the what-if replay and fit, ...) is a
:class:`Table`, declared where its function is defined with :func:`table`::

    @view.table(kept=True)                    # kept in the result cache with the result
    def budget(res: Result) -> pl.DataFrame:  # asks for what it needs by calling those tables
        return mean_budget(res, steady_keys(res))

    budget(res)                               # made once per result and cycle choice, then read

Each table is declared with:

- ``kept``: whether it is kept with the result in its result cache (:func:`analyze.read.results.derived`): a
  second command on the same capture reads it instead of making it. Tables made from it need not be, nor
  intermediates too large to write (the steady matched collectives: 200 MB at 10 M kernels).
- ``any_choice``: one value per result whatever the cycle choice (the cycles before any choice is applied),
  shared with the result's views under other choices (:func:`with_choice`).
- ``releases``: tables (not kept) let go of once this one is made: they are made again if asked for later. The
  steady matched collectives go once the tables made from them are (the findings' inputs, the ``comm`` verb's
  straggler verdict), before the what-if fit or ``comm``'s own cross-rank matching, the largest working sets.
- ``params``: keyword arguments that are part of the key (the what-if fit's options); ``inputs``: keyword
  arguments that are not (what the key already determines, e.g. the reports a ``comm`` result was merged from).

One mechanism for all of them: the value is kept in this process (the result's private ``memo``: no other module
reads or writes it), read from or written to the result cache when kept, made by one thread at a time (another
thread asking meanwhile waits for that one's value, or its exception: a failure is not kept, the next caller
tries again), and the declared releases are applied after each table is made. The order in which tables are
asked for changes no value (``tests/test_view.py`` asks for every table in several orders).
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, Generic, TypeVar

from ..model import CycleChoice, Result
from ..read import results as cache

__all__ = ["Table", "TABLES", "table", "known", "held", "with_choice", "take"]

_T = TypeVar("_T")

TABLES: dict[str, Table] = {}  # every declared table, by name (filled as the modules that declare them load)
_LOCK = threading.Lock()  # guards every result's memo (a dict shared by the threads of one command)
_ANY = "any choice"  # the choice part of the key of an ``any_choice`` table


class _Making(Future):
    """A table being made by a thread: what a second thread asking for it waits on."""


class Table(Generic[_T]):
    """A derived table (module docstring): ``t(res, **params)`` is its value for ``res`` under its cycle choice."""

    kept: bool

    def __init__(self, make: Callable[..., _T], name: str, kept: bool, any_choice: bool,
                 releases: tuple[Table, ...], params: tuple[str, ...], inputs: tuple[str, ...]):
        if any(r.kept for r in releases):
            raise ValueError(f"{name}: a table kept in the result cache is never let go of")
        self.make, self.name, self.kept, self.any_choice = make, name, kept, any_choice
        self.releases, self.params, self.inputs = releases, params, inputs
        self.__doc__ = make.__doc__
        self.__wrapped__ = make

    def __repr__(self) -> str:
        return f"<table {self.name}>"

    def key(self, res: Result, params: dict[str, Any]) -> tuple[str, ...]:
        """What the value is kept under: the name, the cycle choice (:attr:`CycleChoice.key`) unless
        ``any_choice``, and the ``params`` given."""
        extra = {k: v for k, v in params.items() if k not in self.inputs}
        if set(extra) - set(self.params):
            raise TypeError(f"{self.name}: unknown parameters {sorted(set(extra) - set(self.params))}")
        choice = _ANY if self.any_choice else _choice(res).key
        return (self.name, choice, repr(sorted(extra.items()))) if self.params else (self.name, choice)

    def __call__(self, res: Result, **params: Any) -> _T:
        key = self.key(res, params)
        memo = _store(res, self)
        with _LOCK:
            got = memo.get(key, _MISSING)
            mine = got is _MISSING
            if mine:
                got = memo[key] = _Making()
        if not isinstance(got, _Making):
            return got
        if not mine:
            return got.result()
        try:
            value = cache.derived(res, key, lambda: self.make(res, **params)) if self.kept else self.make(res, **params)
        except BaseException as e:
            with _LOCK:
                memo.pop(key, None)
            got.set_exception(e)
            raise
        with _LOCK:
            memo[key] = value
            for t in self.releases:  # what the tables made from them no longer need
                store = _store(res, t, locked=True)
                if not isinstance(store.get(k := t.key(res, {}), _MISSING), _Making):
                    store.pop(k, None)
        got.set_result(value)
        return value


_MISSING = object()


def _store(res: Result, t: Table, locked: bool = False) -> dict:
    """Where ``t``'s values for ``res`` are kept: the result's memo, or for an ``any_choice`` table the dict that
    ``res`` shares with its views under other choices (:func:`with_choice`)."""
    if not t.any_choice:
        return res.memo
    if locked:
        return res.memo.setdefault(_SHARED, {})
    with _LOCK:
        return res.memo.setdefault(_SHARED, {})


_SHARED = ("tables of any choice",)


def _choice(res: Result) -> CycleChoice:
    c = res.cycle_choice
    if not isinstance(c, CycleChoice):
        raise TypeError(f"Result.cycle_choice is a CycleChoice, not {type(c).__name__}")
    return c


def table(*, kept: bool = True, any_choice: bool = False, releases: tuple[Table, ...] = (),
          params: tuple[str, ...] = (), inputs: tuple[str, ...] = (),
          name: str | None = None) -> Callable[[Callable[..., _T]], Table[_T]]:
    """Declare the decorated function ``f(res, **params)`` a derived table (module docstring), named after it."""
    def declare(make: Callable[..., _T]) -> Table[_T]:
        n = name or make.__name__.lstrip("_")
        if n in TABLES and TABLES[n].make.__qualname__ != make.__qualname__:
            raise ValueError(f"two tables named {n}")
        t = TABLES[n] = Table(make, n, kept, any_choice, releases, params, inputs)
        return t
    return declare


def known(t: Table, res: Result, **params: Any) -> bool:
    """Whether ``t(res, **params)`` is there without making it: made in this process, or kept with ``res`` in the
    result cache."""
    key = t.key(res, params)
    got = _store(res, t).get(key, _MISSING)
    if got is not _MISSING and not isinstance(got, _Making):
        return True
    return t.kept and cache.known(res, key)


def held(res: Result) -> dict[tuple[str, ...], Any]:
    """The tables ``res`` holds now, by key (name, cycle choice[, params]): made and not let go of (what a memory
    profile lists)."""
    with _LOCK:
        out = {k: v for k, v in res.memo.items() if k != _SHARED and not isinstance(v, _Making)}
        out.update((k, v) for k, v in res.memo.get(_SHARED, {}).items() if not isinstance(v, _Making))
    return out


def with_choice(res: Result, choice: CycleChoice) -> Result:
    """``res`` under another cycle choice: a copy (the same frames) whose tables of ``any_choice`` are those of
    ``res`` (made once for all its views; the others are the copy's own)."""
    out = dataclasses.replace(res, cycle_choice=choice)
    with _LOCK:
        out.memo[_SHARED] = res.memo.setdefault(_SHARED, {})
    return out


def take(res: Result, field: str) -> Any:
    """``res.<field>`` handed over once: its value, the field set to None (a frame a table consumes; whoever asks
    next gets None)."""
    with _LOCK:
        value = getattr(res, field)
        setattr(res, field, None)
    return value
