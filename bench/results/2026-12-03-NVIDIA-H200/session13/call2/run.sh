#!/usr/bin/env bash
# Session 13 call 2. B = dist_s12c (session 12's kernels). N = dist_s13f: the working tree's
# tilebake + a partial tilebake-cuda of 10 mhc ops: mhc_pre_big_fuse as one kernel (m <= 4), the
# 16-byte stores of mhc_post / pre_apply_mix forwards and expand_to_mhc's backward (they were
# split in four), the multilayer's mix staging and post backward of call 1.
# E = dist_s13e: the multilayer reading layer outputs two layers ahead (call 1's kernel otherwise).
set -uo pipefail
R=$OUT/r; mkdir -p $R
rm -rf /tmp/siteB /tmp/siteN /tmp/siteE
python3 -m pip install -q --no-index --no-deps --target /tmp/siteB dist_s12c/tilebake-*.whl dist_s12c/tilebake_cuda-*.whl || exit 1
python3 -m pip install -q --no-index --no-deps --target /tmp/siteN dist_s13f/tilebake-*.whl dist_s13f/tilebake_cuda-*.whl || exit 1
python3 -m pip install -q --no-index --no-deps --target /tmp/siteE dist_s12c/tilebake-*.whl dist_s13e/tilebake_cuda-*.whl || exit 1
date -u +%FT%TZ > $R/date.txt
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/gpu.txt
export PYTHONUNBUFFERED=1
T="tests/mhc/test_mhc_pre_big_fuse.py tests/mhc/test_mhc_post.py tests/mhc/test_mhc_pre_apply_mix.py tests/mhc/test_expand_to_mhc.py
 tests/mhc/test_mhc_multilayer_recompute.py tests/mhc/test_sinkhorn.py tests/mhc/test_pre_split_mixes.py
 tests/mhc/test_mhc_reduce_partials_and_rmsnorm.py tests/mhc/test_head_compute_mix.py tests/test_plans_mhc_norm.py tests/test_plans_mhc.py"
PYTHONPATH=/tmp/siteN timeout 240 python3 -m pytest $T -m "gpu or not gpu" -n 16 -p no:cacheprovider -q -rf --tb=short > $R/tests_n.log 2>&1
echo "tests N rc=$?"; tail -1 $R/tests_n.log; grep -E "^FAILED|^ERROR" $R/tests_n.log | cut -c1-300 | head -12
gzip $R/tests_n.log
cd bench
C="mhc_post|mhc_pre_apply_mix_fwd|expand_to_mhc_bwd|big_fuse|multilayer"
for s in siteN siteB siteN siteB; do
  PYTHONPATH=/tmp/$s timeout 100 python3 anchors.py --cases "$C" --name anchors_s13c2_$s > $R/anchors_$s.log 2>&1
  echo "anchors $s rc=$?"; grep -E "^\| (mhc|expand)" $R/anchors_$s.log | head -8
done
for s in siteE siteE; do
  PYTHONPATH=/tmp/$s timeout 60 python3 anchors.py --cases "multilayer" --name anchors_s13c2e_$s > $R/anchorse_$s.log 2>&1
  echo "anchors E rc=$?"; grep -E "^\| (mhc)" $R/anchorse_$s.log | head -2
done
for s in siteN siteB; do  # the ops in the partial wheel (host_time.py's cases, timed one by one)
PYTHONPATH=/tmp/$s timeout 100 python3 - > $R/host_time_$s.log 2>&1 <<'PY'
import torch, harness, host_time
cases = host_time.cases(("mhc",))
x = host_time.bf16(1, 7168); y = torch.empty_like(x)
print(f"torch.mul(out=) {harness.host_us_per_call(lambda: torch.mul(x, 2, out=y), ()):.2f} us")
for name in ("mhc_pre_big_fuse_fwd", "mhc_multilayer_recompute", "mhc_post_fwd", "mhc_pre_apply_mix_fwd", "mhc_sinkhorn_fwd"):
    for label, fn in zip(("allocated", "given"), cases[name]):
        if fn is not None:
            print(f"{name} {label} {harness.host_us_per_call(fn, ()):.2f} us")
PY
echo "host $s rc=$?"; cat $R/host_time_$s.log | head -12
done
cd ..
find $OUT -name "*.json" -newer $R/date.txt -path "*NVIDIA*" -exec cp {} $R/ \;
find $OUT -name "*.md" -newer $R/date.txt -path "*NVIDIA*" -exec cp {} $R/ \;
tar czf $OUT/results.tgz -C $R . && rm -rf $R $OUT/20*  # one file back
