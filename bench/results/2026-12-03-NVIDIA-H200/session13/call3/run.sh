#!/usr/bin/env bash
# Session 13 call 3. N = dist_s13g: the working tree's tilebake + a partial tilebake-cuda:
# mhc_pre_big_fuse as two kernels (the mixes a warp a token, then mhc_pre_apply_mix's forward)
# through one call plan. B = dist_s12c (the chain of four ops, session 12's kernels).
set -uo pipefail
R=$OUT/r; mkdir -p $R
rm -rf /tmp/siteB /tmp/siteN
python3 -m pip install -q --no-index --no-deps --target /tmp/siteB dist_s12c/tilebake-*.whl dist_s12c/tilebake_cuda-*.whl || exit 1
python3 -m pip install -q --no-index --no-deps --target /tmp/siteN dist_s13g/tilebake-*.whl dist_s13g/tilebake_cuda-*.whl || exit 1
date -u +%FT%TZ > $R/date.txt
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/gpu.txt
export PYTHONUNBUFFERED=1
PYTHONPATH=/tmp/siteN timeout 200 python3 -m pytest tests/mhc/test_mhc_pre_big_fuse.py tests/mhc/test_mhc_pre_apply_mix.py tests/test_plans_mhc_norm.py tests/modeling/test_mhc_layer.py -m "gpu or not gpu" -n 16 -p no:cacheprovider -q -rf --tb=short > $R/tests_n.log 2>&1
echo "tests N rc=$?"; tail -1 $R/tests_n.log; grep -E "^FAILED|^ERROR" $R/tests_n.log | cut -c1-300 | head -12
gzip $R/tests_n.log
cd bench
for s in siteN siteB siteN siteB; do
  PYTHONPATH=/tmp/$s timeout 60 python3 anchors.py --cases "big_fuse|mhc_pre_apply_mix_fwd" --name anchors_s13c3_$s > $R/anchors_$s.log 2>&1
  echo "anchors $s rc=$?"; grep -E "^\| (mhc)" $R/anchors_$s.log | head -3
done
PYTHONPATH=/tmp/siteN timeout 60 python3 - > $R/host_time_siteN.log 2>&1 <<'PY'
import torch, harness, host_time
cases = host_time.cases(("mhc",))
x = host_time.bf16(1, 7168); y = torch.empty_like(x)
print(f"torch.mul(out=) {harness.host_us_per_call(lambda: torch.mul(x, 2, out=y), ()):.2f} us")
for name in ("mhc_pre_big_fuse_fwd", "mhc_pre_apply_mix_fwd"):
    for label, fn in zip(("allocated", "given"), cases[name]):
        if fn is not None:
            print(f"{name} {label} {harness.host_us_per_call(fn, ()):.2f} us")
PY
echo "host rc=$?"; cat $R/host_time_siteN.log | head -6
cd ..
find $OUT -name "*.json" -newer $R/date.txt -path "*NVIDIA*" -exec cp {} $R/ \;
find $OUT -name "*.md" -newer $R/date.txt -path "*NVIDIA*" -exec cp {} $R/ \;
tar czf $OUT/results.tgz -C $R . && rm -rf $R $OUT/20*  # one file back
