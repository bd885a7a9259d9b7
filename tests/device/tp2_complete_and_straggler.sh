#!/usr/bin/env bash
# On 2 GPUs (nvidia-h200-x2): are TP2 captures of the embedded workload complete on every rank, and
# does a window opened by rank 0 alone still name the injected straggler? About 2-3 minutes.
# Run from the repo root there: bash tests/device/tp2_complete_and_straggler.sh      (results under $OUT)
# Needs: .devdeps/*.deb (libdw/libelf for nsys's importer), .whl/nvtx-*.whl (python nvtx for cp312).
# Captures (each: `python -m nvtx_hooks.capture trace --strict`, which prints one line per rank and exits 3
# when a rank's GPU tail is lost), 30 measured cycles, CUDA graphs, 2 ranks over NCCL:
#   all       whole run (--capture all), the workload's new exit (CUPTI flush, NCCL teardown, normal exit)
#   api       cudaProfilerStart/Stop window on every rank (the default capture)
#   all_os    whole run with --exit os (the old os._exit after the barrier): expected to lose a GPU tail
#   straggler window opened and closed by rank 0 only (--profiler-rank 0), rank 1 sleeping 500 µs before
#             every verify (--delay-rank 1 --delay-us 500)
# Out: $OUT/log.txt (per-rank lines, exit codes, row counts) and $OUT/tp2_complete_and_straggler.tar (scrubbed,
# xz-compressed exports with manifests and stdout).
set -u
W=/tmp/tp2_complete_and_straggler
. tests/device/setup.sh
versions

# cap NAME [trace options] -- [workload options]
cap() {
  local name=$1; shift
  local targs=()
  while [ "$1" != "--" ]; do targs+=("$1"); shift; done; shift
  log "capture $name: trace --strict ${targs[*]} -- workload --nproc 2 --cycles 30 --warmup 3 $*"
  timeout 120 python3 -m nvtx_hooks.capture trace --strict --force -o "$W/$name" "${targs[@]}" -- \
    python3 -m nvtx_hooks.capture.workload --nproc 2 --cycles 30 --warmup 3 "$@" > "$W/$name.stdout" 2>&1
  log "  $name: trace exit $? (0 = complete on every rank, 3 = a GPU tail lost, 124 = timed out)"
  grep -h '^spectrace: \(rank\|pid\|--strict\)' "$W/$name.stdout" | tee -a "$OUT/log.txt"
  python3 - "$W/$name.sqlite" >> "$OUT/log.txt" 2>&1 <<'EOF'
import sqlite3, sys
con = sqlite3.connect(sys.argv[1])
q = "SELECT (globalPid >> 24) & 16777215, COUNT(*) FROM CUPTI_ACTIVITY_KIND_KERNEL GROUP BY 1"
print("   kernels per pid:", dict(con.execute(q).fetchall()))
for (t,) in con.execute("SELECT text FROM DIAGNOSTIC_EVENT WHERE text LIKE '%CUPTI%' OR text LIKE 'Not all%'"):
    print("   diag:", t[:160])
EOF
}

cap all --capture all --
cap api --
cap all_os --capture all -- --exit os
cap straggler -- --profiler-rank 0 --delay-rank 1 --delay-us 500

cd "$W" || exit 1
mkdir -p pack
for f in all api all_os straggler; do
  [ -f "$f.sqlite" ] || { log "no export for $f"; continue; }
  python3 -m nvtx_hooks.capture scrub "$f.sqlite" -o "pack/tp2_$f.sqlite" --force --check PATH= --check HOME= \
    --check "$REPO" >> "$OUT/log.txt" 2>&1 || log "scrub check failed for $f"
  xz -T0 -9 -f "pack/tp2_$f.sqlite"
  cp "$f.manifest.json" "pack/tp2_$f.manifest.json" 2>/dev/null
  cp "$f.stdout" "pack/tp2_$f.stdout" 2>/dev/null
done
ls -la pack >> "$OUT/log.txt"
tar -cf "$OUT/tp2_complete_and_straggler.tar" -C pack .
log "done"
