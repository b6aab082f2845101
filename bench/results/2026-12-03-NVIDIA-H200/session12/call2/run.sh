#!/usr/bin/env bash
# Session 12 call 2: dist_s12b/ (partial tilebake-cuda of the working tree: mhc_pre_norm_gemm's
# persistent forward with its tile origins computed once a step; mhc_pre_apply_mix's forward with
# 2 tokens a CTA; the exact-m multilayer recompute) and dist_s12y/ (pre_apply_mix, 4 tokens a CTA)
# against dist_fma/ (session 11's final wheels): tests, GEMM splits, anchors; Nsight Compute of
# the multilayer recompute (3 layers, 8192 x 8192). dist_s12z/: mhc_post's forward loading its
# mixes with the vectors (an experiment).
set -uo pipefail
R=$OUT/r; mkdir -p $R
rm -rf /tmp/siteO /tmp/siteN /tmp/siteY /tmp/siteZ
python3 -m pip install -q --no-index --no-deps --target /tmp/siteZ dist_s12b/tilebake-*.whl dist_s12z/tilebake_cuda-*.whl || exit 1
python3 -m pip install -q --no-index --no-deps --target /tmp/siteO dist_fma/tilebake-*.whl dist_fma/tilebake_cuda-*.whl || exit 1
python3 -m pip install -q --no-index --no-deps --target /tmp/siteN dist_s12b/tilebake-*.whl dist_s12b/tilebake_cuda-*.whl || exit 1
python3 -m pip install -q --no-index --no-deps --target /tmp/siteY dist_s12b/tilebake-*.whl dist_s12y/tilebake_cuda-*.whl || exit 1
date -u +%FT%TZ > $R/date.txt
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/gpu.txt
export PYTHONUNBUFFERED=1
PYTHONPATH=/tmp/siteN timeout 200 python3 -m pytest tests/mhc/test_mhc_multilayer_recompute.py tests/mhc/test_mhc_pre_norm_gemm.py tests/test_plans_mhc_norm.py tests/mhc/test_mhc_pre_apply_mix.py -m "gpu or not gpu" -n 16 -p no:cacheprovider -q -rf --tb=short > $R/tests.log 2>&1
echo "tests rc=$?"; tail -1 $R/tests.log; grep -E "^FAILED|^ERROR" $R/tests.log | cut -c1-250 | head -12
PYTHONPATH=/tmp/siteY timeout 100 python3 -m pytest tests/mhc/test_mhc_pre_apply_mix.py -m gpu -n 16 -p no:cacheprovider -q -rf --tb=short > $R/tests_y.log 2>&1
echo "tests Y rc=$?"; tail -1 $R/tests_y.log
PYTHONPATH=/tmp/siteZ timeout 100 python3 -m pytest tests/mhc/test_mhc_post.py -m gpu -n 16 -p no:cacheprovider -q -rf --tb=short > $R/tests_z.log 2>&1
echo "tests Z rc=$?"; tail -1 $R/tests_z.log
gzip $R/tests.log $R/tests_y.log $R/tests_z.log
cd bench
for s in siteN siteO siteN siteO; do
  PYTHONPATH=/tmp/$s timeout 100 python3 gemm_splits.py --splits 16,8,4 --name gemm_s12c2_$s > $R/gemm_$s.log 2>&1
  echo "gemm $s rc=$?"; cat $R/gemm_$s.log | tail -4
done
for s in siteN siteY siteO siteN siteY siteO; do
  PYTHONPATH=/tmp/$s timeout 100 python3 anchors.py --cases "mhc_pre_apply_mix_fwd" --name anchors_s12c2_$s > $R/anchors_$s.log 2>&1
  echo "anchors $s rc=$?"; grep -E "^\| (mhc)" $R/anchors_$s.log | head -3
done
for s in siteZ siteO siteZ siteO; do
  PYTHONPATH=/tmp/$s timeout 100 python3 anchors.py --cases "mhc_post_fwd" --name anchors_s12c2z_$s > $R/anchorsz_$s.log 2>&1
  echo "anchors Z $s rc=$?"; grep -E "^\| (mhc)" $R/anchorsz_$s.log | head -3
done
cd ..
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
PYTHONPATH=/tmp/siteN timeout 150 "$NCU" --clock-control none --profile-from-start off --set full --print-details all \
  python3 bench/ncu_case.py mhc_multilayer_recompute "" 8192x8192 > $R/ncu_multilayer.txt 2>&1
echo "ncu rc=$?"; grep -E "Duration|DRAM Throughput|Issue Slots Busy|Achieved Occupancy|Registers Per|Executed Ipc A" $R/ncu_multilayer.txt | head -12
gzip $R/ncu_multilayer.txt
find $OUT -name "*.json" -newer $R/date.txt -path "*NVIDIA*" -exec cp {} $R/ \;
tar czf $OUT/results.tgz -C $R . && rm -rf $R $OUT/20*  # one file back
