#!/usr/bin/env bash
# Session 12 call 1: dist_s12a/ (partial tilebake-cuda of the working tree: mhc_multilayer_recompute
# with an exact m = 4 variant and 32-bit bf16-pair widening; mhc_pre_norm_gemm's persistent forward;
# mhc_post, mhc_pre_apply_mix for the chain checks) against dist_fma/ (session 11's final wheels):
# the ops' GPU tests, then anchors / GEMM splits alternating old and new, twice each. dist_s12x/: an
# experiment, mhc_post and mhc_pre_apply_mix forwards with two tokens a CTA (tests + anchors).
set -uo pipefail
R=$OUT/r; mkdir -p $R
rm -rf /tmp/siteO /tmp/siteN /tmp/siteX
python3 -m pip install -q --no-index --no-deps --target /tmp/siteX dist_s12a/tilebake-*.whl dist_s12x/tilebake_cuda-*.whl || exit 1
python3 -m pip install -q --no-index --no-deps --target /tmp/siteO dist_fma/tilebake-*.whl dist_fma/tilebake_cuda-*.whl || exit 1
python3 -m pip install -q --no-index --no-deps --target /tmp/siteN dist_s12a/tilebake-*.whl dist_s12a/tilebake_cuda-*.whl || exit 1
date -u +%FT%TZ > $R/date.txt
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/gpu.txt
export PYTHONUNBUFFERED=1
PYTHONPATH=/tmp/siteN timeout 200 python3 -m pytest tests/mhc/test_mhc_multilayer_recompute.py tests/mhc/test_mhc_pre_norm_gemm.py tests/test_plans_mhc_norm.py tests/mhc/test_mhc_post.py tests/mhc/test_mhc_pre_apply_mix.py -m "gpu or not gpu" -n 16 -p no:cacheprovider -q -rf --tb=short > $R/tests.log 2>&1
echo "tests rc=$?"; tail -1 $R/tests.log; grep -E "^FAILED|^ERROR" $R/tests.log | cut -c1-250 | head -12
PYTHONPATH=/tmp/siteX timeout 200 python3 -m pytest tests/mhc/test_mhc_post.py tests/mhc/test_mhc_pre_apply_mix.py -m gpu -n 16 -p no:cacheprovider -q -rf --tb=short > $R/tests_x.log 2>&1
echo "tests X rc=$?"; tail -1 $R/tests_x.log; grep -E "^FAILED|^ERROR" $R/tests_x.log | cut -c1-250 | head -12
gzip $R/tests.log $R/tests_x.log
cd bench
for s in siteN siteO siteN siteO; do
  PYTHONPATH=/tmp/$s timeout 100 python3 anchors.py --cases "multilayer" --name anchors_s12c1_$s > $R/anchors_$s.log 2>&1
  echo "anchors $s rc=$?"; grep -E "^\| (mhc)" $R/anchors_$s.log | head -4
  PYTHONPATH=/tmp/$s timeout 100 python3 gemm_splits.py --splits 16,8,4 --name gemm_s12c1_$s > $R/gemm_$s.log 2>&1
  echo "gemm $s rc=$?"; cat $R/gemm_$s.log | tail -4
done
for s in siteX siteO siteX siteO; do
  PYTHONPATH=/tmp/$s timeout 100 python3 anchors.py --cases "mhc_post|mhc_pre_apply_mix" --name anchors_s12c1x_$s > $R/anchorsx_$s.log 2>&1
  echo "anchors X $s rc=$?"; grep -E "^\| (mhc)" $R/anchorsx_$s.log | head -8
done
cd ..
find bench/results -newer $R/date.txt -type f -name "*s12c1*" -exec cp {} $R/ \;
tar czf $OUT/results.tgz -C $R . && rm -rf $R  # one file back
