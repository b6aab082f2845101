#!/usr/bin/env bash
# Session 20 call 1: wheels of main + mhc_pre_big_fuse as one kernel (the mixes a warp a token,
# the streams mixed by the CTA over all columns, the Sinkhorn last): the mHC / modeling / plan GPU
# tests; tune.py candidates of the big fuse and of mhc_pre_apply_mix's forward stepping over the
# columns (column_loop); the mHC anchors; host time and its breakdown.
set -uo pipefail
R=$OUT/r; mkdir -p $R
python3 -m pip install -q --no-index --no-deps --target /tmp/siteS dist_s20/tilebake-*.whl dist_s20/tilebake_cuda-*.whl || exit 1
date -u +%FT%TZ > $R/date.txt
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/gpu.txt
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/siteS
timeout 200 python3 -m pytest tests/mhc tests/modeling tests/test_plans_mhc.py tests/test_plans_mhc_norm.py -m gpu -q -p no:cacheprovider -n 14 -rf > $R/mhc_tests.log 2>&1
echo "mhc tests rc=$?: $(tail -1 $R/mhc_tests.log)"; grep -E "^FAILED|^ERROR" $R/mhc_tests.log | cut -c1-250 | head
timeout 60 python3 bench/tune.py run .carry/tune_bf mhc_pre_big_fuse > $R/tune_big_fuse.log 2>&1
echo "tune bf rc=$?"; tail -4 $R/tune_big_fuse.log | cut -c1-200
timeout 60 python3 bench/tune.py run .carry/tune_am mhc_pre_apply_mix > $R/tune_apply.log 2>&1
echo "tune am rc=$?"; tail -4 $R/tune_apply.log | cut -c1-200
timeout 60 python3 bench/host_breakdown.py > $R/host_breakdown.log 2>&1
echo "breakdown rc=$?"; cat $R/host_breakdown.log | cut -c1-200
cd bench
timeout 200 python3 anchors.py --cases "mhc" --name anchors_s20c1 > $R/anchors.log 2>&1
echo "anchors rc=$?"; grep -E "^\| (mhc|expand)" $R/anchors.log | cut -c1-150
timeout 100 python3 host_time.py --name host_time_s20c1 --families mhc > $R/host_time.log 2>&1
echo "host time rc=$?"; grep -E "^\| (mhc|expand)|torch.mul" $R/host_time.log | cut -c1-150
cd ..
find $OUT -name "*.json" -newer $R/date.txt -path "*NVIDIA*" -exec cp {} $R/ \;
find $OUT -name "*.md" -newer $R/date.txt -path "*NVIDIA*" -exec cp {} $R/ \;
gzip $R/mhc_tests.log
tar czf $OUT/results.tgz -C $R . && rm -rf $R $OUT/20*
