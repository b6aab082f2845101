#!/usr/bin/env bash
# Session 13 call 5: dist_s13h/ (tilebake of the working tree: mhc_multilayer_recompute's call plan,
# list items in plans, 72 tensor slots) with dist_s13/'s tilebake-cuda (6d81a2a's kernels): the
# plan tests and the multilayer's GPU tests, then the mhc family's host times.
set -uo pipefail
R=$OUT/r; mkdir -p $R
rm -rf /tmp/site
python3 -m pip install -q --no-index --no-deps --target /tmp/site dist_s13h/tilebake-*.whl dist_s13/tilebake_cuda-*.whl || exit 1
date -u +%FT%TZ > $R/date.txt
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/gpu.txt
export PYTHONUNBUFFERED=1
PYTHONPATH=/tmp/site timeout 150 python3 -m pytest tests/mhc/test_mhc_multilayer_recompute.py tests/test_plans.py tests/test_plans_mhc.py tests/test_plans_mhc_norm.py tests/test_native_path.py -m "gpu or not gpu" -n 16 -p no:cacheprovider -q -rf --tb=short > $R/tests.log 2>&1
echo "tests rc=$?"; tail -1 $R/tests.log; grep -E "^FAILED|^ERROR" $R/tests.log | cut -c1-250 | head -12
gzip $R/tests.log
cd bench
PYTHONPATH=/tmp/site timeout 120 python3 host_time.py --families mhc --name host_time_s13c5 > $R/host_time.log 2>&1
echo "host rc=$?"; grep -E "torch.mul|mhc" $R/host_time.log | head -24
PYTHONPATH=/tmp/site timeout 60 python3 - > $R/host_time_layers.log 2>&1 <<'PY'
import torch, harness, tilebake
T, H, M = 1, 7168, 4
x = torch.randn(T, H, device="cuda").bfloat16(); y = torch.empty_like(x)
print(f"torch.mul(out=) {harness.host_us_per_call(lambda: torch.mul(x, 2, out=y), ()):.2f} us")
for L in (1, 4, 10):
    bf = lambda *s: torch.randn(*s, device="cuda").bfloat16()
    r0 = bf(T, M, H); pre = [torch.rand(T, M, 1, device="cuda") for _ in range(L)]; outs = [bf(T, H) for _ in range(L)]
    post = [torch.rand(T, M, 1, device="cuda") for _ in range(L)]; comb = [torch.rand(T, M, M, device="cuda") for _ in range(L)]
    li = [bf(T, H) for _ in range(L)]; rl = [bf(T, M, H) for _ in range(L)]
    us = harness.host_us_per_call(lambda: tilebake.mhc.mhc_multilayer_recompute(r0, pre, outs, post, comb, li, rl), ())
    print(f"mhc_multilayer_recompute {L} layers {us:.2f} us")
PY
echo "layers rc=$?"; cat $R/host_time_layers.log
cd ..
find $OUT -name "*.json" -newer $R/date.txt -path "*NVIDIA*" -exec cp {} $R/ \;
find $OUT -name "*.md" -newer $R/date.txt -path "*NVIDIA*" -exec cp {} $R/ \;
tar czf $OUT/results.tgz -C $R . && rm -rf $R $OUT/20*  # one file back
