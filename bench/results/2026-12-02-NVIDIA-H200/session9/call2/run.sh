#!/usr/bin/env bash
# Session 9 call 2: the gate's 512 class and more 1024 and 4096 candidates; call 1's winners the defaults (partial wheel: the gate, fused_weight,
# grad_w_reduce): the candidates' sweep, the gate GPU tests on the default configs, the hidden sweep.
set -uo pipefail
R=$OUT/r; mkdir -p $R
rm -rf /tmp/site
python3 -m pip install -q --no-index --no-deps --target /tmp/site .carry/pw/tilebake-*.whl .carry/pw/tilebake_cuda-*.whl || exit 1
date -u +%FT%TZ > $R/date.txt
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > $R/gpu.txt
export PYTHONUNBUFFERED=1
PYTHONPATH=/tmp/site timeout 200 python3 bench/tune_engram_gate.py run .carry/tune2 > $R/tune2.log 2>&1
echo "tune rc=$?"; cat $R/tune2.log
PYTHONPATH=/tmp/site timeout 200 python3 -m pytest tests/engram/test_engram_gate_fwd.py tests/engram/test_engram_gate_bwd.py tests/engram/test_fused_weight_and_grad_w_reduce.py tests/test_plans_engram.py -m gpu -n 16 -p no:cacheprovider -q -rf --tb=short > $R/tests.log 2>&1
echo "tests rc=$?"; tail -1 $R/tests.log; grep -E "^FAILED|^ERROR" $R/tests.log | cut -c1-200 | head -20
PYTHONPATH=/tmp/site timeout 240 python3 bench/gate_hidden_sweep.py > $R/sweep.log 2>&1
echo "sweep rc=$?"; cat $R/sweep.log
for f in .carry/tune2/sm_90a/*.cubin; do echo "$(basename $f .cubin): $(cuobjdump -res-usage $f 2>/dev/null | grep -oE 'REG:[0-9]+|STACK:[0-9]+|LOCAL:[0-9]+' | tr '\n' ' ')"; done
