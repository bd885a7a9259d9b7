"""Env-gated autoload, run from ``spectrace_hooks.pth`` at interpreter start in every process.

The ``.pth`` line imports this module only when ``SPECTRACE_HOOKS`` is set and not off (0, false, no, off); it then
arms the import hook (SGLang itself is not imported). Processes without SGLang
installed stay untouched and silent.
"""

from __future__ import annotations

import os
import sys

__all__ = ["run"]


def run() -> None:
    """Install the hooks if ``SPECTRACE_HOOKS`` is on (1, true, yes, on: any case); never raises."""
    from .capture.bounds import switch

    on, problem = switch("SPECTRACE_HOOKS")
    if problem:
        print(f"spectrace hooks: {problem}", file=sys.stderr)
    if not on:
        return
    try:
        from . import patch

        if patch.sglang_version() is None and not os.environ.get("SPECTRACE_SGLANG_VERSION"):
            return  # no SGLang in this environment: nothing to hook
        patch.install()
    except Exception as e:  # a broken hook must never stop Python from starting
        print(f"spectrace hooks: autoload failed (ignored): {e!r}", file=sys.stderr)


run()
