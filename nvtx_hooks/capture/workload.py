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

- Adaptive speculation, ``--adaptive BS:STEPS[:CYCLES],...`` (e.g. ``1:4,8:3,32:1,64:0,8:3``): segments as
  ``--schedule``'s, each with its own draft steps (CYCLES default ``--cycles``); every (batch size, steps) has its
  own CUDA graphs; 0 steps is verify only: no ``draft`` range, verify over the batch's own tokens, then
  ``draft_extend`` (SGLang keeps the draft's KV warm) unless ``--zero-step-draft-extend skip`` (SGLang's
  ``SGLANG_SPEC_SKIP_ZERO_STEP_DRAFT_EXTEND``). Every range's payload carries the cycle's steps (payload version 2).
- Acceptance per draft position, ``--accept-profile P1,P2,...``: each request accepts draft position j with
  probability Pj given it accepted j-1 (:func:`nvtx_hooks.capture.plan.plan_drafts`); the ``accept_histogram``
  marks carry each cycle's requests by accepted drafts, as the hooks emit them.
- The scheduler, ``--scheduler``: each iteration runs SGLang's loop on the host — ``recv_requests``,
  ``process_input_requests``, ``get_next_batch_to_run`` (busy spins of ``--scheduler-us`` µs), ``run_batch`` (the
  cycle: draft, verify, draft_extend; no ``host_overhead``), ``process_batch_result`` (a ``.tolist()`` of the
  cycle's per-request accept lengths: a D2H copy that waits for the GPU, the ``accept`` and ``accept_histogram``
  marks, its µs, and ``--busy-us`` µs in the pure-Python ``spectrace_busy_python`` for CPU sampling to find);
  ``--overlap``: SGLang's overlap scheduler, the next batch scheduled and launched while the GPU runs the current
  one, whose result is processed after (an event the copy recorded, then the host list). Ranges around those
  functions (``--scheduler-ranges``): ``hooks`` (``scheduler.<method>`` in the spectrace.host domain, as the hooks),
  ``sglang`` (the same names in the default domain, as ``SGLANG_ENABLE_NVTX_SCHEDULER=1``) or ``none``.
- Injected host time, ``--extra PIECE:US:RULE`` (repeatable): US µs more, spun, in PIECE (a scheduler function,
  ``host_overhead`` or ``between``: outside any range before the cycle) in the cycles RULE picks: ``every=N[+K]``
  (i % N == K), ``p=P`` (each cycle with probability P, seeded) or ``from=N`` (every cycle from N on: a level
  shift).

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
import contextlib
import functools
import json
import os
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterator

from ..phases import encode_accept_histogram, encode_payload, histogram_of
from . import plan as pl
from . import torch_profile
from .plan import Segment

__all__ = ["build_parser", "parse_schedule", "check", "flush_cupti", "accept_lengths", "spin", "segments_of",
           "run", "torchrun_command", "to_argv", "main"]

_TEARDOWN_S = 60.0  # NCCL teardown after the final barrier normally takes well under a second
_HOST_US = 300  # host_overhead's default µs (not with --scheduler, whose host time is in its functions)


def _rate(text: str) -> float:
    v = float(text)
    if not 0 <= v <= 1:
        raise argparse.ArgumentTypeError(f"must be a probability from 0 to 1, not {text}")
    return v


def _typed(parse: Callable, keep: Callable = str) -> Callable:
    """An argparse type from a parser raising ValueError; the value kept is ``keep(text)``."""

    def conv(text: str):
        try:
            parse(text)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
        return keep(text)

    return conv


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
    p.add_argument("--host-us", type=_non_negative, default=None,
                   help=f"host time in host_overhead, µs (default {_HOST_US}; not with --scheduler)")
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
    p.add_argument("--adaptive", type=_typed(lambda t: pl.parse_adaptive(t, 1)), default=None,
                   metavar="BS:STEPS[:CYCLES],...",
                   help="adaptive speculation: segments as --schedule's, each at its own draft steps (0: verify "
                        "only), e.g. 1:4,8:3,32:1,64:0,8:3; CYCLES defaults to --cycles; each (batch size, steps) "
                        "has its own CUDA graphs")
    p.add_argument("--zero-step-draft-extend", choices=("run", "skip"), default="run",
                   help="a 0-step cycle's draft_extend: run it (SGLang's default) or skip it "
                        "(SGLANG_SPEC_SKIP_ZERO_STEP_DRAFT_EXTEND)")
    p.add_argument("--prompt-len", type=_positive, default=128,
                   help="prompt tokens per new request in a --schedule/--adaptive prefill (default 128)")
    p.add_argument("--device", choices=("cuda", "cpu"), default=None, help="default: cuda when available")
    p.add_argument("--seed", type=int, default=0, help="seed of the accept lengths, the random extras and weights")
    p.add_argument("--accept-rate", type=_rate, default=None, metavar="A",
                   help="accept each draft token with probability A until the first rejection (a draft model's "
                        "acceptance; default: accept lengths uniform in 1..steps+1)")
    p.add_argument("--accept-profile", type=_typed(pl.parse_profile), default=None, metavar="P1,P2,...",
                   help="per request: draft position j accepted with probability Pj given j-1 was (the last value "
                        "for positions past the list); e.g. 0.9,0.75,0.6,0.45")
    p.add_argument("--scheduler", action="store_true",
                   help="emulate SGLang's scheduler loop on the host: recv_requests, process_input_requests, "
                        "get_next_batch_to_run, run_batch (the cycle), process_batch_result (a .tolist() D2H sync)")
    p.add_argument("--scheduler-us", type=_typed(pl.parse_scheduler_us), default=None, metavar="NAME=US,...",
                   help="µs of the emulated scheduler functions (default "
                        + ",".join(f"{k}={v}" for k, v in pl.DEFAULT_SCHEDULER_US.items()) + ")")
    p.add_argument("--scheduler-ranges", choices=pl.RANGE_KINDS, default="hooks",
                   help="ranges around the scheduler functions: hooks (scheduler.* in the spectrace.host domain, as "
                        "the hooks emit them; default), sglang (the same names in the default domain, as "
                        "SGLANG_ENABLE_NVTX_SCHEDULER=1) or none")
    p.add_argument("--overlap", action="store_true",
                   help="with --scheduler: SGLang's overlap scheduler (the next batch scheduled and launched while the "
                        "GPU runs the current one; a result is processed one iteration later)")
    p.add_argument("--busy-us", type=_non_negative, default=0,
                   help=f"with --scheduler: µs of pure-Python work in {pl.BUSY_FUNCTION}() inside "
                        "process_batch_result (what CPU sampling finds; default 0)")
    p.add_argument("--extra", action="append", type=_typed(pl.parse_extra), default=None,
                   metavar="PIECE:US:RULE",
                   help="injected host time, repeatable: US µs more in PIECE (" + ", ".join(pl.PIECES) + ") in "
                        "the cycles RULE picks: every=N[+K], p=P (seeded) or from=N (a level shift)")
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


def segments_of(args: argparse.Namespace) -> list[Segment]:
    """The measured loop's segments: ``--adaptive``'s, ``--schedule``'s (at ``--steps``), or one of ``--batch``."""
    if args.adaptive:
        return pl.parse_adaptive(args.adaptive, args.cycles)
    if args.schedule:
        return [Segment(b, args.steps, c) for b, c in parse_schedule(args.schedule)]
    return [Segment(args.batch, args.steps, args.cycles)]


def check(args: argparse.Namespace) -> None:
    """Raise ValueError (one line) for options that do not go together."""
    if args.delay_offset >= args.delay_every:
        raise ValueError(f"--delay-offset {args.delay_offset} must be below --delay-every {args.delay_every}")
    if args.schedule and args.baseline:
        raise ValueError("--schedule runs speculative cycles: it cannot be combined with --baseline")
    if args.adaptive and (args.schedule or args.baseline):
        raise ValueError("--adaptive runs its own segments: it cannot be combined with --schedule or --baseline")
    if args.accept_profile and args.accept_rate is not None:
        raise ValueError("--accept-profile and --accept-rate are two acceptance models: give one")
    if args.scheduler and args.baseline:
        raise ValueError("--scheduler emulates the speculative loop: it cannot be combined with --baseline")
    if args.scheduler and args.host_us is not None:
        raise ValueError("--host-us is host_overhead's time; with --scheduler the host time is in the scheduler "
                         "functions (--scheduler-us)")
    if not args.scheduler and (args.overlap or args.busy_us or args.scheduler_us):
        raise ValueError("--overlap, --busy-us and --scheduler-us need --scheduler")
    for x in args.extra or []:
        e = pl.parse_extra(x)
        if e.piece in pl.SCHEDULER_FUNCTIONS and not args.scheduler:
            raise ValueError(f"--extra {x}: {e.piece} is an emulated scheduler function (--scheduler)")
        if e.piece == "host_overhead" and args.scheduler:
            raise ValueError(f"--extra {x}: there is no host_overhead range with --scheduler")
        if args.baseline:
            raise ValueError("--extra injects into the speculative loop: it cannot be combined with --baseline")
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
    model's acceptance looks like: E[accepted drafts] = rate + rate² + … + rate^steps). The cycles' lengths of
    :func:`nvtx_hooks.capture.plan.plan_drafts` at one steps count without a profile (every request alike)."""
    return [ds[0] + 1 for ds in pl.plan_drafts([(1, steps)] * n, seed, rate, None)]


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


def _host_ranges(kind: str, ranges_on: bool, spectrace):
    """The ranges around the emulated scheduler functions: the hooks' (``spectrace.host``, the phase ranges'
    emitter's ``host``), SGLang's own (default domain), or none."""
    if not ranges_on or kind == "none":
        return _NoRanges
    return spectrace.host if kind == "hooks" else pl.DefaultDomainRanges()


@contextlib.contextmanager
def _profiler_window(bracket: bool, flush: bool) -> Iterator[None]:
    """The measured loop's profiler window: ``cudaProfilerStart/Stop`` (nsys ``--capture-range=cudaProfilerApi``)
    when ``bracket``; with ``flush`` the CUPTI flush before it closes (this rank's events reach the profiler
    before its window closes). ``--torch-profiler``'s profiler (:mod:`.torch_profile`) is started inside it and
    stopped after it."""
    import torch

    if bracket:
        torch.cuda.cudart().cudaProfilerStart()
    try:
        yield
    finally:
        if flush:
            flush_cupti()
        if bracket:
            torch.cuda.cudart().cudaProfilerStop()


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
    size, None with ``--schedule``/``--adaptive``; ``steps``: the draft steps, None with ``--adaptive``;
    ``tokens_per_cycle``: the mean over the measured cycles of the batch's accepted drafts plus its size;
    ``period_median_us`` with a single segment: the median host time from one measured cycle's push to the
    next's), and the ground truth of the knobs (cycle indices count the warm-up cycles too):

    - ``delay`` (a straggler is set and its rank exists): ``rank, every, offset, before, us``, ``cycles`` (the
      indices whose phase the straggler waited before, warm-up included; [] with ``--baseline``) and
      ``measured_us_mean`` (perf_counter around each wait, on the straggler; None on the other ranks);
    - ``stall`` (``--stall-us`` > 0): ``every, us, cycles`` (the indices stalled before, warm-up included),
      ``measured_us_mean``;
    - ``segments`` (``--schedule``/``--adaptive``): per segment ``batch, steps, cycles, first_cycle`` (its first
      cycle index), ``prefill`` (a prefill ran just before it), ``prefill_ms`` (push of ``prefill`` to the end of
      its host sync; None without one) and ``period_median_us`` (the median, over its pairs of consecutive
      cycles, of the host time from one cycle's push to the next's; the host syncs every cycle, so it follows the
      GPU's period; None for a one-cycle segment);
    - ``acceptance`` (speculative runs): ``model`` (``uniform``, ``rate`` or ``profile``), ``rate``, ``profile``,
      and per segment (its measured cycles) ``batch, steps, first_cycle, cycles``, ``requests`` (request-cycles),
      ``histogram`` (requests that accepted 0, 1, … steps drafts, summed over the cycles) and
      ``accepted_at_position`` (for position j = 1..steps, requests that accepted at least j drafts); every
      measured cycle's histogram in ``accept_histograms`` ({cycle index: counts}: what its ``accept_histogram``
      marks carry); ``accept_lengths`` ({cycle index: accepted tokens per request, the bonus included}) with
      ``--v2`` when every request of a cycle accepts alike;
    - ``scheduler`` (``--scheduler``): ``ranges``, ``overlap``, ``us`` (each function's asked µs), ``busy_us``,
      ``busy_function``, ``busy_in``, ``first_cycle`` and, per function, ``measured_us``: one value per measured
      iteration (iteration k launches cycle first_cycle + k; an overlap iteration's process_batch_result processes
      the previous cycle's result, the last result's after the loop in ``drain_us``; None where it processed
      none: the first overlap iteration), perf_counter around the function body, its extras and busy work
      included;
    - ``extras`` (``--extra``): per extra its ``piece, us, rule, every, offset, p, from``, ``cycles`` (the cycle
      indices it applied to, warm-up included) and ``measured_us_mean`` (perf_counter around its extra spin);
    - ``zero_step_draft_extend`` (``run``/``skip``).
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

    def draft_model(x, steps):
        for _ in range(steps):
            for w in Wd:
                x = layer(x, w)
        return x

    segments = segments_of(args)
    # the requests prefilled before each segment (0: none)
    new_requests = [0] + [max(0, b.batch - a.batch) for a, b in zip(segments, segments[1:])]
    keys = list(dict.fromkeys((s.batch, s.steps) for s in segments))  # each (batch size, steps) once, in order
    sizes = list(dict.fromkeys(s.batch for s in segments))
    measured_cycles = sum(s.cycles for s in segments)
    n_total = args.warmup + measured_cycles
    # per cycle index: its (batch size, steps); the warm-up runs at the first segment's
    seg_of = [segments[0]] * args.warmup + [s for s in segments for _ in range(s.cycles)]
    profile = pl.parse_profile(args.accept_profile) if args.accept_profile else None
    drafts = pl.plan_drafts([(s.batch, s.steps) for s in seg_of], args.seed, args.accept_rate, profile)
    accepted = [sum(ds) for ds in drafts]  # per cycle: the batch's accepted draft tokens (the payload's)
    extras = [pl.parse_extra(x) for x in args.extra or []]
    extra_at = pl.extra_cycles(extras, n_total, args.seed)
    extra_us: dict[tuple[str, int], int] = {}
    for x, cyc in zip(extras, extra_at):
        for i in cyc:
            extra_us[(x.piece, i)] = extra_us.get((x.piece, i), 0) + x.us
    extra_spent: dict[tuple[str, int], float] = {}  # (piece, cycle) -> the extra spin's time, s

    # per (batch size, steps): the verify input (BS*(STEPS+1) tokens); per batch size: the draft input (BS tokens)
    xv = {(b, st): mk(b * (st + 1), H) for b, st in keys}
    xd = {b: mk(b, H) for b in sizes}
    xp = mk(max(new_requests) * args.prompt_len, H) if max(new_requests) else None  # a prefill's prompts
    acc_dev = torch.zeros(1, dtype=torch.int64, device=dev)
    # v2: two host buffers and events, so cycle i's copy lands while cycle i-1's is read
    acc_host = [torch.zeros(1, dtype=torch.int64, pin_memory=use_cuda) for _ in range(2)]
    copied = [torch.cuda.Event() if use_cuda else None for _ in range(2)]
    # --scheduler: every cycle's per-request accept lengths (drafts + the bonus token) on the device, uploaded once;
    # each cycle's result is a copy of its slice made after its draft_extend (as SGLang's sampled output)
    offsets = [0]
    for ds in drafts:
        offsets.append(offsets[-1] + len(ds))
    acc_all = torch.tensor([d + 1 for ds in drafts for d in ds] or [0], dtype=torch.int64, device=dev)
    res_host = [torch.zeros(max(sizes), dtype=torch.int64, pin_memory=use_cuda) for _ in range(2)]
    res_dev: dict[int, torch.Tensor] = {}

    if use_cuda:
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(3):
                for b, st in keys:
                    target(xv[(b, st)] if not args.baseline else xd[b])
                    draft_model(xd[b], st)
            if xp is not None:  # (made whenever a prefill is scheduled)
                for n in sorted(set(new_requests) - {0}):
                    layer(target(xp[: n * args.prompt_len]), Wd[0])
        torch.cuda.current_stream().wait_stream(s)
        torch.cuda.synchronize()
    run_v: dict[tuple[int, int], Callable[[], object]] = {}  # per (batch size, steps): one verify,
    run_d: dict[tuple[int, int], Callable[[], object]] = {}  # one draft (none at 0 steps)
    run_b: Callable[[], object]  # a decode step of the baseline (no speculation)
    if graphs:
        if args.baseline:
            gb = torch.cuda.CUDAGraph()
            with torch.cuda.graph(gb):
                target(xd[args.batch])
            run_b = gb.replay
        else:
            for b, st in keys:
                gv = torch.cuda.CUDAGraph()
                with torch.cuda.graph(gv):
                    target(xv[(b, st)])
                run_v[(b, st)] = gv.replay
                if st:
                    gd = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(gd):
                        draft_model(xd[b], st)
                    run_d[(b, st)] = gd.replay
    else:
        run_b = lambda: target(xd[args.batch])  # noqa: E731
        for b, st in keys:
            run_v[(b, st)] = functools.partial(target, xv[(b, st)])
            run_d[(b, st)] = functools.partial(draft_model, xd[b], st)
    if use_cuda:
        torch.cuda.synchronize()
    if world > 1:
        dist.barrier()

    delay_on = args.delay_us > 0 and args.delay_rank is not None and 0 <= args.delay_rank < world
    delay_s = args.delay_us / 1e6 if (delay_on and args.delay_rank == rank) else 0.0
    host_s = (_HOST_US if args.host_us is None else args.host_us) / 1e6
    host_wait = time.sleep if args.host_wait == "sleep" else spin
    push, pop, mark = R.push, R.pop, R.mark
    HR = _host_ranges(args.scheduler_ranges, args.ranges, R)  # around the emulated scheduler functions
    sched_us = pl.parse_scheduler_us(args.scheduler_us) if args.scheduler_us else dict(pl.DEFAULT_SCHEDULER_US)
    sched_spent: dict[str, dict[int, float]] = {f: {} for f in pl.SCHEDULER_FUNCTIONS}  # function -> cycle -> s
    drain_spent: list[float] = []
    batch_of: dict[int, int] = {}  # cycle index -> its batch size
    pushed_at: dict[int, float] = {}  # cycle index -> perf_counter just before its push
    delay_spent: dict[int, float] = {}  # cycle index -> the straggler's wait before its phase, s
    stall_spent: dict[int, float] = {}  # cycle index -> the host work before its push, s
    pending: list[int] = []  # cycles whose accept lengths are on their way to the host

    def extra(piece: str, i: int) -> None:
        """The injected extra host time of ``piece`` in cycle i, if any (a spin, measured)."""
        us = extra_us.get((piece, i))
        if us:
            t = time.perf_counter()
            spin(us / 1e6)
            extra_spent[(piece, i)] = time.perf_counter() - t

    def histogram_marks(j: int, per_request: list[int]) -> None:
        """Cycle j's requests by accepted drafts, as the hooks emit them (after the accept lengths reach the host)."""
        for v in encode_accept_histogram(j, histogram_of(per_request)):
            mark("accept_histogram", v)

    def accept_result(j: int) -> None:
        """Cycle j's result on the host (SGLang v2: after its copy-done event), and the hooks' marks."""
        event = copied[j % 2]
        if event is not None:
            event.synchronize()
        a = int(acc_host[j % 2].item())  # a CPU tensor: no device sync; the batch's accepted drafts
        mark("accept", encode_payload(batch_of[j], j, a))
        histogram_marks(j, drafts[j])

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
        extra("between", i)

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

    def phases(i: int, seg: Segment, v1_accepts: bool) -> None:
        """Cycle i's phase ranges and GPU work (inside its cycle range): draft (not at 0 steps), verify,
        draft_extend (not at 0 steps with --zero-step-draft-extend skip); ``v1_accepts``: the accept lengths are
        on the host after verify (the hooks' v1 histogram marks follow it)."""
        bs, st, key = seg.batch, seg.steps, (seg.batch, seg.steps)
        p_cycle = encode_payload(bs, i, None, st)
        p_known = encode_payload(bs, i, accepted[i], st) if v1_accepts else p_cycle
        straggle(i, "draft")
        if st:
            push("draft", p_cycle)
            run_d[key]()
            pop()
        straggle(i, "verify")
        push("verify", p_cycle)
        run_v[key]()
        acc_dev.fill_(accepted[i])
        pop()
        if v1_accepts:
            histogram_marks(i, drafts[i])
        if st or args.zero_step_draft_extend == "run":
            push("draft_extend", p_known)
            xd[bs].copy_(layer(xv[key][: accepted[i] + bs], Wd[0])[:bs])
            pop()

    def one_cycle(i: int, seg: Segment) -> None:
        """A cycle as the workload always ran it: phases, then host_overhead (the sync, the host time)."""
        bs, st = seg.batch, seg.steps
        batch_of[i] = bs
        pushed_at[i] = time.perf_counter()
        if args.baseline:
            push("decode_step", encode_payload(bs, i))
            run_b()
            acc_dev.fill_(1)
            int(acc_dev.item())  # the host reads the sampled token: one sync per step
            pop()
            return
        push("cycle", encode_payload(bs, i, None if args.v2 else accepted[i], st))
        phases(i, seg, not args.v2)
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
        extra("host_overhead", i)
        pop()
        pop()
        if args.v2:  # the previous cycle's result, processed while this one runs
            if pending:
                accept_result(pending.pop())
            pending.append(i)

    def scheduler_function(name: str, i: int) -> None:
        """One emulated scheduler function of cycle i's iteration: its range, its µs and extras, spun."""
        HR.push(pl.range_name(name))
        t = time.perf_counter()
        spin(sched_us[name] / 1e6)
        extra(name, i)
        sched_spent[name][i] = time.perf_counter() - t
        HR.pop()

    def process_batch_result(j: int, i: int | None) -> None:
        """Cycle j's result (``i``: the iteration it runs in; None: after the loop): the accept lengths to the host
        (overlap: wait on the copy's event, read the host buffer; else a .tolist() of the device tensor, a D2H copy
        that waits for the GPU), the hooks' marks, the function's µs, extras and busy Python work."""
        HR.push(pl.range_name("process_batch_result"))
        t = time.perf_counter()
        bj = batch_of[j]
        if args.overlap:
            event = copied[j % 2]
            if event is not None:
                event.synchronize()
            lens = res_host[j % 2][:bj].tolist()
        else:
            lens = res_dev[j].tolist()
        del res_dev[j]
        per_request = [x - 1 for x in lens]
        if per_request != drafts[j]:
            raise RuntimeError(f"cycle {j}: the accept lengths read back {lens} are not the planned ones")
        mark("accept", encode_payload(bj, j, sum(per_request)))
        histogram_marks(j, per_request)
        spin(sched_us["process_batch_result"] / 1e6)
        if i is not None:
            extra("process_batch_result", i)
        if args.busy_us:
            pl.spectrace_busy_python(args.busy_us / 1e6)
        spent = time.perf_counter() - t
        if i is None:
            drain_spent.append(spent)
        else:
            sched_spent["process_batch_result"][i] = spent
        HR.pop()

    def iteration(i: int, seg: Segment) -> None:
        """One iteration of SGLang's scheduler loop: poll, schedule, launch cycle i (run_batch), process a result
        (this cycle's; with --overlap the previous one's, while this one runs)."""
        for name in ("recv_requests", "process_input_requests", "get_next_batch_to_run"):
            scheduler_function(name, i)
        batch_of[i] = seg.batch
        HR.push(pl.range_name("run_batch"))
        pushed_at[i] = time.perf_counter()
        push("cycle", encode_payload(seg.batch, i, None, seg.steps))
        phases(i, seg, False)
        pop()
        res = res_dev[i] = acc_all[offsets[i]: offsets[i + 1]].clone()  # the sampled output, after draft_extend
        if args.overlap:
            res_host[i % 2][: seg.batch].copy_(res, non_blocking=use_cuda)
            event = copied[i % 2]
            if event is not None:
                event.record()
        HR.pop()
        if args.overlap:
            if pending:
                process_batch_result(pending.pop(), i)
            pending.append(i)
        else:
            process_batch_result(i, i)

    def drain() -> None:
        """The results still on their way (the last cycle's)."""
        while pending:
            j = pending.pop()
            if args.scheduler:
                process_batch_result(j, None)
            else:
                accept_result(j)

    step = iteration if args.scheduler else one_cycle
    for i in range(args.warmup):
        stall(i)
        step(i, segments[0])
    drain()
    drain_spent.clear()  # the record's drain is the measured loop's
    if use_cuda:
        torch.cuda.synchronize()
    if world > 1:
        dist.barrier()
    bracket = use_cuda and args.profiler_api and args.profiler_rank in (None, rank)
    with _profiler_window(bracket, use_cuda and args.exit_mode != "os"):
        prof = torch_profile.start(args, use_cuda)
        t0 = time.perf_counter()
        i = args.warmup
        prefill_ms: list[float | None] = []
        for seg, new in zip(segments, new_requests):
            prefill_ms.append(None)
            for k in range(seg.cycles):
                stall(i)
                if k == 0 and new:
                    prefill_ms[-1] = prefill(new, i - 1)
                step(i, seg)
                i += 1
        drain()  # the last cycle's result
        if use_cuda:
            torch.cuda.synchronize()
        wall = time.perf_counter() - t0
    torch_trace = torch_profile.stop(prof, args, rank)  # after the CUPTI flush and cudaProfilerStop
    measured = range(args.warmup, args.warmup + measured_cycles)
    rec = {
        "rank": rank,
        "world": world,
        "device": torch.cuda.get_device_name(dev) if use_cuda else "cpu",
        "mode": "baseline" if args.baseline else "eagle",
        "graphs": graphs,
        "ranges": bool(args.ranges),
        "cycles": measured_cycles,
        "steps": None if args.adaptive else args.steps,
        "layers": args.layers,
        "batch": None if (args.schedule or args.adaptive) else args.batch,
        "delay_us": args.delay_us if delay_s else 0,
        "host_wait": args.host_wait,
        "wall_s": wall,
        "cycles_per_s": measured_cycles / wall if wall > 0 else None,
        "tokens_per_cycle": (args.batch if args.baseline
                             else sum(batch_of[j] + accepted[j] for j in measured) / max(1, measured_cycles)),
    }
    if torch_trace:
        rec["torch_trace"] = torch_trace
    if len(segments) == 1:
        rec["period_median_us"] = _median_step_us([pushed_at[j] for j in measured])
    if args.v2 and profile is None:  # per cycle index: accepted tokens per request, the bonus token included
        rec["accept_lengths"] = {j: drafts[j][0] + 1 for j in measured}
    if delay_on:
        due = [] if args.baseline else [j for j in sorted(batch_of) if j % args.delay_every == args.delay_offset]
        rec["delay"] = {"rank": args.delay_rank, "every": args.delay_every, "offset": args.delay_offset,
                        "before": args.delay_before, "us": args.delay_us,
                        "measured_us_mean": _mean_us(list(delay_spent.values())) if delay_s else None,
                        "cycles": due}
    if args.stall_us:
        rec["stall"] = {"every": args.stall_every, "us": args.stall_us,
                        "measured_us_mean": _mean_us(list(stall_spent.values())), "cycles": sorted(stall_spent)}
    if args.schedule or args.adaptive:
        rec["segments"] = []
        first = args.warmup
        for seg, new, ms in zip(segments, new_requests, prefill_ms):
            rec["segments"].append({
                "batch": seg.batch, "steps": seg.steps, "cycles": seg.cycles, "first_cycle": first,
                "prefill": bool(new), "prefill_ms": None if ms is None else round(ms, 3),
                "period_median_us": _median_step_us([pushed_at[j] for j in range(first, first + seg.cycles)]),
            })
            first += seg.cycles
    if not args.baseline:
        rec["acceptance"] = _acceptance(segments, args.warmup, drafts, args.accept_rate, profile)
        rec["accept_histograms"] = {j: histogram_of(drafts[j]) for j in measured}
        rec["zero_step_draft_extend"] = args.zero_step_draft_extend
    if args.scheduler:
        rec["scheduler"] = {
            "ranges": args.scheduler_ranges if args.ranges else "none", "overlap": args.overlap, "us": sched_us,
            "busy_us": args.busy_us, "busy_function": pl.BUSY_FUNCTION, "busy_in": "process_batch_result",
            "first_cycle": args.warmup,
            "measured_us": {f: [None if sched_spent[f].get(j) is None else round(sched_spent[f][j] * 1e6, 1)
                                for j in measured] for f in pl.SCHEDULER_FUNCTIONS},
            "drain_us": [round(x * 1e6, 1) for x in drain_spent],
        }
    if extras:
        rec["extras"] = [{**x.as_dict(), "cycles": cyc,
                          "measured_us_mean": _mean_us([extra_spent[(x.piece, j)] for j in cyc
                                                        if (x.piece, j) in extra_spent])}
                         for x, cyc in zip(extras, extra_at)]
    if args.decode_log_interval > 0 and rank == 0 and not args.baseline:
        _decode_log(segments, args.warmup, args.decode_log_interval, pushed_at, drafts, graphs)
    return rec


def _acceptance(segments: list[Segment], first: int, drafts: list[list[int]], rate: float | None,
                profile: tuple[float, ...] | None) -> dict:
    """The record's ``acceptance``: the model and, per segment, its requests by accepted drafts (see :func:`run`)."""
    out: dict = {"model": "profile" if profile else ("rate" if rate is not None else "uniform"), "rate": rate,
                 "profile": list(profile) if profile else None, "segments": []}
    for seg in segments:
        hist = [0] * (seg.steps + 1)
        for ds in drafts[first: first + seg.cycles]:
            for d in ds:
                hist[d] += 1
        out["segments"].append({
            "batch": seg.batch, "steps": seg.steps, "first_cycle": first, "cycles": seg.cycles,
            "requests": sum(hist), "histogram": hist,
            "accepted_at_position": [sum(hist[j:]) for j in range(1, seg.steps + 1)],
        })
        first += seg.cycles
    return out


def _decode_log(segments: list[Segment], first: int, every: int, pushed_at: dict[int, float],
                drafts: list[list[int]], graphs: bool) -> None:
    """SGLang's decode log lines for the measured cycles (written after the run: no host time inside it): per
    segment, one line per ``every`` cycles, ``accept len`` = accepted tokens (bonus included) per request and
    cycle, ``gen throughput`` = the tokens they generated over the time from the first one's push to the push after
    the last (as SGLang's: tokens since the previous line over the time since)."""
    lines = []
    for seg in segments:
        for j in range(first, first + seg.cycles - every, every):  # the cycle after the last must be in this segment
            tokens = sum(len(drafts[k]) + sum(drafts[k]) for k in range(j, j + every))
            requests = sum(len(drafts[k]) for k in range(j, j + every))
            dt = pushed_at[j + every] - pushed_at[j]
            if dt > 0:
                lines.append(f"[workload TP0] Decode batch, #running-req: {seg.batch}, accept len: "
                             f"{tokens / requests:.2f}, cuda graph: {graphs}, gen throughput (token/s): "
                             f"{tokens / dt:.2f}, #queue-req: 0")
        first += seg.cycles
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
        elif isinstance(act, argparse._AppendAction):
            for v in val:
                out += [flag, str(v)]
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
