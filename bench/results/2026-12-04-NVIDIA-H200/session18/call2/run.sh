#!/usr/bin/env bash
# Session 18 call 2: mhc_pre_apply_mix launch configs (bench/tune.py: threads, tokens a thread,
# register streams) at 8192 x 4 x 7168 and 4096 x 4 x 1280; the mHC anchors again with each call's
# CUPTI kernel time beside its graph time (the original harness's measure).
set -uo pipefail
R=$OUT/r; mkdir -p $R
python3 -m pip install -q --no-index --no-deps --target /tmp/siteS dist_s18/tilebake-*.whl dist_s18/tilebake_cuda-*.whl || exit 1
date -u +%FT%TZ > $R/date.txt
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/gpu.txt
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/siteS
timeout 200 python3 bench/tune.py run .carry/tune mhc_pre_apply_mix > $R/tune_apply.log 2>&1
echo "tune rc=$?"; tail -8 $R/tune_apply.log | cut -c1-200
cd bench
timeout 200 python3 anchors.py --cases "mhc" --name anchors_s18c2 > $R/anchors.log 2>&1
echo "anchors rc=$?"; grep -E "^\| (mhc|expand)" $R/anchors.log | cut -c1-150
cd ..
find $OUT -name "*.json" -newer $R/date.txt -path "*NVIDIA*" -exec cp {} $R/ \;
find $OUT -name "*.md" -newer $R/date.txt -path "*NVIDIA*" -exec cp {} $R/ \;
tar czf $OUT/results.tgz -C $R . && rm -rf $R $OUT/20*
