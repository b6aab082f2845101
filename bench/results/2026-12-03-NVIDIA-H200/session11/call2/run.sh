#!/usr/bin/env bash
# Session 11 call 2: dist_fma/ (the tree of call 1 with mhc_post's forward and the multilayer
# recompute's post step adding each term by a fused multiply-add, __fmaf_rn, and the reference
# mhc_post_ref doing the same exactly, fma32): the mhc and modeling GPU tests, then the anchors of
# post / multilayer with dist_fma and with call 1's dist_s11, twice each.
set -uo pipefail
R=$OUT/r; mkdir -p $R
rm -rf /tmp/site /tmp/siteF
python3 -m pip install -q --no-index --no-deps --target /tmp/site dist_s11/tilebake-*.whl dist_s11/tilebake_cuda-*.whl || exit 1
python3 -m pip install -q --no-index --no-deps --target /tmp/siteF dist_fma/tilebake-*.whl dist_fma/tilebake_cuda-*.whl || exit 1
date -u +%FT%TZ > $R/date.txt
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/gpu.txt
export PYTHONUNBUFFERED=1
PYTHONPATH=/tmp/siteF timeout 300 python3 -m pytest tests/mhc tests/modeling tests/test_plans_mhc.py -m gpu -n 16 -p no:cacheprovider -q -rf --tb=short > $R/fma_tests.log 2>&1
echo "fma tests rc=$?"; tail -1 $R/fma_tests.log; grep -E "^FAILED|^ERROR" $R/fma_tests.log | cut -c1-200 | head -12
gzip $R/fma_tests.log
cd bench
for s in siteF site siteF site; do
  PYTHONPATH=/tmp/$s timeout 100 python3 anchors.py --cases "multilayer|mhc_post" --name anchors_s11c2_$s > $R/anchors_$s.log 2>&1
  echo "anchors $s rc=$?"; grep -E "^\| (mhc)" $R/anchors_$s.log | head -8
done
cd ..
find bench/results -newer $R/date.txt -type f -name "*s11c2*" -exec cp {} $R/ \;
tar czf $OUT/results.tgz -C $R . && rm -rf $R  # one file back
