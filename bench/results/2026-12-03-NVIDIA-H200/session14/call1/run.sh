#!/usr/bin/env bash
# Session 14 call 1. R = dist_s14a (the working tree's tilebake: call plans for fn_normw_merge and
# the GEMM backward, one version bump a plan) + dist_s13's kernels; K1 / K2 = dist_s14a + partial
# tilebake-cuda (mhc_post, mhc_pre_apply_mix, mhc_pre_big_fuse) of the working tree's kernels:
# post bwd a CTA a token (K1: 128 registers; K2: at most 96, 5 CTAs an SM), post fwd / apply_mix
# fwd+bwd with the mixes loaded up front (apply fwd K1: 5 CTAs an SM, K2: 4); B = dist_s13.
set -uo pipefail
R=$OUT/r; mkdir -p $R
for s in R K1 K2 B; do rm -rf /tmp/site$s; done
pip() { python3 -m pip install -q --no-index --no-deps --target "$@" || exit 1; }
pip /tmp/siteR dist_s14a/tilebake-*.whl dist_s13/tilebake_cuda-*.whl
pip /tmp/siteK1 dist_s14a/tilebake-*.whl dist_s14K1/tilebake_cuda-*.whl
pip /tmp/siteK2 dist_s14a/tilebake-*.whl dist_s14K2/tilebake_cuda-*.whl
pip /tmp/siteB dist_s13/tilebake-*.whl dist_s13/tilebake_cuda-*.whl
date -u +%FT%TZ > $R/date.txt
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/gpu.txt
export PYTHONUNBUFFERED=1
PYTHONPATH=/tmp/siteR timeout 240 python3 -m pytest tests/mhc tests/modeling tests/test_plans.py tests/test_plans_mhc.py tests/test_plans_mhc_norm.py tests/test_plans_back.py tests/test_native_path.py tests/test_out_buffers.py -m gpu -n 16 -p no:cacheprovider -q -rf --tb=short > $R/tests_r.log 2>&1
echo "tests R rc=$?"; tail -1 $R/tests_r.log; grep -E "^FAILED|^ERROR" $R/tests_r.log | cut -c1-250 | head -12
gzip $R/tests_r.log
PYTHONPATH=/tmp/siteK1 timeout 150 python3 -m pytest tests/mhc/test_mhc_post.py tests/mhc/test_mhc_pre_apply_mix.py tests/mhc/test_mhc_pre_big_fuse.py -m gpu -n 16 -p no:cacheprovider -q -rf --tb=short > $R/tests_k1.log 2>&1
echo "tests K1 rc=$?"; tail -1 $R/tests_k1.log; grep -E "^FAILED|^ERROR" $R/tests_k1.log | cut -c1-250 | head -12
gzip $R/tests_k1.log
cd bench
for s in siteK1 siteK2 siteB siteK1 siteK2 siteB; do
  PYTHONPATH=/tmp/$s timeout 60 python3 anchors.py --cases "mhc_post|mhc_pre_apply_mix|big_fuse" --name anchors_s14c1_$s > $R/anchors_$s.log 2>&1
  echo "anchors $s rc=$?"; grep -E "^\| (mhc)" $R/anchors_$s.log | cut -c1-110 | head -6
done
for s in siteK1 siteK2 siteB; do
  PYTHONPATH=/tmp/$s timeout 120 python3 - > $R/post_small_$s.log 2>&1 <<'PY'
# mhc_post at the issue's small shapes (and the anchor's): CUDA-graph replays against the same run's copy
import bench, cases, harness
copy = harness.copy_bandwidth_gbs()
print(f"copy {copy:.0f} GB/s")
for make in cases.CASES["mhc_post"]:
    for t, h in ((4096, 1280), (8192, 1280), (8192, 7168)):
        row = bench.measure(make(t, h), copy, None)
        print(f"{row['variant'][:40]:40s} {t}x{h}: graph {row['graph_us']:7.1f} us {row['graph_pct_copy']:5.1f}% of copy, "
              f"eager {row['eager_us']:7.1f} us, matches {row['output_matches_reference']}")
PY
  echo "post small $s rc=$?"; cat $R/post_small_$s.log | tail -7
done
PYTHONPATH=/tmp/siteR timeout 120 python3 host_time.py --families mhc --name host_time_s14c1 > $R/host_time.log 2>&1
echo "host rc=$?"; grep -E "torch.mul|mhc" $R/host_time.log | head -24
cd ..
find $OUT -name "*.json" -newer $R/date.txt -path "*NVIDIA*" -exec cp {} $R/ \;
find $OUT -name "*.md" -newer $R/date.txt -path "*NVIDIA*" -exec cp {} $R/ \;
tar czf $OUT/results.tgz -C $R . && rm -rf $R $OUT/20*  # one file back
