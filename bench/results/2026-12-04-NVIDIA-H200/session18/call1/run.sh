#!/usr/bin/env bash
# Session 18 call 1: the mHC family's anchors on full wheels of main + the persistent pre-norm GEMM
# forward; the GEMM's split sweep and tests; split mixes bwd over its partial count; issue 18's
# load-dependent cases under load (tests/test_under_load.py) and the moe / transform GPU tests as
# 14 processes.
set -uo pipefail
R=$OUT/r; mkdir -p $R
python3 -m pip install -q --no-index --no-deps --target /tmp/siteS dist_s18/tilebake-*.whl dist_s18/tilebake_cuda-*.whl || exit 1
date -u +%FT%TZ > $R/date.txt
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/gpu.txt
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/siteS
timeout 100 python3 -m pytest tests/mhc/test_mhc_pre_norm_gemm.py tests/modeling/test_mhc_training.py -q -x -p no:cacheprovider -n 8 > $R/gemm_tests.log 2>&1
echo "gemm tests rc=$?: $(tail -1 $R/gemm_tests.log)"
cd bench
timeout 60 python3 gemm_splits.py --splits 1,2,4,8,16,32 --name gemm_splits_s18c1 > $R/gemm_splits.log 2>&1
echo "gemm splits rc=$?"; tail -8 $R/gemm_splits.log | cut -c1-150
timeout 60 python3 split_mixes_partials.py > $R/split_partials.log 2>&1
echo "split partials rc=$?"; cut -c1-250 $R/split_partials.log | tail -6
timeout 130 python3 anchors.py --cases "mhc" --name anchors_s18c1 > $R/anchors.log 2>&1
echo "anchors rc=$?"; grep -E "^\| (mhc|expand)" $R/anchors.log | cut -c1-110
cd ..
timeout 100 python3 -m pytest tests/test_under_load.py -q -p no:cacheprovider -rf > $R/under_load.log 2>&1
echo "under load rc=$?: $(tail -1 $R/under_load.log)"; grep -E "^FAILED|Error" $R/under_load.log | cut -c1-300 | head
timeout 110 python3 -m pytest tests/moe tests/transform -m gpu -q -p no:cacheprovider -n 14 -rf > $R/moe_transform_n14.log 2>&1
echo "moe/transform n14 rc=$?: $(tail -1 $R/moe_transform_n14.log)"; grep -E "^FAILED" $R/moe_transform_n14.log | cut -c1-300 | head -20
find $OUT -name "*.json" -newer $R/date.txt -path "*NVIDIA*" -exec cp {} $R/ \;
find $OUT -name "*.md" -newer $R/date.txt -path "*NVIDIA*" -exec cp {} $R/ \;
tar czf $OUT/results.tgz -C $R . && rm -rf $R $OUT/20*
