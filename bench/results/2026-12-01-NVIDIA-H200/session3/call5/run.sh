#!/usr/bin/env bash
# Session call 5: anchors x2 with CUDA-graph GPU times (same wheels as call 4).
set -uo pipefail
rm -rf /tmp/site-s5
python3 -m pip install -q --no-index --no-deps --target /tmp/site-s5 dist/tilebake-*.whl dist/tilebake_cuda-*.whl || exit 1
export PYTHONPATH=/tmp/site-s5 PYTHONUNBUFFERED=1
R=/tmp/r5; rm -rf $R; mkdir -p $R
date -u +%FT%TZ > $R/date.txt
for i in 1 2; do
  OUT=$R timeout 250 python3 bench/anchors.py --name anchors$i > $R/anchors$i.log 2>&1; grep -E "^\| " $R/anchors$i.log | cut -c1-130
done
tar czf $OUT/results.tgz -C $R .
