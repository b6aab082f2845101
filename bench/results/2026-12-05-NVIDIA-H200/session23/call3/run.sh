#!/usr/bin/env bash
# Session 23 call 3: wheels of main + the Ascend SF layouts on NPU tensors (dist_s23c: the runtime
# rebuilt, the kernel package of call 2's main, unchanged kernels): the GPU tests of the code the
# change touched (quant ops' SF checks and allocations, their plans, out= buffers) and the
# split-mixes tests (its two-stream test against the shipped two-launch backward).
set -uo pipefail
R=$OUT/r; mkdir -p $R
rm -rf /tmp/siteC
python3 -m pip install -q --no-index --no-deps --target /tmp/siteC dist_s23c/tilebake-*.whl dist_s23c/tilebake_cuda-*.whl || exit 1
date -u +%FT%TZ > $R/date.txt
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/gpu.txt; cat $R/gpu.txt
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/siteC
timeout 480 python3 -m pytest tests/mhc/test_pre_split_mixes.py tests/quant tests/test_plans_cast.py tests/test_plans_back.py \
  tests/test_plans_norm.py tests/test_plans_swiglu.py tests/test_out_buffers.py tests/test_partial_out.py \
  -m gpu -q -p no:cacheprovider -n 14 -rf > $R/tests.log 2>&1
echo "tests rc=$?: $(tail -1 $R/tests.log)"; grep -E "^FAILED|^ERROR" $R/tests.log | cut -c1-250 | head -20
gzip $R/tests.log
tar czf $OUT/results.tgz -C $R .
