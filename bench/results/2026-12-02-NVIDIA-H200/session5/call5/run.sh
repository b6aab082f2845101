#!/usr/bin/env bash
# Session 5 call 5: anchors (CUDA-graph GPU times, copy bandwidth, torch.mul host time) and host times.
set -uo pipefail
rm -rf /tmp/site-s5
python3 -m pip install -q --no-index --no-deps --target /tmp/site-s5 dist/tilebake-*.whl dist/tilebake_cuda-*.whl || exit 1
export PYTHONPATH=/tmp/site-s5 PYTHONUNBUFFERED=1
R=/tmp/r5; rm -rf $R; mkdir -p $R
date -u +%FT%TZ > $R/date.txt
OUT=$R timeout 330 python3 bench/anchors.py --name anchors > $R/anchors.log 2>&1; grep -E "^\| |Command" $R/anchors.log | cut -c1-170
OUT=$R timeout 200 python3 bench/host_time.py --name host_time > $R/host_time.log 2>&1; grep -E "torch.mul|^\| " $R/host_time.log | cut -c1-150
tar czf $OUT/results.tgz -C $R .
