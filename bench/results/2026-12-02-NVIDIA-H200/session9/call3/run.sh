#!/usr/bin/env bash
# Session 9 call 3: the final gate configs (partial wheel: the gate, fused_weight, grad_w_reduce): the
# 2048 class's smaller-CTA candidates, every Engram GPU test, the hidden sweep, the gate anchors.
set -uo pipefail
R=$OUT/r; mkdir -p $R
rm -rf /tmp/site
python3 -m pip install -q --no-index --no-deps --target /tmp/site .carry/pw/tilebake-*.whl .carry/pw/tilebake_cuda-*.whl || exit 1
date -u +%FT%TZ > $R/date.txt
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > $R/gpu.txt
export PYTHONUNBUFFERED=1
PYTHONPATH=/tmp/site timeout 100 python3 bench/tune_engram_gate.py run .carry/tune3 > $R/tune3.log 2>&1
echo "tune rc=$?"; cat $R/tune3.log
PYTHONPATH=/tmp/site timeout 300 python3 -m pytest tests/engram tests/modeling/test_engram.py tests/test_plans_engram.py -m gpu -n 16 -p no:cacheprovider -q -rf --tb=short > $R/tests.log 2>&1
echo "tests rc=$?"; tail -1 $R/tests.log; grep -E "^FAILED|^ERROR" $R/tests.log | cut -c1-200 | head -20
PYTHONPATH=/tmp/site timeout 240 python3 bench/gate_hidden_sweep.py > $R/sweep.log 2>&1
echo "sweep rc=$?"; cat $R/sweep.log
cd bench
PYTHONPATH=/tmp/site timeout 120 python3 anchors.py --cases "engram_gate" --name anchors_s9_gate > $R/anchors.log 2>&1
echo "anchors rc=$?"; grep -E "^\| engram|copy" $R/anchors.log | head
cd ..
find bench/results -newer $R/date.txt -type f -exec cp {} $R/ \;
