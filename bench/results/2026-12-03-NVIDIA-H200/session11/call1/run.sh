#!/usr/bin/env bash
# Session 11 call 1: the kernel-bundle tree's wheels (dist_s11/: one cubin per bundle of up to 8
# variants, the loader's per-device module cache): the whole GPU suite; then the mHC anchors of
# multilayer recompute / post / pre_apply_mix with those wheels and with distB/ (a partial
# tilebake-cuda of those three ops whose forward sums are left to nvcc's fused multiply-adds, an
# experiment), and the three ops' GPU tests against distB.
set -uo pipefail
R=$OUT/r; mkdir -p $R
rm -rf /tmp/site /tmp/siteB
python3 -m pip install -q --no-index --no-deps --target /tmp/site dist_s11/tilebake-*.whl dist_s11/tilebake_cuda-*.whl || exit 1
cp -r /tmp/site /tmp/siteB && rm -rf /tmp/siteB/tilebake_cuda*
python3 -m pip install -q --no-index --no-deps --target /tmp/siteB distB/tilebake_cuda-*.whl || exit 1
date -u +%FT%TZ > $R/date.txt
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/gpu.txt
export PYTHONUNBUFFERED=1
PYTHONPATH=/tmp/site timeout 480 python3 -m pytest tests -m gpu -n 16 -p no:cacheprovider -v -rf --tb=short > $R/gpu_tests.log 2>&1
echo "suite rc=$?"; tail -1 $R/gpu_tests.log; grep -E "^FAILED|^ERROR" $R/gpu_tests.log | cut -c1-240 | head -20
gzip $R/gpu_tests.log
cd bench
for s in site siteB site siteB; do
  PYTHONPATH=/tmp/$s timeout 100 python3 anchors.py --cases "multilayer|mhc_post|pre_apply_mix" --name anchors_s11_$s > $R/anchors_$s.log 2>&1
  echo "anchors $s rc=$?"; grep -E "^\| (mhc)|copy" $R/anchors_$s.log | head -8
done
cd ..
PYTHONPATH=/tmp/siteB timeout 150 python3 -m pytest tests/mhc/test_mhc_multilayer_recompute.py tests/mhc/test_mhc_post.py tests/mhc/test_mhc_pre_apply_mix.py -m gpu -n 16 -p no:cacheprovider -q -rf --tb=line > $R/fma_tests.log 2>&1
echo "fma tests rc=$?"; tail -1 $R/fma_tests.log; grep -E "^FAILED" $R/fma_tests.log | cut -c1-200 | head -12
find bench/results -newer $R/date.txt -type f -name "*s11*" -exec cp {} $R/ \;
tar czf $OUT/results.tgz -C $R . && rm -rf $R  # one file back
