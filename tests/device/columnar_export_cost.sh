#!/usr/bin/env bash
# What `spectrace trace --columnar` costs at capture: the same .nsys-rep exported as SQLite, parquetdir and
# arrowdir, timed one after the other and (SQLite + parquetdir) side by side, at two capture sizes (node-level
# graph tracing of the 32-layer workload, TP1). Results under $OUT: columnar_export_cost.txt (one line per export:
# seconds, MB, rows), the smaller capture's SQLite and parquetdir (xz) to check here that both analyse the same.
#   run: bash tests/device/columnar_export_cost.sh   (carry .devdeps and .whl)
set -u
. tests/device/setup.sh
R="$OUT/columnar_export_cost.txt"
versions
nproc >> "$R"
for cyc in ${CYCLES:-1500 6000}; do
  left || break
  name=tp1_n${cyc}
  log "capture $name"
  timeout 300 python3 -m nvtx_hooks.capture trace --force --capture all --cuda-graph-trace node -o "$W/$name" -- \
    python3 -m nvtx_hooks.capture.workload --nproc 1 --layers 32 --steps 3 --cycles "$cyc" > "$W/$name.stdout" 2>&1
  log "  rc=$?"
  [ -f "$W/$name.nsys-rep" ] || continue
  k=$(python3 -c "import sqlite3,sys; c=sqlite3.connect(sys.argv[1]); print(c.execute('select count(*) from CUPTI_ACTIVITY_KIND_KERNEL').fetchone()[0], c.execute('select count(*) from CUPTI_ACTIVITY_KIND_RUNTIME').fetchone()[0])" "$W/$name.sqlite")
  echo "$name kernels,runtime: $k; nsys-rep MB $(du -m "$W/$name.nsys-rep" | cut -f1)" | tee -a "$R"
  for t in sqlite parquetdir arrowdir sqlite parquetdir arrowdir; do
    left || break
    rm -rf "$W/x_$t" "$W/x_$t".sqlite "$W/x_${t}"_pqtdir "$W/x_${t}"_arwdir
    s=$(date +%s.%N)
    "$NSYS" export --type=$t --force-overwrite=true -o "$W/x_$t" "$W/$name.nsys-rep" > /dev/null 2>&1
    rc=$?
    e=$(python3 -c "print(round($(date +%s.%N)-$s,2))")
    mb=$(du -sm "$W"/x_${t}* 2>/dev/null | awk '{s+=$1} END {print s}')
    echo "$name export $t rc=$rc seconds=$e MB=$mb" | tee -a "$R"
  done
  left || break
  rm -rf "$W"/y_*
  s=$(date +%s.%N)
  "$NSYS" export --type=sqlite --force-overwrite=true -o "$W/y_s" "$W/$name.nsys-rep" > /dev/null 2>&1 &
  "$NSYS" export --type=parquetdir --force-overwrite=true -o "$W/y_p" "$W/$name.nsys-rep" > /dev/null 2>&1 &
  wait
  echo "$name export sqlite+parquetdir side by side seconds=$(python3 -c "print(round($(date +%s.%N)-$s,2))")" | tee -a "$R"
  if [ "$cyc" = "${KEEP:-1500}" ]; then
    pack "$name"
    ls -d "$W"/x_parquetdir* >> "$OUT/log.txt" 2>&1
    tar -C "$W" -cJf "$OUT/${name}_pqtdir.tar.xz" --transform "s,^x_parquetdir[^/]*,${name}_pqtdir," $(cd "$W" && ls -d x_parquetdir*)
  fi
done
ls -la "$OUT" >> "$OUT/log.txt"
log done
