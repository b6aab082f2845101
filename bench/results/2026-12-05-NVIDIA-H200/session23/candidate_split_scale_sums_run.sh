#!/usr/bin/env bash
# Session 23 call 5: main 8537ab5 + mhc_pre_split_mixes_bwd's scale sums by three warps (a lane two
# columns, then an xor butterfly) instead of three threads' serial chains (dist_s23d, "N"), against
# main 3cb7b00's kernels (dist_s23, "O"): the split-mixes, per_block_cast and lossless GPU tests on
# N; the split-mixes backward's anchor on O and N alternately.
set -uo pipefail
R=$OUT/r; mkdir -p $R
for s in O N; do rm -rf /tmp/site$s; done
python3 -m pip install -q --no-index --no-deps --target /tmp/siteO dist_s23/tilebake-*.whl dist_s23/tilebake_cuda-*.whl || exit 1
python3 -m pip install -q --no-index --no-deps --target /tmp/siteN dist_s23d/tilebake-*.whl dist_s23d/tilebake_cuda-*.whl || exit 1
date -u +%FT%TZ > $R/date.txt
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/gpu.txt; cat $R/gpu.txt
export PYTHONUNBUFFERED=1
PYTHONPATH=/tmp/siteN timeout 90 python3 -m pytest tests/mhc/test_pre_split_mixes.py \
  tests/quant/test_per_block_cast.py \
  -m gpu -q -p no:cacheprovider -n 14 -rf > $R/tests.log 2>&1
echo "tests rc=$?: $(tail -1 $R/tests.log)"; grep -E "^FAILED|^ERROR" $R/tests.log | cut -c1-250 | head
cd bench
for s in O N O N; do
  PYTHONPATH=/tmp/site$s timeout 40 python3 anchors.py --cases "split_mixes" --name anchors_s23c5_$s > $R/anchors_$s.log 2>&1
  echo "anchors $s rc=$?"; grep -E "^\| mhc" $R/anchors_$s.log | cut -c1-120
done
cd ..
gzip $R/tests.log
find $OUT -name "*.json" -newer $R/date.txt -path "*NVIDIA*" -exec cp {} $R/ \;
find $OUT -name "*.md" -newer $R/date.txt -path "*NVIDIA*" -exec cp {} $R/ \;
tar czf $OUT/results.tgz -C $R . && rm -rf $R $OUT/20*
