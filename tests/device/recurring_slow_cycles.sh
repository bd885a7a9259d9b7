#!/usr/bin/env bash
# Recurring slow cycles, serving segments, prefill: captures of the embedded workload with known
# ground truth, on one H200. The workload's JSON record (one line on stdout, kept in each manifest's
# program_output) says which cycle indices were stalled or delayed and for how long (measured), where each
# serving segment starts, its batch size, whether a prefill ran before it and the host-measured median cycle
# period per segment: what the analysis tests compare the traces against.
#
#   NPROC=1 bash tests/device/recurring_slow_cycles.sh      # from the repo root on the GPU machine; about 4-5 minutes
#
# Needs what setup.sh needs (.devdeps/*.deb or ../shared/nsys/*.deb: libdw/libelf for nsys's importer;
# .whl/nvtx-*.whl: python nvtx); no SGLang. Workload defaults otherwise: 16 target layers, hidden 4096, bf16,
# 3 draft steps, batch 4, 5 warm-up cycles (captured: --capture all), host_overhead sleeps 300 µs.
#
#   tp1_stall_every5  --cycles 100 --stall-every 5 --stall-us 400: 400 µs of host spin outside any range
#                     before every cycle i > 0 with i % 5 == 0 (node-level CUDA-graph trace, the default)
#   tp1_delay_every4  --cycles 100 --delay-rank 0 --delay-every 4 --delay-us 500 --delay-before draft
#                     --host-wait spin: 500 µs of host spin between the cycle push and the draft push in every
#                     cycle i with i % 4 == 0 (spin, not sleep, so the injected wait is exact)
#   tp1_clean         --cycles 100 --host-wait spin: the same as tp1_delay_every4 without the delay (compare's A)
#   tp1_serve_graph   --schedule 1:40,4:40,16:40,64:40,16:40,4:40 --stall-every 10 --stall-us 1000, with
#                     --cuda-graph-trace graph: six segments, a prefill (128-token prompts) before each growth
#                     (1->4, 4->16, 16->64), none when the batch shrinks
#   tp1_serve_node    the same at node level
#   tp1_serve_plain   the same schedule without any profiler, REPS runs: the per-segment medians unprofiled
#
# Out ($OUT, 8 files): NAME.sqlite.xz per capture (scrubbed, checked free of PATH/HOME, xz -9),
# tp1_serve_plain.jsonl, log.txt, and recurring_slow_cycles_text.tar (manifests, stdouts, log).
set -u
NPROC=${NPROC:-1}
REPS=${REPS:-2}
BUDGET_S=${BUDGET_S:-420}      # no new step starts after this many seconds
W=${W:-/tmp/i23}
. tests/device/setup.sh
TP=tp$NPROC
versions
log "GPUs visible: $NP, NPROC=$NPROC"
SERVE=(--schedule 1:40,4:40,16:40,64:40,16:40,4:40 --stall-every 10 --stall-us 1000)

# cap NAME [trace options] -- [workload options]: the whole run under nsys, then a summary of the export
cap() {
  local name=$1; shift
  local targs=()
  while [ "$1" != "--" ]; do targs+=("$1"); shift; done; shift
  left || { log "skip $name (budget)"; return; }
  log "capture $name: trace --capture all ${targs[*]} -- workload --nproc $NPROC $*"
  timeout 180 python3 -m nvtx_hooks.capture trace --capture all --force -o "$W/$name" "${targs[@]}" -- \
    python3 -m nvtx_hooks.capture.workload --nproc "$NPROC" "$@" > "$W/$name.stdout" 2>&1
  log "  rc=$? $(grep -h '^{"rank"' "$W/$name.stdout" | cut -c1-300 | tr '\n' ' ')"
  python3 - "$W/$name.sqlite" >> "$OUT/log.txt" 2>&1 <<'PY'
import sqlite3, sys
con = sqlite3.connect(sys.argv[1])
q = """SELECT COALESCE(e.text, s.value) AS name, count(*) FROM NVTX_EVENTS e LEFT JOIN StringIds s ON s.id = e.textId
       WHERE e.end IS NOT NULL GROUP BY name ORDER BY name"""
print("   ranges:", ", ".join(f"{n} {c}" for n, c in con.execute(q)))
for t in ("CUPTI_ACTIVITY_KIND_KERNEL", "CUDA_GRAPH_EVENTS"):
    try:
        print(f"   {t}:", con.execute(f"SELECT count(*) FROM {t}").fetchone()[0])
    except sqlite3.Error as e:
        print(f"   {t}: {e}")
for (t,) in con.execute("SELECT text FROM DIAGNOSTIC_EVENT"):
    print("   diag:", t[:160])
PY
  pack "$name"
  log "  packed $name: $(stat -c %s "$OUT/$name.sqlite.xz" 2>/dev/null) bytes"
}

cap "${TP}_stall_every5" -- --cycles 100 --stall-every 5 --stall-us 400
cap "${TP}_delay_every4" -- --cycles 100 --delay-rank 0 --delay-every 4 --delay-us 500 --delay-before draft \
  --host-wait spin
cap "${TP}_clean" -- --cycles 100 --host-wait spin
cap "${TP}_serve_graph" --cuda-graph-trace graph -- "${SERVE[@]}"
cap "${TP}_serve_node" -- "${SERVE[@]}"

for rep in $(seq 1 "$REPS"); do
  left || break
  python3 -m nvtx_hooks.capture.workload --nproc "$NPROC" "${SERVE[@]}" 2>> "$OUT/log.txt" | grep '^{"rank"' \
    | sed "s/^{/{\"rep\": $rep, /" >> "$OUT/${TP}_serve_plain.jsonl"
  log "plain serving run $rep: $(tail -c 600 "$OUT/${TP}_serve_plain.jsonl")"
done

log "done"
ls -la "$OUT" >> "$OUT/log.txt"
cd "$OUT" || exit 1
tar -cf recurring_slow_cycles_text.tar ./*.manifest.json ./*.stdout.txt log.txt ./*.jsonl 2>/dev/null
rm -f ./*.manifest.json ./*.stdout.txt
ls -la
