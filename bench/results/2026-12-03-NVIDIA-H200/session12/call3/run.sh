#!/usr/bin/env bash
# Session 12 call 3: dist_s12c/ (full wheels of the working tree: pre_apply_mix forward two tokens a
# CTA; mhc_post forward, pre_apply_mix forward and the multilayer recompute on a one-dimensional
# grid, a token's column blocks adjacent) against dist_s12b/ (the same ops on the two-dimensional
# grid, token-major): anchors E, B, E; then the whole GPU suite on dist_s12c.
set -uo pipefail
R=$OUT/r; mkdir -p $R
rm -rf /tmp/site /tmp/siteB
python3 -m pip install -q --no-index --no-deps --target /tmp/site dist_s12c/tilebake-*.whl dist_s12c/tilebake_cuda-*.whl || exit 1
python3 -m pip install -q --no-index --no-deps --target /tmp/siteB dist_s12b/tilebake-*.whl dist_s12b/tilebake_cuda-*.whl || exit 1
date -u +%FT%TZ > $R/date.txt
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/gpu.txt
export PYTHONUNBUFFERED=1
cd bench
for s in site siteB site; do
  PYTHONPATH=/tmp/$s timeout 60 python3 anchors.py --cases "mhc_post_fwd|mhc_pre_apply_mix_fwd|multilayer" --name anchors_s12c3_$s > $R/anchors_$s.log 2>&1
  echo "anchors $s rc=$?"; grep -E "^\| (mhc)" $R/anchors_$s.log | head -4
done
cd ..
PYTHONPATH=/tmp/site timeout 400 python3 -m pytest tests -m gpu -n 16 -p no:cacheprovider -q -rf --tb=short > $R/gpu_tests.log 2>&1
echo "suite rc=$?"; tail -1 $R/gpu_tests.log; grep -E "^FAILED|^ERROR" $R/gpu_tests.log | cut -c1-250 | head -20
gzip $R/gpu_tests.log
find $OUT -name "*.json" -newer $R/date.txt -path "*NVIDIA*" -exec cp {} $R/ \;
tar czf $OUT/results.tgz -C $R . && rm -rf $R $OUT/20*  # one file back
