"""spectrace analysis: per-rank, per-phase GPU compute, communication and idle time from nsys exports.

The public API (each a thin call into the layers below; see the README, *Architecture*)::

    from analyze import analyze, comm, compare, whatif, report, probe_effect
    res = analyze("run.sqlite")          # a Result: res.phases, res.seams, res.instances, ...

Layers, dependencies pointing down only: :mod:`analyze.cli` → :mod:`analyze.api` → ``analyze.output``
(text, JSON/CSV/SQLite, figures, HTML) → ``analyze.compute`` (the per-process pipeline and every
metric) → ``analyze.read`` (SQLite, parquet/arrow dirs, the parquet store) → :mod:`analyze.model`.
Names are loaded on first use: importing :mod:`analyze` loads nothing else.
"""

from __future__ import annotations

__version__ = "0.1.0"

_API = {
    "analyze": "analyze.api", "comm": "analyze.api", "compare": "analyze.api", "whatif": "analyze.api",
    "report": "analyze.api", "probe_effect": "analyze.api",
    "Result": "analyze.model", "Trace": "analyze.model", "Diagnostic": "analyze.model", "InputError": "analyze.model",
    "CommResult": "analyze.model",
    "load": "analyze.read.export", "open_store": "analyze.read.store",
}

__all__ = sorted(_API)


def __getattr__(name: str):
    mod = _API.get(name)
    if mod is None:
        raise AttributeError(f"module 'analyze' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(mod), name)
