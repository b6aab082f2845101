#!/usr/bin/env bash
# Session 14 call 2. N = dist_s14b: the working tree's tilebake (mhc_post_bwd with token_warps;
# call plans for fn_normw_merge, the GEMM backward; one version bump a plan; SM count cached)
# + a partial tilebake-cuda (mhc_post: the backward 1, 2 or 4 warps a token by hidden).
# R = dist_s14b's tilebake + dist_s13's kernels (but mhc_post's old backward: not used here).
# B = dist_s13 (session 13's wheels). H128 / H512 / H1024: partial wheels of mhc_head_compute_mix
# with its forward's CTA at that many threads (256 shipped); S128 / S256: of mhc_sinkhorn, CTAs of
# 128 / 256 threads (64 shipped).
set -uo pipefail
R=$OUT/r; mkdir -p $R
for s in N R B; do rm -rf /tmp/site$s; done
pip() { python3 -m pip install -q --no-index --no-deps --target "$@" || exit 1; }
pip /tmp/siteN dist_s14b/tilebake-*.whl dist_s14b/tilebake_cuda-*.whl
pip /tmp/siteR dist_s14b/tilebake-*.whl dist_s13/tilebake_cuda-*.whl
pip /tmp/siteB dist_s13/tilebake-*.whl dist_s13/tilebake_cuda-*.whl
date -u +%FT%TZ > $R/date.txt
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/gpu.txt
export PYTHONUNBUFFERED=1
PYTHONPATH=/tmp/siteN timeout 150 python3 -m pytest tests/mhc/test_mhc_post.py tests/test_plans_mhc.py -m gpu -n 16 -p no:cacheprovider -q -rf --tb=short > $R/tests_n.log 2>&1
echo "tests N rc=$?"; tail -1 $R/tests_n.log; grep -E "^FAILED|^ERROR" $R/tests_n.log | cut -c1-250 | head -12
gzip $R/tests_n.log
cd bench
for s in siteN siteB siteN siteB; do
  PYTHONPATH=/tmp/$s timeout 60 python3 anchors.py --cases "mhc_post" --name anchors_s14c2_$s > $R/anchors_$s.log 2>&1
  echo "anchors $s rc=$?"; grep -E "^\| (mhc)" $R/anchors_$s.log | cut -c1-110 | head -3
done
for s in siteN siteB; do
  PYTHONPATH=/tmp/$s timeout 120 python3 - > $R/post_small_$s.log 2>&1 <<'PY'
# mhc_post's backward at the issue's small shapes, a 2560-4096 one and the anchor's: CUDA-graph replays against the same run's copy
import bench, cases, harness
copy = harness.copy_bandwidth_gbs()
print(f"copy {copy:.0f} GB/s")
make = cases.CASES["mhc_post"][1]
for t, h in ((4096, 1280), (8192, 1280), (8192, 4096), (8192, 7168)):
    row = bench.measure(make(t, h), copy, None)
    print(f"{row['variant'][:40]:40s} {t}x{h}: graph {row['graph_us']:7.1f} us {row['graph_pct_copy']:5.1f}% of copy, "
          f"eager {row['eager_us']:7.1f} us, matches {row['output_matches_reference']}")
PY
  echo "post small $s rc=$?"; tail -4 $R/post_small_$s.log
done
PYTHONPATH=/tmp/siteR timeout 60 python3 - > $R/host_gemm_bwd.log 2>&1 <<'PY'
# where the GEMM backward's host time goes (T = 1): the key, the plan run, the whole call
import torch, harness, tilebake
from tilebake.mhc import mhc_pre_norm_gemm as g
mh = tilebake.mhc
x = torch.randn(1, 7168, device="cuda").bfloat16(); y = torch.empty_like(x)
residual, fn = torch.randn(1, 4, 7168, device="cuda").bfloat16(), torch.randn(24, 4 * 7168, device="cuda")
out, sq, r_grad, fn_grad = torch.randn(1, 24, device="cuda"), torch.randn(1, 1, device="cuda"), torch.zeros_like(residual), torch.empty_like(fn)
print(f"torch.mul(out=) {harness.host_us_per_call(lambda: torch.mul(x, 2, out=y), ()):.2f} us")
call = lambda: mh.mhc_pre_norm_gemm_bwd(residual, fn, out, sq, r_grad, fn_grad)
print(f"whole call {harness.host_us_per_call(call, ()):.2f} us")
key = g._bwd_key(residual, fn, out, sq, r_grad, fn_grad)
print(f"key {harness.host_us_per_call(lambda: g._bwd_key(residual, fn, out, sq, r_grad, fn_grad), ()):.2f} us", key)
p = g._PLANS[key]
from tilebake._runtime import plan
print(f"plan.run {harness.host_us_per_call(lambda: plan.run(p, residual, fn, out, sq, r_grad, fn_grad), ()):.2f} us")
print(f"get_num_sms {harness.host_us_per_call(tilebake.config.get_num_sms, ()):.2f} us")
print(f"torch.empty 2.75 MB {harness.host_us_per_call(lambda: torch.empty(1, 24, 28672, device='cuda'), ()):.2f} us")
PY
echo "host gemm bwd rc=$?"; cat $R/host_gemm_bwd.log | tail -7
for v in H128 H512 H1024 S128 S256; do
  rm -rf /tmp/site$v; python3 -m pip install -q --no-index --no-deps --target /tmp/site$v dist_s14b/tilebake-*.whl dist_s14$v/tilebake_cuda-*.whl
done
for s in siteH128 siteH512 siteH1024 siteB siteH128 siteH512 siteH1024 siteB; do
  PYTHONPATH=/tmp/$s timeout 60 python3 anchors.py --cases "head_compute_mix_fwd" --name anchors_s14c2_head_$s > $R/anchors_head_$s.log 2>&1
  echo "anchors $s rc=$?"; grep -E "^\| (mhc)" $R/anchors_head_$s.log | cut -c1-110 | head -2
done
for s in siteS128 siteS256 siteB siteS128 siteS256 siteB; do
  PYTHONPATH=/tmp/$s timeout 60 python3 anchors.py --cases "sinkhorn" --name anchors_s14c2_sk_$s > $R/anchors_sk_$s.log 2>&1
  echo "anchors $s rc=$?"; grep -E "^\| (mhc)" $R/anchors_sk_$s.log | cut -c1-110 | head -3
done
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
for c in "mhc_sinkhorn|forward|512x7168" "mhc_head_compute_mix|forward|8192x7168" "mhc_pre_split_mixes|backward|8192x7168"; do
  IFS='|' read op v shape <<< "$c"
  PYTHONPATH=/tmp/siteR timeout 90 $NCU --clock-control none --profile-from-start off --section SpeedOfLight --section LaunchStats --section Occupancy --section WarpStateStats --print-details all python3 ncu_case.py "$op" "$v" "$shape" > $R/ncu_$op.txt 2>&1
  echo "ncu $op rc=$?"; grep -E "Duration|Warp Cycles Per Issued|Achieved Occupancy|Block Size|Grid Size" $R/ncu_$op.txt | head -10
done
cd ..
find $OUT -name "*.json" -newer $R/date.txt -path "*NVIDIA*" -exec cp {} $R/ \;
find $OUT -name "*.md" -newer $R/date.txt -path "*NVIDIA*" -exec cp {} $R/ \;
tar czf $OUT/results.tgz -C $R . && rm -rf $R $OUT/20*  # one file back
