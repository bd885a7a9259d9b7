"""Hand-computable synthetic EAGLE and baseline exports (built on tests/helpers/synth.py) for report/compare/what-if
tests.

EAGLE trace (``eagle``): 2 ranks (pid 100 → device 0 → rank 0, pid 200 → device 1 → rank 1), 4 cycles,
batch 2, 3 draft steps (manifest), cycle ``i`` at ``B = 10_000 + 10_000 i``; GPU ops (ns from B):

- draft: gemm [1000, 1600] then NCCL [1600, 1600 + w], w = 500 on rank 0, 100 on rank 1
  → span 1100 (rank 0) / 700 (rank 1);
- verify: gemm [2500, 5500] → 3000;
- draft_extend: gemm [5600, 5600 + E], E = 100 + 25 · tokens, tokens = accept + batch, accept
  (payload, summed over the batch) = 0, 2, 4, 6 → tokens 2, 4, 6, 8 → E = 150, 200, 250, 300;
- host_overhead: gemm [7000, 7100] → 100.

So the cycle period (first GPU op → next cycle's first) is 10 000 on both ranks.

Variants (defaults give the trace above): ``cycles=N`` runs N cycles, accept lengths repeating ``accept``
(default ``ACCEPT``: cycle i has ``ACCEPT[i % 4]``); ``starts=[B_0, B_1, ...]`` puts the cycles there instead (periods =
differences); ``verify_comm=c`` makes verify a gemm [2500, 5000] then an NCCL all-reduce [5000, 5000 + c]
on both ranks (c ≤ 500: verify span 2500 + c, compute 2500, comm c, no wait); ``prefills=[P, ...]`` adds a
top-level ``prefill`` range [P, P + 300] per rank, its gemm on the GPU [P + 100, P + 600] (put P between a cycle's
range end B + 9500 and the next cycle's B' − 600); ``straggler=d`` (d ≤ 700) makes
rank 1 late to draft's all-reduce: its gemm runs [1000, 1600 + d], both ranks' all-reduces end at 1700 + d
(rank 0 [1600, 1700 + d]: waits d, transfers 100; rank 1 [1600 + d, 1700 + d]).

Baseline trace (``baseline``): same ranks, 4 ``decode_step`` ranges at ``B = 10_000 + 3_000 i``, one gemm
[B + 500, B + 2000] → 1500 each, payload batch 2 (or none, with a manifest saying batch 2).
"""

from __future__ import annotations

import json
from pathlib import Path

from nvtx_hooks.phases import encode_payload

from .synth import Synth

NCCL = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<(unsigned long)4096>)"
RANKS = ((100, 0, 500), (200, 1, 100))  # pid, device, draft NCCL length
ACCEPT = (0, 2, 4, 6)
BATCH = 2


def _manifest(path: Path, spec: dict) -> None:
    name = path.name[: -len(".sqlite")]
    path.with_name(name + ".manifest.json").write_text(json.dumps({"schema": "spectrace.trace-manifest/1",
                                                                   "speculative": spec}))


def eagle(path, steps: int | None = 3, prefix: str = "", accept_on: str = "cycle",
          manifest: bool = True, cycles: int = 4, starts: list[int] | None = None,
          verify_comm: int | None = None, straggler: int | None = None, accept: tuple = ACCEPT,
          prefills: tuple[int, ...] = ()) -> Path:
    """The EAGLE trace; ``accept_on='draft_extend'`` puts the accept length there (SGLang v1 style);
    ``accept_on='mark'`` in an ``accept`` mark instead (SGLang v2 via the hooks): cycle i's mark after cycle
    i+1's range closed (the overlap scheduler), the last one right after its own cycle."""
    path = Path(path)
    starts = starts or [10_000 + 10_000 * i for i in range(cycles)]
    s = Synth(path, duration=max(100_000, starts[-1] + 60_000))
    corr = 0
    verify = ([(2500, 5500, "gemm")] if verify_comm is None
              else [(2500, 5000, "gemm"), (5000, 5000 + verify_comm, NCCL)])
    for pid, dev, w in RANKS:
        s.device(dev)
        s.domain(pid, pid, "spectrace", 1)
        for i, b in enumerate(starts):
            acc = accept[i % len(accept)]
            tokens = acc + BATCH
            known, bare = encode_payload(BATCH, i, acc), encode_payload(BATCH, i)
            s.range(pid, pid, prefix + "cycle", b, b + 9500, domain_id=1,
                    payload=known if accept_on == "cycle" else bare)
            s.range(pid, pid, prefix + "draft", b + 100, b + 1000, domain_id=1, payload=bare)
            s.range(pid, pid, prefix + "verify", b + 1000, b + 2000, domain_id=1, payload=bare)
            s.range(pid, pid, prefix + "draft_extend", b + 2000, b + 3000, domain_id=1,
                    payload=known if accept_on == "draft_extend" else bare)
            s.range(pid, pid, prefix + "host_overhead", b + 3000, b + 9000, domain_id=1)
            if accept_on == "mark":
                t = (starts[i + 1] if i + 1 < len(starts) else b) + 9700
                s.range(pid, pid, "accept", t, None, domain_id=1, event_type=34, payload=known)
            e = 100 + 25 * tokens
            draft = [(b + 1000, b + 1600, "gemm"), (b + 1600, b + 1600 + w, NCCL)]
            if straggler is not None:
                d = straggler if pid == RANKS[1][0] else 0
                draft = [(b + 1000, b + 1600 + d, "gemm"), (b + 1600 + d, b + 1700 + straggler, NCCL)]
            for api, ops in ((b + 200, draft),
                             (b + 1100, [(b + x, b + y, k) for x, y, k in verify]),
                             (b + 2100, [(b + 5600, b + 5600 + e, "gemm")]),
                             (b + 3100, [(b + 7000, b + 7100, "gemm")])):
                corr += 1
                s.launch(pid, pid, "cudaLaunchKernel_v7000", (api, api + 50), corr, ops, device=dev)
        for p in prefills:
            s.range(pid, pid, prefix + "prefill", p, p + 300, domain_id=1)
            corr += 1
            s.launch(pid, pid, "cudaLaunchKernel_v7000", (p + 50, p + 100), corr, [(p + 100, p + 600, "gemm")],
                     device=dev)
    out = s.save()
    if manifest:
        _manifest(out, {"algorithm": "eagle-shaped", "steps": steps, "batch": BATCH})
    return out


def baseline(path, payload: bool = True, manifest: bool = False) -> Path:
    """The baseline trace: 4 decode steps of 1500 ns GPU span, period 3000 ns, 2 tokens each."""
    path = Path(path)
    s = Synth(path, duration=100_000)
    corr = 0
    for pid, dev, _ in RANKS:
        s.device(dev)
        s.domain(pid, pid, "spectrace", 1)
        for i in range(4):
            b = 10_000 + 3_000 * i
            s.range(pid, pid, "decode_step", b, b + 2500, domain_id=1,
                    payload=encode_payload(BATCH, i) if payload else None)
            corr += 1
            s.launch(pid, pid, "cudaLaunchKernel_v7000", (b + 100, b + 150), corr, [(b + 500, b + 2000, "gemm")],
                     device=dev)
    out = s.save()
    if manifest:
        _manifest(out, {"algorithm": "none", "baseline": True, "batch": BATCH})
    return out


def chained(path, mode: str = "Node", cycles: int = 5, steps: int = 3) -> Path:
    """One rank whose host waits for the GPU every cycle (the embedded workload's shape), at ``steps`` draft
    steps, traced with node-level (``mode="Node"``) or graph-level (``"Graph"``) CUDA-graph tracing.

    Per cycle, ns from its base B (B += period):

    - draft: cudaGraphLaunch [0, 20] → 3 nodes of 100 ns (one graph row in Graph mode) [25, 325];
    - verify: cudaGraphLaunch [30, 30 + Lv] → 10 nodes of 100 ns (the 6th an all-reduce); Node: Lv = 400 (node tracing's
      launch cost: the call returns 105 ns after draft ended, the verify GPU starts at 435); Graph: Lv = 20,
      queued, the verify GPU starts at 330 (5 ns after draft);
    - draft_extend: cudaLaunchKernel [x, x + 10] with x = Lv + 40 → op of 100 ns, 5 ns after verify;
    - host_overhead: cudaMemcpyAsync [x + 20, x + 30] → DtoH copy of 5 ns, 5 ns after draft_extend;
      cudaStreamSynchronize [x + 40, copy end + 10]; then 440 ns of host work before the next cycle.

    Period: Node 2000 (copy ends at 1550), Graph 1895 (copy ends at 1445). Draft runs ``100 · steps`` ns.
    """
    path = Path(path)
    s = Synth(path, duration=10_000_000, mode=mode)
    s.device(0)
    s.domain(1, 1, "spectrace", 1)
    lv = 400 if mode == "Node" else 20
    d = 100 * steps
    b, corr = 1000, 0

    def graph_launch(t0, t1, op0, nodes):
        nonlocal corr
        corr += 1
        if mode == "Node":  # verify's 6th node is an all-reduce: 100 of its 1000 ns are communication
            s.launch(1, 1, "cudaGraphLaunch_v10000", (t0, t1), corr,
                     [(op0 + 100 * i, op0 + 100 * (i + 1), NCCL if (nodes, i) == (10, 5) else "gemm")
                      for i in range(nodes)])
        else:
            s.api(1, 1, "cudaGraphLaunch_v10000", t0, t1, corr)
            s.graph(1, 0, 7, corr, op0, op0 + 100 * nodes, graph_id=nodes)

    for i in range(cycles):
        v0 = max(30 + lv + 5, 25 + d + 5)
        x = 30 + lv + 10
        e0 = v0 + 1000 + 5
        m0 = e0 + 100 + 5
        sync_end = m0 + 5 + 10
        s.range(1, 1, "cycle", b - 5, b + sync_end + 430, domain_id=1, payload=encode_payload(2, i))
        s.range(1, 1, "draft", b - 2, b + 22, domain_id=1)
        graph_launch(b, b + 20, b + 25, steps)
        s.range(1, 1, "verify", b + 28, b + 30 + lv + 2, domain_id=1)
        graph_launch(b + 30, b + 30 + lv, b + v0, 10)
        s.range(1, 1, "draft_extend", b + x - 2, b + x + 12, domain_id=1)
        corr += 1
        s.launch(1, 1, "cudaLaunchKernel_v7000", (b + x, b + x + 10), corr, [(b + e0, b + e0 + 100, "gemm")])
        s.range(1, 1, "host_overhead", b + x + 18, b + sync_end + 420, domain_id=1)
        corr += 1
        s.api(1, 1, "cudaMemcpyAsync_v3020", b + x + 20, b + x + 30, corr)
        s.memcpy(1, 0, 7, corr, b + m0, b + m0 + 5, kind=2)
        corr += 1
        s.api(1, 1, "cudaStreamSynchronize_v3020", b + x + 40, b + sync_end, corr)
        b += sync_end + 440
    out = s.save()
    _manifest(out, {"algorithm": "eagle-shaped", "steps": steps, "batch": BATCH})
    return out
