#!/usr/bin/env bash
# On the GPU machine (~1 min): the workload's SGLang-v2-like mode (accept lengths stay on the GPU,
# copied asynchronously, read one cycle later and marked 'accept') under nsys, and the same run with ranges
# off: the marks must add no synchronising or copying CUDA call. Run from the repo root:
#   bash tests/device/sglang_v2_accept_marks.sh            (results under $OUT: log.txt, *.sqlite.xz, *.stdout.txt)
# Check afterwards (here, with polars): per-cycle acceptance from the marks == the workload's accept_lengths;
# log.txt's sync/copy counts equal for v2 and v2_noranges.
set -u
. tests/device/setup.sh
cap() {  # cap NAME [workload options]
  local name=$1; shift
  log "capture $name: workload --nproc $NP $*"
  python3 -m nvtx_hooks.capture trace --capture all --force -o "$W/$name" -- \
    python3 -m nvtx_hooks.capture.workload --nproc "$NP" "$@" > "$W/$name.stdout" 2>&1
  log "  rc=$? $(grep -h '^{"rank"' "$W/$name.stdout" | cut -c1-200 | tr '\n' ' ')"
  python3 - "$W/$name.sqlite" >> "$OUT/log.txt" 2>&1 <<'PY'
import sqlite3, sys
con = sqlite3.connect(sys.argv[1])
q = """SELECT s.value, count(*) FROM CUPTI_ACTIVITY_KIND_RUNTIME r JOIN StringIds s ON s.id = r.nameId
       WHERE s.value LIKE '%ynchronize%' OR s.value LIKE '%emcpy%' GROUP BY s.value ORDER BY s.value"""
for name, n in con.execute(q):
    print(f"   {sys.argv[1].split('/')[-1]} api {name}: {n}")
print("   marks:", con.execute("SELECT count(*) FROM NVTX_EVENTS WHERE eventType = 34").fetchone()[0])
for (t,) in con.execute("SELECT text FROM DIAGNOSTIC_EVENT"):
    print("   diag:", t[:160])
PY
}
cap "tp${NP}_v2" --v2 --cycles 30 --warmup 3
cap "tp${NP}_v2_noranges" --v2 --no-ranges --cycles 30 --warmup 3
pack "tp${NP}_v2"
log done
