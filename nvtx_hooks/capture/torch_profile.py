"""The workload under ``torch.profiler``: its phases as ``record_function`` spans, one trace per rank; and the scrub of
such traces.

``--torch-profiler DIR`` profiles the measured loop (where ``cudaProfilerStart/Stop`` would bracket it) with
``torch.profiler`` (CPU, and CUDA when the workload runs on the GPU) and writes ``DIR/workload-TP-{rank}.trace.json.gz``
per rank, named as SGLang names its traces. The phases become ``record_function`` spans (:class:`Emitter`):

- spectrace's names (:func:`nvtx_hooks.phases.annotation`: ``spectrace:verify``, the payload in the name), what the
  hooks' ranges are under nsys;
- with ``--native-spans also``, SGLang 0.5.23's own spans beside them, and with ``--native-spans only`` those alone:
  ``draft``; ``step[VERIFY bs=N]``; ``draft_extend`` with ``step[DRAFT bs=N]`` inside it; a prefill's
  ``step[EXTEND bs=N toks=T]`` and ``draft_extend``; a baseline decode step's ``step[DECODE bs=N]`` (no cycle or
  host_overhead span: SGLang has none).

The NVTX ranges (``--ranges``) are emitted as before; they reach nsys only (no NVTX tool is attached under the torch
profiler). :func:`scrub_trace` writes a copy of a trace without what names the machine or its files (``spectrace
scrub`` on a ``.json``/``.json.gz`` trace).
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import json
import os
import zlib
from pathlib import Path
from typing import Any

from .. import phases as ph
from . import chrome_trace

__all__ = ["NATIVE_MODES", "add_arguments", "check", "Emitter", "emitter", "start", "stop", "trace_name", "is_torch_trace",
           "scrub_trace", "find_strings"]

NATIVE_MODES = ("also", "only")
_DROPPED_KEYS = ("traceName", "host_name", "hostname", "trace_id")  # name the machine or a path of it
_DROPPED_CATS = ("python_function",)  # their names are source paths of the machine's Python installation


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The workload's torch profiler options."""
    p.add_argument("--torch-profiler", metavar="DIR", default=None,
                   help="profile the measured loop with torch.profiler instead of bracketing it for nsys: one trace "
                        "per rank, DIR/workload-TP-{rank}.trace.json.gz, the phases as record_function spans")
    p.add_argument("--native-spans", choices=NATIVE_MODES, default=None,
                   help="with --torch-profiler: SGLang 0.5.23's own span names (draft, step[VERIFY bs=N], "
                        "draft_extend) beside spectrace's (also) or instead of them (only)")


def check(args: argparse.Namespace) -> None:
    """ValueError (one line) for torch profiler options that do not go together."""
    if getattr(args, "native_spans", None) and not getattr(args, "torch_profiler", None):
        raise ValueError("--native-spans names record_function spans: it needs --torch-profiler DIR")


def trace_name(rank: int) -> str:
    """A rank's trace file, named as SGLang names them (``…-TP-{rank}.trace.json.gz``)."""
    return f"workload-TP-{rank}.trace.json.gz"


class Emitter:
    """``push``/``pop``/``mark`` as :mod:`nvtx_hooks.ranges` has them, passed on to ``inner`` (the NVTX ranges), and as
    ``record_function`` spans: spectrace's names (``spectrace``) and/or SGLang's (``native``)."""

    def __init__(self, inner: Any, spectrace: bool = True, native: bool = False, prompt_len: int = 128):
        from torch.autograd.profiler import record_function

        self.inner, self.spectrace, self.native, self.prompt_len = inner, spectrace, native, prompt_len
        self._rf = record_function
        self._open: list[list[Any]] = []
        self._batch = 0  # the current cycle's batch size (its payload), for SGLang's step names
        self._new = 0  # the current prefill's new requests

    def _native(self, name: str, payload: int | None) -> list[str]:
        bs = (ph.decode_payload(payload) or {}).get("batch_size", 0) if payload is not None else None
        if name in ("cycle", "decode_step") and bs is not None:
            self._batch = bs
        if name == "prefill" and bs is not None:
            self._new = bs
        if name == "draft":
            return ["draft"]
        if name == "verify":
            return [f"step[VERIFY bs={self._batch}]"]
        if name == "draft_extend":
            return ["draft_extend", f"step[DRAFT bs={self._batch}]"]
        if name == "prefill_target_extend":
            return [f"step[EXTEND bs={self._new} toks={self._new * self.prompt_len}]"]
        if name == "prefill_draft_extend":
            return ["draft_extend", f"step[DRAFT bs={self._new}]"]
        if name == "decode_step":
            return [f"step[DECODE bs={self._batch}]"]
        return []

    @property
    def host(self) -> Any:
        """The inner ranges' ``host`` (the scheduler's ``spectrace.host`` ranges): NVTX only, no span (the reader
        maps the phases, not the scheduler's host ranges)."""
        return self.inner.host

    def push(self, name: str, payload: int | None = None) -> None:
        self.inner.push(name, payload)
        spans = [ph.annotation(name, payload)] if self.spectrace else []
        if self.native:
            spans += self._native(name, payload)
        opened = []
        for s in spans:
            rf = self._rf(s)
            rf.__enter__()
            opened.append(rf)
        self._open.append(opened)

    def pop(self) -> None:
        for rf in reversed(self._open.pop() if self._open else []):
            rf.__exit__(None, None, None)
        self.inner.pop()

    def mark(self, name: str, payload: int | None = None) -> None:
        self.inner.mark(name, payload)
        if self.spectrace:  # an instant: a span that ends where it starts
            rf = self._rf(ph.annotation(name, payload))
            rf.__enter__()
            rf.__exit__(None, None, None)


def emitter(inner: Any, args: argparse.Namespace) -> Any:
    """The workload's ranges: ``inner`` as it is without ``--torch-profiler``, else an :class:`Emitter` over it."""
    if not getattr(args, "torch_profiler", None):
        return inner
    native = getattr(args, "native_spans", None)
    return Emitter(inner, spectrace=native != "only", native=native is not None,
                   prompt_len=getattr(args, "prompt_len", 128))


def start(args: argparse.Namespace, cuda: bool) -> Any:
    """The torch profiler, started (None without ``--torch-profiler``)."""
    if not getattr(args, "torch_profiler", None):
        return None
    import torch

    acts = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if cuda else [])
    prof = torch.profiler.profile(activities=acts, record_shapes=False, with_stack=False)
    prof.start()
    return prof


def stop(prof: Any, args: argparse.Namespace, rank: int) -> str | None:
    """Stop the profiler and write this rank's trace (under a temporary name, renamed into place); its path."""
    if prof is None:
        return None
    prof.stop()
    out = Path(args.torch_profiler)
    out.mkdir(parents=True, exist_ok=True)
    final = out / trace_name(rank)
    tmp = out / f".{final.name[: -len('.json.gz')]}.tmp-{os.getpid()}.json.gz"
    try:
        prof.export_chrome_trace(str(tmp))  # (gzipped by its .gz suffix)
        os.replace(tmp, final)
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink()
    return str(final)


# ---- scrub -----------------------------------------------------------------------------------------------------


def is_torch_trace(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a file whose (gunzipped) text is a JSON object or array (a torch profiler trace)."""
    p = Path(path)
    if not p.is_file():
        return False
    try:
        with chrome_trace.opened(p) as f:
            head = f.read(chrome_trace.SNIFF)
    except (OSError, EOFError, zlib.error):
        return False
    return head.lstrip()[:1] in (b"{", b"[")


def scrub_trace(src: str | os.PathLike, dst: str | os.PathLike) -> dict:
    """Write ``dst`` (gzip when it ends in ``.gz``): the trace ``src`` without its top-level keys that name the
    machine or a path (``traceName``, ``host_name``, ``trace_id``) and without ``python_function`` events (their
    names are the machine's source paths), streamed (bounded memory). Returns counts of what was removed. The
    caller makes ``dst`` a new file (:func:`nvtx_hooks.capture.files.new_file`)."""
    src, dst = Path(src), Path(dst)
    dropped = 0
    out = gzip.open(dst, "wt", encoding="utf-8", compresslevel=6) if dst.name.endswith(".gz") else dst.open(
        "w", encoding="utf-8")

    def copy(events) -> None:
        nonlocal dropped
        first = True
        for e in events:
            if isinstance(e, dict) and e.get("cat") in _DROPPED_CATS:
                dropped += 1
                continue
            out.write(("" if first else ",\n") + json.dumps(e))
            first = False

    with out:
        out.write('{"traceEvents": [\n')
        meta = chrome_trace.read(src, copy)
        out.write("\n]")
        keys = [k for k in _DROPPED_KEYS if meta.pop(k, None) is not None]
        for k, v in meta.items():
            out.write(f",\n{json.dumps(k)}: {json.dumps(v)}")
        out.write("}\n")
    return {"keys_removed": len(keys), "events_removed": dropped}


def find_strings(path: str | os.PathLike, needles: list[str]) -> dict[str, list[str]]:
    """Where each needle still occurs in a trace's text: ``{needle: ["trace"]}``."""
    hits: dict[str, list[str]] = {}
    with chrome_trace.opened(Path(path)) as f:
        text = f.read()
    for n in needles:
        if n.encode() in text:
            hits.setdefault(n, []).append("trace")
    return hits
