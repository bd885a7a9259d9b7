"""Rendering results: text tables (:mod:`.text`), JSON/CSV/SQLite (:mod:`.data`), figures (:mod:`.plots`)
and the HTML report (:mod:`.html`). Depends on :mod:`analyze.compute` and :mod:`analyze.model`."""

__all__: list[str] = []  # a namespace of modules: import them (e.g. `from analyze.compute import whatif`)
