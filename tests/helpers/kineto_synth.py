"""Hand-made torch profiler traces (Kineto's Chrome trace-event JSON) with GPU events, numbers known by construction.

Every rank runs the same EAGLE cycles, one every :data:`PERIOD` µs, on its own device; per cycle (times in µs from
the cycle's start ``c``), with the launching CUDA call of each GPU operation inside its phase:

=============  ===============  ==========================================================  ===================
phase          CPU span          GPU operations (launch → run)                               GPU time per cycle
=============  ===============  ==========================================================  ===================
draft          c+10 … c+110     cudaGraphLaunch c+20 → draft_gemm c+50…c+150, NCCL           120 µs
                                all-reduce c+150…c+170 (same correlation id)
verify         c+120 … c+300    cudaLaunchKernel c+130 → verify_gemm c+200…c+500;            330 µs
                                c+140 → custom all-reduce c+500…c+530
draft_extend   c+310 … c+400    c+320 → extend kernel c+540…c+600; cudaMemcpyAsync c+330 →   67 µs
                                DtoH c+600…c+605; cudaMemsetAsync c+340 → memset c+605…c+607
host_overhead  c+400 … c+600    none                                                        0
=============  ===============  ==========================================================  ===================

``names="spectrace"``: the hooks' ``record_function`` names (:func:`nvtx_hooks.phases.annotation`, with the cycle's
payload); ``"native"``: SGLang 0.5.23's spans only (``draft``; ``step[VERIFY bs=N]`` c+125…c+295; ``draft_extend``
with ``step[DRAFT bs=N]`` inside it). Noise a real trace has: ``cpu_op`` and ``python_function`` events, ``ac2g``
flows, metadata events, ``gpu_user_annotation`` spans, the profiler's ``Trace`` span.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from nvtx_hooks import phases as ph

__all__ = ["PERIOD", "BASE_NS", "GPU_US", "rank_trace", "merged_trace", "write"]

PERIOD = 1000  # µs from one cycle's start to the next
BASE_NS = 1_790_857_026_000_000_000  # Kineto's baseTimeNanoseconds (a Unix time)
T0 = 2_000_000.0  # µs after the base: the first cycle's start
GPU_US = {"draft": 120, "verify": 330, "draft_extend": 67}  # GPU busy time per cycle and phase
_PID = 4000  # rank r's process id: _PID + r


def _x(cat: str, name: str, pid, tid, ts: float, dur: float, **args) -> dict:
    e = {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": round(ts, 3), "dur": round(dur, 3)}
    if args:
        e["args"] = args
    return e


def rank_trace(rank: int, cycles: int = 20, batch: int = 4, names: str = "spectrace", world: int = 2,
               shift_us: float = 0.0) -> dict:
    """Rank ``rank``'s trace (a dict as Kineto writes it). ``shift_us``: every event of this rank later by that."""
    pid, dev, ev = _PID + rank, rank, []
    ext, corr = 1, 1
    ev += [{"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "ts": T0, "args": {"name": "python3"}},
           {"ph": "M", "name": "thread_name", "pid": pid, "tid": pid, "ts": T0, "args": {"name": f"thread {pid}"}},
           {"ph": "M", "name": "process_name", "pid": dev, "tid": 0, "ts": T0, "args": {"name": "python3"}}]

    def ann(name: str, a: float, b: float) -> None:
        nonlocal ext
        ev.append(_x("user_annotation", name, pid, pid, a, b - a, **{"External id": ext, "Record function id": 0}))
        ext += 1

    def launch(api: str, at: float, ops: list[tuple[str, str, float, float, dict]]) -> None:
        """A CUDA call at ``at`` (10 µs) and the GPU operations it launched: (category, name, start, end, args)."""
        nonlocal ext, corr
        ev.append(_x("cpu_op", "aten::mm", pid, pid, at - 2, 14, **{"External id": ext}))
        ev.append(_x("python_function", "torch/nn/modules/module.py(1750): _call_impl", pid, pid, at - 3, 16,
                     **{"Python id": ext}))
        ev.append(_x("cuda_runtime", api, pid, pid, at, 10, **{"External id": ext, "cbid": 211, "correlation": corr}))
        ev.append({"ph": "s", "id": corr, "pid": pid, "tid": pid, "ts": at, "cat": "ac2g", "name": "ac2g"})
        for cat, name, a, b, extra in ops:
            ev.append(_x(cat, name, dev, 7, a, b - a, **{"External id": ext, "device": dev, "context": 1,
                                                          "stream": 7, "correlation": corr, **extra}))
        ev.append({"ph": "f", "id": corr, "pid": dev, "tid": 7, "ts": ops[0][2], "cat": "ac2g", "name": "ac2g",
                   "bp": "e"})
        ext += 1
        corr += 1

    k = {"grid": [1, 1, 1], "block": [128, 1, 1], "registers per thread": 32}
    for i in range(cycles):
        c = T0 + i * PERIOD + shift_us
        payload = ph.encode_payload(batch, i + 1)
        if names == "spectrace":
            ann(ph.annotation("cycle", payload), c, c + 600)
            ann(ph.annotation("draft"), c + 10, c + 110)
            ann(ph.annotation("verify", payload), c + 120, c + 300)
            ann(ph.annotation("draft_extend", payload), c + 310, c + 400)
            ann(ph.annotation("host_overhead"), c + 400, c + 600)
        else:
            ann("draft", c + 10, c + 110)
            ann(f"step[VERIFY bs={batch}]", c + 125, c + 295)
            ann("draft_extend", c + 310, c + 400)
            ann(f"step[DRAFT bs={batch}]", c + 315, c + 395)
        launch("cudaGraphLaunch", c + 20, [("kernel", "draft_gemm_kernel", c + 50, c + 150, k),
                                            ("kernel", "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgs)",
                                             c + 150, c + 170, k)])
        launch("cudaLaunchKernel", c + 130, [("kernel", "verify_gemm_kernel", c + 200, c + 500, k)])
        launch("cudaLaunchKernel", c + 140, [("kernel", "void cross_device_reduce_1stage<__nv_bfloat16, 2>(...)",
                                              c + 500, c + 530, k)])
        launch("cudaLaunchKernel", c + 320, [("kernel", "extend_kernel", c + 540, c + 600, k)])
        launch("cudaMemcpyAsync", c + 330, [("gpu_memcpy", "Memcpy DtoH (Device -> Pinned)", c + 600, c + 605,
                                             {"bytes": 64})])
        launch("cudaMemsetAsync", c + 340, [("gpu_memset", "Memset (Device)", c + 605, c + 607, {"bytes": 64})])
        ev.append(_x("gpu_user_annotation", "draft", dev, 7, c + 49, 122))
    end = T0 + cycles * PERIOD + shift_us + 100
    ev.append(_x("Trace", "PyTorch Profiler (0)", "Spans", "PyTorch Profiler", T0 - 100, end - T0 + 100,
                 **{"Op count": 0}))
    ev.append({"ph": "i", "s": "g", "name": "Record Window End", "pid": "", "tid": "", "ts": end})
    return {"schemaVersion": 1, "deviceProperties": [{"id": dev, "name": "NVIDIA H200", "totalGlobalMem": 1}],
            "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": world},
            "host_name": "node0", "displayTimeUnit": "ms", "baseTimeNanoseconds": BASE_NS,
            "traceEvents": ev, "traceName": f"/home/someone/run/prof-TP-{rank}.trace.json"}


def merged_trace(traces: list[dict]) -> dict:
    """SGLang's merged file of per-rank traces (``ProfileMerger``): events first, each pid labelled ``[TPnn] pid``,
    the other keys of the first trace after them, every rank's deviceProperties."""
    out: dict = {"traceEvents": []}
    props = []
    for r, t in enumerate(traces):
        for e in t["traceEvents"]:
            out["traceEvents"].append({**e, "pid": f"[TP{r:02d}] {e['pid']}"})
        props += t.get("deviceProperties", [])
        for k, v in t.items():
            if k not in ("traceEvents", "deviceProperties") and k not in out:
                out[k] = v
    out["deviceProperties"] = props
    return out


def write(path: Path, trace: dict, pretty: bool = False) -> Path:
    """Write ``trace`` as JSON (gzip when the name ends in ``.gz``; Kineto's indented layout with ``pretty``)."""
    text = json.dumps(trace, indent=2 if pretty else None).encode()
    if path.name.endswith(".gz"):
        path.write_bytes(gzip.compress(text, compresslevel=1))
    else:
        path.write_bytes(text)
    return path
