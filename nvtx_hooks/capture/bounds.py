"""Bounded arguments and environments: the one check of every numeric command-line option, and of the
environment variables that change how spectrace runs.

:func:`number` is the ``type=`` of every numeric option of every verb (``analyze``, ``comm``, ``report``,
``compare``, ``whatif``, ``trace``): an integer or a finite float within its range, else one line
(``argument --top: must be an integer from 1 to 10,000, not -1``). NaN, infinities and values too large for
the code that reads them never get through. :func:`environment_problem` checks the variables read before any
work starts (polars' thread count and chunk sizes: a 0 makes polars panic, a huge count makes it crawl).
Standard library only: used by the analysis CLI and by the capture tools (which never import :mod:`analyze`).
"""

from __future__ import annotations

import argparse
import math
import os
import shlex
from collections.abc import Mapping

__all__ = ["Number", "number", "shell_words", "environment_problem"]

# Polars' own integer settings: a value of 0 makes it panic, a thread count far above the CPUs makes it crawl.
_THREADS_PER_CPU = 8


def _cpus() -> int:
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _env_bounds() -> dict[str, tuple[int, int]]:
    """The environment variables checked, each with its allowed integer range."""
    return {
        "POLARS_MAX_THREADS": (1, _THREADS_PER_CPU * _cpus()),
        "POLARS_IDEAL_MORSEL_SIZE": (1, 2**31),
        "POLARS_STREAMING_CHUNK_SIZE": (1, 2**31),
    }


def _fmt(v: float) -> str:
    return f"{int(v):,}" if float(v).is_integer() and abs(v) < 1e15 else f"{v:g}"


class Number:
    """An argparse ``type=``: text to an ``int`` (``kind=int``) or a finite ``float`` in ``[lo, hi]`` (``lo_open``:
    strictly above ``lo``); ``None`` for an open end."""

    def __init__(self, kind: type = int, lo: float | None = None, hi: float | None = None, lo_open: bool = False):
        self.kind, self.lo, self.hi, self.lo_open = kind, lo, hi, lo_open
        self.__name__ = kind.__name__  # what argparse names in its own messages

    def what(self) -> str:
        """``an integer from 1 to 100``, ``a finite number > 0``, ..."""
        noun = "an integer" if self.kind is int else "a finite number"
        lo, hi = self.lo, self.hi
        if lo is not None and hi is not None and not self.lo_open:
            return f"{noun} from {_fmt(lo)} to {_fmt(hi)}"
        parts = ([f"{'>' if self.lo_open else '>='} {_fmt(lo)}"] if lo is not None else []) + (
            [f"<= {_fmt(hi)}"] if hi is not None else [])
        return f"{noun} {' and '.join(parts)}".rstrip()

    def __call__(self, text: str) -> int | float:
        try:
            v = self.kind(text)
        except (ValueError, OverflowError):
            v = None
        if v is None or (self.kind is float and not math.isfinite(v)):
            raise argparse.ArgumentTypeError(f"must be {self.what()}, not {text!r}")
        low = self.lo is not None and (v <= self.lo if self.lo_open else v < self.lo)
        if low or (self.hi is not None and v > self.hi):
            raise argparse.ArgumentTypeError(f"must be {self.what()}, not {text}")
        return v


def number(kind: type = int, lo: float | None = None, hi: float | None = None, lo_open: bool = False) -> Number:
    """The ``type=`` of a numeric option: see :class:`Number`."""
    return Number(kind, lo, hi, lo_open)


def shell_words(text: str) -> str:
    """An argparse ``type=`` for options split like a shell command line (``--nsys-arg``): the text itself,
    once it splits (a lone quote is one line, not a traceback later)."""
    try:
        shlex.split(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"{text!r} cannot be split into arguments ({e}); quote it as a shell would") from None
    return text


def environment_problem(env: Mapping[str, str] | None = None) -> str | None:
    """The first environment variable of :func:`_env_bounds` set to something outside its range, as one line;
    None when all are unset, empty or fine."""
    environ: Mapping[str, str] = os.environ if env is None else env
    for name, (lo, hi) in _env_bounds().items():
        text = environ.get(name)
        if not text:
            continue
        try:
            v = int(text.strip())
        except ValueError:
            v = None
        if v is None or not lo <= v <= hi:
            return (f"environment variable {name}={text!r}: must be an integer from {lo:,} to {hi:,} (unset it "
                    "to use the default)")
    return None
