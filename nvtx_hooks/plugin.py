"""SGLang plugin entry point (``sglang.srt.plugins``, SGLang ≥ 0.5.11).

SGLang calls :func:`load` in every scheduler process (``load_plugins()`` at the
start of ``run_scheduler_process``) and in the launcher. It installs the
hooks when ``SPECTRACE_HOOKS`` is on (1, true, yes, on) or when ``SGLANG_PLUGINS`` names ``spectrace``
explicitly; otherwise an installed spectrace leaves SGLang alone.
"""

from __future__ import annotations

import os
import sys

__all__ = ["wanted", "load"]


def wanted() -> bool:
    """True if the environment asks for the hooks."""
    from .capture.bounds import switch

    on, problem = switch("SPECTRACE_HOOKS")
    if problem:
        print(f"spectrace hooks: {problem}", file=sys.stderr)
    if on:
        return True
    allow = {x.strip() for x in os.environ.get("SGLANG_PLUGINS", "").split(",")}
    return "spectrace" in allow


def load() -> None:
    """Plugin callable: arm the import hook (idempotent, shares state with the .pth autoload)."""
    if not wanted():
        return
    from .patch import install

    install()
