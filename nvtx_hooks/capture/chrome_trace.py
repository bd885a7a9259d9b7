"""Stream a Chrome trace-event JSON file (a torch profiler trace, plain or gzip): its events one at a time, its
other top-level keys, in bounded memory.

:func:`read` hands the events (the ``traceEvents`` array, or a bare array of events) to a consumer as
:mod:`ijson`'s C parser builds them, and returns the file's other top-level keys: those before the array from the
file's first :data:`HEAD` bytes, those after it (SGLang's merged file puts them there) from its last :data:`TAIL`
bytes, kept as the parser reads. Used by ``analyze.read.kineto`` (the converter) and
:mod:`nvtx_hooks.capture.torch_profile` (its scrub). A file that cannot be read raises :class:`TraceError` (one
line, with a code).
"""

from __future__ import annotations

import gzip
import io
import json
import re
import zlib
from collections import deque
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

__all__ = ["GZIP", "SNIFF", "HEAD", "TAIL", "READ", "TraceError", "opened", "read"]

GZIP = b"\x1f\x8b"
SNIFF = 4096  # bytes read to tell what a file is
HEAD = 1 << 20  # bytes of a file's start kept for its metadata (the keys before traceEvents)
TAIL = 4 << 20  # ...and of its end (the keys after it)
READ = 1 << 20  # bytes per read handed to the parser


class TraceError(Exception):
    """A trace file that cannot be read; ``str(e)`` says why in one line, ``code`` tags it."""

    def __init__(self, message: str, code: str):
        super().__init__(message)
        self.code = code

    def __reduce__(self):
        return (type(self), (str(self), self.code))


def opened(path: Path):
    """A binary stream of the file's JSON text (gunzipped when it is gzip)."""
    with path.open("rb") as f:
        magic = f.read(2)
    return gzip.open(path, "rb") if magic == GZIP else path.open("rb")



class _Recorder(io.RawIOBase):
    """The file's text as read by the parser, keeping its first :data:`HEAD` and last :data:`TAIL` bytes."""

    def __init__(self, f):
        self.f, self.head, self.tail, self.tail_len, self.pos = f, bytearray(), deque[bytes](), 0, 0

    def readable(self) -> bool:
        return True

    def read(self, n: int = -1) -> bytes:
        b = self.f.read(n)
        if len(self.head) < HEAD:
            self.head += b[: HEAD - len(self.head)]
        self.tail.append(b)
        self.tail_len += len(b)
        while self.tail_len - len(self.tail[0]) >= TAIL:
            self.tail_len -= len(self.tail.popleft())
        self.pos += len(b)
        return b

    def readinto(self, buf) -> int:  # (RawIOBase) not used by ijson
        b = self.read(len(buf))
        buf[: len(b)] = b
        return len(b)

    def tail_bytes(self) -> tuple[int, bytes]:
        """The kept end of the text and its offset in it."""
        data = b"".join(self.tail)
        return self.pos - len(data), data


def _head_meta(head: bytes) -> tuple[dict, int | None, bool]:
    """The top-level keys before ``traceEvents`` (values decoded), the offset of its array, and whether the text
    is a bare array of events (Chrome's JSON Array Format)."""
    text = head.decode("utf-8", "replace")
    meta: dict[str, Any] = {}
    dec, i = json.JSONDecoder(), len(text) - len(text.lstrip())
    if text[i:i + 1] == "[":
        return meta, i, True
    i += 1
    try:
        while True:
            while text[i:i + 1].isspace() or text[i:i + 1] == ",":
                i += 1
            key, i = dec.raw_decode(text, i)
            while text[i:i + 1].isspace() or text[i:i + 1] == ":":
                i += 1
            if key == "traceEvents":
                return meta, len(text[:i].encode()), False
            value, i = dec.raw_decode(text, i)
            meta[key] = value
    except (ValueError, IndexError):
        return meta, None, False


_WS = re.compile(r"\s*")


def _object_end(text: str, j: int) -> dict | None:
    """The keys of an object's end that starts at ``j`` (``, "k": v, ... }`` or ``}``) running to the end of
    ``text``; None when the text there is not that."""
    dec, out, n = json.JSONDecoder(), {}, len(text)
    try:
        j = _WS.match(text, j).end()  # type: ignore[union-attr]  # (\s* always matches)
        c = text[j:j + 1]
        while c == ",":
            j = _WS.match(text, j + 1).end()  # type: ignore[union-attr]
            if text[j:j + 1] != '"':
                return None
            key, j = dec.raw_decode(text, j)
            j = _WS.match(text, j).end()  # type: ignore[union-attr]
            if text[j:j + 1] != ":":
                return None
            out[key], j = dec.raw_decode(text, _WS.match(text, j + 1).end())  # type: ignore[union-attr]
            j = _WS.match(text, j).end()  # type: ignore[union-attr]
            c = text[j:j + 1]
        if c == "}" and _WS.match(text, j + 1).end() == n:  # type: ignore[union-attr]
            return out
    except ValueError:
        pass
    return None


def _tail_meta(data: bytes, skip: int) -> dict:
    """The top-level keys after the events array, from the kept end of the text: after the leftmost ``]`` (past
    ``skip``) that closes the array, i.e. after which the text is the end of an object (a ``]`` inside an event
    leaves that event open, so the text after it is not)."""
    text = data.decode("utf-8", "replace")
    i = text.find("]", max(0, skip))
    while i >= 0:
        out = _object_end(text, i + 1)
        if out is not None:
            return out
        i = text.find("]", i + 1)
    return {}



class _Chained(io.RawIOBase):
    """``first`` then the rest of ``f``."""

    def __init__(self, first: bytes, f):
        self.first, self.f = first, f

    def readable(self) -> bool:
        return True

    def read(self, n: int = -1) -> bytes:
        if n == 0:
            return b""
        if self.first:
            b, self.first = self.first, b""
            return b
        return self.f.read(n)

    def readinto(self, buf) -> int:
        b = self.read(len(buf))
        buf[: len(b)] = b
        return len(b)




def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split())[:200] or type(e).__name__


def read(path: Path, consume: Callable[[Iterator[Any]], None]) -> dict:
    """Hand the events of the trace file ``path`` to ``consume`` (an iterator of decoded events; numbers that are not
    integers as floats), then return its other top-level keys. :class:`TraceError` when the file cannot be read:
    ``CORRUPT`` (not complete JSON), ``TRUNCATED`` (a gzip that ends early or is damaged), ``NOT_A_TRACE`` (JSON
    without a ``traceEvents`` array), ``UNREADABLE``."""
    import ijson  # type: ignore[import-untyped]  # (ships no type information)

    try:
        with opened(path) as raw:
            first = raw.read(SNIFF)
            bare = first.lstrip()[:1] == b"["
            rec = _Recorder(_Chained(first, raw))
            consume(ijson.items(rec, "item" if bare else "traceEvents.item", use_float=True, buf_size=READ))
            while rec.read(READ):  # (the parser reads to the end of the text; nothing should be left)
                pass
    except ijson.JSONError as e:
        raise TraceError(f"not a complete JSON trace ({_one_line(e)}); copy or export it again", "CORRUPT") from None
    except (EOFError, gzip.BadGzipFile, zlib.error) as e:
        raise TraceError(f"truncated or corrupt gzip ({_one_line(e)}); copy it again", "TRUNCATED") from None
    except OSError as e:
        raise TraceError(f"cannot read it ({e.strerror or _one_line(e)})", "UNREADABLE") from None
    if bare:
        return {}
    meta, at, _ = _head_meta(bytes(rec.head))
    if at is None:
        raise TraceError("JSON, but not a torch profiler trace (no traceEvents array)", "NOT_A_TRACE")
    off, data = rec.tail_bytes()
    meta.update(_tail_meta(data, at - off))
    meta.pop("traceEvents", None)
    return meta
