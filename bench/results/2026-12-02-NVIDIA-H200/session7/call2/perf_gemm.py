"""Session 7: the pre-norm GEMM and mhc_post at the issue's shapes, with copy bandwidth and mul host time."""
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
    print(f"gemm fwd T{T} m{m} H{H} n_splits={splits}: {us:.1f} us, {nbytes / us / 1e3:.0f} GB/s = {nbytes / us / 1e3 / copy * 100:.1f}% of copy")
