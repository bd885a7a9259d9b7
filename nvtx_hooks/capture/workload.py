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
across ranks). ``--delay-rank R --delay-us N`` sleeps N µs on the host of rank R just before
each verify launch, so that rank's verify starts late and the others wait in their all-reduces.
The measured loop is bracketed by ``cudaProfilerStart/Stop`` (use nsys
``--capture-range=cudaProfilerApi``); one JSON line with the loop's throughput goes to stdout.

Every rank hands its buffered CUDA events to the profiler after the loop and before it ends
(``cuptiActivityFlushAll`` when a CUPTI is loaded, e.g. by nsys) and ends with a normal exit, where CUDA
and the profiler flush what is left; NCCL's teardown gets :data:`TEARDOWN_S` seconds, then the rank ends
anyway. ``--exit os`` keeps the old ending (no flush, ``os._exit`` right after the final barrier), which
lost the last CUPTI buffers of a whole-run capture.

Run: ``python -m nvtx_hooks.capture.workload --help`` or ``spectrace demo-workload``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import threading
import time

from ..phases import encode_payload

TEARDOWN_S = 60.0  # NCCL teardown after the final barrier normally takes well under a second


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
    p.add_argument("--host-us", type=int, default=300, help="host time in host_overhead, µs")
    p.add_argument("--host-wait", choices=("sleep", "spin"), default="sleep",
                   help="how host_overhead spends its host time: time.sleep (default) or a busy loop on the clock")
    p.add_argument("--delay-rank", type=int, default=None, help="rank that sleeps before each verify")
    p.add_argument("--delay-us", type=int, default=0, help="that sleep, µs")
    p.add_argument("--device", choices=("cuda", "cpu"), default=None, help="default: cuda when available")
    p.add_argument("--seed", type=int, default=0, help="seed of the accept lengths and weights")
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
    return p


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


def accept_lengths(n: int, steps: int, seed: int) -> list[int]:
    """A fixed pseudo-random accept-length schedule in 1..steps+1 (the bonus token counts)."""
    rng = random.Random(seed)
    return [rng.randint(1, steps + 1) for _ in range(n)]


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


def cycle_payload(batch_size: int, cycle_index: int, accepted_per_request: int | None = None) -> int:
    """The phase API's payload: ``accepted_per_request`` counts the bonus token, the payload does not."""
    acc = None if accepted_per_request is None else batch_size * (accepted_per_request - 1)
    return encode_payload(batch_size, cycle_index, acc)


def run(args: argparse.Namespace) -> dict:
    """Build the model, run warmup and the measured loop on this rank; return the throughput record."""
    import torch
    import torch.distributed as dist

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
    R = _ranges(args.ranges)
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

    bs, ntok = args.batch, args.batch * (args.steps + 1)
    xv, xd = mk(ntok, H), mk(bs, H)
    acc_dev = torch.zeros(1, dtype=torch.int64, device=dev)
    # v2: two host buffers and events, so cycle i's copy lands while cycle i-1's is read
    acc_host = [torch.zeros(1, dtype=torch.int64, pin_memory=use_cuda) for _ in range(2)]
    copied = [torch.cuda.Event() if use_cuda else None for _ in range(2)]
    pending: list[int] = []  # cycles whose accept length is on its way to the host
    sched = accept_lengths(args.warmup + args.cycles, args.steps, args.seed)

    if use_cuda:
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(3):
                target(xv if not args.baseline else xd)
                draft_model(xd)
        torch.cuda.current_stream().wait_stream(s)
        torch.cuda.synchronize()
    if graphs:
        if args.baseline:
            gb = torch.cuda.CUDAGraph()
            with torch.cuda.graph(gb):
                target(xd)
            run_b = gb.replay
        else:
            gv, gd = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
            with torch.cuda.graph(gv):
                target(xv)
            with torch.cuda.graph(gd):
                draft_model(xd)
            run_v, run_d = gv.replay, gd.replay
    else:
        run_b = lambda: target(xd)  # noqa: E731
        run_v, run_d = (lambda: target(xv)), (lambda: draft_model(xd))
    if use_cuda:
        torch.cuda.synchronize()
    if world > 1:
        dist.barrier()

    delay_s = args.delay_us / 1e6 if (args.delay_rank == rank and args.delay_us > 0) else 0.0
    host_s = args.host_us / 1e6
    host_wait = time.sleep if args.host_wait == "sleep" else spin
    push, pop, mark = R.push, R.pop, R.mark

    def accept_result(j: int) -> None:
        """Cycle j's result on the host (SGLang v2: after its copy-done event), and the hooks' mark."""
        if copied[j % 2] is not None:
            copied[j % 2].synchronize()
        a = int(acc_host[j % 2].item())  # a CPU tensor: no device sync
        mark("accept", encode_payload(bs, j, bs * (a - 1)))

    def one_cycle(i: int) -> None:
        if args.baseline:
            push("decode_step", cycle_payload(bs, i))
            run_b()
            acc_dev.fill_(1)
            int(acc_dev.item())  # the host reads the sampled token: one sync per step
            pop()
            return
        a = sched[i]
        p_known, p_cycle = cycle_payload(bs, i, a), cycle_payload(bs, i)
        if args.v2:
            p_known = p_cycle  # the accept length stays on the GPU
        push("cycle", p_known)
        push("draft", p_cycle)
        run_d()
        pop()
        if delay_s:
            time.sleep(delay_s)
        push("verify", p_cycle)
        run_v()
        acc_dev.fill_(a)
        pop()
        push("draft_extend", p_known)
        xd.copy_(layer(xv[: bs * a], Wd[0])[:bs])
        pop()
        push("host_overhead")
        if args.v2:
            acc_host[i % 2].copy_(acc_dev, non_blocking=use_cuda)
            if copied[i % 2] is not None:
                copied[i % 2].record()
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
        one_cycle(i)
    while pending:
        accept_result(pending.pop())
    if use_cuda:
        torch.cuda.synchronize()
    if world > 1:
        dist.barrier()
    bracket = use_cuda and args.profiler_api and args.profiler_rank in (None, rank)
    if bracket:
        torch.cuda.cudart().cudaProfilerStart()
    t0 = time.perf_counter()
    for i in range(args.warmup, args.warmup + args.cycles):
        one_cycle(i)
    while pending:  # the last cycle's result
        accept_result(pending.pop())
    if use_cuda:
        torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    if use_cuda and args.exit_mode != "os":
        flush_cupti()  # this rank's events reach the profiler before its window closes
    if bracket:
        torch.cuda.cudart().cudaProfilerStop()
    measured = sched[args.warmup:]
    rec = {
        "rank": rank,
        "world": world,
        "device": torch.cuda.get_device_name(dev) if use_cuda else "cpu",
        "mode": "baseline" if args.baseline else "eagle",
        "graphs": graphs,
        "ranges": bool(args.ranges),
        "cycles": args.cycles,
        "steps": args.steps,
        "layers": args.layers,
        "batch": bs,
        "delay_us": args.delay_us if delay_s else 0,
        "host_wait": args.host_wait,
        "wall_s": wall,
        "cycles_per_s": args.cycles / wall if wall > 0 else None,
        "tokens_per_cycle": (bs if args.baseline else bs * sum(measured) / max(1, len(measured))),
    }
    if args.v2:  # per cycle index: accepted tokens per request, the bonus token included
        rec["accept_lengths"] = dict(zip(range(args.warmup, args.warmup + args.cycles), measured))
    return rec


def _under_torchrun() -> bool:
    return "TORCHELASTIC_RUN_ID" in os.environ or "LOCAL_RANK" in os.environ


def visible_gpus() -> int:
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
    nproc = args.nproc if args.nproc is not None else max(1, visible_gpus())
    if nproc > 1 and not _under_torchrun():
        import subprocess

        env = dict(os.environ)
        env.setdefault("NCCL_NVLS_ENABLE", "0")
        return subprocess.call(torchrun_command(nproc, argv), env=env)
    rec = run(args)
    print(json.dumps(rec), flush=True)
    if rec["world"] > 1:
        end_rank(args.exit_mode)
    return 0


def end_rank(mode: str) -> None:
    """End one rank of several: GPU idle and CUPTI flushed, all ranks done, then NCCL torn down (bounded by
    :data:`TEARDOWN_S`: it can hang) and a normal exit; ``mode='os'``: ``os._exit`` after the barrier."""
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
    watchdog = threading.Timer(TEARDOWN_S, os._exit, (0,))
    watchdog.daemon = True
    watchdog.start()
    dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
