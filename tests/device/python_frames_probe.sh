# A short --cpu-sampling capture on one H200, exported with and without --include-blobs=true, and what each holds
# (tables, the string ids of the busy function, the blobs): how the Python samples' frames were found (tp1_pyframes).
#   bash tests/device/python_frames_probe.sh   (carry .devdeps and .whl)
set -u
. tests/device/setup.sh
W=/tmp/pyb; mkdir -p $W
timeout 100 python3 -m nvtx_hooks.capture trace --capture all --columnar none --force --cpu-sampling -o $W/cpu -- python3 -m nvtx_hooks.capture.workload --nproc 1 --scheduler --v2 --batch 4 --steps 3 --cycles 60 --busy-us 300 > $W/out.txt 2>&1; echo "trace rc=$?"
ls -la $W
"$NSYS" export --type sqlite --include-blobs=true --force-overwrite=true -o $W/blobs.sqlite $W/cpu.nsys-rep > $W/exp.txt 2>&1; echo "export rc=$?"; tail -3 $W/exp.txt
for db in $W/cpu.sqlite $W/blobs.sqlite; do echo "== $db"; python3 - "$db" <<'PY'
import sqlite3, sys
con = sqlite3.connect(sys.argv[1])
for (t,) in con.execute("select name from sqlite_master where type='table' order by name"):
    n = con.execute(f"select count(*) from [{t}]").fetchone()[0]
    if n and not t.startswith("ENUM"):
        cols = [r[1] for r in con.execute(f"pragma table_info([{t}])")]
        print(t, n, cols if any(k in t.upper() for k in ("SAMPL","CALLCHAIN","COMPOSITE","PYTHON","BACKTRACE","BLOB","NVTX_EVENTS")) else "")
print("busy in StringIds:", con.execute("select id, value from StringIds where value like '%busy%' or value like '%process_batch_result%' or value like '%workload.py%'").fetchall()[:10])
for (t,) in con.execute("select name from sqlite_master where type='table'"):
    cols = [r[1] for r in con.execute(f"pragma table_info([{t}])")]
    for c in cols:
        try:
            r = con.execute(f"select count(*) from [{t}] where typeof([{c}])='blob'").fetchone()[0]
        except Exception:
            r = 0
        if r:
            ex = con.execute(f"select [{c}] from [{t}] where typeof([{c}])='blob' limit 1").fetchone()[0]
            print("blob", t, c, r, len(ex), bytes(ex[:200]))
            if b"busy" in bytes(ex) or any(b"spectrace_busy" in bytes(x[0]) for x in con.execute(f"select [{c}] from [{t}] where typeof([{c}])='blob' limit 2000")):
                print("   contains spectrace_busy_python")
PY
done
