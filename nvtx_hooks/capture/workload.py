"""An EAGLE-shaped PyTorch program that emits spectrace's phase ranges, for machines without SGLang.

Each decode cycle (range ``cycle``, payload: batch size, cycle index, accept length):

- ``draft``: STEPS draft layers over BATCH tokens (one CUDA graph replay, or eager);
- ``verify``: LAYERS target layers over BATCH*(STEPS+1) tokens (one CUDA graph replay, or eager);
- ``draft_extend``: one draft layer over the accepted tokens, always eager (its shape varies);
- ``host_overhead``: a host sync that reads the accept length, then HOST_US µs of host time: a sleep
  (default) or, with ``--host-wait spin``, a busy loop on the clock, like the CPU work of a scheduler (a
  sleep's wake-up varies from run to run with the core's idle state: ±35 µs between TP2 runs on H200).

With ``--v2`` the accept lengths stay on the GPU, as in SGLang's v2 (overlap) EAGLE worker: no payload
carries them and ``host_overhead`` does not sync; each cycle's accept length is copied to the host
asynchronously (an event recorded after the copy), and the *next* cycle, once launched, waits on that
event and emits the ``accept`` mark with the earlier cycle's index — what the hooks do in SGLang's
result processing. The JSON record then lists the accept lengths it used (``accept_lengths``).

With ``--baseline`` each iteration is one ``decode_step``: the target over BATCH tokens.
Every layer all-reduces over NCCL when run by torchrun (tensor parallel: the FFN is split
across ranks). Cycle indices count from 0 over the warm-up and the measured cycles alike (the payload's
``cycle_index``); the knobs below name cycles by that index, warm-up cycles included.

- Straggler, ``--delay-rank R --delay-us N [--delay-every E --delay-offset K --delay-before PHASE]``: rank R
  waits N µs on the host just before it pushes and launches PHASE (``verify``, the default, or ``draft``) in
  every cycle i with ``i % E == K`` (default: every cycle, before verify), so that rank's phase starts late
  and the others wait in their all-reduces. The wait is spent like host_overhead's (``--host-wait``: a
  sleep by default, a busy spin with ``spin``); the record says what it really took. Not in ``--baseline``.
- Host work between cycles, ``--stall-us U [--stall-every E]``: every rank spins U µs on the clock (CPU work,
  as a scheduler's) outside any range, after cycle i-1 is popped and before cycle i is pushed, for every
  i > 0 with ``i % E == 0`` (default E = 1).
- Serving schedule, ``--schedule BS:CYCLES,...``: the measured loop runs the segments in order, each at
  decode batch size BS for CYCLES cycles (instead of --batch and --cycles; the warm-up runs at the first
  size). Every distinct size has its own draft and verify CUDA graphs, captured up front. When the batch
  grows from one segment to the next, a prefill of the new requests runs between the two segments (after
  any stall of the new segment's first cycle): range ``prefill`` (payload: the new requests, the last
  cycle's index, as the SGLang hooks emit it) around ``prefill_target_extend`` (the target, eager, over
  (BS_new - BS_old) * PROMPT_LEN tokens) and ``prefill_draft_extend`` (one draft layer over their hidden
  states), then a host sync outside the ranges. The first segment gets none (the warm-up already runs at
  its size); a shrinking batch needs none.

The measured loop is bracketed by ``cudaProfilerStart/Stop`` (use nsys
``--capture-range=cudaProfilerApi``); one JSON line goes to stdout: the loop's throughput and the ground
truth of the knobs above (see :func:`run`).

Every rank hands its buffered CUDA events to the profiler after the loop and before it ends
(``cuptiActivityFlushAll`` when a CUPTI is loaded, e.g. by nsys) and ends with a normal exit, where CUDA
and the profiler flush what is left; NCCL's teardown gets :data:`_TEARDOWN_S` seconds, then the rank ends
anyway. ``--exit os`` keeps the old ending (no flush, ``os._exit`` right after the final barrier), which
lost the last CUPTI buffers of a whole-run capture.

Run: ``python -m nvtx_hooks.capture.workload --help`` or ``spectrace demo-workload``.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import random
import statistics
import sys
import threading
import time
from collections.abc import Callable

from ..phases import encode_payload
from . import torch_profile

__all__ = ["build_parser", "parse_schedule", "check", "flush_cupti", "accept_lengths", "spin", "run",
           "torchrun_command", "to_argv", "main"]

_TEARDOWN_S = 60.0  # NCCL teardown after the final barrier normally takes well under a second


def _rate(text: str) -> float:
    v = float(text)
    if not 0 <= v <= 1:
        raise argparse.ArgumentTypeError(f"must be a probability from 0 to 1, not {text}")
    return v


def build_parser(parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    """The workload's knobs (also used by ``spectrace demo-workload``)."""
    p = parser or argparse.ArgumentParser(prog="python -m nvtx_hooks.capture.workload", description=__doc__.split("\n")[0])
    p.add_argument("--cycles", type=int, default=60, help="measured decode cycles (or baseline steps)")
    p.add_argument("--warmup", type=int, default=5, help="unmeasured cycles before the profiled loop")
    p.add_argument("--steps", type=int, default=3, help="draft steps per cycle (speculative-num-steps)")
    p.add_argument("--layers", type=int, default=16, help="target layers")
    p.add_argument("--draft-layers", type=int, default=1, help="draft layers per draft step")
    p.add_argument("--batch", type=int, default=4, help="decode batch size (requests)")
    p.add_argument("--hidden", type=int, default=4096, help="hidden size of the target and draft layers")
    p.add_argument("--ffn", type=int, default=14336, help="FFN width, split across TP ranks")
    p.add_argument("--graphs", action=argparse.BooleanOptionalAction, default=True,
                   help="CUDA graphs for draft and verify (baseline: for the decode step)")
    p.add_argument("--baseline", action="store_true", help="no speculation: decode_step ranges only")
    p.add_argument("--v2", action="store_true",
                   help="SGLang v2-like: accept lengths stay on the GPU, read one cycle later, 'accept' marks")
    p.add_argument("--ranges", action=argparse.BooleanOptionalAction, default=True,
                   help="emit the NVTX phase ranges (off: same work, no ranges; for overhead runs)")
    p.add_argument("--decode-log-interval", type=_non_negative, default=0, metavar="N",
                   help="after the run, write SGLang-style 'Decode batch' lines to stderr (rank 0), one per N "
                        "measured cycles of one batch size: its accept length and tokens/s over those cycles "
                        "(what `spectrace whatif --unprofiled-log` reads; 0: none)")
    p.add_argument("--host-us", type=int, default=300, help="host time in host_overhead, µs")
    p.add_argument("--host-wait", choices=("sleep", "spin"), default="sleep",
                   help="how host_overhead spends its host time: time.sleep (default) or a busy loop on the clock")
    p.add_argument("--delay-rank", type=int, default=None,
                   help="straggler: the rank that waits on the host before a phase (see --delay-us)")
    p.add_argument("--delay-us", type=int, default=0,
                   help="the straggler's wait, µs, spent as --host-wait says (0: no straggler)")
    p.add_argument("--delay-every", type=_positive, default=1, metavar="N",
                   help="the straggler waits in cycles i with i %% N == --delay-offset (default 1: every cycle)")
    p.add_argument("--delay-offset", type=_non_negative, default=0, metavar="K",
                   help="see --delay-every; below N (default 0)")
    p.add_argument("--delay-before", choices=("draft", "verify"), default="verify",
                   help="the phase the straggler's wait comes before (default: verify)")
    p.add_argument("--stall-us", type=_non_negative, default=0,
                   help="host work (a busy spin on the clock) on every rank between two cycles, outside any "
                        "range, µs (default 0: none)")
    p.add_argument("--stall-every", type=_positive, default=1, metavar="N",
                   help="the stall runs before cycles i > 0 with i %% N == 0 (default 1: before every cycle)")
    p.add_argument("--schedule", type=_schedule_arg, default=None, metavar="BS:CYCLES,...",
                   help="serving segments run in order, e.g. 1:40,2:40,4:40 (overrides --batch and --cycles); "
                        "a growing batch gets a prefill of the new requests")
    p.add_argument("--prompt-len", type=_positive, default=128,
                   help="prompt tokens per new request in a --schedule prefill (default 128)")
    p.add_argument("--device", choices=("cuda", "cpu"), default=None, help="default: cuda when available")
    p.add_argument("--seed", type=int, default=0, help="seed of the accept lengths and weights")
    p.add_argument("--accept-rate", type=_rate, default=None, metavar="A",
                   help="accept each draft token with probability A until the first rejection (a draft model's "
                        "acceptance; default: accept lengths uniform in 1..steps+1)")
    p.add_argument("--profiler-api", action=argparse.BooleanOptionalAction, default=True,
                   help="bracket the measured loop with cudaProfilerStart/Stop")
    p.add_argument("--profiler-rank", type=int, default=None,
                   help="only this rank calls cudaProfilerStart/Stop (as SGLang's first scheduler does; "
                        "default: every rank)")
    p.add_argument("--nproc", type=int, default=None,
                   help="ranks to start with torchrun when not already under it (default: visible GPUs)")
    p.add_argument("--exit", choices=("flush", "os"), default="flush", dest="exit_mode",
                   help="how each rank of several ends: flush (CUPTI flush, NCCL teardown, normal exit; default) "
                        "or os (no flush, os._exit after the final barrier: a whole-run capture loses its last "
                        "CUDA events)")
    torch_profile.add_arguments(p)
    return p


def _positive(text: str) -> int:
    """An argparse type: an integer ≥ 1."""
    v = int(text)
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {v}")
    return v


def _non_negative(text: str) -> int:
    """An argparse type: an integer ≥ 0."""
    v = int(text)
    if v < 0:
        raise argparse.ArgumentTypeError(f"must be at least 0, got {v}")
    return v


def parse_schedule(text: str) -> list[tuple[int, int]]:
    """A serving schedule ``BS:CYCLES,BS:CYCLES,...`` as (batch size, cycles) segments, both ≥ 1;
    ValueError with a one-line reason otherwise."""
    segments = []
    for part in text.split(","):
        bs, _, n = part.strip().partition(":")
        try:
            b, c = int(bs), int(n)
        except ValueError:
            raise ValueError(f"segment {part.strip()!r} of {text!r} is not BS:CYCLES (e.g. 1:40,2:40)") from None
        if b < 1 or c < 1:
            raise ValueError(f"segment {part.strip()!r}: the batch size and the cycles must be at least 1")
        segments.append((b, c))
    return segments


def _schedule_arg(text: str) -> str:
    """An argparse type: a valid ``--schedule``, written back in its plain form (so ``to_argv`` keeps it)."""
    try:
        segments = parse_schedule(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return ",".join(f"{b}:{c}" for b, c in segments)


def check(args: argparse.Namespace) -> None:
    """Raise ValueError (one line) for options that do not go together."""
    if args.delay_offset >= args.delay_every:
        raise ValueError(f"--delay-offset {args.delay_offset} must be below --delay-every {args.delay_every}")
    if args.schedule and args.baseline:
        raise ValueError("--schedule runs speculative cycles: it cannot be combined with --baseline")
    torch_profile.check(args)


def flush_cupti() -> int:
    """Hand the CUDA events CUPTI still buffers in this process to the profiler now (``cuptiActivityFlushAll``
    of every libcupti loaded here, e.g. by nsys's injection); the number of libraries flushed."""
    import ctypes

    try:
        with open("/proc/self/maps") as f:
            libs = sorted({line.split()[-1] for line in f if "libcupti" in line})
    except OSError:
        return 0
    done = 0
    for lib in libs:
        try:
            done += ctypes.CDLL(lib).cuptiActivityFlushAll(1) == 0  # CUPTI_ACTIVITY_FLAG_FLUSH_FORCED
        except (OSError, AttributeError):
            continue
    return done


def accept_lengths(n: int, steps: int, seed: int, rate: float | None = None) -> list[int]:
    """A fixed pseudo-random accept-length schedule in 1..steps+1 (the bonus token counts): uniform by default;
    with ``rate`` each draft token is accepted with that probability until the first rejection (what a draft
    model's acceptance looks like: E[accepted drafts] = rate + rate² + … + rate^steps)."""
    rng = random.Random(seed)
    if rate is None:
        return [rng.randint(1, steps + 1) for _ in range(n)]
    out = []
    for _ in range(n):
        k = 0
        while k < steps and rng.random() < rate:
            k += 1
        out.append(k + 1)
    return out


class _NoRanges:
    """Stand-in for ``nvtx_hooks.ranges`` when ranges are off."""

    @staticmethod
    def push(name, payload=None):
        return None

    @staticmethod
    def pop():
        return None

    @staticmethod
    def mark(name, payload=None):
        return None


def _ranges(on: bool):
    if not on:
        return _NoRanges
    from nvtx_hooks import ranges

    return ranges


def spin(seconds: float) -> None:
    """Keep the host busy for ``seconds`` (CPU work, as a scheduler's; no sleep, no wake-up latency)."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def _cycle_payload(batch_size: int, cycle_index: int, accepted_per_request: int | None = None) -> int:
    """The phase API's payload: ``accepted_per_request`` counts the bonus token, the payload does not."""
    acc = None if accepted_per_request is None else batch_size * (accepted_per_request - 1)
    return encode_payload(batch_size, cycle_index, acc)


def _median_step_us(times: list[float]) -> float | None:
    """The median step between consecutive perf_counter times, µs (None with fewer than two times)."""
    steps = [b - a for a, b in zip(times, times[1:])]
    return round(statistics.median(steps) * 1e6, 1) if steps else None


def _mean_us(seconds: list[float]) -> float | None:
    """The mean of ``seconds``, µs (None when empty)."""
    return round(sum(seconds) / len(seconds) * 1e6, 1) if seconds else None


def run(args: argparse.Namespace) -> dict:
    """Build the model, run warmup and the measured loop on this rank; return the record (one JSON line).

    The record: the run's settings and throughput (``cycles``: measured cycles; ``batch``: the decode batch
    size, None with ``--schedule``; ``tokens_per_cycle``: the mean over the measured cycles of batch size ×
    accept length; ``period_median_us`` without ``--schedule``: the median host time from one measured
    cycle's push to the next's), and the ground truth of the knobs:

    - ``delay`` (a straggler is set and its rank exists): ``rank, every, offset, before, us``, ``cycles`` (the
      indices whose phase the straggler waited before, warm-up included; [] with ``--baseline``) and
      ``measured_us_mean`` (perf_counter around each wait, on the straggler; None on the other ranks);
    - ``stall`` (``--stall-us`` > 0): ``every, us, cycles`` (the indices stalled before, warm-up included),
      ``measured_us_mean``;
    - ``segments`` (``--schedule``): per segment ``batch, cycles, first_cycle`` (its first cycle index),
      ``prefill`` (a prefill ran just before it), ``prefill_ms`` (push of ``prefill`` to the end of its host
      sync; None without one) and ``period_median_us`` (the median, over its pairs of consecutive cycles,
      of the host time from one cycle's push to the next's; the host syncs in every host_overhead, so it
      follows the GPU's period; None for a one-cycle segment).
    """
    import torch
    import torch.distributed as dist

    check(args)
    rank = int(os.environ.get("RANK", 0))
    world = int(os.environ.get("WORLD_SIZE", 1))
    local = int(os.environ.get("LOCAL_RANK", rank))
    use_cuda = (args.device or ("cuda" if torch.cuda.is_available() else "cpu")) == "cuda"
    if use_cuda:
        torch.cuda.set_device(local)
        dev = torch.device("cuda", local)
        dtype = torch.bfloat16
    else:
        dev = torch.device("cpu")
        dtype = torch.float32
    graphs = args.graphs and use_cuda
    if world > 1:
        if use_cuda:
            dist.init_process_group("nccl", device_id=dev)
        else:
            dist.init_process_group("gloo")
    R = torch_profile.emitter(_ranges(args.ranges), args)
    H, inter = args.hidden, max(1, args.ffn // world)
    gen = torch.Generator(device=dev).manual_seed(args.seed + 17 * rank)

    def mk(*shape):
        return torch.randn(*shape, generator=gen, device=dev, dtype=dtype) * 0.02

    W = [(mk(H, inter), mk(inter, H)) for _ in range(args.layers)]
    Wd = [(mk(H, inter), mk(inter, H)) for _ in range(args.draft_layers)]

    def layer(x, w):
        y = torch.nn.functional.gelu(x @ w[0]) @ w[1]
        if world > 1:
            dist.all_reduce(y)
        return x + y

    def target(x):
        for w in W:
            x = layer(x, w)
        return x

    def draft_model(x):
        for _ in range(args.steps):
            for w in Wd:
                x = layer(x, w)
        return x

    # (batch size, cycles) per segment of the measured loop; the requests prefilled before each (0: none)
    segments = parse_schedule(args.schedule) if args.schedule else [(args.batch, args.cycles)]
    new_requests = [0] + [max(0, b - a) for (a, _), (b, _) in zip(segments, segments[1:])]
    sizes = list(dict.fromkeys(b for b, _ in segments))  # each distinct batch size once, in order
    measured_cycles = sum(c for _, c in segments)
    # per batch size: the verify input (BS*(STEPS+1) tokens) and the draft input (BS tokens)
    xv, xd = {}, {}
    for b in sizes:
        xv[b], xd[b] = mk(b * (args.steps + 1), H), mk(b, H)
    xp = mk(max(new_requests) * args.prompt_len, H) if max(new_requests) else None  # a prefill's prompts
    acc_dev = torch.zeros(1, dtype=torch.int64, device=dev)
    # v2: two host buffers and events, so cycle i's copy lands while cycle i-1's is read
    acc_host = [torch.zeros(1, dtype=torch.int64, pin_memory=use_cuda) for _ in range(2)]
    copied = [torch.cuda.Event() if use_cuda else None for _ in range(2)]
    pending: list[int] = []  # cycles whose accept length is on its way to the host
    sched = accept_lengths(args.warmup + measured_cycles, args.steps, args.seed, args.accept_rate)

    if use_cuda:
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(3):
                for b in sizes:
                    target(xv[b] if not args.baseline else xd[b])
                    draft_model(xd[b])
            if xp is not None:  # (made whenever a prefill is scheduled)
                for n in sorted(set(new_requests) - {0}):
                    layer(target(xp[: n * args.prompt_len]), Wd[0])
        torch.cuda.current_stream().wait_stream(s)
        torch.cuda.synchronize()
    run_v: dict[int, Callable[[], object]] = {}  # per batch size: one verify,
    run_d: dict[int, Callable[[], object]] = {}  # one draft
    run_b: Callable[[], object]  # a decode step of the baseline (no speculation)
    if graphs:
        if args.baseline:
            gb = torch.cuda.CUDAGraph()
            with torch.cuda.graph(gb):
                target(xd[args.batch])
            run_b = gb.replay
        else:
            for b in sizes:
                gv, gd = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
                with torch.cuda.graph(gv):
                    target(xv[b])
                with torch.cuda.graph(gd):
                    draft_model(xd[b])
                run_v[b], run_d[b] = gv.replay, gd.replay
    else:
        run_b = lambda: target(xd[args.batch])  # noqa: E731
        for b in sizes:
            run_v[b], run_d[b] = functools.partial(target, xv[b]), functools.partial(draft_model, xd[b])
    if use_cuda:
        torch.cuda.synchronize()
    if world > 1:
        dist.barrier()

    delay_on = args.delay_us > 0 and args.delay_rank is not None and 0 <= args.delay_rank < world
    delay_s = args.delay_us / 1e6 if (delay_on and args.delay_rank == rank) else 0.0
    host_s = args.host_us / 1e6
    host_wait = time.sleep if args.host_wait == "sleep" else spin
    push, pop, mark = R.push, R.pop, R.mark
    batch_of: dict[int, int] = {}  # cycle index -> its batch size
    pushed_at: dict[int, float] = {}  # cycle index -> perf_counter just before its push
    delay_spent: dict[int, float] = {}  # cycle index -> the straggler's wait before its phase, s
    stall_spent: dict[int, float] = {}  # cycle index -> the host work before its push, s

    def accept_result(j: int) -> None:
        """Cycle j's result on the host (SGLang v2: after its copy-done event), and the hooks' mark."""
        event = copied[j % 2]
        if event is not None:
            event.synchronize()
        a = int(acc_host[j % 2].item())  # a CPU tensor: no device sync
        bj = batch_of[j]
        mark("accept", encode_payload(bj, j, bj * (a - 1)))

    def straggle(i: int, phase: str) -> None:
        """The straggler's wait before ``phase`` of cycle i, when this rank is the straggler and i is due."""
        if delay_s and phase == args.delay_before and i % args.delay_every == args.delay_offset:
            t = time.perf_counter()
            host_wait(delay_s)
            delay_spent[i] = time.perf_counter() - t

    def stall(i: int) -> None:
        """The host work between cycle i-1 and cycle i, when i is due (outside any range)."""
        if args.stall_us and i > 0 and i % args.stall_every == 0:
            t = time.perf_counter()
            spin(args.stall_us / 1e6)
            stall_spent[i] = time.perf_counter() - t

    def prefill(new: int, last: int) -> float:
        """A prefill of ``new`` requests after cycle ``last`` (ranges, then a host sync); its host time, ms."""
        assert xp is not None  # (made whenever a prefill is scheduled)
        t = time.perf_counter()
        push("prefill", encode_payload(new, last))
        push("prefill_target_extend")
        h = target(xp[: new * args.prompt_len])
        pop()
        push("prefill_draft_extend")
        layer(h, Wd[0])
        pop()
        pop()
        if use_cuda:
            torch.cuda.synchronize()  # the host reads the first tokens of the new requests
        return (time.perf_counter() - t) * 1e3

    def one_cycle(i: int, bs: int) -> None:
        batch_of[i] = bs
        pushed_at[i] = time.perf_counter()
        if args.baseline:
            push("decode_step", _cycle_payload(bs, i))
            run_b()
            acc_dev.fill_(1)
            int(acc_dev.item())  # the host reads the sampled token: one sync per step
            pop()
            return
        a = sched[i]
        p_known, p_cycle = _cycle_payload(bs, i, a), _cycle_payload(bs, i)
        if args.v2:
            p_known = p_cycle  # the accept length stays on the GPU
        push("cycle", p_known)
        straggle(i, "draft")
        push("draft", p_cycle)
        run_d[bs]()
        pop()
        straggle(i, "verify")
        push("verify", p_cycle)
        run_v[bs]()
        acc_dev.fill_(a)
        pop()
        push("draft_extend", p_known)
        xd[bs].copy_(layer(xv[bs][: bs * a], Wd[0])[:bs])
        pop()
        push("host_overhead")
        if args.v2:
            acc_host[i % 2].copy_(acc_dev, non_blocking=use_cuda)
            event = copied[i % 2]
            if event is not None:
                event.record()
        else:
            int(acc_dev.item())
        if host_s:
            host_wait(host_s)
        pop()
        pop()
        if args.v2:  # the previous cycle's result, processed while this one runs
            if pending:
                accept_result(pending.pop())
            pending.append(i)

    for i in range(args.warmup):
        stall(i)
        one_cycle(i, segments[0][0])
    while pending:
        accept_result(pending.pop())
    if use_cuda:
        torch.cuda.synchronize()
    if world > 1:
        dist.barrier()
    bracket = use_cuda and args.profiler_api and args.profiler_rank in (None, rank)
    if bracket:
        torch.cuda.cudart().cudaProfilerStart()
    prof = torch_profile.start(args, use_cuda)
    t0 = time.perf_counter()
    i = args.warmup
    prefill_ms: list[float | None] = []
    for (bs, n), new in zip(segments, new_requests):
        prefill_ms.append(None)
        for k in range(n):
            stall(i)
            if k == 0 and new:
                prefill_ms[-1] = prefill(new, i - 1)
            one_cycle(i, bs)
            i += 1
    while pending:  # the last cycle's result
        accept_result(pending.pop())
    if use_cuda:
        torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    if use_cuda and args.exit_mode != "os":
        flush_cupti()  # this rank's events reach the profiler before its window closes
    if bracket:
        torch.cuda.cudart().cudaProfilerStop()
    torch_trace = torch_profile.stop(prof, args, rank)
    measured = range(args.warmup, args.warmup + measured_cycles)
    rec = {
        "rank": rank,
        "world": world,
        "device": torch.cuda.get_device_name(dev) if use_cuda else "cpu",
        "mode": "baseline" if args.baseline else "eagle",
        "graphs": graphs,
        "ranges": bool(args.ranges),
        "cycles": measured_cycles,
        "steps": args.steps,
        "layers": args.layers,
        "batch": None if args.schedule else args.batch,
        "delay_us": args.delay_us if delay_s else 0,
        "host_wait": args.host_wait,
        "wall_s": wall,
        "cycles_per_s": measured_cycles / wall if wall > 0 else None,
        "tokens_per_cycle": (args.batch if args.baseline
                             else sum(batch_of[j] * sched[j] for j in measured) / max(1, measured_cycles)),
    }
    if torch_trace:
        rec["torch_trace"] = torch_trace
    if not args.schedule:
        rec["period_median_us"] = _median_step_us([pushed_at[j] for j in measured])
    if args.v2:  # per cycle index: accepted tokens per request, the bonus token included
        rec["accept_lengths"] = {j: sched[j] for j in measured}
    if delay_on:
        due = [] if args.baseline else [j for j in sorted(batch_of) if j % args.delay_every == args.delay_offset]
        rec["delay"] = {"rank": args.delay_rank, "every": args.delay_every, "offset": args.delay_offset,
                        "before": args.delay_before, "us": args.delay_us,
                        "measured_us_mean": _mean_us(list(delay_spent.values())) if delay_s else None,
                        "cycles": due}
    if args.stall_us:
        rec["stall"] = {"every": args.stall_every, "us": args.stall_us,
                        "measured_us_mean": _mean_us(list(stall_spent.values())), "cycles": sorted(stall_spent)}
    if args.schedule:
        rec["segments"] = []
        first = args.warmup
        for (bs, n), new, ms in zip(segments, new_requests, prefill_ms):
            rec["segments"].append({
                "batch": bs, "cycles": n, "first_cycle": first, "prefill": bool(new),
                "prefill_ms": None if ms is None else round(ms, 3),
                "period_median_us": _median_step_us([pushed_at[j] for j in range(first, first + n)]),
            })
            first += n
    if args.decode_log_interval > 0 and rank == 0 and not args.baseline:
        _decode_log(segments, args.warmup, args.decode_log_interval, pushed_at, sched, graphs)
    return rec


def _decode_log(segments, first: int, every: int, pushed_at: dict[int, float], sched, graphs: bool) -> None:
    """SGLang's decode log lines for the measured cycles (written after the run: no host time inside it): per batch
    size, one line per ``every`` cycles, ``gen throughput`` = the tokens they generated over the time from the
    first one's push to the push after the last (as SGLang's: tokens since the previous line over the time since)."""
    lines = []
    for bs, n in segments:
        for j in range(first, first + n - every, every):  # the cycle after the last must be in this batch size
            accepted = [sched[k] for k in range(j, j + every)]
            dt = pushed_at[j + every] - pushed_at[j]
            if dt > 0:
                lines.append(f"[workload TP0] Decode batch, #running-req: {bs}, accept len: "
                             f"{sum(accepted) / every:.2f}, cuda graph: {graphs}, gen throughput (token/s): "
                             f"{bs * sum(accepted) / dt:.2f}, #queue-req: 0")
        first += n
    print("\n".join(lines), file=sys.stderr, flush=True)


def _under_torchrun() -> bool:
    return "TORCHELASTIC_RUN_ID" in os.environ or "LOCAL_RANK" in os.environ


def _visible_gpus() -> int:
    """GPUs torch can see here (0 without torch or CUDA)."""
    try:
        import torch

        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except ImportError:
        return 0


def _drop_nproc(argv: list[str]) -> list[str]:
    out, skip = [], False
    for tok in argv:
        if skip:
            skip = False
        elif tok == "--nproc":
            skip = True
        elif not tok.startswith("--nproc="):
            out.append(tok)
    return out


def torchrun_command(nproc: int, argv: list[str]) -> list[str]:
    """The command that re-runs this workload on ``nproc`` ranks under torchrun."""
    argv = _drop_nproc(argv)
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
            "-m", "nvtx_hooks.capture.workload", *argv]


def to_argv(args: argparse.Namespace) -> list[str]:
    """The command-line options that reproduce ``args`` (those that differ from the defaults)."""
    out: list[str] = []
    for act in build_parser()._actions:
        if not act.option_strings or act.dest == "help":
            continue
        val = getattr(args, act.dest, act.default)
        if val == act.default:
            continue
        flag = act.option_strings[0]
        if isinstance(act, argparse.BooleanOptionalAction):
            out.append(flag if val else "--no-" + flag[2:])
        elif act.nargs == 0:
            out.append(flag)
        else:
            out += [flag, str(val)]
    return out


def main(argv: list[str] | None = None, args: argparse.Namespace | None = None) -> int:
    """Entry point: relaunch under torchrun when several GPUs are wanted, else run this rank."""
    if args is None:
        argv = list(sys.argv[1:] if argv is None else argv)
        args = build_parser().parse_args(argv)
    else:
        argv = to_argv(args)
    try:
        check(args)
    except ValueError as e:
        build_parser().error(str(e))
    nproc = args.nproc if args.nproc is not None else max(1, _visible_gpus())
    if nproc > 1 and not _under_torchrun():
        import subprocess

        env = dict(os.environ)
        env.setdefault("NCCL_NVLS_ENABLE", "0")
        return subprocess.call(torchrun_command(nproc, argv), env=env)
    rec = run(args)
    print(json.dumps(rec), flush=True)
    if rec["world"] > 1:
        _end_rank(args.exit_mode)
    return 0


def _end_rank(mode: str) -> None:
    """End one rank of several: GPU idle and CUPTI flushed, all ranks done, then NCCL torn down (bounded by
    :data:`_TEARDOWN_S`: it can hang) and a normal exit; ``mode='os'``: ``os._exit`` after the barrier."""
    import torch
    import torch.distributed as dist

    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()
    if mode != "os":
        flush_cupti()
    dist.barrier()
    sys.stdout.flush()
    sys.stderr.flush()
    if mode == "os":
        os._exit(0)
    watchdog = threading.Timer(_TEARDOWN_S, os._exit, (0,))
    watchdog.daemon = True
    watchdog.start()
    dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
