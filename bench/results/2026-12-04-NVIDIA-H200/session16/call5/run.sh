#!/usr/bin/env bash
# Session 16 call 5: the CUDA path after the Ascend backend's runtime changes (the launcher gained
# acl_launcher.c; per_token_cast / cast_back gained an NPU branch): this tree's tilebake wheel with
# the session's tilebake-cuda (its cubins unchanged by these commits).
set -uo pipefail
R=$OUT/r; mkdir -p $R
python3 -m pip install -q --no-index --no-deps --target /tmp/siteS dist_s16g/*.whl || exit 1
date -u +%FT%TZ > $R/date.txt
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/gpu.txt
PYTHONPATH=/tmp/siteS timeout 170 python3 -m pytest tests/quant/test_per_token_cast.py tests/quant/test_cast_back.py tests/test_native_path.py tests/test_ascend_runtime.py -m "gpu or not gpu" -n 16 -p no:cacheprovider -q -rf --tb=short > $R/tests.log 2>&1
echo "tests rc=$?"; tail -2 $R/tests.log; grep -E "^FAILED|^ERROR" $R/tests.log | cut -c1-200 | head -8
PYTHONPATH=/tmp/siteS timeout 60 python3 -m tilebake doctor > $R/doctor.log 2>&1; echo "doctor rc=$?"; tail -6 $R/doctor.log
tar czf $OUT/results.tgz -C $R . && rm -rf $R
