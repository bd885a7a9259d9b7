"""The progress bar on standard error: one line, redrawn at most five times a second, cleared when the step ends.

The store's build and the analysis of the processes report to a meter
(:class:`analyze.read.protocols.ProgressMeter`) without knowing what shows it; the API and the CLI choose this bar
(:func:`terminal_bar`): on a terminal by default, never with ``-q`` / ``progress=False``.
"""

from __future__ import annotations

import sys
import threading
import time

from ..read.protocols import ShowProgress

__all__ = ["Bar", "terminal_bar"]


class Bar:
    """A one-line progress bar of ``total`` rows on stderr, named ``label`` (e.g. ``spectrace: reading run.sqlite``).
    Thread-safe: the store's reader threads and the pipeline's workers add to it at once."""

    def __init__(self, total: int, label: str):
        self.total, self.label, self.done = max(total, 1), label, 0
        self._lock, self._last, self._t0 = threading.Lock(), 0.0, time.perf_counter()

    def add(self, n: int) -> None:
        with self._lock:
            self.done += n
            now = time.perf_counter()
            if now - self._last >= 0.2:
                self._last = now
                frac = min(self.done / self.total, 1.0)
                bar = "#" * int(30 * frac)
                sys.stderr.write(f"\r{self.label} [{bar:<30}] {frac:4.0%} {self.done:,} rows "
                                 f"{now - self._t0:,.1f} s")
                sys.stderr.flush()

    def close(self) -> None:
        sys.stderr.write("\r" + " " * 79 + "\r")
        sys.stderr.flush()


def terminal_bar(show: bool | None = None) -> ShowProgress | None:
    """The bar for ``progress`` as the API takes it: None (the default: when standard error is a terminal), True
    (always) or False (never: None returned, no meter)."""
    return Bar if (sys.stderr.isatty() if show is None else show) else None
