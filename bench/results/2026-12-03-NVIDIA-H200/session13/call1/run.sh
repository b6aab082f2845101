#!/usr/bin/env bash
# Session 13 call 1. Baseline B = dist_s12c (main's multilayer / post backward kernels).
# A = dist_s13a: the multilayer recompute with every layer's mix loads issued before any store to
#     shared memory (they were serialised: a load stored in its own guarded block), + post, pre_apply_mix;
# T = dist_s13b: A's multilayer with 64-thread CTAs (512 columns), 10 CTAs an SM;
# P = dist_s13c: mhc_post backward with the token's mixes in registers (m <= 4) rather than reloaded a step.
set -uo pipefail
R=$OUT/r; mkdir -p $R
rm -rf /tmp/siteA /tmp/siteB /tmp/siteT /tmp/siteP
inst() { python3 -m pip install -q --no-index --no-deps --target /tmp/$1 dist_s12c/tilebake-*.whl $2/tilebake_cuda-*.whl || exit 1; }
inst siteB dist_s12c; inst siteA dist_s13a; inst siteT dist_s13b; inst siteP dist_s13c
date -u +%FT%TZ > $R/date.txt
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/gpu.txt
export PYTHONUNBUFFERED=1
PYTHONPATH=/tmp/siteA timeout 150 python3 -m pytest tests/mhc/test_mhc_multilayer_recompute.py -m gpu -n 16 -p no:cacheprovider -q -rf --tb=short > $R/tests_a.log 2>&1
echo "tests A rc=$?"; tail -1 $R/tests_a.log; grep -E "^FAILED|^ERROR" $R/tests_a.log | cut -c1-250 | head -8
PYTHONPATH=/tmp/siteP timeout 150 python3 -m pytest tests/mhc/test_mhc_post.py -m gpu -n 16 -p no:cacheprovider -q -rf --tb=short > $R/tests_p.log 2>&1
echo "tests P rc=$?"; tail -1 $R/tests_p.log; grep -E "^FAILED|^ERROR" $R/tests_p.log | cut -c1-250 | head -8
gzip $R/tests_*.log
cd bench
for s in siteA siteT siteB siteA siteT siteB; do
  PYTHONPATH=/tmp/$s timeout 60 python3 anchors.py --cases "multilayer" --name anchors_s13c1_$s > $R/anchors_$s.log 2>&1
  echo "anchors $s rc=$?"; grep -E "^\| (mhc)" $R/anchors_$s.log | head -2
done
for s in siteP siteB siteP siteB; do
  PYTHONPATH=/tmp/$s timeout 60 python3 anchors.py --cases "mhc_post_bwd" --name anchors_s13c1p_$s > $R/anchorsp_$s.log 2>&1
  echo "anchors P $s rc=$?"; grep -E "^\| (mhc)" $R/anchorsp_$s.log | head -2
done
cd ..
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
PYTHONPATH=/tmp/siteA timeout 120 "$NCU" --clock-control none --profile-from-start off --set full --print-details all \
  python3 bench/ncu_case.py mhc_multilayer_recompute "" 8192x8192 > $R/ncu_multilayer.txt 2>&1
echo "ncu rc=$?"; grep -E "Duration|DRAM Throughput|Issue Slots Busy|Achieved Occupancy|Registers Per|Stall" $R/ncu_multilayer.txt | head -14
gzip $R/ncu_multilayer.txt
find $OUT -name "*.json" -newer $R/date.txt -path "*NVIDIA*" -exec cp {} $R/ \;
tar czf $OUT/results.tgz -C $R . && rm -rf $R $OUT/20*  # one file back
