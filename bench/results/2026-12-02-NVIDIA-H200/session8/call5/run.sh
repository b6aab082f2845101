#!/usr/bin/env bash
# Session 8 call 5: the final tree's changes after call 4 on a partial wheel (engram_sinkhorn, grad_w_reduce,
# fused_weight, norm_backward(_reduce), mhc_pre_norm_gemm; the step and sum_partial_rows back to call 1's,
# the GEMM forward's plan key with its variant class): their GPU tests, the new plan-key test on call 4's
# wheels (expected to fail there) and on these, the Sinkhorn anchors.
set -uo pipefail
R=$OUT/r; mkdir -p $R
rm -rf /tmp/site /tmp/old
python3 -m pip install -q --no-index --no-deps --target /tmp/site .carry/pw/tilebake-*.whl .carry/pw/tilebake_cuda-*.whl || exit 1
python3 -m pip install -q --no-index --no-deps --target /tmp/old dist/tilebake-*.whl dist/tilebake_cuda-*.whl || exit 1
date -u +%FT%TZ > $R/date.txt
export PYTHONUNBUFFERED=1
T=tests/mhc/test_mhc_pre_norm_gemm.py::test_forward_plans_keep_to_their_variant
echo "== call 4's wheels:"; PYTHONPATH=/tmp/old timeout 60 python3 -m pytest $T -m gpu -p no:cacheprovider -q --tb=line 2>&1 | tail -3
echo "== this tree:"; PYTHONPATH=/tmp/site timeout 60 python3 -m pytest $T -m gpu -p no:cacheprovider -q --tb=line 2>&1 | tail -3
PYTHONPATH=/tmp/site timeout 200 python3 -m pytest tests/mhc/test_mhc_pre_norm_gemm.py tests/engram/test_engram_sinkhorn.py tests/engram/test_fused_weight_and_grad_w_reduce.py tests/quant/test_norm_backward.py tests/test_plans_mhc_norm.py -m gpu -n 16 -p no:cacheprovider -q -rf --tb=short > $R/tests.log 2>&1
echo "tests rc=$?"; tail -1 $R/tests.log; grep -E "^FAILED|^ERROR" $R/tests.log | cut -c1-200 | head
cd bench
PYTHONPATH=/tmp/site timeout 60 python3 anchors.py --cases "engram_sinkhorn" --name anchors_s8_sinkhorn > $R/anchors.log 2>&1
echo "anchors rc=$?"; grep -E "^\| engram|copy" $R/anchors.log | head
cd ..
find bench/results -newer $R/date.txt -type f -exec cp {} $R/ \;
rm -f $R/anchors.log
