#!/usr/bin/env bash
# Session 11 call 3: the final tree's wheels (dist_fma/: call 2's with fma32 computing float64
# oracles plainly and differentiable as a * b + c): the mhc, modeling and engram GPU tests and the
# call-plan tests.
set -uo pipefail
R=$OUT/r; mkdir -p $R
rm -rf /tmp/site
python3 -m pip install -q --no-index --no-deps --target /tmp/site dist_fma/tilebake-*.whl dist_fma/tilebake_cuda-*.whl || exit 1
date -u +%FT%TZ > $R/date.txt
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/gpu.txt
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site
timeout 400 python3 -m pytest tests/mhc tests/modeling tests/test_plans_mhc.py tests/test_loader.py tests/test_build.py -m gpu -n 16 -p no:cacheprovider -q -rf --tb=short > $R/tests.log 2>&1
echo "tests rc=$?"; tail -1 $R/tests.log; grep -E "^FAILED|^ERROR" $R/tests.log | cut -c1-200 | head -12
gzip $R/tests.log
tar czf $OUT/results.tgz -C $R . && rm -rf $R
