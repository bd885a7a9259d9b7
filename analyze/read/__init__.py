"""Reading exports: SQLite (:mod:`.sqlite`), parquetdir/arrowdir (:mod:`.exportdir`), the queries that turn
either into frames (:mod:`.export`), the per-process parquet store that is also the cache (:mod:`.store`),
sources of processes for the pipeline (:mod:`.source`), and the Protocols a reader and a source follow
(:mod:`.protocols`). Depends only on :mod:`analyze.model`."""

__all__: list[str] = []  # a namespace of modules: import them (e.g. `from analyze.compute import whatif`)
