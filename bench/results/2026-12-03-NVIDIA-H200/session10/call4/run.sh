#!/usr/bin/env bash
# Session 10 call 4: the gate backward's 16384 class with the next token's g and v rows in flight
# (gv_ahead). dist_final/ (its default): the engram gate GPU tests, the hidden sweep; .carry/gate:
# the class's two candidates through the public op (bench/tune_engram_gate.py run), same run.
set -uo pipefail
R=$OUT/r; mkdir -p $R
rm -rf /tmp/site
python3 -m pip install -q --no-index --no-deps --target /tmp/site dist_final/tilebake-*.whl dist_final/tilebake_cuda-*.whl || exit 1
date -u +%FT%TZ > $R/date.txt
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site
timeout 200 python3 -m pytest tests/engram/test_engram_gate_bwd.py tests/engram/test_engram_gate_fwd.py tests/modeling/test_engram.py tests/test_plans_engram.py -m gpu -n 16 -p no:cacheprovider -q -rf --tb=short > $R/tests.log 2>&1
echo "tests rc=$?"; tail -1 $R/tests.log; grep -E "^FAILED|^ERROR" $R/tests.log | head -10
timeout 150 python3 bench/tune_engram_gate.py run .carry/gate > $R/tune_gate.log 2>&1
echo "tune rc=$?"; cat $R/tune_gate.log
timeout 200 python3 bench/gate_hidden_sweep.py > $R/sweep.log 2>&1
echo "sweep rc=$?"; cat $R/sweep.log
tar czf $OUT/call4.tgz -C $R . && rm -rf $R
