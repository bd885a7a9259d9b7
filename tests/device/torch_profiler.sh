#!/usr/bin/env bash
# On 1 GPU (nvidia-h200): the same workload profiled once with nsys and once with torch.profiler, to check that
# spectrace reads the torch profiler trace to the same answers (issue 41). About 3-4 minutes.
# Run from the repo root there: bash tests/device/torch_profiler.sh      (results under $OUT)
# Needs (git-ignored, carried): .devdeps/*.deb (libdw/libelf for nsys's importer), .whl/nvtx-*.whl and
# .whl/ijson-*.whl (cp312 wheels: python nvtx for the nsys captures; ijson to scrub the torch traces), e.g.
#   pip download --no-deps --only-binary=:all: --python-version 3.12 --platform manylinux2014_x86_64 -d .whl ijson
# Runs, TP1, CUDA graphs, 60 measured cycles after 5 warm-up (REP 1, then REP 2 of each while the budget lasts):
#   tp1_nsys_rREP      nsys, straggler-free TP1 run (cudaProfilerStart/Stop window)
#   tp1_torch_rREP     torch.profiler over the same loop, spectrace's record_function names (--torch-profiler)
#   sched_nsys_rREP    nsys, the serving schedule 1:40,2:40,4:40 (prefills between the segments)
#   sched_torch_rREP   torch.profiler, the same schedule
#   tp1_native         torch.profiler, SGLang 0.5.23's native span names only (--native-spans only)
# Out ($OUT, 2 files: the device returns at most 8): log.txt (versions, each run's exit code and JSON record) and
# torch_profiler.tar: the nsys exports scrubbed (`spectrace scrub`) as NAME.sqlite.xz with NAME.manifest.json, the
# torch traces scrubbed (`spectrace scrub`: no traceName, host name, trace id or python_function paths) as
# NAME.trace.json.xz, each run's stdout as NAME.stdout.txt, and log.txt. The files are made in a stage folder
# (STAGE, default /tmp/tp_stage) and only the tar and the log are put into $OUT. Then, on the analysis machine:
#   python -m bench.torch_vs_nsys --dir FOLDER   (the files decompressed: X.sqlite, X.trace.json, X.stdout.txt)
# prints the side-by-side table of issue 41 (docs/torch-profiler.md, "Validation on the H200").
# WORKLOAD_ARGS (appended to every workload command) exists to try the script on CPU with a stand-in nsys
# (tests/test_trace_device_script.py); leave it unset on the GPU machine.
set -u
EXTRA_WL=${WORKLOAD_ARGS:-}
FINAL=${OUT:-/tmp/spectrace-out}
OUT=${STAGE:-/tmp/tp_stage}  # setup.sh logs here and pack writes here; the tar and log.txt go to FINAL
W=${W:-/tmp/torch_profiler}
rm -rf "$OUT" "$W"
mkdir -p "$FINAL" "$OUT" "$W"
. tests/device/setup.sh
BUDGET_S=${BUDGET_S:-220}
versions
python3 -c 'import ijson; print("ijson", ijson.__version__, ijson.backend)' >> "$OUT/log.txt" 2>&1
WL=(--nproc 1 --cycles 60 --warmup 5)
SCHED=(--schedule 1:40,2:40,4:40)

# nsys_run NAME [workload options]: the workload under nsys (cudaProfilerApi window), scrubbed and xz'd
nsys_run() {
  local name=$1; shift
  left || { log "skipped $name (budget)"; return 0; }
  log "nsys $name: workload ${WL[*]} $* $EXTRA_WL"
  # shellcheck disable=SC2086
  timeout 150 python3 -m nvtx_hooks.capture trace --force -o "$W/$name" -- \
    python3 -m nvtx_hooks.capture.workload "${WL[@]}" "$@" $EXTRA_WL > "$W/$name.stdout" 2>&1
  log "  $name: exit $?"
  grep '^{"rank"' "$W/$name.stdout" >> "$OUT/log.txt"
  pack "$name"
}

# torch_run NAME [workload options]: the workload under torch.profiler, its trace scrubbed and xz'd
torch_run() {
  local name=$1; shift
  left || { log "skipped $name (budget)"; return 0; }
  log "torch $name: workload ${WL[*]} --torch-profiler $W/$name $* $EXTRA_WL"
  rm -rf "${W:?}/$name"
  # shellcheck disable=SC2086
  timeout 150 python3 -m nvtx_hooks.capture.workload "${WL[@]}" --torch-profiler "$W/$name" "$@" $EXTRA_WL \
    > "$W/$name.stdout" 2>&1
  log "  $name: exit $?"
  grep '^{"rank"' "$W/$name.stdout" >> "$OUT/log.txt"
  for f in "$W/$name"/*.trace.json.gz; do
    [ -f "$f" ] || continue
    python3 -m nvtx_hooks.capture scrub "$f" -o "$W/$name.trace.json" --force --check "$(hostname)" \
      --check HOME= --check "$REPO" >> "$OUT/log.txt" 2>&1 && xz -9 -c "$W/$name.trace.json" > "$OUT/$name.trace.json.xz"
  done
  cp "$W/$name.stdout" "$OUT/$name.stdout.txt"
}

for REP in 1 2; do
  nsys_run "tp1_nsys_r$REP"
  torch_run "tp1_torch_r$REP"
  nsys_run "sched_nsys_r$REP" "${SCHED[@]}"
  torch_run "sched_torch_r$REP" "${SCHED[@]}"
  [ "$REP" = 1 ] && torch_run tp1_native --native-spans only
done
log "done"
ls -la "$OUT" >> "$OUT/log.txt"
tar -C "$OUT" -cf "$FINAL/torch_profiler.tar" . && log "tar: $FINAL/torch_profiler.tar"
cp "$OUT/log.txt" "$FINAL/log.txt"
ls -la "$FINAL"
