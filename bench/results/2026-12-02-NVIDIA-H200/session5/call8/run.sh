#!/usr/bin/env bash
# Session 5 call 8: mhc_post with a max_mult-4 variant (the register arrays sized for m <= 4): the same tests,
# anchors and host times as call 7.
set -uo pipefail
rm -rf /tmp/site-s5
python3 -m pip install -q --no-index --no-deps --target /tmp/site-s5 dist/tilebake-*.whl dist/tilebake_cuda-*.whl || exit 1
export PYTHONPATH=/tmp/site-s5 PYTHONUNBUFFERED=1
R=/tmp/r8; rm -rf $R; mkdir -p $R
date -u +%FT%TZ > $R/date.txt
timeout 240 python3 -m pytest tests/mhc tests/test_native_path.py tests/test_smoke.py tests/test_plans_mhc.py tests/quant/test_norm_backward.py -m gpu -n 16 -p no:cacheprovider -q -rf --tb=short > $R/gpu_tests.log 2>&1
echo "pytest rc=$?"; tail -1 $R/gpu_tests.log; grep -E "^FAILED|^ERROR" $R/gpu_tests.log | cut -c1-240 | head -20
OUT=$R timeout 150 python3 bench/anchors.py --name anchors > $R/anchors.log 2>&1; grep -E "^\| |Command" $R/anchors.log | cut -c1-170
OUT=$R timeout 120 python3 bench/host_time.py --name host_time > $R/host_time.log 2>&1; grep -E "torch.mul|^\| " $R/host_time.log | cut -c1-150
gzip -k $R/gpu_tests.log; rm $R/gpu_tests.log
tar czf $OUT/results.tgz -C $R .
