#!/usr/bin/env bash
# One device call runs several device scripts, each into its own folder; one tar comes back.
#   bash tests/device/session.sh 1    # 2 GPUs: complete TP2 captures and a straggler, NCCL Simple/LL, SGLang v2
#   bash tests/device/session.sh 2    # 2 GPUs: the probe step sweep at TP2
#   bash tests/device/session.sh 3    # the probe step sweep on one GPU (CUDA_VISIBLE_DEVICES=0)
# Out: $OUT/batchN.tar (every script's $OUT and console) and $OUT/summary.txt (exit codes, times).
set -u
BATCH=$1
FINAL=${OUT:-/tmp/spectrace-out}
mkdir -p "$FINAL" /tmp/o
T0=$(date +%s)
run() {  # run NAME SECONDS SCRIPT
  local name=$1 limit=$2 script=$3
  mkdir -p "/tmp/o/$name"
  OUT=/tmp/o/$name timeout "$limit" bash "$script" > "/tmp/o/$name.console" 2>&1
  echo "$name rc=$? at $(( $(date +%s) - T0 ))s" >> "$FINAL/summary.txt"
}
case $BATCH in
  1) run tp2_complete 200 tests/device/tp2_complete_and_straggler.sh
     run nccl 150 tests/device/nccl_simple_vs_ll.sh
     run v2 120 tests/device/sglang_v2_accept_marks.sh ;;
  2) export NPROC=2 BUDGET_S=300; run probe_sweep_tp2 420 tests/device/probe_step_sweep.sh ;;
  3) export NPROC=1 BUDGET_S=300 CUDA_VISIBLE_DEVICES=0; run probe_sweep_tp1 420 tests/device/probe_step_sweep.sh ;;
esac
tar -cf "$FINAL/batch$BATCH.tar" -C /tmp/o .
ls -la /tmp/o >> "$FINAL/summary.txt"
