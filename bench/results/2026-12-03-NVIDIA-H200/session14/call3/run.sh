#!/usr/bin/env bash
# Session 14 call 3. N = dist_s14c: the working tree's tilebake + a partial tilebake-cuda (mhc_post:
# the backward in two variants, a warp a token (hidden < 5120) or a CTA a token, picked by the host).
# B = dist_s13. H128 / H512 / H1024: mhc_head_compute_mix's forward CTA at that many threads (256
# shipped); S128 / S256: mhc_sinkhorn's CTAs of 128 / 256 threads (64 shipped); with dist_s14b's tilebake.
set -uo pipefail
R=$OUT/r; mkdir -p $R
pip() { python3 -m pip install -q --no-index --no-deps --target "$@" || exit 1; }
rm -rf /tmp/siteN /tmp/siteB; pip /tmp/siteN dist_s14c/tilebake-*.whl dist_s14c/tilebake_cuda-*.whl
pip /tmp/siteB dist_s13/tilebake-*.whl dist_s13/tilebake_cuda-*.whl
for v in H128 H512 H1024 S128 S256; do rm -rf /tmp/site$v; pip /tmp/site$v dist_s14b/tilebake-*.whl dist_s14$v/tilebake_cuda-*.whl; done
date -u +%FT%TZ > $R/date.txt
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/gpu.txt
export PYTHONUNBUFFERED=1
PYTHONPATH=/tmp/siteN timeout 150 python3 -m pytest tests/mhc/test_mhc_post.py tests/test_plans_mhc.py -k post -m "gpu or not gpu" -n 16 -p no:cacheprovider -q -rf --tb=short > $R/tests_n.log 2>&1
echo "tests N rc=$?"; tail -1 $R/tests_n.log; grep -E "^FAILED|^ERROR" $R/tests_n.log | cut -c1-250 | head -12
gzip $R/tests_n.log
cd bench
for s in siteN siteB siteN siteB; do
  PYTHONPATH=/tmp/$s timeout 60 python3 anchors.py --cases "mhc_post_bwd" --name anchors_s14c3_$s > $R/anchors_$s.log 2>&1
  echo "anchors $s rc=$?"; grep -E "^\| (mhc)" $R/anchors_$s.log | cut -c1-110 | head -3
done
for s in siteN siteB; do
  PYTHONPATH=/tmp/$s timeout 120 python3 - > $R/post_small_$s.log 2>&1 <<'PY'
# mhc_post's backward at the issue's small shapes, around the 5120 switch and the anchor's: CUDA-graph replays against the same run's copy
import bench, cases, harness
copy = harness.copy_bandwidth_gbs()
print(f"copy {copy:.0f} GB/s")
make = cases.CASES["mhc_post"][1]
for t, h in ((4096, 1280), (8192, 1280), (8192, 4096), (8192, 5120), (8192, 7168)):
    row = bench.measure(make(t, h), copy, None)
    print(f"{row['variant'][:40]:40s} {t}x{h}: graph {row['graph_us']:7.1f} us {row['graph_pct_copy']:5.1f}% of copy, "
          f"eager {row['eager_us']:7.1f} us, matches {row['output_matches_reference']}")
PY
  echo "post small $s rc=$?"; tail -5 $R/post_small_$s.log
done
for s in siteH128 siteH512 siteH1024 siteB siteH128 siteH512 siteH1024 siteB; do
  PYTHONPATH=/tmp/$s timeout 60 python3 anchors.py --cases "head_compute_mix_fwd" --name anchors_s14c3_head_$s > $R/anchors_head_$s.log 2>&1
  echo "anchors $s rc=$?"; grep -E "^\| (mhc)" $R/anchors_head_$s.log | cut -c1-110 | head -2
done
for s in siteS128 siteS256 siteB siteS128 siteS256 siteB; do
  PYTHONPATH=/tmp/$s timeout 60 python3 anchors.py --cases "sinkhorn" --name anchors_s14c3_sk_$s > $R/anchors_sk_$s.log 2>&1
  echo "anchors $s rc=$?"; grep -E "^\| (mhc)" $R/anchors_sk_$s.log | cut -c1-110 | head -3
done
cd ..
find $OUT -name "*.json" -newer $R/date.txt -path "*NVIDIA*" -exec cp {} $R/ \;
find $OUT -name "*.md" -newer $R/date.txt -path "*NVIDIA*" -exec cp {} $R/ \;
tar czf $OUT/results.tgz -C $R . && rm -rf $R $OUT/20*  # one file back
