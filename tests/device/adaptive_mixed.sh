#!/usr/bin/env bash
# Issue 38, item 3: one batch size measured at SEVERAL step counts in one run (what SGLang's adaptive slot does when
# the acceptance moves its EMA across a threshold): the what-if per batch size joins them as measured points. One
# H200, one device call (no new step after BUDGET_S, default 300 s; each step ≤ 100 s):
#
#   bash tests/device/adaptive_mixed.sh        # from the repo root; carry .devdeps and .whl
#
#   tp1_adaptive_mixed        adaptive 8:3,8:1,32:1,32:0,8:4 (50 cycles each): batch 8 at 1, 3 and 4 steps, 32 at 0
#                             and 1; per-position acceptance 0.85,0.7,0.55,0.4, v2 accept marks, host_overhead 300 µs
#                             spun; node-level graph trace
#   tp1_adaptive_mixed_graph  the same, --cuda-graph-trace graph
#   tp1_adaptive_mixed_plain.jsonl  3 runs without a profiler of batch 8 and 32 at 0..4 steps, 40 cycles each: the
#                             what-if truth
#
# Out ($OUT): m.tar (NAME.sqlite.xz scrubbed, NAME.manifest.json, NAME.stdout.txt; the jsonl), log.txt.
set -u
NPROC=1
REPS=${REPS:-3}
BUDGET_S=${BUDGET_S:-300}
FINAL=${OUT:-/tmp/spectrace-out}
OUT=${STAGE:-/tmp/m_stage}
W=${W:-/tmp/m_cap}
rm -rf "$OUT" "$W"
mkdir -p "$FINAL" "$OUT" "$W"
. tests/device/setup.sh
versions
PROFILE=(--accept-profile 0.85,0.7,0.55,0.4 --v2 --host-us 300 --host-wait spin)
SCHED=8:3:50,8:1:50,32:1:50,32:0:50,8:4:50
cap tp1_adaptive_mixed -- --adaptive "$SCHED" "${PROFILE[@]}"
cap tp1_adaptive_mixed_graph --cuda-graph-trace graph -- --adaptive "$SCHED" "${PROFILE[@]}"
for rep in $(seq 1 "$REPS"); do
  left || { log "skip plain rep $rep (budget)"; break; }
  segs=""
  for bs in 8 32; do for k in 0 1 2 3 4; do segs="$segs,$bs:$(( (k + rep - 1) % 5 )):40"; done; done
  timeout 100 python3 -m nvtx_hooks.capture.workload --nproc "$NPROC" --adaptive "${segs#,}" "${PROFILE[@]}" \
    2>> "$OUT/log.txt" | grep '^{"rank"' | sed "s/^{/{\"rep\": $rep, /" >> "$OUT/tp1_adaptive_mixed_plain.jsonl"
  log "plain rep $rep"
done
wait
log "done"
cd "$OUT" && tar -cf "$FINAL/m.tar" ./*.sqlite.xz ./*.manifest.json ./*.stdout.txt ./*.jsonl 2>/dev/null
cp log.txt "$FINAL/log.txt"; ls -la "$FINAL"
