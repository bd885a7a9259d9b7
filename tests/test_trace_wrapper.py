"""`spectrace trace`: command line, environment, dry run, --force, manifest, errors, Ctrl-C (fake nsys)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from analyze.cli import main
from nvtx_hooks.capture import manifest
from nvtx_hooks.capture import nsys as capture

FAKE = Path(__file__).parent / "data" / "fake_nsys.py"
DEFAULTS = ["--trace=cuda,nvtx", "--cuda-graph-trace=node", "--trace-fork-before-exec=true", "--sample=none",
            "--cpuctxsw=none", "--capture-range=cudaProfilerApi", "--capture-range-end=stop"]


@pytest.fixture
def nsys(tmp_path, monkeypatch):
    """A fake nsys executable; its calls are logged to tmp_path/nsys.log."""
    d = tmp_path / "bin"
    d.mkdir()
    exe = d / "nsys"
    exe.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{FAKE}" "$@"\n')
    exe.chmod(0o755)
    monkeypatch.setenv("FAKE_NSYS_LOG", str(tmp_path / "nsys.log"))
    monkeypatch.delenv("NSYS", raising=False)
    return exe


def calls(tmp_path) -> list[dict]:
    p = tmp_path / "nsys.log"
    return [json.loads(x) for x in p.read_text().splitlines()] if p.exists() else []


CMD = [sys.executable, "-c", "import sys; sys.exit(0)"]


def test_dry_run_prints_exact_command_and_env(tmp_path, capsys):
    rc = main(["trace", "--dry-run", "--nsys", "/opt/x/nsys", "-o", str(tmp_path / "r"), "--", "python", "-V"])
    assert rc == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == ("SPECTRACE_HOOKS=1 /opt/x/nsys profile " + " ".join(DEFAULTS)
                        + f" -o {tmp_path / 'r.nsys-rep'} python -V")
    assert lines[1] == f"/opt/x/nsys export --type=sqlite --force-overwrite=true -o {tmp_path / 'r.sqlite'} " \
                       f"{tmp_path / 'r.nsys-rep'}"
    assert not list(tmp_path.iterdir())


def kinds(c: list[dict]) -> list[str]:
    """The kinds of nsys calls in order, the SQLite and columnar exports (run side by side) in a fixed order."""
    k = [x["kind"] for x in c]
    exports = sorted(i for i, x in enumerate(k) if x.startswith("export"))
    for i, x in zip(exports, sorted(k[i] for i in exports)):
        k[i] = x
    return k


def test_dry_run_overrides(tmp_path, nsys, capsys):
    main(["trace", "-n", "--nsys", str(nsys), "-o", "x.sqlite", "--cuda-graph-trace", "graph", "--delay", "60",
          "--duration", "70", "-t", "cuda,nvtx,osrt", "--env", "NCCL_DEBUG=INFO",
          "--nsys-arg=--cuda-flush-interval=100", "--stats", "--", "srv", "--tp", "8"])
    out = capsys.readouterr().out.splitlines()
    first = out[0].split()
    assert first[:2] == ["SPECTRACE_HOOKS=1", "NCCL_DEBUG=INFO"]
    assert "--cuda-graph-trace=graph" in first and "--trace=cuda,nvtx,osrt" in first
    assert "--delay=60.0" in first and "--duration=70.0" in first
    assert not any(a.startswith("--capture-range") for a in first)  # a timed window replaces the API range
    assert first.index("--cuda-flush-interval=100") < first.index("-o")
    assert first[-3:] == ["srv", "--tp", "8"] and "x.nsys-rep" in first
    assert out[2].split()[1:3] == ["export", "--type=parquetdir"]  # the default columnar export (dry run: no version)
    assert out[3].split()[1:6] == ["stats", "--report", "nvtx_gpu_proj_sum,nvtx_sum", "--format", "csv"]


def test_runs_nsys_with_hooks_env_and_writes_manifest(tmp_path, nsys, monkeypatch, capsys):
    monkeypatch.setenv("NCCL_NVLS_ENABLE", "0")
    cmd = [*CMD, "--tp", "8", "--speculative-algorithm", "EAGLE3", "--speculative-num-steps=3",
           "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4", "sglang"]
    rc = main(["trace", "--nsys", str(nsys), "--stats", "-o", str(tmp_path / "out" / "run"), "--", *cmd])
    assert rc == 0
    c = calls(tmp_path)
    assert kinds(c) == ["profile", "profiled", "export", "export_parquetdir", "stats"]  # parquetdir by default
    assert c[0]["hooks"] == "1" and c[0]["command"] == cmd
    assert c[0]["argv"][:len(DEFAULTS) + 1] == ["profile", *DEFAULTS]
    out = tmp_path / "out"
    assert {p.name for p in out.iterdir()} == {"run.nsys-rep", "run.sqlite", "run.manifest.json", "run_pqtdir",
                                               "run_nvtx_gpu_proj_sum.csv", "run_nvtx_sum.csv"}
    m = json.loads((out / "run.manifest.json").read_text())
    assert m["schema"] == manifest.SCHEMA and m["command"] == cmd and m["exit_code"] == 0
    assert m["nsys"]["version"] == "2025.3.1.90" and m["nsys"]["path"] == str(nsys)
    assert m["speculative"] == {"tp": 8, "algorithm": "EAGLE3", "steps": 3, "topk": 1, "draft_tokens": 4}
    assert m["nccl_env"]["NCCL_NVLS_ENABLE"] == "0" and m["env_added"] == {"SPECTRACE_HOOKS": "1"}
    assert m["exported"] and not m["interrupted"] and m["outputs"]["run.sqlite"] > 0
    assert {"started_utc", "ended_utc", "wall_s", "gpus", "sglang_version"} <= set(m)


def test_nsys_from_env_and_path(tmp_path, nsys, monkeypatch):
    monkeypatch.setenv("NSYS", str(nsys))
    assert capture.find_nsys() == str(nsys)
    monkeypatch.delenv("NSYS")
    monkeypatch.setenv("PATH", f"{nsys.parent}{os.pathsep}{os.environ['PATH']}")
    assert capture.find_nsys() == str(nsys)
    assert main(["trace", "-o", str(tmp_path / "a"), "--", *CMD]) == 0  # found on PATH
    assert (tmp_path / "a.sqlite").exists()


def test_missing_nsys_is_a_clear_error(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("NSYS", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert main(["trace", "-o", str(tmp_path / "a"), "--", "true"]) == 2
    assert "nsys not found" in capsys.readouterr().err
    assert main(["trace", "--nsys", str(tmp_path / "nope"), "-o", str(tmp_path / "a"), "--", "true"]) == 2
    assert "--nsys" in capsys.readouterr().err


def test_too_old_nsys(tmp_path, nsys, monkeypatch, capsys):
    monkeypatch.setenv("FAKE_NSYS_VERSION", "2023.4.1.97-32adbd5")
    assert main(["trace", "--nsys", str(nsys), "-o", str(tmp_path / "a"), "--", *CMD]) == 2
    assert "too old" in capsys.readouterr().err and not calls(tmp_path)


def test_no_overwrite_without_force(tmp_path, nsys, capsys):
    (tmp_path / "a.sqlite").write_text("old")
    assert main(["trace", "--nsys", str(nsys), "-o", str(tmp_path / "a"), "--", *CMD]) == 2
    assert "--force" in capsys.readouterr().err and (tmp_path / "a.sqlite").read_text() == "old"
    assert main(["trace", "--nsys", str(nsys), "--force", "-o", str(tmp_path / "a"), "--", *CMD]) == 0
    assert "--force-overwrite=true" in calls(tmp_path)[0]["argv"]
    assert (tmp_path / "a.sqlite").read_bytes()[:15] == b"SQLite format 3"


def test_bad_arguments(tmp_path, nsys, capsys):
    assert main(["trace", "--nsys", str(nsys), "-o", str(tmp_path / "a")]) == 2
    assert "no command" in capsys.readouterr().err
    assert main(["trace", "--nsys", str(nsys), "--env", "NOEQUALS", "-o", str(tmp_path / "a"), "--", "x"]) == 2


def test_failing_command_exit_code_is_passed_on(tmp_path, nsys):
    rc = main(["trace", "--nsys", str(nsys), "-o", str(tmp_path / "a"), "--", sys.executable, "-c",
               "raise SystemExit(3)"])
    assert rc == 3
    assert json.loads((tmp_path / "a.manifest.json").read_text())["exit_code"] == 3


def test_ctrl_c_still_exports(tmp_path, nsys):
    env = {**os.environ, "FAKE_NSYS_LOG": str(tmp_path / "nsys.log")}
    ready = tmp_path / "ready"
    prog = f"import pathlib, time; pathlib.Path({str(ready)!r}).touch(); time.sleep(60)"
    p = subprocess.Popen([sys.executable, "-m", "nvtx_hooks.capture", "trace", "--nsys", str(nsys), "-o",
                          str(tmp_path / "c"), "--", sys.executable, "-c", prog], env=env)
    t0 = time.monotonic()
    while not ready.exists() and time.monotonic() - t0 < 30:
        time.sleep(0.05)
    p.send_signal(signal.SIGINT)
    assert p.wait(timeout=30) == 130
    assert (tmp_path / "c.sqlite").exists()
    m = json.loads((tmp_path / "c.manifest.json").read_text())
    assert m["interrupted"] and m["exported"]


def test_version_parsing():
    assert capture.parse_version("NVIDIA Nsight Systems version 2025.3.1.90-253135822126v0") == (2025, 3, 1, 90)
    assert capture.parse_version("2024.2") == (2024, 2)
    assert capture.parse_version("nothing") is None
    assert capture.output_base("a/b.nsys-rep") == Path("a/b")


@pytest.mark.parametrize("module", ["nvtx_hooks.capture.workload", "nvtx_hooks.workload"])  # now, and old manifests
def test_workload_settings_in_manifest(module):
    cfg = manifest.speculative_config(["python", "-m", module, "--steps", "2", "--nproc", "2",
                                       "--baseline", "--no-graphs"])
    assert cfg["workload"] == "nvtx_hooks.capture.workload" and cfg["steps"] == 2 and cfg["tp"] == 2
    assert cfg["baseline"] is True and cfg["graphs"] is False and cfg["algorithm"] == "none"


@pytest.mark.parametrize("preset", [None, "narenas:2", "dirty_decay_ms:500,muzzy_decay_ms:1000"])
def test_traced_command_gets_the_environment_unchanged_by_spectrace(tmp_path, nsys, preset):
    """The spectrace command sets polars' allocator variable for itself only: the profiled program
    (an SGLang server) sees it exactly as the user had it. The value a parent process gets by importing polars
    (the last preset) is not the user's: spectrace's own process uses its setting all the same."""
    env = {k: v for k, v in os.environ.items() if k != "_RJEM_MALLOC_CONF"}
    if preset:
        env["_RJEM_MALLOC_CONF"] = preset
    seen = tmp_path / "seen"
    prog = f"import os, pathlib; pathlib.Path({str(seen)!r}).write_text(repr(os.environ.get('_RJEM_MALLOC_CONF')))"
    rc = subprocess.run([sys.executable, "-m", "analyze.cli", "trace", "--nsys", str(nsys), "-o", str(tmp_path / "t"),
                         "--", sys.executable, "-c", prog], env=env, capture_output=True).returncode
    assert rc == 0
    assert seen.read_text() == repr(preset)
    # ...while spectrace's own process (an analysis) keeps freed pages longer than polars' default.
    probe = ("import os, contextlib, io; from analyze.cli import main\n"
             "with contextlib.redirect_stdout(io.StringIO()): main(['hooks'])\n"
             "import polars; print(os.environ['_RJEM_MALLOC_CONF'])")
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True).stdout
    ours = "narenas:1,dirty_decay_ms:1000,muzzy_decay_ms:0,oversize_threshold:0"
    assert out.strip().endswith(ours if preset in (None, "dirty_decay_ms:500,muzzy_decay_ms:1000") else preset)


def test_passes_dry_run(tmp_path, nsys, capsys):
    assert main(["trace", "-n", "--nsys", str(nsys), "--passes", "graph,node,plain", "-o", str(tmp_path / "w"),
                 "--", "prog", "--x"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 7  # each profiled pass: profile, SQLite export, parquetdir export
    assert "--cuda-graph-trace=graph" in out[0] and f"{tmp_path / 'w_graph.nsys-rep'}" in out[0]
    assert "--type=parquetdir" in out[2] and f"{tmp_path / 'w_graph'} " in out[2]
    assert "--cuda-graph-trace=node" in out[3] and f"{tmp_path / 'w_node.sqlite'}" in out[4]
    assert out[6] == "SPECTRACE_HOOKS=1 prog --x"


def test_passes_run_each_pass_and_keep_the_program_output(tmp_path, nsys, capfd):
    prog = ("import json, os; print('warming up'); "
            "print(json.dumps({'rank': 0, 'cycles_per_s': 321.5, 'hooks': os.environ.get('SPECTRACE_HOOKS')}))")
    rc = main(["trace", "--nsys", str(nsys), "--passes", "graph,node,plain", "-o", str(tmp_path / "w"), "--",
               sys.executable, "-c", prog])
    assert rc == 0
    assert capfd.readouterr().out.count("warming up") == 3  # the program's output still reaches the terminal
    c = [x for x in calls(tmp_path) if x["kind"] == "profile"]
    assert [next(a for a in x["argv"] if a.startswith("--cuda-graph-trace")) for x in c] == [
        "--cuda-graph-trace=graph", "--cuda-graph-trace=node"]
    names = {"graph": "w_graph", "node": "w_node", "plain": "w_plain"}
    for p in ("graph", "node", "plain"):
        m = json.loads((tmp_path / f"w_{p}.manifest.json").read_text())
        assert m["pass"] == p and m["passes"] == names and m["exit_code"] == 0
        assert m["program_output"] == [{"rank": 0, "cycles_per_s": 321.5, "hooks": "1"}]
    assert (tmp_path / "w_graph.sqlite").exists() and (tmp_path / "w_node.sqlite").exists()
    assert not (tmp_path / "w_plain.sqlite").exists()
    assert json.loads((tmp_path / "w_plain.manifest.json").read_text())["nsys"] is None


def test_passes_errors(tmp_path, nsys, capsys):
    for bad in ("graph,graph", "node,eager", ","):
        assert main(["trace", "--nsys", str(nsys), "--passes", bad, "-o", str(tmp_path / "w"), "--", "x"]) == 2
        assert "--passes" in capsys.readouterr().err
    rc = main(["trace", "--nsys", str(nsys), "--passes", "node,plain", "-o", str(tmp_path / "f"), "--",
               sys.executable, "-c", "raise SystemExit(4)"])
    assert rc == 4
    assert json.loads((tmp_path / "f_plain.manifest.json").read_text())["exit_code"] == 4


def test_gpu_metrics_dry_run(tmp_path, nsys, capsys):
    main(["trace", "-n", "--nsys", str(nsys), "-o", str(tmp_path / "r"), "--gpu-metrics", "--", "x"])
    first = capsys.readouterr().out.splitlines()[0].split()
    assert "--gpu-metrics-devices=all" in first and "--gpu-metrics-frequency=20000" in first
    assert first.index("--gpu-metrics-frequency=20000") < first.index("-o")
    main(["trace", "-n", "--nsys", str(nsys), "-o", str(tmp_path / "r"), "--", "x"])
    assert "--gpu-metrics" not in capsys.readouterr().out  # off unless asked
    main(["trace", "-n", "--nsys", str(nsys), "-o", str(tmp_path / "r"), "--gpu-metrics", "--gpu-metrics-frequency",
          "100000", "--gpu-metrics-devices", "0,1", "--", "x"])
    first = capsys.readouterr().out.splitlines()[0].split()
    assert "--gpu-metrics-devices=0,1" in first and "--gpu-metrics-frequency=100000" in first


@pytest.mark.parametrize("hz", ["5", "200001", "fast"])
def test_gpu_metrics_frequency_bounds(tmp_path, capsys, hz):
    rc = main(["trace", "-n", "--nsys", "nsys", "-o", str(tmp_path / "r"), "--gpu-metrics", "--gpu-metrics-frequency",
               hz, "--", "x"])
    err = capsys.readouterr().err
    assert rc == 2 and "--gpu-metrics-frequency" in err and "10 to 200,000" in err and len(err.splitlines()) == 1


def test_gpu_metrics_in_manifest(tmp_path, nsys):
    assert main(["trace", "--nsys", str(nsys), "-o", str(tmp_path / "g"), "--gpu-metrics", "--", *CMD]) == 0
    c = calls(tmp_path)
    assert "--gpu-metrics-devices=all" in c[0]["argv"] and "--gpu-metrics-frequency=20000" in c[0]["argv"]
    m = json.loads((tmp_path / "g.manifest.json").read_text())
    assert m["gpu_metrics"] == {"devices": "all", "frequency_hz": 20000, "period_us": 50.0}
    assert "--gpu-metrics-frequency=20000" in m["nsys"]["profile_command"]
    assert main(["trace", "--nsys", str(nsys), "-o", str(tmp_path / "h"), "--", *CMD]) == 0
    assert "gpu_metrics" not in json.loads((tmp_path / "h.manifest.json").read_text())


def test_dry_run_refuses_an_nsys_a_real_run_refuses(tmp_path, nsys, monkeypatch, capsys):
    """--dry-run checks the nsys it finds as a real run does (2022.4 is older than MIN_NSYS)."""
    monkeypatch.setenv("FAKE_NSYS_VERSION", "2022.4.1.21-0e2b1a3")
    argv = ["trace", "--dry-run", "--nsys", str(nsys), "-o", str(tmp_path / "r"), "--", "python", "-V"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "2022.4" in err and "2024.2" in err, err
    assert main([x for x in argv if x != "--dry-run"]) == 2  # what a real run says
    assert capsys.readouterr().err == err and not list(tmp_path.glob("r*"))
    monkeypatch.setenv("FAKE_NSYS_VERSION", "2024.2.1.106-0")
    assert main(argv) == 0 and "profile" in capsys.readouterr().out


def test_columnar_export_beside_the_sqlite(tmp_path, nsys, capsys):
    """--columnar parquetdir: one more nsys export after the SQLite one, into NAME_pqtdir/ (nsys's own naming)."""
    rc = main(["trace", "--nsys", str(nsys), "--columnar", "parquetdir", "-o", str(tmp_path / "out" / "run"),
               "--", *CMD])
    assert rc == 0
    c = calls(tmp_path)
    assert kinds(c) == ["profile", "profiled", "export", "export_parquetdir"]
    assert next(x for x in c if x["kind"] == "export_parquetdir")["argv"] == ["export", "--type=parquetdir", "--force-overwrite=true", "-o", str(tmp_path / "out" / "run"),
                            str(tmp_path / "out" / "run.nsys-rep")]
    out = tmp_path / "out"
    assert {p.name for p in out.iterdir()} == {"run.nsys-rep", "run.sqlite", "run_pqtdir", "run.manifest.json"}
    m = json.loads((out / "run.manifest.json").read_text())
    assert m["columnar_export"] == "run_pqtdir" and "run_pqtdir" in m["outputs"]
    assert f"spectrace analyze {out / 'run_pqtdir'}" in capsys.readouterr().err


def test_columnar_none_old_nsys_skipped_failure_said(tmp_path, nsys, monkeypatch, capsys):
    assert main(["trace", "--nsys", str(nsys), "--columnar", "none", "-o", str(tmp_path / "a"), "--", *CMD]) == 0
    assert kinds(calls(tmp_path)) == ["profile", "profiled", "export"]  # none: SQLite only
    assert not (tmp_path / "a_pqtdir").exists()
    (tmp_path / "nsys.log").unlink()
    capsys.readouterr()
    monkeypatch.setattr(capture, "COLUMNAR_NSYS", (2099, 1))  # an nsys without the export: skipped...
    assert main(["trace", "--nsys", str(nsys), "-o", str(tmp_path / "a2"), "--", *CMD]) == 0
    assert kinds(calls(tmp_path)) == ["profile", "profiled", "export"]
    assert "has no --type" not in capsys.readouterr().err  # ...quietly when it was the default
    (tmp_path / "nsys.log").unlink()
    assert main(["trace", "--nsys", str(nsys), "--columnar", "arrowdir", "-o", str(tmp_path / "b"), "--", *CMD]) == 0
    assert kinds(calls(tmp_path)) == ["profile", "profiled", "export"]
    assert "has no --type arrowdir export" in capsys.readouterr().err  # ...and said when asked for by name
    monkeypatch.setattr(capture, "COLUMNAR_NSYS", (2023, 4))
    monkeypatch.setenv("FAKE_NSYS_NO_COLUMNAR", "1")  # the export fails: the SQLite capture stands, one line says so
    assert main(["trace", "--nsys", str(nsys), "--columnar", "arrowdir", "-o", str(tmp_path / "c"), "--", *CMD]) == 0
    err = capsys.readouterr().err
    assert "--type=arrowdir failed" in err and (tmp_path / "c.sqlite").exists()
    assert json.loads((tmp_path / "c.manifest.json").read_text())["columnar_export"] is None


def test_columnar_refuses_an_existing_folder_and_dry_run_prints_it(tmp_path, nsys, capsys):
    (tmp_path / "d_arwdir").mkdir()
    assert main(["trace", "--nsys", str(nsys), "--columnar", "arrowdir", "-o", str(tmp_path / "d"), "--", *CMD]) == 2
    assert "d_arwdir exists" in capsys.readouterr().err and not (tmp_path / "d.nsys-rep").exists()
    assert main(["trace", "-n", "--nsys", "/opt/x/nsys", "--columnar", "parquetdir", "-o", str(tmp_path / "e"),
                 "--", "python"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[2] == f"/opt/x/nsys export --type=parquetdir --force-overwrite=true -o {tmp_path / 'e'} " \
                       f"{tmp_path / 'e.nsys-rep'}"


def test_cpu_sampling_dry_run(tmp_path, capsys):
    """--cpu-sampling: --sample=process-tree in place of --sample=none, then the backtrace options."""
    assert main(["trace", "-n", "--nsys", "/opt/x/nsys", "--cpu-sampling", "-o", str(tmp_path / "r"), "--", "p"]) == 0
    first = capsys.readouterr().out.splitlines()[0].split()
    opts = [x for x in first if x.startswith("--")]
    assert opts[:7] == ["--trace=cuda,nvtx", "--cuda-graph-trace=node", "--trace-fork-before-exec=true",
                        "--sample=process-tree", "--cpuctxsw=none", "--cudabacktrace=all", "--python-backtrace=cuda"]
    assert "--sample=none" not in first and "--python-sampling=true" not in first  # a dry run asks no nsys


@pytest.mark.parametrize("python_sampling", [True, False])
def test_cpu_sampling_run_and_manifest(tmp_path, nsys, monkeypatch, python_sampling):
    """A run checks the switches in this nsys's profile --help; Python sampling is added where it is listed; the
    manifest says what was asked."""
    if not python_sampling:
        monkeypatch.setenv("FAKE_NSYS_NO_PYTHON_SAMPLING", "1")
    out = tmp_path / "r"
    assert main(["trace", "--nsys", str(nsys), "--cpu-sampling", "--columnar", "none", "-o", str(out), "--",
                 *CMD]) == 0
    prof = next(c for c in calls(tmp_path) if c["kind"] == "profile")["argv"]
    want = ["--sample=process-tree", "--cudabacktrace=all", "--python-backtrace=cuda"]
    assert all(x in prof for x in want) and ("--python-sampling=true" in prof) is python_sampling
    m = json.loads((tmp_path / "r.manifest.json").read_text())
    assert m["cpu_sampling"] == {"options": want + (["--python-sampling=true"] if python_sampling else []),
                                 "python_sampling": python_sampling, "switches_checked": True}
    assert "--sample=process-tree" in m["nsys"]["profile_command"]
    # the export keeps the NVTX binary payloads, where nsys writes the Python samples' frames
    export = [c["argv"] for c in calls(tmp_path) if c["kind"] == "export"]
    assert export and all("--include-blobs=true" in a for a in export)


def test_cpu_sampling_refused_by_an_nsys_without_the_switches(tmp_path, nsys, monkeypatch, capsys):
    monkeypatch.setenv("FAKE_NSYS_NO_SWITCHES", "--python-backtrace")
    assert main(["trace", "--nsys", str(nsys), "--cpu-sampling", "-o", str(tmp_path / "r"), "--", *CMD]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no --python-backtrace" in err[0] and "2024.2" in err[0]
    assert not any(c["kind"] == "profile" for c in calls(tmp_path))  # refused before anything ran
    assert main(["trace", "--nsys", str(nsys), "-n", "--cpu-sampling", "-s", "cpu", "-o", str(tmp_path / "q"), "--", *CMD]) == 2
    assert "cannot be combined with --sample cpu" in capsys.readouterr().err
