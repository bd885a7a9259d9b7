"""Every number: interval algebra, attribution of GPU ops to ranges, per-instance breakdown, collectives
across ranks, diagnostics, tokens, comparison and the what-if model; :mod:`.pipeline` runs them per
process over a source and globally once. Depends on :mod:`analyze.read` and :mod:`analyze.model`."""

__all__: list[str] = []  # a namespace of modules: import them (e.g. `from analyze.compute import whatif`)
