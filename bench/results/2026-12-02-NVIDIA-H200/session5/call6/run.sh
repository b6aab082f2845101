#!/usr/bin/env bash
# Session 5 call 6: the whole GPU suite on the wheels of this tree (with the first mHC kernels).
set -uo pipefail
rm -rf /tmp/site-s5
python3 -m pip install -q --no-index --no-deps --target /tmp/site-s5 dist/tilebake-*.whl dist/tilebake_cuda-*.whl || exit 1
export PYTHONPATH=/tmp/site-s5 PYTHONUNBUFFERED=1
R=/tmp/r6; rm -rf $R; mkdir -p $R
date -u +%FT%TZ > $R/date.txt
timeout 500 python3 -m pytest tests -m gpu -n 16 -p no:cacheprovider -q -rf --tb=short > $R/gpu_tests.log 2>&1
echo "pytest rc=$?"; tail -2 $R/gpu_tests.log; grep -E "^FAILED|^ERROR" $R/gpu_tests.log | cut -c1-240 | head -30
gzip -k $R/gpu_tests.log; rm $R/gpu_tests.log
tar czf $OUT/results.tgz -C $R .
