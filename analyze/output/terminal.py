"""Standard output and standard error: what every verb prints goes through here, whatever the names in the
capture, the locale, or the state of the descriptors.

- **Names are data** (:func:`clean`): control characters (C0 but tab and newline, DEL, C1) and the
  bidirectional overrides are removed from everything printed, so that an ESC sequence in an NVTX range or
  kernel name cannot move the cursor, recolour or retitle the terminal, and a carriage return cannot hide the
  start of a line (standard error keeps its own carriage returns: the progress bar). JSON is unchanged by this:
  it escapes every non-ASCII and control character itself.
- **Encoding independent of the locale**: a terminal keeps the encoding its locale (or ``PYTHONIOENCODING``)
  gives; what that encoding cannot hold degrades to ASCII (``µs`` → ``us``, ``→`` → ``->``, others ``?``; see
  :data:`_ASCII`) instead of failing. Output to a file or a pipe is UTF-8 unless ``PYTHONIOENCODING`` names
  another encoding. File names that are not UTF-8 are printed as the bytes they are.
- **Closed descriptors** (``>&-``, ``2>&-``): ``/dev/null`` takes their place, so that no file opened later
  becomes descriptor 1 or 2 (a stray write would land in it). Writing to a closed standard output is then an
  ``OSError`` (the verb's one line, exit 2); a closed standard error discards what is written to it.
"""

from __future__ import annotations

import codecs
import contextlib
import errno
import os
import re
import sys
import unicodedata

__all__ = ["clean", "streams"]

# C0 controls but tab and newline, DEL, C1 controls, and the bidirectional embeddings, overrides and isolates.
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
_CONTROL_KEEP_CR = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
# ASCII stand-ins for the characters spectrace's own text uses; other characters are decomposed (é → e) or "?".
_ASCII = {"µ": "u", "→": "->", "←": "<-", "…": "...", "·": "-", "×": "x", "–": "-", "—": "--", "−": "-",
          "Δ": "d", "α": "a", "≥": ">=", "≤": "<=", "≈": "~", "²": "^2", "⊃": ">", "∝": "~", "±": "+/-",
          "\ufffd": "?"}
_ERRORS = "spectrace-ascii"


def clean(text: str, keep_cr: bool = False) -> str:
    """``text`` without control characters (see the module docstring); ``keep_cr``: carriage returns stay."""
    return (_CONTROL_KEEP_CR if keep_cr else _CONTROL).sub("", text)


def _ascii_for(ch: str) -> str:
    """An ASCII stand-in for one character."""
    if ch in _ASCII:
        return _ASCII[ch]
    plain = unicodedata.normalize("NFKD", ch).encode("ascii", "ignore").decode()
    return plain or "?"


def _degrade(e: UnicodeError) -> tuple[str | bytes, int]:
    """The codec error handler :data:`_ERRORS`: a character the encoding cannot hold becomes its ASCII stand-in;
    an undecodable byte of a file name (a lone surrogate) is written back as that byte."""
    if not isinstance(e, UnicodeEncodeError):
        raise e
    ch = e.object[e.start]
    if 0xDC80 <= ord(ch) <= 0xDCFF:
        return bytes([ord(ch) - 0xDC00]), e.start + 1
    return _ascii_for(ch), e.start + 1


codecs.register_error(_ERRORS, _degrade)


class _Cleaned:
    """A text stream whose writes go through :func:`clean`; everything else is the wrapped stream's."""

    def __init__(self, stream, keep_cr: bool = False):
        self._stream = stream
        self._keep_cr = keep_cr

    def write(self, text: str) -> int:
        self._stream.write(clean(text, self._keep_cr))
        return len(text)

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


class _Closed:
    """Standard output closed by the caller (``>&-``): every write fails, as it would on the descriptor."""

    encoding = "utf-8"

    def write(self, text: str) -> int:
        if not text:
            return 0
        raise OSError(errno.EBADF, "it is closed", "standard output")

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return False

    def fileno(self) -> int:
        return 1


def _is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
        return True
    except OSError:
        return False


def _encode(stream) -> None:
    """Set the encoding of one standard stream (see the module docstring)."""
    if not hasattr(stream, "reconfigure"):
        return
    try:
        tty = stream.isatty()
    except (OSError, ValueError):
        tty = False
    keep = tty or os.environ.get("PYTHONIOENCODING")
    try:
        if keep:
            stream.reconfigure(errors=_ERRORS)
        else:
            stream.reconfigure(encoding="utf-8", errors=_ERRORS)
    except (OSError, ValueError, LookupError):
        pass


@contextlib.contextmanager
def streams():
    """Standard output and error set up for one run of a verb (closed descriptors, encoding, cleaning), and
    given back as they were afterwards."""
    saved = sys.stdout, sys.stderr
    devnull = None
    for fd in (0, 1, 2):
        if not _is_open(fd):
            null = os.open(os.devnull, os.O_RDWR)
            if null != fd:
                os.dup2(null, fd)
                os.close(null)
    if sys.stdout is None:
        sys.stdout = _Closed()
    if sys.stderr is None:
        devnull = open(os.devnull, "w", encoding="utf-8")  # noqa: SIM115 (closed below)
        sys.stderr = devnull
    for s in (sys.stdout, sys.stderr):
        _encode(s)
    sys.stdout, sys.stderr = _Cleaned(sys.stdout), _Cleaned(sys.stderr, keep_cr=True)
    try:
        yield
    finally:
        for s in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):
                s.flush()
        sys.stdout, sys.stderr = saved
        if devnull is not None:
            devnull.close()
