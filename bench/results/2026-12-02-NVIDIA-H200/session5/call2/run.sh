#!/usr/bin/env bash
# Session 5 call 2: the Sinkhorn step with 512 and 1024 threads (half and a quarter of the registers a thread), staged or not.
set -uo pipefail
rm -rf /tmp/site-s5
python3 -m pip install -q --no-index --no-deps --target /tmp/site-s5 dist/tilebake-*.whl dist/tilebake_cuda-*.whl || exit 1
export PYTHONPATH=/tmp/site-s5 PYTHONUNBUFFERED=1
R=/tmp/r2; rm -rf $R; mkdir -p $R
date -u +%FT%TZ > $R/date.txt; nvidia-smi --query-gpu=name,driver_version --format=csv > $R/gpu.txt
timeout 200 python3 bench/tune_engram.py run .carry/s5/step step > $R/tune_step.log 2>&1; cat $R/tune_step.log

tar czf $OUT/results.tgz -C $R .
