#!/usr/bin/env bash
# Session 4 call 1: the gate kernels' GPU tests, the launch-config sweep, Engram anchors.
set -uo pipefail
rm -rf /tmp/site-s4
python3 -m pip install -q --no-index --no-deps --target /tmp/site-s4 dist/tilebake-*.whl dist/tilebake_cuda-*.whl || exit 1
export PYTHONPATH=/tmp/site-s4 PYTHONUNBUFFERED=1
R=/tmp/r1; rm -rf $R; mkdir -p $R
date -u +%FT%TZ > $R/date.txt
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv > $R/gpu.txt
timeout 240 python3 -m pytest tests/engram tests/modeling tests/test_smoke.py -m gpu -n 16 -p no:cacheprovider -q -rf --tb=short > $R/gpu_tests.log 2>&1
echo "pytest rc=$?"; tail -2 $R/gpu_tests.log; grep -E "^FAILED|^ERROR" $R/gpu_tests.log | cut -c1-240 | head -20
timeout 200 python3 bench/tune_engram_gate.py run .carry/tune_gate > $R/tune_gate.log 2>&1; cat $R/tune_gate.log | cut -c1-160
OUT=$R timeout 100 python3 bench/anchors.py --name anchors_engram --cases '^(engram_gate|engram_sinkhorn step)' > $R/anchors_engram.log 2>&1; grep -E "^\| " $R/anchors_engram.log | cut -c1-150
tar czf $OUT/results.tgz -C $R .
