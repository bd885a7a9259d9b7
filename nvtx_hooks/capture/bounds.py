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

__all__ = ["Number", "number", "shell_words", "environment_problem", "STEPS_MAX", "CYCLES_MAX", "BATCH_MAX",
           "TOKENS_PER_S_MAX", "CYCLES_PER_S_MAX", "SWITCH_ON", "SWITCH_OFF", "switch", "whole", "in_bounds"]

# Physical bounds, defined once: the CLI's options, the API's arguments, manifests, payloads and decode logs are
# held to the same ones.
STEPS_MAX = 64  # draft steps (--steps-now, --max-steps, a manifest's speculative.steps): EAGLE drafts a handful
CYCLES_MAX = 1_000_000_000  # decode cycles (--skip-cycles, a window's ends)
BATCH_MAX = 1 << 16  # requests decoded together (a manifest's batch, a decode log's #running-req)
TOKENS_PER_S_MAX = 10_000_000.0  # tokens a server generates per second (a decode log's gen throughput): 10 M
CYCLES_PER_S_MAX = 1_000_000.0  # decode cycles per second (a manifest's cycles_per_s): one per microsecond

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


def whole(value: object) -> bool:
    """An integer (not a bool, not a float that happens to be whole)."""
    return isinstance(value, int) and not isinstance(value, bool)


def in_bounds(value: object, lo: float, hi: float) -> bool:
    """A real number (int or finite float, not a bool) within ``[lo, hi]``."""
    return (isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
            and lo <= value <= hi)


SWITCH_ON = frozenset({"1", "true", "yes", "on", "y", "t"})  # an environment switch's spellings (any case)
SWITCH_OFF = frozenset({"0", "false", "no", "off", "n", "f", ""})


def switch(name: str, default: bool = False, env: Mapping[str, str] | None = None) -> tuple[bool, str | None]:
    """An environment switch (``SPECTRACE_HOOKS``, ...): ``(value, problem)``. Unset: ``default``. The usual
    spellings (1/0, true/false, yes/no, on/off, any case) are understood; anything else is ``default`` with a
    one-line ``problem`` saying so (the caller prints it: hooks never stop a server for it)."""
    environ: Mapping[str, str] = os.environ if env is None else env
    text = environ.get(name)
    if text is None:
        return default, None
    word = text.strip().lower()
    if word in SWITCH_ON:
        return True, None
    if word in SWITCH_OFF:
        return False, None
    return default, (f"environment variable {name}={text!r} is not understood (1/0, true/false, yes/no, on/off); "
                     f"taken as {'on' if default else 'off'}")
