#!/usr/bin/env bash
# Session 5 call 9: the mhc ops' torch.compile registrations and plans on the GPU (tests/mhc).
set -uo pipefail
rm -rf /tmp/site-s5
python3 -m pip install -q --no-index --no-deps --target /tmp/site-s5 dist/tilebake-*.whl dist/tilebake_cuda-*.whl || exit 1
export PYTHONPATH=/tmp/site-s5 PYTHONUNBUFFERED=1
R=/tmp/r9; rm -rf $R; mkdir -p $R
date -u +%FT%TZ > $R/date.txt
timeout 200 python3 -m pytest tests/mhc tests/test_native_path.py -k "mhc or compile" -m gpu -n 16 -p no:cacheprovider -q -rf --tb=short > $R/gpu_tests.log 2>&1
echo "pytest rc=$?"; tail -1 $R/gpu_tests.log; grep -E "^FAILED|^ERROR" $R/gpu_tests.log | cut -c1-240 | head -20
gzip -k $R/gpu_tests.log; rm $R/gpu_tests.log
tar czf $OUT/results.tgz -C $R .
