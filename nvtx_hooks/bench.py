"""CPU cost of one spectrace range (push + pop), in ns: ``python -m nvtx_hooks.bench``.

Run it plain (no profiler: NVTX calls are no-ops inside libnvtx) or under
``nsys profile -t nvtx python -m nvtx_hooks.bench`` (a tool attached: the real
cost the hooks add to SGLang). Each row is the best of ``--repeat`` timed
loops of ``--n`` ranges, divided by ``--n``; the loop overhead (an empty
function call pair) is measured and shown separately, not subtracted.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import sys
import time

__all__ = ["main"]


def _time(fn, n: int, repeat: int) -> float:
    """Best ns per call of ``fn(n)`` over ``repeat`` runs."""
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter_ns()
        fn(n)
        best = min(best, (time.perf_counter_ns() - t0) / n)
    return best


def _cases():
    """(label, loop function) pairs; each loop runs n ranges (or n empty pairs)."""
    from . import patch, ranges
    from .phases import encode_payload
    from .targets import DRAFT, ENTRY, PHASE, STAGE, Target

    push, pop = ranges.push, ranges.pop
    payload = encode_payload(64, 12345)

    def noop(*a):
        return None

    def empty(n):
        for _ in range(n):
            noop("verify")
            noop()

    def plain(n):
        for _ in range(n):
            push("verify")
            pop()

    def with_payload(n):
        for _ in range(n):
            push("cycle", payload)
            pop()

    def ctx(n):
        pr = ranges.phase_range
        for _ in range(n):
            with pr("verify"):
                pass

    # A patched method, as SGLang's are: wrapper + stack + compile guard + push/pop around a no-op body.
    class W:
        def verify(self, batch):
            return batch

    t = Target("bench", "W", ("verify",), "verify", PHASE, (0, 0, 0), (9, 9, 9), ())
    wrapped = patch._make_wrapper(W.__dict__["verify"], t)
    raw_method = W.__dict__["verify"]
    w = W()

    def method_raw(n):
        for _ in range(n):
            raw_method(w, 1)

    def method_hooked(n):
        for _ in range(n):
            wrapped(w, 1)

    # The kinds added with payload version 2: a draft (payload with steps read from the worker), a decode-cycle
    # entry (batch size, index, steps; the result tagged), a scheduler method (host range, busy gate), and the
    # accept_histogram marks of a 48-request batch (what result processing adds per decode batch).
    class Batch:
        reqs = list(range(48))
        is_extend_in_batch = False
        forward_mode = None

    class Out:
        pass

    class Worker:
        speculative_num_steps = 3
        adaptive_controller = None

        def draft(self, batch):
            return batch

        def forward_batch_generation(self, batch):
            return Out()

        def get_next_batch_to_run(self):
            return batch

    batch, worker = Batch(), Worker()
    row = functools.partial(Target, "bench", "Worker", lo=(0, 0, 0), hi=(9, 9, 9), params=())
    draft = patch._make_wrapper(Worker.__dict__["draft"], row(("draft",), "draft", DRAFT))
    entry = patch._make_wrapper(Worker.__dict__["forward_batch_generation"],
                                row(("forward_batch_generation",), "cycle", ENTRY, tags_result=True))
    stage = patch._make_wrapper(Worker.__dict__["get_next_batch_to_run"],
                                row(("get_next_batch_to_run",), "scheduler.get_next_batch_to_run", STAGE))
    per_request = [i % 4 for i in range(48)]

    def draft_hooked(n):
        for _ in range(n):
            draft(worker, batch)

    def entry_hooked(n):
        for _ in range(n):
            entry(worker, batch)

    def stage_hooked(n):
        patch._tls.busy = True
        for _ in range(n):
            stage(worker)

    def histogram(n):
        marks = patch._histogram_marks
        for _ in range(n):
            marks(7, per_request, 72)

    cases = [
        ("loop + 2 empty calls (baseline)", empty),
        ("push/pop", plain),
        ("push(payload)/pop", with_payload),
        ("with phase_range()", ctx),
        ("unpatched method call (baseline)", method_raw),
        ("patched method call", method_hooked),
        ("patched draft (payload v2, steps)", draft_hooked),
        ("patched decode-cycle entry", entry_hooked),
        ("patched scheduler method (host range)", stage_hooked),
        ("accept_histogram marks, 48 requests", histogram),
    ]
    try:
        import nvtx

        dom = nvtx.get_domain("spectrace_bench")
        attrs = dom.get_event_attributes(message="verify")

        def nvtx_domain(n):
            for _ in range(n):
                dom.push_range(attrs)
                dom.pop_range()

        def nvtx_global(n):
            for _ in range(n):
                nvtx.push_range("verify", domain="spectrace_bench")
                nvtx.pop_range(domain="spectrace_bench")

        cases += [("ref: nvtx Domain.push_range(attrs)/pop", nvtx_domain),
                  ("ref: nvtx.push_range(msg, domain=)/pop", nvtx_global)]
    except ImportError:
        pass
    return cases


def main(argv: list[str] | None = None) -> int:
    """Print a table of ns per range for each emission mode."""
    ap = argparse.ArgumentParser(prog="python -m nvtx_hooks.bench", description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=200_000, help="ranges per timed loop")
    ap.add_argument("--repeat", type=int, default=7, help="timed loops per row (best is kept)")
    ap.add_argument("--json", action="store_true", help="also print the rows as one JSON line")
    args = ap.parse_args(argv)

    from . import ranges

    tool = ranges.available()
    try:
        import nvtx

        nvtx_version = getattr(nvtx, "__version__", None) or _dist_version("nvtx")
    except ImportError:
        nvtx_version = None
    print(f"spectrace range cost — python {platform.python_version()}, nvtx {nvtx_version}, "
          f"NVTX tool attached: {'yes' if tool else 'no'}, pid {os.getpid()}")
    print(f"best of {args.repeat} × {args.n:,} ranges; ns per range (push+pop) or per call\n")

    modes = [("off", False, False)]
    if nvtx_version:
        modes.append(("on (tool)" if tool else "on (no tool: libnvtx no-ops)", True, not tool))
    rows = []
    cases = _cases()
    width = max(len(c[0]) for c in cases)
    header = f"{'case':<{width}}  " + "  ".join(f"{m[0]:>30}" for m in modes)
    print(header)
    print("-" * len(header))
    for label, fn in cases:
        vals = []
        for _mname, on, force in modes:
            ranges.set_enabled(on, force=force)
            fn(1000)  # warm up
            vals.append(_time(fn, args.n, args.repeat))
        ranges.set_enabled(tool)
        rows.append({"case": label, **{m[0]: round(v, 1) for m, v in zip(modes, vals)}})
        print(f"{label:<{width}}  " + "  ".join(f"{v:>30.1f}" for v in vals))
    if args.json:
        print(json.dumps({"tool_attached": tool, "nvtx": nvtx_version, "rows": rows}))
    return 0


def _dist_version(name: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return None


if __name__ == "__main__":
    sys.exit(main())
