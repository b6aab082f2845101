#!/usr/bin/env bash
# Session 10 call 2, command 1: the final tree's wheels (dist_next/): the whole GPU suite.
set -uo pipefail
R=$OUT/r; mkdir -p $R
rm -rf /tmp/site
python3 -m pip install -q --no-index --no-deps --target /tmp/site dist_next/tilebake-*.whl dist_next/tilebake_cuda-*.whl || exit 1
date -u +%FT%TZ > $R/date.txt
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/gpu.txt
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site
timeout 480 python3 -m pytest tests -m gpu -n 16 -p no:cacheprovider -v -rf --tb=short > $R/gpu_tests.log 2>&1
echo "suite rc=$?"; tail -1 $R/gpu_tests.log; grep -E "^FAILED|^ERROR" $R/gpu_tests.log | cut -c1-240 | head -20
grep -E "^E  " $R/gpu_tests.log | head -20
gzip $R/gpu_tests.log
tar czf $OUT/suite.tgz -C $R . && rm -rf $R
