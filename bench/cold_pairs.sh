#!/bin/bash
# Same-minute pairs of a cold `spectrace analyze --format json`: BASE (a checkout, e.g. `git archive REV | tar -x -C /tmp/base`)
# then this checkout, alternating, each on a fresh copy of TRACE with an empty cache; prints /usr/bin/time's CPU and peak.
#   bench/cold_pairs.sh BASE TRACE [PAIRS]
set -e
BASE=$(realpath "$1"); T=$(realpath "$2"); n=${3:-3}; HERE=$(cd "$(dirname "$0")/.." && pwd)
for i in $(seq "$n"); do
 for side in base this; do
  [ $side = base ] && code=$BASE || code=$HERE
  d=$(mktemp -d /tmp/cold_pairs.XXXX); cp -r "$T" "$d/"
  ( cd /tmp && PYTHONPATH=$code SPECTRACE_CACHE_DIR=$d/c /usr/bin/time -f "$side %e wall-s %U user-s %S sys-s %M KB" \
      "$HERE/.venv/bin/spectrace" analyze "$d/$(basename "$T")" --format json -q > "$d/out.json" ) 2>&1 | tail -1
  rm -rf "$d"
 done
done
