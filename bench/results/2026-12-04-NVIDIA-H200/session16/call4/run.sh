#!/usr/bin/env bash
# Session 16 call 4: the mHC family's anchors and host times on full wheels of main (mhc_post's
# backward by 1 KiB-aligned cp.async stages).
set -uo pipefail
R=$OUT/r; mkdir -p $R
python3 -m pip install -q --no-index --no-deps --target /tmp/siteS dist_s16full/tilebake-*.whl dist_s16full/tilebake_cuda-*.whl || exit 1
date -u +%FT%TZ > $R/date.txt
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/gpu.txt
export PYTHONUNBUFFERED=1
cd bench
PYTHONPATH=/tmp/siteS timeout 150 python3 anchors.py --cases "mhc" --name anchors_s16c4 > $R/anchors.log 2>&1
echo "anchors rc=$?"; grep -E "^\| (mhc|expand)" $R/anchors.log | cut -c1-110
PYTHONPATH=/tmp/siteS timeout 60 python3 host_time.py --name host_time_s16c4 --families mhc > $R/host_time.log 2>&1
echo "host rc=$?"; tail -30 $R/host_time.log | cut -c1-150
cd ..
find $OUT -name "*.json" -newer $R/date.txt -path "*NVIDIA*" -exec cp {} $R/ \;
find $OUT -name "*.md" -newer $R/date.txt -path "*NVIDIA*" -exec cp {} $R/ \;
tar czf $OUT/results.tgz -C $R . && rm -rf $R $OUT/20*  # one file back
