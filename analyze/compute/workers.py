"""The analysis's worker processes (``analyze(..., workers=N)``, :func:`analyze.compute.pipeline.results_of`): how
Ctrl-C reaches them (ignored while idle or spawning, the first one interrupts a task, the parent ends the pool)."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from types import FrameType
from typing import NoReturn, TypeVar

__all__ = ["signal_all", "start_deaf", "start", "run"]

_T = TypeVar("_T")


def signal_all(ex: ProcessPoolExecutor, signum: int) -> None:
    for proc in list((getattr(ex, "_processes", None) or {}).values()):
        with contextlib.suppress(OSError):
            os.kill(proc.pid, signum)


@contextlib.contextmanager
def start_deaf() -> Iterator[None]:
    """Ctrl-C ignored while the workers are spawned: they inherit that, so a Ctrl-C while they load (before
    :func:`start`) is no traceback of theirs; the parent gets it as usual."""
    main = threading.current_thread() is threading.main_thread()
    old = signal.signal(signal.SIGINT, signal.SIG_IGN) if main else None
    try:
        yield
    finally:
        if main:
            signal.signal(signal.SIGINT, old)


def start() -> None:
    """Worker processes ignore Ctrl-C while idle (the parent ends the pool); a task turns it on (:func:`run`)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def run(fn: Callable[..., _T], *args: object) -> _T:
    """``fn(*args)`` interruptible by the first Ctrl-C only, so that its cleanup is not interrupted by a second."""
    def once(signum: int, frame: FrameType | None) -> NoReturn:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, once)
    try:
        return fn(*args)
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
