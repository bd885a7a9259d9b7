"""spectrace analysis: per-rank, per-phase GPU compute, communication and idle time from nsys exports.

The public API, what the CLI uses (each verb a thin call into the layers below; docs/reference/api.md)::

    from analyze import analyze, comm, compare, whatif, report, timeline, probe_effect, plots, findings_text
    res = analyze("run.sqlite")          # a Result: res.phases, res.seams, res.instances, ... (every instance)
    res.steady.budget                    # the steady state, what `spectrace analyze` prints first: .phases,
    res.steady.findings                  # .seams, .budget, .findings, .tokens, .segments, .cycle_classes, ...
    compare("a.sqlite", "b.sqlite")      # a Comparison (.verdict, .rows, ...; to_dict(): the JSON)

Layers, dependencies pointing down only: :mod:`analyze.cli` → :mod:`analyze.api` → ``analyze.output``
(text, JSON/CSV/SQLite, figures, HTML) → ``analyze.compute`` (the per-process pipeline and every
metric) → ``analyze.read`` (SQLite, parquet/arrow dirs, the parquet store) → :mod:`analyze.model`.
Names are loaded on first use: importing :mod:`analyze` loads nothing else.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from typing import Any

__version__ = "0.1.0"

_API = {
    "analyze": "analyze.api", "comm": "analyze.api", "compare": "analyze.api", "whatif": "analyze.api",
    "report": "analyze.api", "timeline": "analyze.api", "probe_effect": "analyze.api",
    "Result": "analyze.model", "Trace": "analyze.model", "Diagnostic": "analyze.model", "InputError": "analyze.model",
    "CommResult": "analyze.model", "whatif_validation": "analyze.api",
    "load": "analyze.read.export", "open_store": "analyze.read.store",
    # what the results are made of
    "SteadyState": "analyze.compute.steady_state", "Finding": "analyze.compute.findings",
    "Comparison": "analyze.compute.compare", "Tokens": "analyze.compute.tokens",
    "CycleClass": "analyze.compute.anatomy", "Segment": "analyze.compute.anatomy",
    "Timeline": "analyze.output.timeline",
    # the CLI's text renderings
    "analyze_table": "analyze.output.text", "findings_text": "analyze.output.text", "comm_table": "analyze.output.text",
    "compare_table": "analyze.output.text", "whatif_table": "analyze.output.text",
}
# Modules of the public API: the figures of the report (each a matplotlib Figure, shown inline in a notebook).
_MODULES = {"plots": "analyze.output.plots"}

__all__ = sorted(_API.keys() | _MODULES.keys())


def __getattr__(name: str) -> Any:
    import importlib

    if name in _MODULES:
        return importlib.import_module(_MODULES[name])
    mod = _API.get(name)
    if mod is None:
        raise AttributeError(f"module 'analyze' has no attribute {name!r}")
    return getattr(importlib.import_module(mod), name)
