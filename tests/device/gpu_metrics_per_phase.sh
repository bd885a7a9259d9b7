#!/usr/bin/env bash
# Hardware utilisation per phase from nsys GPU-metrics sampling: one capture with GPU metrics of a
# schedule whose verify is memory-bound at batch 1 and compute-bound at batch 128, and the cost of sampling:
# repeated interleaved runs under nsys without and with --gpu-metrics-devices at two frequencies.
#
#   NPROC=1 bash tests/device/gpu_metrics_per_phase.sh      # from the repo root on the GPU machine; about 2 minutes
#
#   tp1_gpumetrics_graph   3 steps, schedule 1:40,16:40,128:40, accept rate 0.7, graph-level CUDA-graph trace,
#                          --capture api (the profiled loop only), GPU metrics sampled at 20 kHz (50 µs)
#   tp1_gpumetrics_cost.jsonl  REPS × {none, 20 kHz, 100 kHz}: the workload's host-measured period per segment
#                              under nsys (rotated order per repetition), "freq": 0 = no GPU metrics
# Out: i25.tar (the capture .sqlite.xz, manifest, stdout, the cost JSONL), log lines in log.txt.
set -u
NPROC=${NPROC:-1}
REPS=${REPS:-3}
W=${W:-/tmp/i25}
. tests/device/setup.sh
TP=tp$NPROC
versions
"$NSYS" profile --help 2>&1 | grep -A6 -- '--gpu-metrics-freq' >> "$OUT/log.txt"
DEVS=$(seq -s, 0 $((NPROC - 1)))
WL=(--steps 3 --schedule 1:40,16:40,128:40 --accept-rate 0.7 --host-wait spin)
gm() { [ "$1" = 0 ] && return; echo "--gpu-metrics-devices=$DEVS --gpu-metrics-frequency=$1"; }

name="${TP}_gpumetrics_graph"
log "capture $name"
timeout 180 python3 -m nvtx_hooks.capture trace --capture api --force --cuda-graph-trace graph \
  --nsys-arg "$(gm 20000)" -o "$W/$name" -- \
  python3 -m nvtx_hooks.capture.workload --nproc "$NPROC" "${WL[@]}" > "$W/$name.stdout" 2>&1
log "  rc=$? $(grep -h '^{"rank"' "$W/$name.stdout" | cut -c1-160)"
pack "$name"
sqlite3 "$W/$name.sqlite" "select count(*) from GPU_METRICS; select metricId, metricName from TARGET_INFO_GPU_METRICS" \
  >> "$OUT/log.txt" 2>&1 || python3 - "$W/$name.sqlite" >> "$OUT/log.txt" 2>&1 <<'PY'
import sqlite3, sys
c = sqlite3.connect(sys.argv[1])
print(c.execute("select count(*) from GPU_METRICS").fetchone())
print(c.execute("select * from TARGET_INFO_GPU_METRICS").fetchall())
PY

for rep in $(seq 1 "$REPS"); do
  for k in 0 1 2; do
    left || break 2
    F=(0 20000 100000); f=${F[$(( (k + rep) % 3 ))]}
    n="cost_${f}_$rep"
    opt=(); [ "$f" != 0 ] && opt=(--nsys-arg "$(gm "$f")")
    timeout 120 python3 -m nvtx_hooks.capture trace --capture api --force --cuda-graph-trace graph "${opt[@]}" \
      -o "$W/$n" -- python3 -m nvtx_hooks.capture.workload --nproc "$NPROC" "${WL[@]}" > "$W/$n.stdout" 2>&1
    grep -h '^{"rank"' "$W/$n.stdout" | sed "s/^{/{\"rep\": $rep, \"freq\": $f, /" >> "$W/${TP}_gpumetrics_cost.jsonl"
    log "cost freq $f rep $rep rc=$?"
    rm -f "$W/$n".*
  done
done
cp "$W/${TP}_gpumetrics_cost.jsonl" "$OUT/" 2>/dev/null
log "gpu_metrics_per_phase done"
cd "$OUT" && tar -cf i25.tar ./*gpumetrics* && rm -f ./*gpumetrics*
