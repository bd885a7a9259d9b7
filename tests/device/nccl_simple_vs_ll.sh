#!/usr/bin/env bash
# The same TP2 workload captured with NCCL_PROTO=Simple and with NCCL_PROTO=LL, for checking that
# `spectrace compare` puts the verify change into communication (compare runs here, where polars is).
# Run from the repo root on a machine with 2 GPUs (nvidia-h200-x2):
#   bash tests/device/nccl_simple_vs_ll.sh            (about 1-2 minutes; results under $OUT)
# Needs nsys (NSYS, default the Nsight Compute 2025.3.1 copy), libdw/libelf debs for its importer (.devdeps/*.deb
# or shared/nsys/*.deb) and python nvtx (.whl/nvtx-*.whl, or installed) for the ranges, as capture_all.sh.
# Writes $OUT/tp2_nccl_{simple,ll}.sqlite.xz (scrubbed), their manifests and stdout, and $OUT/log.txt with the
# NCCL kernel names each capture ran (the protocol is in the name: ..._RING_SIMPLE vs ..._RING_LL) and the kernel
# count per process (both ranks must have GPU rows to the end of the measured loop).
set -u
W=/tmp/nccl14
. tests/device/setup.sh
{
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  "$NSYS" --version
  python3 -c 'import torch, nvtx; print("torch", torch.__version__, "cuda", torch.version.cuda, "nccl", torch.cuda.nccl.version(), "nvtx", nvtx.__file__)'
} >> "$OUT/log.txt" 2>&1
NP=$(python3 -c 'import torch; print(torch.cuda.device_count())')
[ "$NP" -ge 2 ] || { log "needs 2 GPUs, found $NP"; exit 1; }

# The default capture window (the workload's cudaProfilerStart/Stop around its 60 measured cycles): nsys stops
# and flushes at cudaProfilerStop, before NCCL teardown, so both ranks keep their GPU rows.
for proto in Simple LL; do
  name=tp2_nccl_$(echo "$proto" | tr 'A-Z' 'a-z')
  log "capture $name: NCCL_PROTO=$proto, workload --nproc 2 --cycles 60"
  timeout 150 python3 -m nvtx_hooks.capture trace --force --env "NCCL_PROTO=$proto" -o "$W/$name" -- \
    python3 -m nvtx_hooks.capture.workload --nproc 2 --cycles 60 > "$W/$name.stdout" 2>&1
  log "  rc=$? $(grep -h '^{"rank"' "$W/$name.stdout" | tr '\n' ' ')"
  python3 - "$W/$name.sqlite" >> "$OUT/log.txt" 2>&1 <<'EOF'
import sqlite3, sys
con = sqlite3.connect(sys.argv[1])
q = ("SELECT s.value, count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s ON s.id = k.shortName "
     "WHERE s.value LIKE 'nccl%' GROUP BY 1 ORDER BY 2 DESC")
for name, n in con.execute(q):
    print(f"   {n:6d} x {name}")
for pid, n, last in con.execute("SELECT globalPid >> 24 & 16777215, count(*), max(end) FROM CUPTI_ACTIVITY_KIND_KERNEL "
                                "GROUP BY 1 ORDER BY 1"):
    print(f"   pid {pid}: {n} kernels, last ends at {last / 1e9:.3f} s")
for (t,) in con.execute("SELECT text FROM DIAGNOSTIC_EVENT ORDER BY timestamp"):
    print("   diag:", t[:160])
EOF
  if [ -f "$W/$name.sqlite" ]; then
    python3 -m nvtx_hooks.capture scrub "$W/$name.sqlite" -o "$W/pack_$name.sqlite" --force --check PATH= \
      --check HOME= --check "$PWD" >> "$OUT/log.txt" 2>&1 || log "  scrub check failed for $name"
    xz -T0 -9 -c "$W/pack_$name.sqlite" > "$OUT/$name.sqlite.xz"
    cp "$W/$name.manifest.json" "$W/$name.stdout" "$OUT/" 2>/dev/null
  fi
done
log "done"
