#!/usr/bin/env bash
# How much do separate runs of the same TP2 workload differ? Graph-level captures of the 32-layer
# workload at 1..4 draft steps, REPS times each (about 2-3 minutes on two H200s). Results under $OUT:
# tp2_rN_sS_graph.sqlite.xz + manifests, log.txt. Check here: python -m bench.probe_check on them (the sweep table).
set -u
. tests/device/setup.sh
REPS=${REPS:-2}
for r in $(seq 1 "$REPS"); do
  for s in 1 2 3 4; do
    name=tp2_r${r}_s${s}_graph
    log "capture $name"
    timeout 90 python3 -m nvtx_hooks.capture trace --force --capture all --cuda-graph-trace graph -o "$W/$name" -- \
      python3 -m nvtx_hooks.capture.workload --nproc "$NP" --layers 32 --steps "$s" > "$W/$name.stdout" 2>&1
    log "  rc=$? $(grep -h '"cycles_per_s"' "$W/$name.stdout" | head -1 | grep -o '"cycles_per_s": [0-9.]*')"
    pack "$name"
  done
done
rm -f "$OUT"/*.stdout.txt
tar -cf "$OUT/probe_repeat_runs.tar" -C "$OUT" $(cd "$OUT" && ls *.xz *.manifest.json) && rm -f "$OUT"/*.xz "$OUT"/*.manifest.json
log done
