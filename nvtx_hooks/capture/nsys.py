"""``spectrace trace``: run a command under nsys with the settings spectrace needs, then export SQLite.

Defaults: ``-t cuda,nvtx --cuda-graph-trace=node --trace-fork-before-exec=true -s none
--cpuctxsw=none``, capture window = the program's cudaProfilerStart/Stop range
(``--capture all`` for the whole run, ``--delay``/``--duration`` for a timed window),
``SPECTRACE_HOOKS=1`` in the environment. Writes NAME.nsys-rep, NAME.sqlite and
NAME.manifest.json (and NAME_<report>.csv with ``--stats``). ``--cpu-sampling`` adds CPU sampling with
backtraces (``CPU_SAMPLING``; the manifest's ``cpu_sampling`` says what was asked). ``--passes graph,node[,plain]`` runs the
command once per pass: graph- and node-level CUDA-graph tracing (NAME_graph.*, NAME_node.*) and, for
``plain``, without any profiler (NAME_plain.manifest.json); the JSON-object lines the program prints
(e.g. the embedded workload's cycles/s) are kept in each manifest. Each export is checked: one line per
rank with its cycles with GPU work and any lost GPU tail (``--strict``: exit 3 when one is lost, or the
export has no GPU rows). Also runs ``spectrace demo-workload``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import shlex
import shutil
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from types import FrameType
from typing import IO

from . import CaptureError, complete
from . import manifest as mf
from .bounds import number, shell_words
from .files import OutputError, check_file

__all__ = ["COLUMNAR_NSYS", "CPU_SAMPLING", "PYTHON_SAMPLING", "find_nsys", "parse_version", "nsys_version", "NSYS_ANSWER_S",
           "profile_switches", "output_base", "outputs", "env_added", "trace", "add_trace_arguments",
           "demo_workload"]

_MIN_NSYS = (2024, 2)  # DIAGNOSTIC_EVENT, GRAPH_TRACE and CUDA_GRAPH_NODE_EVENTS exist from here on
_STATS_REPORTS = ("nvtx_gpu_proj_sum", "nvtx_sum")
_HOOKS_ENV = {"SPECTRACE_HOOKS": "1"}
_COLUMNAR = {"parquetdir": "_pqtdir", "arrowdir": "_arwdir"}  # --columnar: the folder nsys names for -o NAME
COLUMNAR_NSYS = (2023, 4)  # nsys export --type parquetdir/arrowdir exist from here on (docs/nsys-sqlite.md)
_PASSES = ("graph", "node", "plain")  # --passes: CUDA-graph trace level, or no profiler at all
# JSON-object lines of the program's output kept in the manifest (the workload's record states its injected truth
# per cycle: a few 10 kB for a few hundred cycles)
_MAX_RECORDS, _MAX_RECORD_BYTES = 64, 1 << 20
# --cpu-sampling: CPU IP sampling of the process tree with native backtraces, a backtrace at every CUDA API call
# (``--cudabacktrace`` needs CPU sampling on) and the Python backtrace there (``--python-backtrace``, nsys 2024.2 on,
# where spectrace's nsys floor is). The nsys user guides of 2024.2 and 2025.3 list all three switches with these
# values; spectrace checks them in this nsys's ``profile --help`` before a run.
CPU_SAMPLING = ("--sample=process-tree", "--cudabacktrace=all", "--python-backtrace=cuda")
# Python frames in the CPU samples themselves (the sampled function's name, not only the interpreter's C frames):
# added when this nsys's ``profile --help`` lists the switch (not every version has it; not verified on a capture).
PYTHON_SAMPLING = "--python-sampling=true"


def find_nsys(explicit: str | None = None, env: Mapping[str, str] | None = None) -> str:
    """The nsys executable: ``--nsys``, else ``$NSYS``, else ``nsys`` on PATH; CaptureError if none."""
    environ: Mapping[str, str] = os.environ if env is None else env
    for cand, origin in ((explicit, "--nsys"), (environ.get("NSYS"), "NSYS")):
        if cand:
            p = shutil.which(cand) or (cand if os.path.isfile(cand) and os.access(cand, os.X_OK) else None)
            if not p:
                raise CaptureError(f"nsys not found at {cand!r} (from {origin}): give the path of an nsys executable")
            return p
    p = shutil.which("nsys", path=environ.get("PATH"))
    if not p:
        raise CaptureError("nsys not found: put Nsight Systems' nsys on PATH, or pass --nsys PATH or set NSYS=PATH")
    return p


NSYS_ANSWER_S = 20  # how long ``nsys --version`` and ``nsys profile --help`` may take (they answer in < 1 s)


def parse_version(text: str) -> tuple[int, ...] | None:
    """``(2025, 3, 1, 90)`` from ``nsys --version`` output, or None."""
    m = re.search(r"(\d{4})\.(\d+)(?:\.(\d+))?(?:\.(\d+))?", text)
    if not m:
        return None
    return tuple(int(g) for g in m.groups() if g is not None)


def nsys_version(nsys: str) -> str:
    """The version string of this nsys; CaptureError if it cannot run or is older than MIN_NSYS."""
    try:
        out = subprocess.run([nsys, "--version"], capture_output=True, text=True, timeout=NSYS_ANSWER_S)
    except subprocess.TimeoutExpired:
        raise CaptureError(f"{nsys} --version did not answer within {NSYS_ANSWER_S} s (a stuck nsys, or not "
                           "nsys): check it, or pass --nsys PATH") from None
    except OSError as e:
        raise CaptureError(f"cannot run {nsys}: {e}") from e
    text = (out.stdout or "") + (out.stderr or "")
    ver = parse_version(text)
    if out.returncode != 0 or ver is None:
        raise CaptureError(f"{nsys} --version failed or printed no version: {text.strip()[:200]!r}")
    if ver[:2] < _MIN_NSYS:
        need = ".".join(map(str, _MIN_NSYS))
        raise CaptureError(f"nsys {'.'.join(map(str, ver))} is too old: spectrace needs nsys >= {need}")
    return ".".join(map(str, ver))


def output_base(name: str) -> Path:
    """NAME without a report suffix (``x.nsys-rep``/``x.sqlite`` → ``x``); CaptureError when it names no file (empty,
    ``.``, ``..``, ``/``, or ending in ``/``: the outputs would be hidden files like ``.nsys-rep`` or land nowhere)."""
    base = name
    for suf in (".nsys-rep", ".sqlite", ".qdstrm", ".manifest.json"):
        if name.endswith(suf):
            base = name[: -len(suf)]
            break
    if not base.strip() or base.endswith(("/", os.sep)) or Path(base).name in ("", ".", ".."):
        raise CaptureError(f"-o {name!r} names no file: give a report name, e.g. -o runs/NAME (writes "
                           "runs/NAME.nsys-rep, NAME.sqlite and NAME.manifest.json)")
    return Path(base)


def outputs(base: Path, stats: bool, columnar: str | None = None) -> dict[str, Path]:
    """The files a capture named ``base`` writes (``columnar``: also that export's folder, ``NAME_pqtdir``)."""
    out = {
        "report": base.with_name(base.name + ".nsys-rep"),
        "sqlite": base.with_name(base.name + ".sqlite"),
    }
    if columnar:
        out["columnar"] = base.with_name(base.name + _COLUMNAR[columnar])
    out["manifest"] = base.with_name(base.name + ".manifest.json")
    if stats:
        for r in _STATS_REPORTS:
            out[r] = base.with_name(f"{base.name}_{r}.csv")
    return out


def profile_switches(nsys: str) -> set[str]:
    """The switches this nsys's ``profile --help`` lists (``--sample``, …); empty when it prints none."""
    try:
        out = subprocess.run([nsys, "profile", "--help"], capture_output=True, text=True, timeout=NSYS_ANSWER_S)
    except (OSError, subprocess.SubprocessError):
        return set()
    return set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", (out.stdout or "") + (out.stderr or "")))


def _cpu_sampling(a: argparse.Namespace, switches: set[str] | None) -> list[str]:
    """The options ``--cpu-sampling`` adds ([] without it): ``CPU_SAMPLING``, and ``PYTHON_SAMPLING`` where
    ``switches`` (this nsys's, None: unknown, a dry run) lists it; CaptureError if this nsys lacks a required one."""
    if not getattr(a, "cpu_sampling", False):
        return []
    if a.sample not in ("none", "process-tree"):
        raise CaptureError(f"--cpu-sampling samples the process tree: it cannot be combined with --sample {a.sample}")
    if switches:
        missing = [o.split("=")[0] for o in CPU_SAMPLING if o.split("=")[0] not in switches]
        if missing:
            raise CaptureError(f"this nsys has no {', '.join(missing)} (nsys profile --help): --cpu-sampling needs "
                               "nsys >= 2024.2")
    return list(CPU_SAMPLING) + ([PYTHON_SAMPLING] if switches and PYTHON_SAMPLING.split("=")[0] in switches else [])


def _profile_args(a: argparse.Namespace, switches: set[str] | None = None) -> list[str]:
    """The ``nsys profile`` options (without the nsys path, output and command); ``switches``: this nsys's (for
    ``--cpu-sampling``; None: not known)."""
    sampling = _cpu_sampling(a, switches)
    args = [
        f"--trace={a.trace}",
        f"--cuda-graph-trace={a.cuda_graph_trace}",
        f"--trace-fork-before-exec={a.trace_fork}",
        *(sampling[:1] or [f"--sample={a.sample}"]),
        f"--cpuctxsw={a.cpuctxsw}",
        *sampling[1:],
    ]
    capture = a.capture
    if capture is None:
        capture = "all" if (a.delay is not None or a.duration is not None) else "api"
    if capture == "api":
        args += ["--capture-range=cudaProfilerApi", f"--capture-range-end={a.capture_range_end}"]
    if a.delay is not None:
        args.append(f"--delay={a.delay}")
    if a.duration is not None:
        args.append(f"--duration={a.duration}")
    if a.force:
        args.append("--force-overwrite=true")
    args += _gpu_metrics_args(a)
    for extra in a.nsys_arg or []:
        args.extend(shlex.split(extra))
    return args


# nsys samples GPU metrics at 10 Hz .. 200 kHz; 20 kHz (50 µs) gives a 100 µs phase two samples; on an H200 it
# changed the EAGLE workload's cycle by +0.25 % on average (paired runs: -0.5 .. +1.3 %, inside the run-to-run
# spread; docs/gpu-metrics.md, tests/device/gpu_metrics_per_phase.sh)
_GPU_METRICS_HZ = 20_000


def _gpu_metrics_args(a: argparse.Namespace) -> list[str]:
    """``--gpu-metrics-devices``/``--gpu-metrics-frequency`` with ``--gpu-metrics`` (every GPU: all the ranks')."""
    if not getattr(a, "gpu_metrics", False):
        return []
    return [f"--gpu-metrics-devices={a.gpu_metrics_devices}", f"--gpu-metrics-frequency={a.gpu_metrics_frequency}"]


def _gpu_metrics_record(a: argparse.Namespace) -> dict | None:
    """The manifest's ``gpu_metrics``: what was sampled (None without ``--gpu-metrics``)."""
    if not getattr(a, "gpu_metrics", False):
        return None
    hz = a.gpu_metrics_frequency
    return {"devices": a.gpu_metrics_devices, "frequency_hz": hz, "period_us": round(1e6 / hz, 3)}


def env_added(a: argparse.Namespace) -> dict[str, str]:
    """Variables spectrace sets for the profiled command (``SPECTRACE_HOOKS=1`` and ``--env``)."""
    out = dict(_HOOKS_ENV)
    for kv in a.env or []:
        k, eq, v = kv.partition("=")
        if not eq or not k:
            raise CaptureError(f"--env wants KEY=VALUE, got {kv!r}")
        out[k] = v
    return out


def _columnar(a: argparse.Namespace, version: str | None) -> str | None:
    """The columnar export to write beside the SQLite one (``--columnar``), or None: none asked, or this nsys
    (``version``; None: unknown, as in a dry run) has no such export."""
    fmt = getattr(a, "columnar", None)
    if fmt == "none":
        return None
    fmt = fmt or "parquetdir"  # the default: parquetdir where this nsys has it (quietly SQLite only where not)
    ver = parse_version(version or "")
    return fmt if ver is None or ver[:2] >= COLUMNAR_NSYS else None


def _commands(nsys: str, a: argparse.Namespace, base: Path, version: str | None = None,
              switches: set[str] | None = None) -> dict[str, list[str]]:
    """The nsys command lines: profile, export, (with --columnar) the columnar export and (with --stats) stats."""
    fmt = _columnar(a, version)
    o = outputs(base, a.stats, fmt)
    cmds = {
        "profile": [nsys, "profile", *_profile_args(a, switches), "-o", str(o["report"]), *a.command],
        # (with CPU sampling: the NVTX binary payloads, where nsys writes the Python samples' frames)
        "export": [nsys, "export", "--type=sqlite", *(["--include-blobs=true"] if getattr(a, "cpu_sampling", False)
                                                       else []),
                   "--force-overwrite=true", "-o", str(o["sqlite"]), str(o["report"])],
    }
    if fmt:
        cmds["columnar"] = [nsys, "export", f"--type={fmt}", "--force-overwrite=true", "-o", str(base),
                            str(o["report"])]
    if a.stats:
        cmds["stats"] = [nsys, "stats", "--report", ",".join(_STATS_REPORTS), "--format", "csv",
                         "--force-export=false", "--force-overwrite=true", "-o", str(base), str(o["sqlite"])]
    return cmds


class _OutputRecords:
    """Copies a child's stdout to ours line by line and keeps the lines that are JSON objects (the
    embedded workload prints its throughput as one): at most :data:`_MAX_RECORDS`, each shorter than
    :data:`_MAX_RECORD_BYTES`."""

    def __init__(self, stream: IO[bytes]) -> None:
        self.records: list[dict] = []
        self._thread = threading.Thread(target=self._copy, args=(stream,), daemon=True)
        self._thread.start()

    def _copy(self, stream: IO[bytes]) -> None:
        out = getattr(sys.stdout, "buffer", None)
        for line in iter(stream.readline, b""):
            try:
                if out is not None:
                    out.write(line)
                    out.flush()
                else:
                    sys.stdout.write(line.decode(errors="replace"))
            except (OSError, ValueError):
                out = None
            text = line.strip()
            if text.startswith(b"{") and len(text) < _MAX_RECORD_BYTES and len(self.records) < _MAX_RECORDS:
                try:
                    rec = json.loads(text)
                except ValueError:
                    continue
                if isinstance(rec, dict):
                    self.records.append(rec)
        stream.close()

    def join(self) -> list[dict]:
        self._thread.join(timeout=10)  # a leftover grandchild may hold the pipe open: do not wait for it
        return self.records


def _run_profile(cmd: list[str], env: dict[str, str], records: list | None = None) -> tuple[int, bool]:
    """Run nsys profile (or the plain command); Ctrl-C is forwarded to it (nsys then stops the app and writes
    the report). ``records``: gets the JSON-object lines of its output (which still reach our stdout)."""
    proc = subprocess.Popen(cmd, env=env, start_new_session=True,
                            stdout=subprocess.PIPE if records is not None else None)
    tee = _OutputRecords(proc.stdout) if records is not None and proc.stdout is not None else None  # (a pipe)
    interrupted = False

    def forward(signum: int, frame: FrameType | None) -> None:
        nonlocal interrupted
        interrupted = True
        try:
            proc.send_signal(signal.SIGINT)
        except ProcessLookupError:
            pass

    old = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        while True:
            try:
                rc = proc.wait()
                break
            except KeyboardInterrupt:  # pragma: no cover - handler above normally catches it
                forward(signal.SIGINT, None)
    finally:
        for s, h in old.items():
            signal.signal(s, h)
    if tee is not None and records is not None:  # (a tee only for records)
        records.extend(tee.join())
    return rc, interrupted


def _parse_passes(text: str | None) -> list[str]:
    """``--passes graph,node[,plain]`` as a list (empty without the option); CaptureError if malformed."""
    if not text:
        return []
    out = [p.strip() for p in text.split(",") if p.strip()]
    bad = [p for p in out if p not in _PASSES]
    if bad or not out or len(set(out)) != len(out):
        raise CaptureError(f"--passes wants distinct names among {', '.join(_PASSES)} separated by commas, "
                           f"got {text!r}")
    return out


def trace(a: argparse.Namespace) -> int:
    """``spectrace trace``: profile, export, write the manifest (once per ``--passes`` pass); returns the
    command's exit code (the first non-zero one over the passes)."""
    command = list(a.command or [])
    if command and command[0] == "--":
        command = command[1:]
    a.command = command
    if not command:
        raise CaptureError("no command to profile: spectrace trace -o NAME -- COMMAND ...")
    base = output_base(a.output)
    passes = _parse_passes(getattr(a, "passes", None))
    added = env_added(a)
    if a.dry_run:
        try:
            nsys = find_nsys(a.nsys)
        except CaptureError:  # none here: the commands are still printed (to run elsewhere)
            nsys = a.nsys or os.environ.get("NSYS") or "nsys"
        else:
            if passes != ["plain"]:
                nsys_version(nsys)  # one found here is checked as a real run checks it (too old: refused)
    elif passes == ["plain"]:
        nsys = ""
    else:
        nsys = find_nsys(a.nsys)
    if not passes:
        return _capture(a, nsys, base, added)
    names = {p: f"{base.name}_{p}" for p in passes}
    rc = 0
    for p in passes:
        pbase = base.with_name(names[p])
        if p == "plain":
            r = _plain(a, pbase, added, names)
        else:
            r = _capture(argparse.Namespace(**{**vars(a), "cuda_graph_trace": p}), nsys, pbase, added,
                         {"pass": p, "passes": names})
        if r == 130:
            return 130
        rc = rc or r
    return rc


def _env_line(added: dict[str, str]) -> str:
    """The variables spectrace adds, as a shell prefix (``--dry-run``)."""
    return " ".join(f"{k}={shlex.quote(v)}" for k, v in added.items())


def _refuse_existing(paths: list[Path], force: bool) -> None:
    """A CaptureError naming the outputs that exist already (a user's own manifest too), unless ``force``; and,
    before anything runs, one if the manifest (the last path) could not be written where it is
    (:func:`nvtx_hooks.capture.files.check_file`: a device, a pipe, a folder)."""
    existing = [str(p) for p in paths if p.exists() or p.is_symlink()]
    if existing and not force:
        raise CaptureError(f"{', '.join(existing)} exists: pass --force to overwrite")
    try:
        check_file(paths[-1], option="the manifest", replace=force)
    except OutputError as e:
        raise CaptureError(str(e)) from None


def _begin(base: Path, added: dict[str, str], shown: str) -> tuple[dict[str, str], str, float]:
    """Before running a pass: the output folder made, the program's environment, the start time (UTC and
    monotonic); ``shown`` (the command) announced on stderr."""
    if base.parent and not base.parent.exists():
        base.parent.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, **added}
    started, t0 = mf.utc_now(), time.monotonic()
    print(f"spectrace: {shown}", file=sys.stderr, flush=True)
    return env, started, t0


def _capture(a: argparse.Namespace, nsys: str, base: Path, added: dict[str, str], extra: dict | None = None) -> int:
    """One capture under nsys: profile, export, write the manifest (``extra``: more manifest keys)."""
    command = a.command
    if a.dry_run:
        cmds = _commands(nsys, a, base)
        print(f"{_env_line(added)} {shlex.join(cmds['profile'])}")
        print(shlex.join(cmds["export"]))
        for k in ("columnar", "stats"):
            if k in cmds:
                print(shlex.join(cmds[k]))
        return 0
    files = outputs(base, a.stats)
    _refuse_existing([files["report"], files["sqlite"], files["manifest"]], a.force)
    version = nsys_version(nsys)
    switches = profile_switches(nsys) if getattr(a, "cpu_sampling", False) else None
    cmds = _commands(nsys, a, base, version, switches)
    fmt = _columnar(a, version)
    if fmt:
        files = outputs(base, a.stats, fmt)
        _refuse_existing([files["columnar"], files["manifest"]], a.force)
    elif getattr(a, "columnar", None) not in (None, "none"):  # asked for by name: said when this nsys has none
        print(f"spectrace: nsys {version} has no --type {a.columnar} export (nsys >= "
              f"{'.'.join(map(str, COLUMNAR_NSYS))}): SQLite only", file=sys.stderr)
    env, started, t0 = _begin(base, added, shlex.join(cmds["profile"]))
    records: list[dict] = []
    rc, interrupted = _run_profile(cmds["profile"], env, records)
    exported = False
    if files["report"].exists():
        # an interrupted capture still gets exported; a second Ctrl-C here stops only the export
        # the columnar export beside the SQLite one (two nsys processes reading the same report): on the lent
        # H200 host (16 CPUs), 1.1 M kernels, the pair took 6.1-7.5 s, the SQLite export alone 5.5-8.3 s
        side = subprocess.Popen(cmds["columnar"]) if "columnar" in cmds else None
        try:
            exported = subprocess.call(cmds["export"]) == 0 and files["sqlite"].exists()
        finally:  # on Ctrl-C the export beside it got the signal too: waited for, not left running
            side_ok = side is not None and side.wait() == 0
        if exported and side is not None and not (side_ok and files["columnar"].is_dir()):
            print(f"spectrace: nsys export {cmds['columnar'][2]} failed: {files['columnar']} not written",
                  file=sys.stderr)
        if exported and "stats" in cmds:
            subprocess.call(cmds["stats"], stdout=subprocess.DEVNULL)
    wall = time.monotonic() - t0
    rec = mf.build(name=base.name, command=command, nsys_path=nsys, nsys_version=version,
                   profile_cmd=cmds["profile"], env_added=added, env=env, started=started,
                   ended=mf.utc_now(), wall_s=wall, exit_code=rc, interrupted=interrupted,
                   outputs=[p for k, p in files.items() if k != "manifest"])
    rec["exported"] = exported
    if _gpu_metrics_record(a) is not None:
        rec["gpu_metrics"] = _gpu_metrics_record(a)
    if getattr(a, "cpu_sampling", False):
        sampled = _cpu_sampling(a, switches)
        rec["cpu_sampling"] = {"options": sampled, "python_sampling": PYTHON_SAMPLING in sampled,
                               "switches_checked": bool(switches)}
    if "columnar" in files:
        rec["columnar_export"] = files["columnar"].name if files["columnar"].is_dir() else None
    rec["program_output"] = records
    rec.update(extra or {})
    if not files["report"].exists():  # nothing captured: no manifest either (it would describe nothing)
        print(f"spectrace: nsys wrote no report {files['report']} (exit {rc}); no manifest written", file=sys.stderr)
        return rc or 1
    ranks = _check(files["sqlite"]) if exported else None
    if ranks is not None:
        rec["ranks"] = [dataclasses.asdict(r) for r in ranks]
    mf.write(files["manifest"], rec, replace=a.force)
    print(f"spectrace: wrote {files['sqlite'] if exported else files['report']} and {files['manifest']}",
          file=sys.stderr)
    if exported and "columnar" in files and files["columnar"].is_dir():
        print(f"spectrace: and {files['columnar']}: analyse it with spectrace analyze {files['columnar']} "
              "(faster on large captures: docs/speed.md)", file=sys.stderr)
    if interrupted:
        return 130
    if rc == 0 and exported and a.strict and not (ranks and all(r.complete for r in ranks)):
        print("spectrace: --strict: the capture is not complete on every rank", file=sys.stderr)
        return 3
    return rc if exported else (rc or 1)


def _plain(a: argparse.Namespace, base: Path, added: dict[str, str], names: dict[str, str]) -> int:
    """The ``plain`` pass: the command without a profiler (same environment), its output lines kept."""
    manifest = base.with_name(base.name + ".manifest.json")
    if a.dry_run:
        print(f"{_env_line(added)} {shlex.join(a.command)}")
        return 0
    _refuse_existing([manifest], a.force)
    env, started, t0 = _begin(base, added, f"{shlex.join(a.command)} (no profiler)")
    records: list[dict] = []
    try:
        rc, interrupted = _run_profile(a.command, env, records)
    except OSError as e:
        raise CaptureError(f"cannot run {a.command[0]}: {e}") from e
    rec = mf.build(name=base.name, command=a.command, nsys_path="", nsys_version=None, profile_cmd=[],
                   env_added=added, env=env, started=started, ended=mf.utc_now(), wall_s=time.monotonic() - t0,
                   exit_code=rc, interrupted=interrupted, outputs=[])
    rec.update(nsys=None, program_output=records, **{"pass": "plain", "passes": names})
    mf.write(manifest, rec, replace=a.force)
    print(f"spectrace: wrote {manifest} ({len(records)} JSON line(s) of the program's output)", file=sys.stderr)
    return 130 if interrupted else rc


def _check(sqlite: Path) -> list[complete.Rank] | None:
    """Print one line per rank of the fresh export (cycles with GPU work, lost tail); None if unreadable."""
    try:
        ranks = complete.ranks(sqlite)
    except sqlite3.Error as e:
        print(f"spectrace: could not check {sqlite}: {e}", file=sys.stderr)
        return None
    for line in complete.lines(ranks):
        print(f"spectrace: {line}", file=sys.stderr)
    return ranks


def add_trace_arguments(p: argparse.ArgumentParser) -> None:
    """The options of ``spectrace trace``."""
    p.add_argument("-o", "--output", required=True, help="report name: writes NAME.nsys-rep, NAME.sqlite, "
                   "NAME.manifest.json")
    p.add_argument("--nsys", help="nsys executable (default: $NSYS, then nsys on PATH)")
    p.add_argument("-t", "--trace", default="cuda,nvtx", help="nsys --trace (default: %(default)s)")
    p.add_argument("--cuda-graph-trace", default="node", choices=("node", "graph"),
                   help="node: every kernel of a graph replay is recorded (default); graph: one row per replay")
    p.add_argument("--passes", metavar="LIST",
                   help="run the command once per pass, in order: graph and/or node (that CUDA-graph trace level; "
                        "writes NAME_graph.*, NAME_node.*), plain (no profiler: NAME_plain.manifest.json with the "
                        "program's JSON output lines, e.g. the workload's cycles/s); e.g. graph,node,plain. "
                        "Analyse with: spectrace analyze NAME_node.sqlite --timing NAME_graph.sqlite")
    p.add_argument("--trace-fork", default="true", choices=("true", "false"),
                   help="nsys --trace-fork-before-exec (default: true; reaches every TP rank)")
    p.add_argument("-s", "--sample", default="none", help="nsys --sample (default: none)")
    p.add_argument("--cpuctxsw", default="none", help="nsys --cpuctxsw (default: none)")
    p.add_argument("--capture", choices=("api", "all"), default=None,
                   help="api: the cudaProfilerStart/Stop range (default); all: the whole run "
                        "(default when --delay or --duration is given)")
    p.add_argument("--capture-range-end", default="stop", help="with --capture api (default: %(default)s)")
    p.add_argument("--delay", type=number(float, 0, 1e6), default=None, help="seconds before collection starts")
    p.add_argument("--duration", type=number(float, 0, 1e6, lo_open=True), default=None,
                   help="seconds of collection (nsys then stops the app)")
    p.add_argument("--cpu-sampling", action="store_true",
                   help="also sample the CPUs with backtraces: nsys " + " ".join(CPU_SAMPLING) + " (and "
                        + PYTHON_SAMPLING + " where this nsys has it); for the host work between cycles "
                        "(docs/capture.md); the manifest's cpu_sampling says what was asked")
    p.add_argument("--gpu-metrics", action="store_true",
                   help="also sample the GPUs' hardware counters (SMs active, tensor active, DRAM bandwidth...) for "
                        "`spectrace analyze --table utilisation` (nsys --gpu-metrics-devices; docs/gpu-metrics.md)")
    p.add_argument("--gpu-metrics-frequency", type=number(int, 10, 200_000), default=_GPU_METRICS_HZ, metavar="HZ",
                   help="with --gpu-metrics: samples per second, 10..200000 (default: %(default)s, every 50 µs)")
    p.add_argument("--gpu-metrics-devices", default="all", metavar="LIST",
                   help="with --gpu-metrics: nsys --gpu-metrics-devices (default: %(default)s, every rank's GPU)")
    p.add_argument("--env", action="append", metavar="KEY=VALUE", help="extra environment for the command")
    p.add_argument("--nsys-arg", action="append", metavar="ARGS", type=shell_words,
                   help="extra nsys profile options, appended last so they override the defaults; "
                        "write --nsys-arg=--flag=value")
    p.add_argument("--columnar", choices=("parquetdir", "arrowdir", "none"), default=None,
                   help="also export NAME_pqtdir/ (parquetdir) or NAME_arwdir/ (arrowdir) beside the SQLite, side by "
                        "side with it, when this nsys has that export (>= 2023.4); spectrace analyses either "
                        "(default: parquetdir where this nsys has it; none: SQLite only; docs/speed.md has the "
                        "measured difference)")
    p.add_argument("--stats", action="store_true",
                   help=f"also write NAME_<report>.csv for {', '.join(_STATS_REPORTS)} (nsys stats)")
    p.add_argument("-f", "--force", action="store_true", help="overwrite an existing report")
    p.add_argument("--strict", action="store_true",
                   help="exit 3 when a rank's GPU rows stop while its cycle ranges go on (lost GPU tail) "
                        "or the export has no GPU rows")
    p.add_argument("-n", "--dry-run", action="store_true", help="print the commands and environment; run nothing")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND [ARGS...]")


def demo_workload(a: argparse.Namespace) -> int:
    """``spectrace demo-workload``: run the embedded EAGLE-shaped workload (needs torch)."""
    try:
        import torch  # noqa: F401
    except ImportError as e:
        raise CaptureError("demo-workload needs PyTorch: pip install torch") from e
    from . import workload

    return workload.main(args=a)
