#!/usr/bin/env bash
# Session 10 call 3: dist_next/ with mhc_post_fwd unrolled over the streams: the mhc_post, multilayer
# recompute and modeling GPU tests, the mhc_post / expand anchors.
set -uo pipefail
R=$OUT/r; mkdir -p $R
rm -rf /tmp/site
python3 -m pip install -q --no-index --no-deps --target /tmp/site dist_next/tilebake-*.whl dist_next/tilebake_cuda-*.whl || exit 1
date -u +%FT%TZ > $R/date.txt
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site
timeout 240 python3 -m pytest tests/mhc/test_mhc_post.py tests/mhc/test_mhc_multilayer_recompute.py tests/modeling tests/test_plans_mhc.py -m gpu -n 16 -p no:cacheprovider -q -rf --tb=short > $R/tests.log 2>&1
echo "tests rc=$?"; tail -1 $R/tests.log; grep -E "^FAILED|^ERROR" $R/tests.log | head -10
cd bench
for i in 1 2; do
  timeout 100 python3 anchors.py --cases "mhc_post|expand|apply_mix" --name anchors_s10_post$i > $R/anchors$i.log 2>&1
  echo "anchors rc=$?"; grep -E "^\| (mhc|expand)|copy" $R/anchors$i.log | head -10
done
cd ..
find bench/results $OUT -maxdepth 3 -newer $R/date.txt -type f -name "*s10_post*" -exec cp {} $R/ \; 2>/dev/null
rm -f $R/anchors*.log
tar czf $OUT/call3.tgz -C $R . && rm -rf $R
