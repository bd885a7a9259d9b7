#!/usr/bin/env bash
# Real captures of the embedded workload with `spectrace trace` on the GPU machine, plus overhead runs.
# Run from the repo root there: bash tests/device/capture_all.sh [smoke|all]   (results under $OUT)
# Needs: .devdeps/*.deb (libdw/libelf for nsys's importer), .whl/nvtx-*.whl (python nvtx for cp312).
set -u
MODE=${1:-all}
BUDGET_S=${BUDGET_S:-540}          # stop starting new steps after this many seconds
OUT=${OUT:-/tmp/spectrace-out}
REPO=$(pwd)
W=/tmp/cap
mkdir -p "$W" "$OUT"
T0=$(date +%s)
log() { echo "== $(( $(date +%s) - T0 ))s $*" | tee -a "$OUT/log.txt"; }
left() { [ $(( $(date +%s) - T0 )) -lt "$BUDGET_S" ]; }

for f in .devdeps/*.deb; do dpkg -x "$f" /tmp/dw; done
export LD_LIBRARY_PATH=/tmp/dw/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$REPO
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export NSYS=${NSYS:-/opt/nvidia/nsight-compute/2025.3.1/host/target-linux-x64/nsys}
NP=$(python3 -c 'import torch; print(torch.cuda.device_count())')
TP=tp$NP
DELAY_RANK=$(( NP - 1 ))
{
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  "$NSYS" --version
  python3 -c 'import torch, nvtx; print("torch", torch.__version__, "cuda", torch.version.cuda, "nvtx", nvtx.__file__)'
  "$NSYS" profile --help | grep -A2 -i 'flush-on-cudaprofilerstop' | head -5
} >> "$OUT/log.txt" 2>&1
log "GPUs: $NP"

# cap NAME [trace options] -- [workload options]
cap() {
  local name=$1; shift
  local targs=()
  while [ "$1" != "--" ]; do targs+=("$1"); shift; done; shift
  left || { log "skip $name (budget)"; return; }
  log "capture $name: spectrace trace ${targs[*]} -- workload --nproc $NP $*"
  python3 -m nvtx_hooks.capture trace --stats --force -o "$W/$name" "${targs[@]}" -- \
    python3 -m nvtx_hooks.capture.workload --nproc "$NP" "$@" > "$W/$name.stdout" 2>&1
  log "  rc=$? $(grep -h '^{"rank"' "$W/$name.stdout" | tr '\n' ' ')"
  python3 - "$W/$name.sqlite" >> "$OUT/log.txt" 2>&1 <<'EOF'
import sqlite3, sys
con = sqlite3.connect(sys.argv[1])
for (t,) in con.execute("SELECT text FROM DIAGNOSTIC_EVENT ORDER BY timestamp"):
    print("   diag:", t[:160])
for q in ("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL", "SELECT count(*) FROM NVTX_EVENTS"):
    print("  ", q.split()[-1], con.execute(q).fetchone()[0])
EOF
}

# The cudaProfilerApi window (the default) leaves "Not all CUDA/NVTX events might have been
# collected" in DIAGNOSTIC_EVENT; find out whether capturing the whole run (normal exit) is complete.
cap "${TP}_node_api" -- --cycles 60
CAP=(--capture all)
cap "${TP}_node" "${CAP[@]}" -- --cycles 60
if grep -A20 "capture ${TP}_node:" "$OUT/log.txt" | grep -q "Not all"; then
  log "whole-run capture is incomplete too: keeping the default window"; CAP=()
fi
if [ "$MODE" = all ]; then
  cap "${TP}_graph" "${CAP[@]}" --cuda-graph-trace graph -- --cycles 60
  cap "${TP}_eager" "${CAP[@]}" -- --cycles 60 --no-graphs
  cap "${TP}_baseline" "${CAP[@]}" -- --cycles 60 --baseline
  cap "${TP}_delay" "${CAP[@]}" -- --cycles 60 --delay-rank "$DELAY_RANK" --delay-us 2000
  for s in 1 2 3 4; do cap "${TP}_steps$s" "${CAP[@]}" -- --cycles 60 --steps "$s"; done
fi

# overhead of the ranges: throughput on vs off, alternating, without nsys and under nsys
OVH="$OUT/overhead.jsonl"
REPS=${REPS:-5}; [ "$MODE" = smoke ] && REPS=1
for rep in $(seq 1 "$REPS"); do
  for r in ranges no-ranges; do
    left || break 2
    python3 -m nvtx_hooks.capture.workload --nproc "$NP" --cycles 1500 --warmup 50 --"$r" 2>/dev/null \
      | grep '^{"rank"' | sed "s/^{/{\"nsys\": false, \"rep\": $rep, /" >> "$OVH"
  done
done
log "overhead without nsys done"
NREPS=${NREPS:-3}; [ "$MODE" = smoke ] && NREPS=1
for rep in $(seq 1 "$NREPS"); do
  for r in ranges no-ranges; do
    left || break 2
    python3 -m nvtx_hooks.capture trace --force -o "$W/ovh" -- \
      python3 -m nvtx_hooks.capture.workload --nproc "$NP" --cycles 1500 --warmup 50 --"$r" 2>/dev/null \
      | grep '^{"rank"' | sed "s/^{/{\"nsys\": true, \"rep\": $rep, /" >> "$OVH"
  done
done
log "overhead under nsys done"
if [ -f nvtx_hooks/bench.py ] && left; then
  log "nvtx_hooks.bench without and under nsys"
  timeout 120 python3 -m nvtx_hooks.bench > "$OUT/bench_plain.txt" 2>&1
  timeout 180 python3 -m nvtx_hooks.capture trace --force --capture all -o "$W/bench" -- \
    python3 -m nvtx_hooks.bench > "$OUT/bench_nsys.txt" 2>&1
fi

# scrub, check, compress, pack
cd "$W" || exit 1
mkdir -p pack
for f in *.sqlite; do
  case $f in ovh.sqlite|bench.sqlite|*.scrubbed.sqlite) continue;; esac
  n=${f%.sqlite}
  python3 -m nvtx_hooks.capture scrub "$f" -o "pack/$n.sqlite" --force --check PATH= --check HOME= \
    --check "$REPO" >> "$OUT/log.txt" 2>&1 || log "scrub check failed for $n"
  xz -T0 -9 -f "pack/$n.sqlite"
  cp "$n".manifest.json "$n"_*.csv "$n.stdout" pack/ 2>/dev/null
done
ls -la pack >> "$OUT/log.txt"
du -b *.sqlite *.nsys-rep >> "$OUT/log.txt" 2>&1
tar -cf "$OUT/captures.tar" -C pack .
log "done"
