#!/usr/bin/env bash
# The best draft-step count per batch size: a serving schedule swept over 1..4 draft steps on one
# H200, so that each segment's predicted period at other step counts can be checked against runs without a
# profiler, and the best step count per batch size against the sweep's.
#
#   NPROC=1 bash tests/device/best_steps_per_batch.sh      # from the repo root on the GPU machine; about 3-4 minutes
#
# The workload: 16 target layers, hidden 4096, bf16, host work spun (--host-wait spin: no sleep wake-up noise),
# acceptance geometric (--accept-rate 0.7: each draft token accepted with p = 0.7 until the first rejection),
# schedule 1:30,8:30,32:30,128:30 (a prefill of the new requests' 128-token prompts at each growth). Verify goes
# from memory-bound (1 × (S+1) tokens) to compute-bound (128 × (S+1) tokens), so the best step count falls
# with the batch size.
#
#   tp1_sweep_sS_graph   S = 1..4: the whole run under nsys, CUDA graphs traced as graphs (one capture each)
#   tp1_sweep_plain.jsonl  REPS runs of each step count without a profiler, interleaved (the order rotates per
#                          repetition): per segment the host-measured median cycle period, the ground truth
#
# Out ($OUT, 7 files): four NAME.sqlite.xz, tp1_sweep_plain.jsonl, log.txt, best_steps_per_batch_text.tar
# (manifests, stdouts).
set -u
NPROC=${NPROC:-1}
REPS=${REPS:-3}
BUDGET_S=${BUDGET_S:-420}
W=${W:-/tmp/i24}
. tests/device/setup.sh
TP=tp$NPROC
versions
WL=(--schedule 1:30,8:30,32:30,128:30 --accept-rate 0.7 --host-wait spin)

for S in 1 2 3 4; do
  left || { log "skip steps $S (budget)"; continue; }
  name="${TP}_sweep_s${S}_graph"
  log "capture $name"
  timeout 180 python3 -m nvtx_hooks.capture trace --capture all --force --cuda-graph-trace graph -o "$W/$name" -- \
    python3 -m nvtx_hooks.capture.workload --nproc "$NPROC" --steps "$S" "${WL[@]}" > "$W/$name.stdout" 2>&1
  log "  rc=$? $(grep -h '^{"rank"' "$W/$name.stdout" | cut -c1-200)"
  pack "$name"
done

plain_sweep "$OUT/${TP}_sweep_plain.jsonl" "${WL[@]}"

log "done"
cd "$OUT" || exit 1
tar -cf best_steps_per_batch_text.tar ./*.manifest.json ./*.stdout.txt 2>/dev/null
rm -f ./*.manifest.json ./*.stdout.txt
ls -la
