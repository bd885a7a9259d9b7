"""Python call stacks that nsys records as NVTX payloads: their layout, defined once.

With Python sampling (``nsys profile --python-sampling=true``, which ``spectrace trace --cpu-sampling`` adds where
the nsys lists it) and Python backtraces on CUDA calls (``--python-backtrace=cuda``), nsys 2025.3 writes each
sample as an NVTX event (``NVTX_EVENTS``, eventType 34) whose binary payload (``binaryData``, present only when
the export runs with ``--include-blobs=true``) follows a schema it registers in ``NVTX_PAYLOAD_SCHEMAS``
(``Python Periodic Sampling``, ``Python Backtrace on CUDA``) and ``NVTX_PAYLOAD_SCHEMA_ENTRIES``: a header (the
payload's offset in the blob: a little-endian u64 at byte :data:`PAYLOAD_AT`), then the payload: thread state id
(u64), thread state (u32), the frame count (u32 at :data:`COUNT_AT`) and the frames from :data:`FRAMES_AT`, each
:data:`FRAME_BYTES` long: the function's and the file's string ids (``StringIds``, HTML-escaped) and the line
(u64 each), the innermost frame first. Read on real H200 exports (nsys 2025.3.1; ``tests/data/h200_tp1``,
``tp1_pyframes``). Used by the scrub (the string ids the frames name are kept) and by
:func:`analyze.read.export.python_samples`.
"""

from __future__ import annotations

import struct

__all__ = ["SCHEMAS", "SAMPLING", "PAYLOAD_AT", "COUNT_AT", "FRAMES_AT", "FRAME_BYTES", "frames"]

SAMPLING = "Python Periodic Sampling"
SCHEMAS = (SAMPLING, "Python Backtrace on CUDA")  # NVTX_PAYLOAD_SCHEMAS.name of the Python stacks
PAYLOAD_AT = 24  # u64: where the payload starts in the blob
COUNT_AT = 12  # u32: the frame count, from the payload's start
FRAMES_AT = 16  # the frames, from the payload's start
FRAME_BYTES = 24  # function string id, file string id, line: u64 each


def frames(blob: bytes) -> list[tuple[int, int, int]]:
    """A payload's frames ``(function id, file id, line)``, innermost first; [] when the blob is shorter than
    its header says (never raises)."""
    try:
        at = struct.unpack_from("<Q", blob, PAYLOAD_AT)[0]
        n = struct.unpack_from("<I", blob, at + COUNT_AT)[0]
        return [struct.unpack_from("<QQQ", blob, at + FRAMES_AT + FRAME_BYTES * i) for i in range(n)]
    except (struct.error, TypeError):
        return []
