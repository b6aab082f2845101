#!/bin/bash
# Session call 1: allocation costs, per_token_cast fp32-in launch configs, persistent norm_forward.
set -x
SITE=/tmp/site-s1; rm -rf $SITE
python3 -m pip install -q --no-index --no-deps --target $SITE dist/*.whl
export PYTHONPATH=$SITE:$PWD/bench
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv > $OUT/nvidia-smi.txt
date -u +%FT%TZ > $OUT/date.txt
python3 bench/alloc_cost.py 2>&1 | tee $OUT/alloc_cost.log
timeout 250 python3 bench/tune_norm.py run .carry/tune_norm 2>&1 | tee $OUT/tune_norm.log
timeout 280 python3 bench/tune.py run .carry/tune_ptc per_token_cast 2>&1 | tee $OUT/tune_ptc.log
