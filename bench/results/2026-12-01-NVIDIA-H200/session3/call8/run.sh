#!/usr/bin/env bash
# Session call 8: the shipped momentum config (128 threads x 4): its GPU tests and anchor.
set -uo pipefail
rm -rf /tmp/site-s8
python3 -m pip install -q --no-index --no-deps --target /tmp/site-s8 dist/tilebake-*.whl dist/tilebake_cuda-*.whl || exit 1
export PYTHONPATH=/tmp/site-s8 PYTHONUNBUFFERED=1
R=/tmp/r8; rm -rf $R; mkdir -p $R
date -u +%FT%TZ > $R/date.txt
timeout 100 python3 -m pytest tests/engram/test_engram_sinkhorn.py tests/test_native_path.py -k "momentum or engram_sinkhorn" -m gpu -n 8 -p no:cacheprovider -q -rf --tb=short > $R/gpu_tests.log 2>&1
echo "pytest rc=$?"; tail -2 $R/gpu_tests.log
OUT=$R timeout 100 python3 bench/anchors.py --name anchors_momentum --cases 'momentum' > $R/anchors_momentum.log 2>&1; grep -E "^\| " $R/anchors_momentum.log | cut -c1-130
tar czf $OUT/results.tgz -C $R .
