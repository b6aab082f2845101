#!/usr/bin/env bash
# Session 16 call 2. S = dist_s16full: full wheels of main 0dccd43 (mhc_post's backward by cp.async
# stages). B = dist_s16B: main 9b961e1's mhc ops (partial, sm_90a).
set -uo pipefail
R=$OUT/r; mkdir -p $R
pip() { python3 -m pip install -q --no-index --no-deps --target "$@" || exit 1; }
pip /tmp/siteS dist_s16full/tilebake-*.whl dist_s16full/tilebake_cuda-*.whl
pip /tmp/siteB dist_s16B/tilebake-*.whl dist_s16B/tilebake_cuda-*.whl
date -u +%FT%TZ > $R/date.txt
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/gpu.txt
export PYTHONUNBUFFERED=1
cd bench
for s in siteS siteB siteS siteB; do
  PYTHONPATH=/tmp/$s timeout 60 python3 anchors.py --cases "mhc_post" --name anchors_s16c2_$s > $R/anchors_$s.log 2>&1
  echo "anchors $s rc=$?"; grep -E "^\| (mhc)" $R/anchors_$s.log | cut -c1-100 | head -2
done
cd ..
PYTHONPATH=/tmp/siteS timeout 440 python3 -m pytest tests -m gpu -n 16 -p no:cacheprovider -q -rf --tb=short > $R/gpu_tests.log 2>&1
echo "gpu tests rc=$?"; tail -2 $R/gpu_tests.log; grep -E "^FAILED|^ERROR" $R/gpu_tests.log | cut -c1-250 | head -12
gzip $R/gpu_tests.log
find $OUT -name "*.json" -newer $R/date.txt -path "*NVIDIA*" -exec cp {} $R/ \;
find $OUT -name "*.md" -newer $R/date.txt -path "*NVIDIA*" -exec cp {} $R/ \;
tar czf $OUT/results.tgz -C $R . && rm -rf $R $OUT/20*  # one file back
