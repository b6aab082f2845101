#!/usr/bin/env bash
# Session 16 call 3: mhc_post's backward at 8192 x 4 x 7168. S1 = dist_s16full (0dccd43: stages at
# shared offset 320), S2 = dist_s16_S2 (partial: the stages 1 KiB aligned), C = dist_s16_2_4 (call
# 1's candidate: stages at offset 0, aliased with the warps' sums: wrong d_post / d_comb at G = 4),
# B = dist_s16B (main 9b961e1).
set -uo pipefail
R=$OUT/r; mkdir -p $R
pip() { python3 -m pip install -q --no-index --no-deps --target "$@" || exit 1; }
pip /tmp/siteS1 dist_s16full/tilebake-*.whl dist_s16full/tilebake_cuda-*.whl
pip /tmp/siteB dist_s16B/tilebake-*.whl dist_s16B/tilebake_cuda-*.whl
pip /tmp/siteS2 dist_s16B/tilebake-*.whl dist_s16_S2/tilebake_cuda-*.whl
pip /tmp/siteC dist_s16B/tilebake-*.whl dist_s16_2_4/tilebake_cuda-*.whl
date -u +%FT%TZ > $R/date.txt
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/gpu.txt
export PYTHONUNBUFFERED=1
PYTHONPATH=/tmp/siteS2 timeout 100 python3 -m pytest tests/mhc/test_mhc_post.py -m gpu -k "backward or bwd" -n 16 -p no:cacheprovider -q -rf --tb=short > $R/tests_S2.log 2>&1
echo "tests S2 rc=$?"; tail -1 $R/tests_S2.log; grep -E "^FAILED|^ERROR" $R/tests_S2.log | cut -c1-250 | head -6
cd bench
for s in siteS2 siteS1 siteC siteB siteS2 siteS1 siteC siteB; do
  PYTHONPATH=/tmp/$s timeout 60 python3 anchors.py --cases "mhc_post_bwd" --name anchors_s16c3_$s > $R/anchors_$s.log 2>&1
  echo "anchors $s rc=$?"; grep -E "^\| (mhc)" $R/anchors_$s.log | cut -c1-100 | head -2
done
cd ..
find $OUT -name "*.json" -newer $R/date.txt -path "*NVIDIA*" -exec cp {} $R/ \;
find $OUT -name "*.md" -newer $R/date.txt -path "*NVIDIA*" -exec cp {} $R/ \;
tar czf $OUT/results.tgz -C $R . && rm -rf $R $OUT/20*  # one file back
