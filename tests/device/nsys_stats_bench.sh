#!/usr/bin/env bash
# How long NVIDIA's own NVTX projection reports take on inflated TP8 traces (for BENCHMARKS.md).
# Run on the GPU machine from the repo root: bash tests/device/nsys_stats_bench.sh  (needs .devdeps/)
set -u
OUT=${OUT:-/tmp/spectrace-out}; mkdir -p "$OUT"
for f in .devdeps/*.deb; do dpkg -x "$f" /tmp/dw; done
export LD_LIBRARY_PATH=/tmp/dw/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
NSYS=${NSYS:-/opt/nvidia/nsight-compute/2025.3.1/host/target-linux-x64/nsys}
"$NSYS" --version | tee -a "$OUT/nsys_bench.txt"
nproc | sed 's/^/cpus: /' | tee -a "$OUT/nsys_bench.txt"
T0=$(date +%s)
run() {  # run NAME COPIES REPORT LIMIT_S
  local src=/tmp/inf_$2.sqlite
  [ -f "$src" ] || python3 -m bench.inflate .devdeps/tp2_probe_node.sqlite "$src" --rank-groups 4 --time-copies "$2" 2>&1 | tr '\n' ' '
  local k; k=$(python3 -c "import sqlite3;print(sqlite3.connect('$src').execute('select count(*) from CUPTI_ACTIVITY_KIND_KERNEL').fetchone()[0])")
  local t=$(date +%s.%N)
  timeout "$4" "$NSYS" stats --report "$3" --format csv --force-export=false -o "/tmp/$1" "$src" > /tmp/$1.log 2>&1
  local rc=$?
  local dt; dt=$(python3 -c "print(round($(date +%s.%N)-$t,1))")
  echo "kernels=$k report=$3 rc=$rc seconds=$dt (limit $4)" | tee -a "$OUT/nsys_bench.txt"
  tail -2 /tmp/$1.log >> "$OUT/nsys_bench.txt"
}
run p1 1 nvtx_gpu_proj_sum 120
run t1 1 nvtx_gpu_proj_trace 120
run p2 2 nvtx_gpu_proj_sum 150
left=$(( 560 - $(date +%s) + T0 ))
[ $left -gt 60 ] && run p17 17 nvtx_gpu_proj_sum $left
echo "total $(( $(date +%s) - T0 ))s" | tee -a "$OUT/nsys_bench.txt"
