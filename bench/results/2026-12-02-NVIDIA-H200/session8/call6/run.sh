#!/usr/bin/env bash
# Session 8 call 6: the gate's GPU time over hidden sizes (bench/gate_hidden_sweep.py), call 4's wheels
# (the gate kernels of the final tree).
set -uo pipefail
R=$OUT/r; mkdir -p $R
rm -rf /tmp/site
python3 -m pip install -q --no-index --no-deps --target /tmp/site dist/tilebake-*.whl dist/tilebake_cuda-*.whl || exit 1
date -u +%FT%TZ > $R/date.txt
PYTHONPATH=/tmp/site timeout 200 python3 bench/gate_hidden_sweep.py 2>&1 | tee $R/gate_hidden_sweep.log
