#!/usr/bin/env bash
# Session 18 call 6: tests/test_properties.py on the H200 (hypothesis, 200 random examples a
# property: the kernels against the CPU path's bytes and the contracts) and tests/test_under_load.py
# with 60 repeats a case beside 3 GPU-loading processes.
set -uo pipefail
R=$OUT/r; mkdir -p $R
python3 -m pip install -q --no-index --no-deps --target /tmp/siteS dist_s18/tilebake-*.whl dist_s18/tilebake_cuda-*.whl || exit 1
date -u +%FT%TZ > $R/date.txt
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/gpu.txt
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/siteS
TILEBAKE_HYPOTHESIS_EXAMPLES=200 TILEBAKE_HYPOTHESIS_RANDOM=1 timeout 120 python3 -m pytest tests/test_properties.py -q -p no:cacheprovider -rf > $R/properties.log 2>&1
echo "properties rc=$?: $(tail -1 $R/properties.log)"; grep -E "^E  |^FAILED|  [a-z_]+=" $R/properties.log | head -30
TILEBAKE_LOAD_REPEATS=60 timeout 90 python3 -m pytest tests/test_under_load.py -q -p no:cacheprovider -rf > $R/under_load.log 2>&1
echo "under load rc=$?: $(tail -1 $R/under_load.log)"; grep -E "^FAILED|^E  " $R/under_load.log | head
tar czf $OUT/results.tgz -C $R . && rm -rf $R
