#!/usr/bin/env bash
set -uo pipefail
rm -rf /tmp/site-s4
python3 -m pip install -q --no-index --no-deps --target /tmp/site-s4 dist/tilebake-*.whl dist/tilebake_cuda-*.whl || exit 1
export PYTHONPATH=/tmp/site-s4 PYTHONUNBUFFERED=1
R=/tmp/r13; rm -rf $R; mkdir -p $R
timeout 400 python3 bench/tune_engram_gate.py run .carry/tune_gate > $R/tune_gate.log 2>&1; cat $R/tune_gate.log | cut -c1-160
tar czf $OUT/results.tgz -C $R .
