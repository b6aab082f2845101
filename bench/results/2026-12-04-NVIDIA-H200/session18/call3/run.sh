#!/usr/bin/env bash
# Session 18 call 3: wheels of main + mhc_pre_apply_mix_bwd's thread-count variants (a thread a
# token's vector, 128 to 1024 threads, m <= 4): the mHC and modeling GPU tests; split mixes'
# bwd_reduce launch configs (bench/tune.py, CUPTI kernel time); the mHC anchors (graph and CUPTI).
set -uo pipefail
R=$OUT/r; mkdir -p $R
python3 -m pip install -q --no-index --no-deps --target /tmp/siteS dist_s18/tilebake-*.whl dist_s18/tilebake_cuda-*.whl || exit 1
date -u +%FT%TZ > $R/date.txt
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/gpu.txt
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/siteS
timeout 200 python3 -m pytest tests/mhc tests/modeling tests/test_plans_mhc.py -m gpu -q -p no:cacheprovider -n 12 -rf > $R/mhc_tests.log 2>&1
echo "mhc tests rc=$?: $(tail -1 $R/mhc_tests.log)"; grep -E "^FAILED" $R/mhc_tests.log | cut -c1-250 | head
timeout 60 python3 bench/tune.py run .carry/tune mhc_pre_split_mixes > $R/tune_split.log 2>&1
echo "tune rc=$?"; tail -4 $R/tune_split.log | cut -c1-200
cd bench
timeout 200 python3 anchors.py --cases "mhc" --name anchors_s18c3 > $R/anchors.log 2>&1
echo "anchors rc=$?"; grep -E "^\| (mhc|expand)" $R/anchors.log | cut -c1-150
cd ..
find $OUT -name "*.json" -newer $R/date.txt -path "*NVIDIA*" -exec cp {} $R/ \;
find $OUT -name "*.md" -newer $R/date.txt -path "*NVIDIA*" -exec cp {} $R/ \;
tar czf $OUT/results.tgz -C $R . && rm -rf $R $OUT/20*
