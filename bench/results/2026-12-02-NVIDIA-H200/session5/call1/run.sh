#!/usr/bin/env bash
# Session 5 call 1: the Sinkhorn step and the gate backward with rows prefetched through cp.async
# into shared memory (g_stages / stages > 1), beside the shipped configs.
set -uo pipefail
rm -rf /tmp/site-s5
python3 -m pip install -q --no-index --no-deps --target /tmp/site-s5 dist/tilebake-*.whl dist/tilebake_cuda-*.whl || exit 1
export PYTHONPATH=/tmp/site-s5 PYTHONUNBUFFERED=1
R=/tmp/r1; rm -rf $R; mkdir -p $R
date -u +%FT%TZ > $R/date.txt; nvidia-smi --query-gpu=name,driver_version --format=csv > $R/gpu.txt
timeout 200 python3 bench/tune_engram.py run .carry/s5/step step > $R/tune_step.log 2>&1; cat $R/tune_step.log
timeout 240 python3 bench/tune_engram_gate.py run .carry/s5/gate > $R/tune_gate.log 2>&1; cat $R/tune_gate.log
tar czf $OUT/results.tgz -C $R .
