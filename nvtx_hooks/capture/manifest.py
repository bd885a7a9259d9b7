"""NAME.manifest.json: what was captured, how, and on what (written beside each report)."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
from collections.abc import Mapping
from datetime import datetime, timezone
from pathlib import Path

__all__ = ["SCHEMA", "utc_now", "speculative_config", "sglang_version", "nccl_env", "build", "write"]

SCHEMA = "spectrace.trace-manifest/1"

# command-line flag -> manifest key; SGLang's spellings first, then the embedded workload's
_SPEC_FLAGS: dict[str, str] = {
    "--tp": "tp",
    "--tp-size": "tp",
    "--tensor-parallel-size": "tp",
    "--speculative-algorithm": "algorithm",
    "--speculative-num-steps": "steps",
    "--speculative-eagle-topk": "topk",
    "--speculative-num-draft-tokens": "draft_tokens",
    "--model-path": "model",
    "--speculative-draft-model-path": "draft_model",
    "--speculative-draft-model": "draft_model",
}


# The embedded workload's module, now and before it moved under nvtx_hooks.capture (older manifests).
_WORKLOAD_MODULES = ("nvtx_hooks.capture.workload", "nvtx_hooks.workload")


def utc_now() -> str:
    """The current UTC time, ISO 8601 to the second."""
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _flag_values(command: list[str], table: dict[str, str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for i, tok in enumerate(command):
        name, eq, val = tok.partition("=")
        if name in table:
            if eq:
                out[table[name]] = val
            elif i + 1 < len(command):
                out[table[name]] = command[i + 1]
    return out


def _num(v: str) -> int | str:
    try:
        return int(v)
    except (TypeError, ValueError):
        return v


def _workload_settings(argv: list[str]) -> dict:
    """The embedded workload's settings from its options (none when it would refuse them, e.g. a bad
    ``--schedule``)."""
    from .workload import build_parser, check, parse_schedule, segments_of

    try:
        wl, _ = build_parser(argparse.ArgumentParser(add_help=False, exit_on_error=False)).parse_known_args(argv)
        check(wl)
    except (argparse.ArgumentError, SystemExit, ValueError):
        return {}
    cfg = dict(steps=wl.steps, layers=wl.layers, batch=wl.batch, cycles=wl.cycles, graphs=wl.graphs,
               baseline=wl.baseline, ranges=wl.ranges, v2=wl.v2)
    if wl.schedule:  # no single batch size: [[batch size, cycles], ...] per segment instead
        segments = parse_schedule(wl.schedule)
        cfg.update(batch=None, cycles=sum(c for _, c in segments), schedule=[list(s) for s in segments],
                   prompt_len=wl.prompt_len)
    if wl.adaptive:  # no single step count either: [[batch size, steps, cycles], ...] per segment
        segs = segments_of(wl)
        cfg.update(batch=None, steps=None, cycles=sum(s.cycles for s in segs),
                   schedule=[[s.batch, s.cycles] for s in segs], adaptive=[[s.batch, s.steps, s.cycles] for s in segs],
                   prompt_len=wl.prompt_len, zero_step_draft_extend=wl.zero_step_draft_extend)
    if wl.nproc is not None:
        cfg["tp"] = wl.nproc
    if wl.delay_us:
        cfg.update(delay_rank=wl.delay_rank, delay_us=wl.delay_us, delay_every=wl.delay_every,
                   delay_offset=wl.delay_offset, delay_before=wl.delay_before)
    if getattr(wl, "accept_rate", None) is not None:
        cfg["accept_rate"] = wl.accept_rate
    if wl.accept_profile:
        cfg["accept_profile"] = [float(x) for x in wl.accept_profile.split(",")]
    if wl.stall_us:
        cfg.update(stall_every=wl.stall_every, stall_us=wl.stall_us)
    if wl.scheduler:
        from .plan import DEFAULT_SCHEDULER_US, parse_scheduler_us

        us = parse_scheduler_us(wl.scheduler_us) if wl.scheduler_us else dict(DEFAULT_SCHEDULER_US)
        cfg["scheduler"] = {"ranges": wl.scheduler_ranges, "overlap": wl.overlap, "us": us, "busy_us": wl.busy_us}
    if wl.extra:
        cfg["extra"] = list(wl.extra)
    return cfg


def speculative_config(command: list[str]) -> dict:
    """Speculative-decoding settings read off the profiled command line (SGLang or the workload)."""
    cfg: dict = {k: _num(v) for k, v in _flag_values(command, _SPEC_FLAGS).items()}
    at = [i for i, t in enumerate(command) if t.endswith(_WORKLOAD_MODULES) or t == "demo-workload"]
    if at:
        cfg["workload"] = "nvtx_hooks.capture.workload"
        cfg.update(_workload_settings(command[at[0] + 1:]))
        cfg.setdefault("algorithm", "none" if cfg.get("baseline") else "eagle-shaped")
    elif ("model" in cfg or any("sglang" in t for t in command)) and "algorithm" not in cfg:
        cfg["algorithm"] = "none"
    return cfg


def sglang_version() -> str | None:
    """The installed SGLang's version, or None (never imports SGLang)."""
    try:
        from importlib.metadata import PackageNotFoundError, version
    except ImportError:  # pragma: no cover
        return None
    try:
        return version("sglang")
    except PackageNotFoundError:
        return None


def _gpu_names() -> list[str] | None:
    """GPU names from nvidia-smi, or None where it is absent or fails."""
    smi = shutil.which("nvidia-smi")
    if not smi:
        return None
    try:
        out = subprocess.run([smi, "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=20, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return [ln.strip() for ln in out.splitlines() if ln.strip()]


def nccl_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The NCCL_* variables the profiled command ran with."""
    environ: Mapping[str, str] = os.environ if env is None else env
    return {k: v for k, v in sorted(environ.items()) if k.startswith("NCCL_")}


def build(*, name: str, command: list[str], nsys_path: str, nsys_version: str | None,
          profile_cmd: list[str], env_added: dict[str, str], env: dict[str, str], started: str,
          ended: str, wall_s: float, exit_code: int | None, interrupted: bool,
          outputs: list[Path]) -> dict:
    """The manifest record for one capture."""
    return {
        "schema": SCHEMA,
        "name": name,
        "command": command,
        "nsys": {"path": nsys_path, "version": nsys_version, "profile_command": profile_cmd},
        "env_added": env_added,
        "nccl_env": nccl_env(env),
        "sglang_version": sglang_version(),
        "speculative": speculative_config(command),
        "gpus": _gpu_names(),
        "started_utc": started,
        "ended_utc": ended,
        "wall_s": round(wall_s, 3),
        "exit_code": exit_code,
        "interrupted": interrupted,
        "outputs": {p.name: p.stat().st_size for p in outputs if p.exists()},
    }


def write(path: Path, record: dict, replace: bool = False) -> Path:
    """Write the manifest as indented JSON (UTF-8), a new file (:func:`nvtx_hooks.capture.files.write_new`: a
    temporary name renamed into place, a regular file); an existing one is replaced only with ``replace``
    (``--force``); returns its path. CaptureError when it cannot be written."""
    from . import CaptureError
    from .files import OutputError, utf8, write_new

    try:
        write_new(path, utf8(json.dumps(record, indent=2) + "\n"), option="the manifest", what="the manifest",
                  replace=replace)
    except OutputError as e:
        raise CaptureError(str(e)) from None
    return path
