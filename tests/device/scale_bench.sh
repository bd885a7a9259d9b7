#!/usr/bin/env bash
# spectrace vs the raw column read vs NVIDIA's `nsys stats`, all on one machine: the lent H200 host
# (16 CPUs). For BENCHMARKS.md. Run from the repo root there, carrying .devdeps (libdw/libelf debs and
# tp2_probe_node.sqlite) and .whlbench (polars, polars-runtime-32, adbc-driver-manager/sqlite wheels
# for CPython 3.12; pyarrow is already there):
#   bash tests/device/scale_bench.sh
# .whlbench was filled here with (58 MiB; with the tree and .devdeps it stays under the 64 MiB a call may carry):
#   pip download --no-deps --only-binary=:all: --python-version 3.12 --platform manylinux2014_x86_64 \
#     --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 -d .whlbench \
#     polars==2.1.0 polars-runtime-32==2.1.0 adbc-driver-sqlite==1.13.0 adbc-driver-manager==1.13.0
set -u
OUT=${OUT:-/tmp/spectrace-out}; mkdir -p "$OUT"
LOG="$OUT/scale_bench.txt"
T0=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whlbench/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
for f in .devdeps/*.deb; do dpkg -x "$f" /tmp/dw; done
export LD_LIBRARY_PATH=/tmp/dw/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
NSYS=${NSYS:-/opt/nvidia/nsight-compute/2025.3.1/host/target-linux-x64/nsys}
export PATH=$(dirname "$NSYS"):$PATH
{ nsys --version; echo "cpus: $(nproc)"; python3 -c "import polars, sys; print('python', sys.version.split()[0], 'polars', polars.__version__)"; } | tee -a "$LOG"
B="python3 -m bench.bench --src .devdeps/tp2_probe_node.sqlite --out /tmp/bench"
# 1 M kernels: every contender, nsys included (3 rounds: a warm-up and 2 counted).
$B --kernels 1000000 --runs 2 --json "$OUT/bench_1m.json" 2>>"$OUT/bench_stderr.txt" | tee -a "$LOG"
# 10 M kernels: ours and the raw read (nsys once, below).
$B --kernels 10000000 --runs 2 --no-nsys --memory-max 1000000 --json "$OUT/bench_10m.json" 2>>"$OUT/bench_stderr.txt" | tee -a "$LOG"
# NVIDIA's projection summary once per size, with its numbers kept to check ours against.
for f in /tmp/bench/inflated_4x17_*.sqlite /tmp/bench/inflated_4x166_*.sqlite; do
  n=$(basename "$f" .sqlite); left=$(( 570 - $(date +%s) + T0 ))
  [ $left -lt 20 ] && { echo "$n: no time left for nsys stats" | tee -a "$LOG"; continue; }
  t=$(date +%s.%N)
  timeout $left nsys stats --report nvtx_gpu_proj_sum --format csv --force-export=false -o "/tmp/$n" "$f" > "/tmp/$n.nsys.log" 2>&1
  rc=$?
  echo "$n: nsys stats --report nvtx_gpu_proj_sum rc=$rc seconds=$(python3 -c "print(round($(date +%s.%N)-$t,1))") (limit $left)" | tee -a "$LOG"
  cp /tmp/"$n"_nvtx_gpu_proj_sum.csv "$OUT/" 2>/dev/null
  python3 -m analyze.cli analyze "$f" --format json -q > "$OUT/$n.spectrace.json" 2>/dev/null
done
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$LOG"
