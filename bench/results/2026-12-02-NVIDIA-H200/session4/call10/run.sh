#!/usr/bin/env bash
# Session 4 call 10: the Sinkhorn step's launch-config sweep; the gate kernels' register classes
# (the 16384-class kernel run at hidden 7168 against the 8192 class that ships for it).
set -uo pipefail
rm -rf /tmp/site-s4
python3 -m pip install -q --no-index --no-deps --target /tmp/site-s4 dist/tilebake-*.whl dist/tilebake_cuda-*.whl || exit 1
export PYTHONPATH=/tmp/site-s4 PYTHONUNBUFFERED=1
R=/tmp/r10; rm -rf $R; mkdir -p $R
timeout 200 python3 bench/tune_engram.py run .carry/tune_step step > $R/tune_step.log 2>&1; cat $R/tune_step.log
timeout 200 python3 .carry/s4/gate_classes.py > $R/gate_classes.log 2>&1; cat $R/gate_classes.log
cp .carry/s4/gate_classes.py $R/
tar czf $OUT/results.tgz -C $R .
