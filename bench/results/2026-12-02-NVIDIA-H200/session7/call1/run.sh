#!/usr/bin/env bash
# Session 7 call 1: (a) the whole GPU suite on the wheels of 2593da1 (kernels built 12:35-12:48 UTC);
# (b) the new pre-norm GEMM forward, mhc_post and mhc_pre_apply_mix kernels (a partial sm_90a build
# of those three ops from the working tree): their GPU tests, and old vs new timings in one run.
set -uo pipefail
R=/tmp/r1; rm -rf $R; mkdir -p $R
rm -rf /tmp/site /tmp/site2
python3 -m pip install -q --no-index --no-deps --target /tmp/site dist/tilebake-*.whl dist/tilebake_cuda-*.whl || exit 1
python3 -m pip install -q --no-index --no-deps --target /tmp/site2 .carry/t7/tilebake-*.whl .carry/t7/tilebake_cuda-*.whl || exit 1
date -u +%FT%TZ > $R/date.txt
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/gpu.txt
export PYTHONUNBUFFERED=1
PYTHONPATH=/tmp/site timeout 330 python3 -m pytest tests -m gpu -n 16 -p no:cacheprovider -q -rf --tb=short > $R/gpu_tests.log 2>&1
echo "suite rc=$?"; tail -1 $R/gpu_tests.log; grep -E "^FAILED|^ERROR" $R/gpu_tests.log | cut -c1-250 | head -30
PYTHONPATH=/tmp/site2 timeout 120 python3 -m pytest tests/mhc/test_mhc_pre_norm_gemm.py tests/mhc/test_mhc_post.py tests/mhc/test_mhc_pre_apply_mix.py tests/mhc/test_mhc_reduce_partials_and_rmsnorm.py -m gpu -n 8 -p no:cacheprovider -q -rf --tb=short > $R/new_tests.log 2>&1
echo "new kernels rc=$?"; tail -1 $R/new_tests.log; grep -E "^FAILED|^ERROR" $R/new_tests.log | cut -c1-250 | head -20
cd bench
for site in site site2; do
  echo "== $site"; PYTHONPATH=/tmp/$site:. timeout 60 python3 ../.carry/t7/perf.py > $R/perf_$site.txt 2>&1; cat $R/perf_$site.txt | tail -12
  PYTHONPATH=/tmp/$site timeout 60 python3 anchors.py --cases "mhc_post|mhc_pre_apply_mix" --name anchors_$site > $R/anchors_$site.log 2>&1; grep -E "^\| (mhc|copy)|copy" $R/anchors_$site.log | head -8
done
cd ..
find bench/results -newer $R/date.txt -type f -exec cp {} $R/ \;
gzip $R/gpu_tests.log
tar czf $OUT/results.tgz -C $R .
