# Sourced by the device scripts: nsys's importer libraries, python nvtx, NCCL safety, helpers.
# Needs (git-ignored, carried): .devdeps/*.deb (libdw/libelf from ../shared/nsys), .whl/nvtx-*.whl (cp312).
OUT=${OUT:-/tmp/spectrace-out}
REPO=$(pwd)
W=${W:-/tmp/cap}
mkdir -p "$W" "$OUT"
T0=${T0:-$(date +%s)}
log() { echo "== $(( $(date +%s) - T0 ))s $*" | tee -a "$OUT/log.txt"; }
# left: whether a new step may start (fewer than BUDGET_S seconds, default 420, since T0)
left() { [ $(( $(date +%s) - T0 )) -lt "${BUDGET_S:-420}" ]; }
for f in .devdeps/*.deb shared/nsys/*.deb ../shared/nsys/*.deb; do [ -f "$f" ] && dpkg -x "$f" /tmp/dw; done
export LD_LIBRARY_PATH=/tmp/dw/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >/dev/null 2>&1
fi
export PYTHONPATH=/tmp/site:$REPO
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export NSYS=${NSYS:-/opt/nvidia/nsight-compute/2025.3.1/host/target-linux-x64/nsys}
NP=${NP:-$(python3 -c 'import torch; print(torch.cuda.device_count())')}

# versions: the GPU and driver, nsys, torch, CUDA and NCCL a run used, into the log
versions() {
  {
    nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
    "$NSYS" --version
    python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "nccl",
                torch.cuda.nccl.version(), "gpus", torch.cuda.device_count())'
  } >> "$OUT/log.txt" 2>&1
}

# pack NAME: scrub W/NAME.sqlite into OUT/NAME.sqlite.xz (with its manifest and the workload's stdout)
pack() {
  python3 -m nvtx_hooks.capture scrub "$W/$1.sqlite" -o "$W/$1.scrubbed.sqlite" --force --check PATH= --check HOME= \
    >> "$OUT/log.txt" 2>&1 && xz -9 -c "$W/$1.scrubbed.sqlite" > "$OUT/$1.sqlite.xz"
  cp "$W/$1.manifest.json" "$OUT/" 2>/dev/null
  cp "$W/$1.stdout" "$OUT/$1.stdout.txt" 2>/dev/null
  return 0
}

# plain_sweep FILE WORKLOAD_ARGS...: REPS rounds of the workload at 1..4 draft steps without a profiler, the order
# rotating per round (round r: steps r+1, r+2, ... mod 4); each rank's JSON record, with "rep", appended to FILE;
# a run's decode log lines (workload --decode-log-interval) in FILE's name with _sS_repR.log instead of .jsonl.
# Stops when the budget (left) is spent.
plain_sweep() {
  local file=$1 rep k S
  shift
  for rep in $(seq 1 "$REPS"); do
    for k in 0 1 2 3; do
      left || return 0
      S=$(( (k + rep) % 4 + 1 ))
      python3 -m nvtx_hooks.capture.workload --nproc "$NPROC" --steps "$S" "$@" 2> "$file.err" \
        | grep '^{"rank"' | sed "s/^{/{\"rep\": $rep, /" >> "$file"
      # the workload's decode log lines (--decode-log-interval), one file per run; the rest to log.txt
      grep 'Decode batch' "$file.err" > "${file%.jsonl}_s${S}_rep$rep.log" || rm -f "${file%.jsonl}_s${S}_rep$rep.log"
      grep -v 'Decode batch' "$file.err" >> "$OUT/log.txt"; rm -f "$file.err"
      log "plain steps $S rep $rep"
    done
  done
}

# cap NAME [trace options] -- [workload options]: the workload (NPROC ranks) under `spectrace trace --capture all`,
# each step bounded to 100 s, its record logged, packed (scrub + xz into OUT) in the background while the next runs
cap() {
  local name=$1; shift
  local targs=()
  while [ "$1" != "--" ]; do targs+=("$1"); shift; done; shift
  left || { log "skip $name (budget)"; return; }
  log "capture $name: trace --capture all ${targs[*]} -- workload $*"
  timeout 100 python3 -m nvtx_hooks.capture trace --capture all --columnar none --force -o "$W/$name" \
    "${targs[@]}" -- python3 -m nvtx_hooks.capture.workload --nproc "$NPROC" "$@" > "$W/$name.stdout" 2>&1
  log "  rc=$? $(grep -h '^{"rank"' "$W/$name.stdout" | cut -c1-200)"
  ( renice -n 19 "$BASHPID" >/dev/null 2>&1; pack "$name" ) &
}
