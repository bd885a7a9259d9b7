"""Reading exports: SQLite (:mod:`.sqlite`), parquetdir/arrowdir (:mod:`.exportdir`), the queries that turn
either into frames (:mod:`.export`), the per-process parquet store that is also the cache (:mod:`.store`),
and sources of processes for the pipeline (:mod:`.source`). Depends only on :mod:`analyze.model`."""
