#!/usr/bin/env bash
# The step sweep with a deterministic host (`--host-wait spin`: host_overhead's 300 µs is a busy loop,
# as a scheduler's CPU work, instead of a sleep whose wake-up varied ±35 µs from run to run), repeated and
# interleaved (s1 s2 s3 s4, s1 s2 s3 s4, ...) so that run-to-run noise shows and drifts spread evenly.
# About 5-6 minutes on two H200s. Results under $OUT: probe_spin_host.tar (tpN_rR_sS_{graph,node,plain}.sqlite.xz +
# manifests) and log.txt. Check here: python -m bench.probe_check DIR (after `tar -xf`).
#   TP2: REPS graph-level captures at 1..4 steps (CYCLES cycles each); in the first repetition, 1 and 3 steps
#        also get a node-level pass and a run without a profiler (--passes graph,node,plain).
#   TP1 (one GPU): REPS1 graph-level captures at 1..4 steps.
set -u
. tests/device/setup.sh
REPS=${REPS:-3}
REPS1=${REPS1:-2}
CYCLES=${CYCLES:-200}
BUDGET_S=${BUDGET_S:-480}
nvidia-smi topo -m >> "$OUT/log.txt" 2>&1
cap() {  # cap NAME NPROC PASSES STEPS
  left || { log "skip $1 (budget)"; return; }
  log "capture $1 --passes $3 (nproc $2, steps $4)"
  timeout 120 python3 -m nvtx_hooks.capture trace --force --capture all --passes "$3" -o "$W/$1" -- \
    python3 -m nvtx_hooks.capture.workload --nproc "$2" --layers 32 --steps "$4" --cycles "$CYCLES" \
    --host-wait spin > "$W/$1.stdout" 2>&1
  log "  rc=$? $(grep -h '"cycles_per_s"' "$W/$1.stdout" | grep -o '"cycles_per_s": [0-9.]*' | tr '\n' ' ')"
  for p in ${3//,/ }; do
    [ "$p" = plain ] || pack "$1_$p"
    cp "$W/$1_$p.manifest.json" "$OUT/" 2>/dev/null
  done
  return 0
}
for r in $(seq 1 "$REPS"); do
  for s in 1 2 3 4; do
    passes=graph
    if [ "$r" = 1 ] && { [ "$s" = 1 ] || [ "$s" = 3 ]; }; then passes=graph,node,plain; fi
    cap "tp2_r${r}_s${s}" 2 "$passes" "$s"
  done
done
for r in $(seq 1 "$REPS1"); do
  for s in 1 2 3 4; do CUDA_VISIBLE_DEVICES=0 cap "tp1_r${r}_s${s}" 1 graph "$s"; done
done
rm -f "$OUT"/*.stdout.txt
tar -cf "$OUT/probe_spin_host.tar" -C "$OUT" $(cd "$OUT" && ls *.xz *.manifest.json) && rm -f "$OUT"/*.xz "$OUT"/*.manifest.json
log done
