#!/usr/bin/env bash
# The step sweep (probe effect, seam causes, what-if): captures of the embedded workload on the GPU machine.
#
#   NPROC=1 bash tests/device/probe_step_sweep.sh      # one H200 (about 4-5 minutes)
#   NPROC=2 bash tests/device/probe_step_sweep.sh      # two H200s, TP2 (about 5-6 minutes)
#
# Run from the repo root there; results in $OUT (default /tmp/spectrace-out): probe_step_sweep_tpN.tar +
# probe_step_sweep_tpN_log.txt.
# Needs what tests/device/capture_all.sh needs: .devdeps/*.deb (libdw/libelf for nsys's importer; else the debs
# in ../shared/nsys) and .whl/nvtx-*.whl (python nvtx). Workload: LAYERS target layers (default 32, as in the
# criteria), batch 4, 1 draft layer per step, CYCLES measured cycles after 5 warm-up ones (whole run captured).
#
#   1. two-pass captures `spectrace trace --passes graph,node,plain` at 3 and at 1 draft steps:
#      tpN_s3_graph / tpN_s3_node / tpN_s3_plain (and s1): graph- and node-level CUDA-graph tracing, and a run
#      without any profiler whose cycles/s line is kept in tpN_sS_plain.manifest.json;
#   2. the host-sleep variant (the host reads the accept length with .item() and sleeps 1 ms every cycle):
#      tpN_sleep_graph / tpN_sleep_node (3 steps, --host-us 1000);
#   3. runs without a profiler, REPS times each at 1 and 3 steps, PLAIN_CYCLES cycles: plain.jsonl;
#   4. budget left: graph-level repeats at 3 and 1 steps (tpN_s3r_graph, tpN_s1r_graph: run-to-run noise) and
#      graph-level captures at 2 and 4 steps (tpN_s2_graph, tpN_s4_graph) for the sweep table.
# Each export is scrubbed (`spectrace scrub`, checked free of PATH/HOME/the repo path) and xz -9'd.
set -u
NPROC=${NPROC:-1}
LAYERS=${LAYERS:-32}
CYCLES=${CYCLES:-60}
PLAIN_CYCLES=${PLAIN_CYCLES:-1000}
REPS=${REPS:-3}
BUDGET_S=${BUDGET_S:-420}      # no new step starts after this many seconds
OUT=${OUT:-/tmp/spectrace-out}
REPO=$(pwd)
TP=tp$NPROC
W=/tmp/probe_step_sweep_$TP
mkdir -p "$W/pack" "$OUT"
LOG="$OUT/probe_step_sweep_${TP}_log.txt"
T0=$(date +%s)
log() { echo "== $(( $(date +%s) - T0 ))s $*" | tee -a "$LOG"; }
left() { [ $(( $(date +%s) - T0 )) -lt "$BUDGET_S" ]; }

debs=(.devdeps/*.deb); [ -e "${debs[0]}" ] || debs=(../shared/nsys/*.deb)
for f in "${debs[@]}"; do dpkg -x "$f" /tmp/dw; done
export LD_LIBRARY_PATH=/tmp/dw/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$REPO
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export NSYS=${NSYS:-/opt/nvidia/nsight-compute/2025.3.1/host/target-linux-x64/nsys}
{
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  "$NSYS" --version
  python3 -c 'import torch, nvtx; print("torch", torch.__version__, "cuda", torch.version.cuda)'
} >> "$LOG" 2>&1
NP=$(python3 -c 'import torch; print(torch.cuda.device_count())')
log "GPUs visible: $NP, NPROC=$NPROC, LAYERS=$LAYERS, CYCLES=$CYCLES"
[ "$NP" -ge "$NPROC" ] || { log "need $NPROC GPUs"; exit 1; }
WL=(python3 -m nvtx_hooks.capture.workload --nproc "$NPROC" --layers "$LAYERS")

# cap NAME PASSES [workload options]: spectrace trace --passes PASSES over the whole run
cap() {
  local name=$1 passes=$2; shift 2
  left || { log "skip $name (budget)"; return; }
  log "capture $name --passes $passes: workload $*"
  python3 -m nvtx_hooks.capture trace --force --capture all --passes "$passes" -o "$W/$name" -- \
    "${WL[@]}" --cycles "$CYCLES" "$@" > "$W/$name.out" 2>&1
  log "  rc=$? $(grep -h '^{"rank"' "$W/$name.out" | tr '\n' ' ')"
  grep -h "Not all\|error" "$W/$name.out" | head -5 >> "$LOG"
}

cap "${TP}_s3" graph,node,plain --steps 3
cap "${TP}_s1" graph,node,plain --steps 1
cap "${TP}_sleep" graph,node --steps 3 --host-us 1000

for rep in $(seq 1 "$REPS"); do
  for s in 1 3; do
    left || break 2
    "${WL[@]}" --cycles "$PLAIN_CYCLES" --warmup 50 --steps "$s" 2>/dev/null | grep '^{"rank"' \
      | sed "s/^{/{\"rep\": $rep, /" >> "$W/pack/plain.jsonl"
  done
done
log "plain runs: $(wc -l < "$W/pack/plain.jsonl" 2>/dev/null) lines"

cap "${TP}_s3r" graph --steps 3     # repeats: the run-to-run noise of the measured periods
cap "${TP}_s1r" graph --steps 1
cap "${TP}_s2" graph --steps 2
cap "${TP}_s4" graph --steps 4

cd "$W" || exit 1
for f in *.sqlite; do
  [ -e "$f" ] || continue
  n=${f%.sqlite}
  python3 -m nvtx_hooks.capture scrub "$f" -o "pack/$n.sqlite" --force --check PATH= --check HOME= \
    --check "$REPO" >> "$LOG" 2>&1 || log "scrub check failed for $n"
  xz -T0 -9 -f "pack/$n.sqlite"
done
cp ./*.manifest.json pack/ 2>/dev/null
ls -la pack >> "$LOG"
tar -cf "$OUT/probe_step_sweep_${TP}.tar" -C pack .
log "done: $OUT/probe_step_sweep_${TP}.tar"
