"""The ``spectrace`` command: a thin layer over the library.

Each subcommand lives in a module that exposes ``register(subparsers)``; the
module adds its parser and sets ``func(args) -> int``. Bad input raises
:class:`analyze.errors.InputError`, printed here as one line with exit 2.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from .errors import InputError  # no polars in it

# Before polars loads (only here, in spectrace's own process; a user's setting wins): keep freed
# pages 2 s rather than polars' 0.5 s, so that the next step reuses them instead of faulting fresh
# ones in. At 20 M kernels this cut system time 14 -> 10 s and the analysis 29 -> 25 s (BENCHMARKS.md).
MALLOC_VAR = "_RJEM_MALLOC_CONF"
_USER_MALLOC = os.environ.get(MALLOC_VAR)
if _USER_MALLOC is None:
    os.environ[MALLOC_VAR] = "dirty_decay_ms:2000,muzzy_decay_ms:0"
# Commands that start the user's programs (an SGLang server under nsys): they get the variable as it was
# (importing polars rewrites it too).
LAUNCHERS = {"trace", "demo-workload"}

# Subcommand modules, in help order. Importing them must stay cheap (no torch, no sglang).
SUBCOMMANDS = (
    "analyze.commands",  # analyze
    "analyze.comm_cli",  # comm
    "analyze.report_cli",  # report, compare, whatif
    "nvtx_hooks.cli",  # hooks
    "nvtx_hooks.capture",  # trace, demo-workload
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="spectrace",
        description="Where the time goes in SGLang EAGLE-3 speculative decoding on tensor-parallel GPUs.",
    )
    from . import __version__

    parser.add_argument("--version", action="version", version=f"spectrace {__version__}")
    sub = parser.add_subparsers(dest="subcommand", metavar="COMMAND")
    for name in SUBCOMMANDS:
        try:
            mod = importlib.import_module(name)
        except ModuleNotFoundError as e:
            if e.name == name:  # not written yet: the subcommand is simply absent
                continue
            raise
        mod.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "subcommand", None) in LAUNCHERS:  # polars, already loaded, keeps its own setting
        if _USER_MALLOC is None:
            os.environ.pop(MALLOC_VAR, None)
        else:
            os.environ[MALLOC_VAR] = _USER_MALLOC
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except InputError as e:
        print(f"spectrace: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("spectrace: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
