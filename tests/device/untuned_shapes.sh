#!/usr/bin/env bash
# Validation captures: shapes the analysis was NOT tuned on (issues 37, 38), each with the workload's JSON record
# as the truth, on one H200 in one device call (no new step after BUDGET_S, default 330 s; each step ≤ 100 s):
#
#   bash tests/device/untuned_shapes.sh        # from the repo root; carry .devdeps and .whl
#
#   tp1_v_mix     SGLang's own scheduler range names, batch 8, 2 steps, other scheduler times
#                 (recv_requests 90, process_input_requests 30, get_next_batch_to_run 220, process_batch_result 120 µs),
#                 +300 µs in process_input_requests every 5th cycle, a level shift +250 µs in process_batch_result
#                 from cycle 110 on, 220 cycles (two shapes at once)
#   tp1_v_stalls  the hooks' ranges, batch 2, 4 steps, CPU sampling, --busy-us 200, random stalls +900 µs in
#                 get_next_batch_to_run with p = 0.1 (seeded), 220 cycles
#   tp1_v_adapt   adaptive 4:2,16:0,48:3,4:2 (50 cycles each), per-position acceptance 0.9,0.6,0.3, v2 accept
#                 marks, host_overhead 200 µs spun, graph-level trace
#   tp1_v_plain.jsonl  2 runs without a profiler of batch 4, 16, 48 at 0..3 steps, 40 cycles each: the what-if truth
#
# Out ($OUT): v.tar (the captures: NAME.sqlite.xz scrubbed, NAME.manifest.json, NAME.stdout.txt; the jsonl), log.txt.
set -u
NPROC=1
REPS=${REPS:-2}
BUDGET_S=${BUDGET_S:-330}
FINAL=${OUT:-/tmp/spectrace-out}
OUT=${STAGE:-/tmp/v_stage}
W=${W:-/tmp/v_cap}
rm -rf "$OUT" "$W"
mkdir -p "$FINAL" "$OUT" "$W"
. tests/device/setup.sh
versions
cap tp1_v_mix -- --scheduler --v2 --batch 8 --steps 2 --cycles 220 --scheduler-ranges sglang \
  --scheduler-us recv_requests=90,process_input_requests=30,get_next_batch_to_run=220,process_batch_result=120 \
  --extra process_input_requests:300:every=5 --extra process_batch_result:250:from=110
cap tp1_v_stalls --cpu-sampling -- --scheduler --v2 --batch 2 --steps 4 --cycles 220 --busy-us 200 \
  --extra get_next_batch_to_run:900:p=0.1
PROFILE=(--accept-profile 0.9,0.6,0.3 --v2 --host-us 200 --host-wait spin)
cap tp1_v_adapt --cuda-graph-trace graph -- --adaptive 4:2:50,16:0:50,48:3:50,4:2:50 "${PROFILE[@]}"
for rep in $(seq 1 "$REPS"); do
  left || { log "skip plain rep $rep (budget)"; break; }
  segs=""
  for bs in 4 16 48; do for k in 0 1 2 3; do segs="$segs,$bs:$(( (k + rep - 1) % 4 )):40"; done; done
  timeout 100 python3 -m nvtx_hooks.capture.workload --nproc "$NPROC" --adaptive "${segs#,}" "${PROFILE[@]}" \
    2>> "$OUT/log.txt" | grep '^{"rank"' | sed "s/^{/{\"rep\": $rep, /" >> "$OUT/tp1_v_plain.jsonl"
  log "plain rep $rep"
done
wait
log "done"
cd "$OUT" && tar -cf "$FINAL/v.tar" ./*.sqlite.xz ./*.manifest.json ./*.stdout.txt ./*.jsonl 2>/dev/null
cp log.txt "$FINAL/log.txt"; ls -la "$FINAL"
