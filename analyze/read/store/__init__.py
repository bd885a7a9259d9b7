"""The store: an nsys export's frames as parquet, split by process, beside the report; the cache of every later run.

One pass over the export (SQLite through ADBC record batches, or a parquetdir/arrowdir through polars scans) writes
the frames :func:`analyze.read.export.load` would build, already normalised, as::

    <report>.spectrace/            (or $SPECTRACE_CACHE_DIR / ~/.cache/spectrace/<hash>_<name>.spectrace if the
      SPECTRACE_CACHE               report's directory is not writable; the report is never touched)
      meta.json                    written last: the key, a build id, every file with its checksums
      ranges.parquet marks.parquet names.parquet devices.parquet diagnostics.parquet
      op_keys.parquet              every distinct (name_id, label) of the GPU operations
      ops/<pid>/<part>.parquet     GPU operations of one process, parts in read order
      api/<pid>/<part>.parquet     CUDA API calls of one process: the ones the analysis needs

A parquetdir/arrowdir export is already columnar: its store (``meta.json`` ``columnar``) has no ``ops/`` or ``api/``,
only the small frames, ``op_keys.parquet`` and ``lost.parquet``; a process's rows are cut from the export's own files
when read, the same rows in the same order as a copy. A cache is used only while its key and every file still
verify; otherwise it is rebuilt once, and a cache that fails again is a one-line error naming its folder.

The modules, one concern each (dependencies point down the list)::

    install         open_store, existing_store, temporary_store, discard: reuse a cache that verifies, else build
                    one under a temporary name and rename it into place, under a lock
    folders         removing our folders safely, the lock, stale builds of dead processes
    build           one build into a new folder: marked, then copied or counted, meta.json last
    copy_build      a SQLite export's rows copied (threads over rowid pieces, per-process parquet files)
    columnar_build  a parquetdir/arrowdir export's store: counts and keys, no copy of the rows
    reader          Store: an opened store, a process's rows read (and checked) on demand; CacheError
    call_keys       which API calls are kept; (pid, correlation id) keys to find the launchers of lost ops
    layout          the folder's marker and meta.json, and the checks of an open (problem)
    fingerprint     the key: format version, the report's path, each file's size, times, inode, content hash
                    (file_keys: also the key of a torch profiler trace's tables, analyze.read.kineto)
    location        where a report's cache goes (cache_dir_for), never inside the input (a torch profiler
                    trace's tables go beside it)
    errors          CacheWriteError, and every write into a store (write_in_cache)

The names below are the store's public face (``analyze.open_store`` is :func:`open_store`).
"""

from .errors import CacheWriteError
from .install import existing_store, open_store, temporary_store
from .location import cache_dir_for
from .reader import CacheError, Store

__all__ = ["Store", "CacheError", "CacheWriteError", "open_store", "existing_store", "temporary_store",
           "cache_dir_for"]
