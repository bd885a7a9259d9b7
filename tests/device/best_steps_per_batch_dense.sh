#!/usr/bin/env bash
# The best draft-step count per batch size, second sweep: a denser serving schedule, so that the verify curve
# measured across segments at 3 steps has points at the verified tokens per cycle that other step counts of the other segments reach
# (batch b at s steps verifies b × (s + 1) tokens: batch 128 at 1, 2, 4 steps ↔ batch 64, 96, 160 at 3 steps).
#
#   NPROC=1 bash tests/device/best_steps_per_batch_dense.sh     # from the repo root on the GPU machine; about 4 minutes
#   REPS=1 CAPS=3 TAG=_r1 bash tests/device/best_steps_per_batch_dense.sh   # one more round: plain runs, then tp1_dense_s3_graph_r1
#   REPS=2 CAPS=3 TAG=_dl1 WL_EXTRA="--decode-log-interval 10" bash tests/device/best_steps_per_batch_dense.sh  # with
#       the decode logs that whatif --unprofiled-log reads (tp1_dense_plain_dl1_s3_rep1.log, ...)
#   REPS=0 CAPS="3 4" TAG=_gm TRACE_OPTS="--gpu-metrics --capture api" bash tests/device/best_steps_per_batch_dense.sh  # clocks
#   KIND=cover ...  # the schedule COVER below, named tp1_cover_*: with every batch size whose verified
#       tokens at 3 steps are the tokens another batch size verifies at 1, 2 or 4 steps, b x (s + 1) / 4
#   for i in 1 2 3; do REPS=2 CAPS=3 TAG=_cv$i KIND=cover WL_EXTRA="--decode-log-interval 5" bash tests/device/best_steps_per_batch_dense.sh; done
#   KIND=serve ...  # SERVE below: the same batch sizes, each visited three times for 10 cycles, shuffled
#
#   tp1_dense_sS_graph      S = 3 (then 2, 4, 1 while the budget lasts): the whole run under nsys, graph-level
#   tp1_dense_plain.jsonl   REPS runs of each step count 1..4 without a profiler, interleaved (order rotates per
#                           repetition): per segment the host-measured median period, the ground truth
# Out: i24.tar (captures .sqlite.xz, manifests, stdouts, the plain JSONL), log lines in log.txt.
set -u
NPROC=${NPROC:-1}
REPS=${REPS:-4}
CAPS=${CAPS:-3 2 4 1}
TAG=${TAG:-}
W=${W:-/tmp/i24d}
. tests/device/setup.sh
TP=tp$NPROC
versions
KIND=${KIND:-dense}
COVER=1:30,2:30,4:30,6:30,8:30,10:30,12:30,16:30,18:30,20:30,24:30,30:30,32:30,36:30,40:30,48:30,60:30,64:30,72:30,80:30,96:30,120:30,128:30,160:30,200:30
# serve: the cover schedule's 25 batch sizes visited three times each for 10 cycles, in a shuffled order (Python's
# random.Random(0).shuffle of the 75 visits, no batch size twice in a row), as a serving run wanders
SERVE=128:10,4:10,8:10,30:10,128:10,36:10,32:10,2:10,80:10,60:10,10:10,48:10,16:10,160:10,40:10,64:10,30:10,200:10,16:10,24:10,48:10,1:10,12:10,18:10,8:10,1:10,60:10,32:10,2:10,160:10,4:10,1:10,6:10,12:10,120:10,6:10,80:10,24:10,36:10,96:10,40:10,128:10,200:10,24:10,10:10,120:10,72:10,8:10,120:10,20:10,80:10,20:10,64:10,16:10,96:10,20:10,60:10,72:10,40:10,12:10,160:10,18:10,72:10,64:10,4:10,96:10,30:10,36:10,2:10,32:10,48:10,18:10,10:10,6:10,200:10
[ "$KIND" = cover ] && SCHED=${SCHED:-$COVER}
[ "$KIND" = serve ] && SCHED=${SCHED:-$SERVE}
WL=(--schedule ${SCHED:-1:30,4:30,8:30,16:30,24:30,32:30,48:30,64:30,96:30,128:30,160:30} --accept-rate 0.7 --host-wait spin ${WL_EXTRA:-})

plain_sweep "$W/${TP}_${KIND}_plain$TAG.jsonl" "${WL[@]}"
cp "$W/${TP}_${KIND}_plain$TAG.jsonl" "$W/${TP}_${KIND}_plain${TAG}"_s*_rep*.log "$OUT/" 2>/dev/null

for S in $CAPS; do
  left || { log "skip steps $S (budget)"; continue; }
  name="${TP}_${KIND}_s${S}_graph$TAG"
  log "capture $name"
  timeout 120 python3 -m nvtx_hooks.capture trace --capture all --force --cuda-graph-trace graph ${TRACE_OPTS:-} \
    -o "$W/$name" -- \
    python3 -m nvtx_hooks.capture.workload --nproc "$NPROC" --steps "$S" "${WL[@]}" > "$W/$name.stdout" 2>&1
  log "  rc=$? $(grep -h '^{"rank"' "$W/$name.stdout" | cut -c1-160)"
  pack "$name"
done
log "best_steps_per_batch $KIND done"
cd "$OUT" && tar -cf "i24$TAG.tar" ./*"$KIND"* ./*.manifest.json ./*.stdout.txt 2>/dev/null && rm -f ./*"$KIND"* ./*.manifest.json ./*.stdout.txt
