"""``python -m nvtx_hooks.capture trace|scrub|demo-workload ...``: the capture verbs of ``spectrace`` on a
GPU host without the analysis stack (no polars). Same functions and options as ``spectrace trace``,
``spectrace scrub`` and ``spectrace demo-workload``."""

from __future__ import annotations

import argparse
import sys

from . import CaptureError

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    from . import nsys, scrub, workload

    parser = argparse.ArgumentParser(prog="python -m nvtx_hooks.capture")
    sub = parser.add_subparsers(dest="verb", required=True)
    nsys.add_trace_arguments(sub.add_parser("trace", help="profile a command under nsys and export SQLite"))
    sub.choices["trace"].set_defaults(func=nsys.trace)
    scrub.add_arguments(sub.add_parser("scrub", help="copy an nsys export without its launch environment"))
    sub.choices["scrub"].set_defaults(func=scrub.run)
    workload.build_parser(sub.add_parser("demo-workload", help="the embedded EAGLE-shaped workload (torch)"))
    sub.choices["demo-workload"].set_defaults(func=nsys.demo_workload)
    a = parser.parse_args(argv)
    try:
        return int(a.func(a) or 0)
    except CaptureError as e:
        print(f"spectrace: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
