#!/usr/bin/env python3
"""A stand-in for nsys in tests: logs each call (argv + SPECTRACE_HOOKS) as JSON to $FAKE_NSYS_LOG,
runs the profiled command, writes placeholder reports (the export: a copy of $FAKE_NSYS_EXPORT_FROM when
set). Version from $FAKE_NSYS_VERSION. ``profile --help`` lists the profile switches of nsys 2025.3 that
spectrace uses, less those in $FAKE_NSYS_NO_SWITCHES (comma-separated), plus --python-sampling unless
$FAKE_NSYS_NO_PYTHON_SAMPLING is set."""

import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys

VALUED = {"-o", "--output", "-t", "--trace", "-s", "--sample", "-d", "--duration", "-r", "--report",
          "--format", "--type"}


def log(kind, **kw):
    path = os.environ.get("FAKE_NSYS_LOG")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps({"kind": kind, "argv": sys.argv[1:], **kw}) + "\n")


def split(args):
    """(options dict, positional rest) of an nsys subcommand line."""
    opts, i = {}, 0
    while i < len(args) and args[i].startswith("-"):
        k, eq, v = args[i].partition("=")
        if not eq and k in VALUED:
            v, i = args[i + 1], i + 1
        opts[k] = v
        i += 1
    return opts, args[i:]


def main():
    argv = sys.argv[1:]
    if argv[:1] == ["--version"]:
        print("NVIDIA Nsight Systems version " + os.environ.get("FAKE_NSYS_VERSION", "2025.3.1.90-253135822126v0"))
        return 0
    sub, rest = argv[0], argv[1:]
    if sub == "profile" and rest[:1] == ["--help"]:
        gone = set(os.environ.get("FAKE_NSYS_NO_SWITCHES", "").split(","))
        switches = ["--trace", "--cuda-graph-trace", "--trace-fork-before-exec", "--sample", "--cpuctxsw",
                    "--cudabacktrace", "--python-backtrace", "--capture-range", "--capture-range-end", "--delay",
                    "--duration", "--force-overwrite", "--output", "--gpu-metrics-devices",
                    "--gpu-metrics-frequency"]
        if not os.environ.get("FAKE_NSYS_NO_PYTHON_SAMPLING"):
            switches.append("--python-sampling")
        print("usage: nsys profile [<args>] [application] [<application args>]")
        for sw in switches:
            if sw not in gone:
                print(f"\t{sw}=\n\t   Possible values are ...")
        return 0
    opts, pos = split(rest)
    out = opts.get("-o") or opts.get("--output")
    if sub == "profile":
        if os.path.exists(out) and opts.get("--force-overwrite") != "true":
            print(f"fake nsys: {out} exists", file=sys.stderr)
            return 1
        log("profile", hooks=os.environ.get("SPECTRACE_HOOKS"), command=pos)
        child = subprocess.Popen(pos)
        signal.signal(signal.SIGINT, lambda s, f: child.send_signal(signal.SIGINT))
        rc = child.wait()
        with open(out, "w") as f:
            f.write("fake report\n")
        log("profiled", rc=rc)
        return rc
    if sub == "export" and opts.get("--type", "sqlite") in ("parquetdir", "arrowdir"):
        log("export_" + opts["--type"])
        if os.environ.get("FAKE_NSYS_NO_COLUMNAR"):
            print("fake nsys: unknown export type", file=sys.stderr)
            return 1
        d = out + ("_pqtdir" if opts["--type"] == "parquetdir" else "_arwdir")
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "META_DATA_EXPORT" + (".parquet" if opts["--type"] == "parquetdir" else ".arrow")),
                  "w") as f:
            f.write("fake table\n")
        return 0
    if sub == "export":
        log("export")
        if os.path.exists(out):
            os.unlink(out)
        if os.environ.get("FAKE_NSYS_EXPORT_FROM"):
            shutil.copyfile(os.environ["FAKE_NSYS_EXPORT_FROM"], out)
            return 0
        con = sqlite3.connect(out)
        con.execute("CREATE TABLE META_DATA_EXPORT(name TEXT, value TEXT)")
        con.execute("INSERT INTO META_DATA_EXPORT VALUES ('EXPORT_PRODUCT_VERSION', '2025.3.1.90')")
        con.commit()
        con.close()
        return 0
    if sub == "stats":
        log("stats")
        for r in opts["--report"].split(","):
            with open(f"{out}_{r}.csv", "w") as f:
                f.write("Range,Style,Total Proj Time (ns)\n")
        return 0
    return 2


if __name__ == "__main__":
    sys.exit(main())
