"""``spectrace hooks check``: verify the SGLang hook targets statically (never imports SGLang)."""

from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path

from analyze.errors import InputError


def register(subparsers) -> None:
    """Add the ``hooks`` subcommand to the spectrace CLI."""
    p = subparsers.add_parser("hooks", help="NVTX hooks for SGLang: verify targets")
    sub = p.add_subparsers(dest="hooks_command", metavar="ACTION")
    c = sub.add_parser(
        "check",
        help="check that every hook target exists, unchanged, in an SGLang source tree (AST, no import)",
        description="Static check of the hook targets. Without --sglang-root, the installed SGLang is read; "
        "with only --version, that wheel is fetched from PyPI into the cache.",
    )
    c.add_argument("--sglang-root", type=Path, help="directory containing sglang/ (or the sglang package dir)")
    c.add_argument("--version", help="SGLang version of the tree (default: read from the tree)")
    c.set_defaults(func=run_check)
    p.set_defaults(func=lambda args: (p.print_help(), 2)[1])


def _installed_root() -> Path | None:
    """Directory holding the installed sglang package, found without importing it."""
    try:
        spec = importlib.util.find_spec("sglang")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0]).parent


def run_check(args: argparse.Namespace) -> int:
    """Run the check; 0 if every target is present and unchanged, 1 otherwise."""
    from .check import FetchError, check_tree, fetch_sglang

    root = args.sglang_root
    if root is None:
        root = _installed_root()
        if root is None:
            if not args.version:
                raise InputError("SGLang is not installed here; pass --sglang-root DIR or --version V")
            try:
                root = fetch_sglang(args.version)
            except FetchError as e:
                raise InputError(str(e)) from e
    elif not root.exists():
        raise InputError(f"{root}: no such directory")
    try:
        rep = check_tree(root, args.version)
    except (FileNotFoundError, ValueError) as e:
        raise InputError(str(e)) from e
    print("\n".join(rep.lines()))
    return 0 if rep.ok else 1
