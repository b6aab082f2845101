#!/usr/bin/env bash
# Session 18 call 7: the final wheels (norm_forward_and_per_token_cast in a module of its own, the
# shared device check): the norm GPU tests, the mixed-device tests (an input on the CPU beside
# CUDA inputs) and the property tests (100 random examples a property).
set -uo pipefail
R=$OUT/r; mkdir -p $R
python3 -m pip install -q --no-index --no-deps --target /tmp/siteS dist_s18/tilebake-*.whl dist_s18/tilebake_cuda-*.whl || exit 1
date -u +%FT%TZ > $R/date.txt
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/gpu.txt
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/siteS TILEBAKE_HYPOTHESIS_EXAMPLES=100 TILEBAKE_HYPOTHESIS_RANDOM=1
timeout 110 python3 -m pytest tests/quant/test_norm_forward.py tests/test_plans_norm.py tests/test_mixed_devices.py tests/test_properties.py -m gpu -q -p no:cacheprovider -n 8 -rf > $R/tests.log 2>&1
echo "tests rc=$?: $(tail -1 $R/tests.log)"; grep -E "^FAILED" $R/tests.log | cut -c1-250 | head -20
tar czf $OUT/results.tgz -C $R . && rm -rf $R
