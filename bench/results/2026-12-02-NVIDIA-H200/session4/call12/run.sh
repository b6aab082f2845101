#!/usr/bin/env bash
# Session 4 call 12: the Sinkhorn step with col_scale / the column sums in shared memory, read and
# written as 16-byte vectors (call 10's version read them element by element).
set -uo pipefail
rm -rf /tmp/site-s4
python3 -m pip install -q --no-index --no-deps --target /tmp/site-s4 dist/tilebake-*.whl dist/tilebake_cuda-*.whl || exit 1
export PYTHONPATH=/tmp/site-s4 PYTHONUNBUFFERED=1
R=/tmp/r12; rm -rf $R; mkdir -p $R
cp .carry/s4/tune_engram_step.py bench/
timeout 200 python3 bench/tune_engram_step.py run .carry/tune_step step > $R/tune_step.log 2>&1; cat $R/tune_step.log
tar czf $OUT/results.tgz -C $R .
