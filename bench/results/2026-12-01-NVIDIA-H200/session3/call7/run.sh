#!/usr/bin/env bash
# Session call 7: main 3a4074d wheels: engram + native-path GPU tests, the momentum config sweep,
# Engram anchors, host times; packed into one archive.
set -uo pipefail
rm -rf /tmp/site-s7
python3 -m pip install -q --no-index --no-deps --target /tmp/site-s7 dist/tilebake-*.whl dist/tilebake_cuda-*.whl || exit 1
export PYTHONPATH=/tmp/site-s7 PYTHONUNBUFFERED=1
R=/tmp/r7; rm -rf $R; mkdir -p $R
date -u +%FT%TZ > $R/date.txt
timeout 150 python3 -m pytest tests/engram tests/test_native_path.py tests/test_smoke.py -m gpu -n 16 -p no:cacheprovider -q -rf --tb=short > $R/gpu_tests.log 2>&1
echo "pytest rc=$?"; tail -2 $R/gpu_tests.log; grep -E "^FAILED|^ERROR" $R/gpu_tests.log | cut -c1-200 | head -20
timeout 120 python3 bench/tune_engram.py run .carry/tune_eng > $R/tune_engram.log 2>&1; cat $R/tune_engram.log
OUT=$R timeout 120 python3 bench/anchors.py --name anchors_engram --cases '^(engram|fused|grad_w)' > $R/anchors_engram.log 2>&1; grep -E "^\| " $R/anchors_engram.log | cut -c1-130
OUT=$R timeout 120 python3 bench/host_time.py --name host_time > $R/host_time.log 2>&1; grep -E "torch.mul|engram|fused|grad_w|per_token_cast \|" $R/host_time.log
tar czf $OUT/results.tgz -C $R .
