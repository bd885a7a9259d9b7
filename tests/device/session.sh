#!/usr/bin/env bash
# One device call runs several issues' device scripts, each into its own folder; one tar comes back.
#   bash tests/device/session.sh 1    # 2 GPUs: issue 12 (complete TP2 captures, straggler), 14 (NCCL Simple/LL), 17 (v2)
#   bash tests/device/session.sh 2    # 2 GPUs: issue 13 sweep at TP2
#   bash tests/device/session.sh 3    # issue 13 sweep on one GPU (CUDA_VISIBLE_DEVICES=0)
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
  1) run i12 200 tests/device/issue12_tp2.sh
     run i14 150 tests/device/issue14_nccl.sh
     run i17 120 tests/device/issue17_v2.sh ;;
  2) export NPROC=2 BUDGET_S=300; run i13_tp2 420 tests/device/issue13_sweep.sh ;;
  3) export NPROC=1 BUDGET_S=300 CUDA_VISIBLE_DEVICES=0; run i13_tp1 420 tests/device/issue13_sweep.sh ;;
esac
tar -cf "$FINAL/batch$BATCH.tar" -C /tmp/o .
ls -la /tmp/o >> "$FINAL/summary.txt"
