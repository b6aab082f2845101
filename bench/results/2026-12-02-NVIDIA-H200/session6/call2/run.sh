#!/usr/bin/env bash
# Session 6 call 2: the pre-norm projection's bandwidth at T = 8192, m = 4, H = 7168 (the issue's
# bar: 85% of copy), forward and backward, beside the same run's copy and torch.mul(out=) host time.
set -uo pipefail
rm -rf /tmp/site-t6
python3 -m pip install -q --no-index --no-deps --target /tmp/site-t6 dist/tilebake-*.whl dist/tilebake_cuda-*.whl || exit 1
export PYTHONPATH=/tmp/site-t6:bench PYTHONUNBUFFERED=1
R=/tmp/r2; rm -rf $R; mkdir -p $R
date -u +%FT%TZ > $R/date.txt
timeout 200 python3 - > $R/gemm.txt 2>&1 <<'PY'
import torch, harness, tilebake
copy = harness.copy_bandwidth_gbs()
x1 = torch.randn(1, 7168, device="cuda").bfloat16(); y1 = torch.empty_like(x1)
mul = harness.host_us_per_call(lambda: torch.mul(x1, 2, out=y1), ())
print(f"copy {copy:.0f} GB/s, torch.mul(out=) host {mul:.2f} us")
T, m, H = 8192, 4, 7168
for splits in (16, 8, 4, 1):
    def make():
        return (torch.randn(T, m, H, device="cuda").bfloat16(), torch.randn(24, m * H, device="cuda") / 170)
    ins = [make() for _ in range(3)]
    us = harness.time_graph(lambda r, fn: tilebake.mhc.mhc_pre_norm_gemm_fwd(r, fn, splits), ins)
    nbytes = T * m * H * 2 + 24 * m * H * 4 + splits * T * 25 * 4
    print(f"fwd n_splits={splits}: {us:.1f} us, {nbytes / us / 1e3:.0f} GB/s = {nbytes / us / 1e3 / copy * 100:.1f}% of copy")
def makeb():
    r, fn = torch.randn(T, m, H, device="cuda").bfloat16(), torch.randn(24, m * H, device="cuda") / 170
    return r, fn, torch.randn(T, 24, device="cuda"), torch.randn(T, device="cuda"), torch.zeros_like(r)
ins = [makeb() for _ in range(3)]
us = harness.time_graph(lambda r, fn, d, s, g: tilebake.mhc.mhc_pre_norm_gemm_bwd(r, fn, d, s, g), ins)
nbytes = T * m * H * 2 * 3
print(f"bwd (residual_grad accumulated): {us:.1f} us, {nbytes / us / 1e3:.0f} GB/s = {nbytes / us / 1e3 / copy * 100:.1f}% of copy")
PY
echo "rc=$?"; cat $R/gemm.txt
tar czf $OUT/results.tgz -C $R .
