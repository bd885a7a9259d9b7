"""The bundled real captures (``tests/data/h200_tp1/*.sqlite.xz``: one H200; ``tests/data/h200_tp2``: two; and the
torch profiler traces ``tests/data/h200_tp1/*.trace.json.xz``), decompressed on first use.

``python -m nvtx_hooks.capture.samples [NAME]`` prints the path of the decompressed export
(default ``tp1_node``; ``--list`` names them); ``make demo`` uses it. Decompressed copies go to
``$SPECTRACE_CACHE_DIR/samples`` or ``.cache/samples`` in the checkout and are reused while newer than the .xz.
The captures live in the source checkout, not in an installed wheel.
"""

from __future__ import annotations

import lzma
import os
import shutil
import sys
from pathlib import Path

__all__ = ["DATA", "names", "trace_names", "data_dir", "cache_dir", "path", "trace", "stats_csv", "main"]

_ROOT = Path(__file__).resolve().parents[2]
DATA = _ROOT / "tests" / "data" / "h200_tp1"
_DATA_DIRS = (DATA, _ROOT / "tests" / "data" / "h200_tp2")
_DEFAULT = "tp1_node"


def names() -> list[str]:
    """The bundled capture names."""
    return sorted(p.name[: -len(".sqlite.xz")] for d in _DATA_DIRS for p in d.glob("*.sqlite.xz"))


def trace_names() -> list[str]:
    """The bundled torch profiler trace names (``NAME.trace.json.xz``)."""
    return sorted(p.name[: -len(".trace.json.xz")] for d in _DATA_DIRS for p in d.glob("*.trace.json.xz"))


def data_dir(name: str) -> Path:
    """The folder that holds bundled capture ``name`` (its .sqlite.xz, manifest and nsys stats CSVs)."""
    for d in _DATA_DIRS:
        if (d / f"{name}.sqlite.xz").exists():
            return d
    return DATA


def cache_dir() -> Path:
    """Where decompressed samples are kept."""
    env = os.environ.get("SPECTRACE_CACHE_DIR")
    return Path(env) / "samples" if env else _ROOT / ".cache" / "samples"


def path(name: str = _DEFAULT, cache: Path | None = None) -> Path:
    """The decompressed SQLite export of bundled capture ``name``."""
    src = data_dir(name) / f"{name}.sqlite.xz"
    if not src.exists():
        raise FileNotFoundError(f"no bundled capture {name!r}; have: {', '.join(names())}")
    return _decompressed(src, (cache or cache_dir()) / f"{name}.sqlite")


def trace(name: str, cache: Path | None = None) -> Path:
    """The decompressed torch profiler trace (Chrome trace-event JSON) of bundled trace ``name``."""
    src = DATA / f"{name}.trace.json.xz"
    if not src.exists():
        raise FileNotFoundError(f"no bundled torch profiler trace {name!r}; have: {', '.join(trace_names())}")
    return _decompressed(src, (cache or cache_dir()) / f"{name}.trace.json")


def _decompressed(src: Path, out: Path) -> Path:
    """``src`` (xz) decompressed into ``out``, written under a temporary name and renamed into place; reused while
    newer than ``src``."""
    if not out.exists() or out.stat().st_mtime < src.stat().st_mtime:
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_suffix(f".tmp{os.getpid()}")
        with lzma.open(src) as f, open(tmp, "wb") as g:
            shutil.copyfileobj(f, g)
        os.replace(tmp, out)
    return out


def stats_csv(name: str, report: str = "nvtx_gpu_proj_sum") -> Path:
    """NVIDIA's ``nsys stats`` CSV for bundled capture ``name``."""
    return data_dir(name) / f"{name}_{report}.csv"


def main(argv: list[str] | None = None) -> int:
    """Print the decompressed path of a bundled capture; one line on stderr and exit 2 when there is none."""
    import argparse

    p = argparse.ArgumentParser(prog="python -m nvtx_hooks.capture.samples",
                                description="Print the path of a bundled real H200 capture (an nsys SQLite export), "
                                            "decompressed on first use.")
    p.add_argument("name", nargs="?", default=_DEFAULT, help=f"capture name (default {_DEFAULT}; --list names them)")
    p.add_argument("--list", action="store_true", help="print the bundled capture names and exit")
    a = p.parse_args(argv)
    if not DATA.is_dir():
        print(f"samples: error: the bundled captures ship with the source checkout ({DATA.relative_to(_ROOT)}), not "
              "with an installed package: clone the repository and run `make demo` there", file=sys.stderr)
        return 2
    if a.list:
        print("\n".join(names()))
        return 0
    try:
        print(path(a.name))
    except (FileNotFoundError, OSError) as e:
        print(f"samples: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
