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
# correctness spot check of the gemm vs float64 (the tests do it thoroughly)
r, fn = torch.randn(1001, m, H, device="cuda").bfloat16(), torch.randn(24, m * H, device="cuda") / 170
o, s = tilebake.mhc.mhc_pre_norm_gemm_fwd(r, fn, 16)
x = r.reshape(1001, -1).double()
want = x @ fn.double().T
err = (o.sum(0).reshape(1001, -1).double() - want).abs().max().item()
serr = ((s.sum(0).reshape(-1).double() - (x * x).sum(1)).abs() / (x * x).sum(1)).max().item()
print(f"gemm check T1001: max abs err {err:.3e} (|want| max {want.abs().max().item():.2f}), sqsum rel err {serr:.2e}")
for n1, h in ((4096, 1280), (8192, 1280), (8192, 7168)):
    def mk():
        return (torch.randn(n1, h, device="cuda").bfloat16(), torch.randn(n1, m, h, device="cuda").bfloat16(),
                torch.rand(n1, m, 1, device="cuda"), torch.rand(n1, m, m, device="cuda"))
    ins = [mk() for _ in range(3)]
    us = harness.time_graph(lambda a, b, c, d: tilebake.mhc.mhc_post_fwd(a, b, c, d), ins)
    nb = (1 + 2 * m) * n1 * h * 2
    print(f"mhc_post_fwd T{n1} m{m} h{h}: {us:.1f} us = {nb / us / 1e3 / copy * 100:.1f}% of copy")
    insb = [(*i, torch.randn(n1, m, h, device="cuda").bfloat16()) for i in ins]
    us = harness.time_graph(lambda a, b, c, d, g: tilebake.mhc.mhc_post_bwd(a, b, c, d, g), insb)
    nb = (2 + 3 * m) * n1 * h * 2
    print(f"mhc_post_bwd T{n1} m{m} h{h}: {us:.1f} us = {nb / us / 1e3 / copy * 100:.1f}% of copy")
def makeb():
    r, fn = torch.randn(T, m, H, device="cuda").bfloat16(), torch.randn(24, m * H, device="cuda") / 170
    return r, fn, torch.randn(T, 24, device="cuda"), torch.randn(T, device="cuda"), torch.zeros_like(r)
ins = [makeb() for _ in range(3)]
us = harness.time_graph(lambda r, fn, d, s, g: tilebake.mhc.mhc_pre_norm_gemm_bwd(r, fn, d, s, g), ins)
nbytes = T * m * H * 2 * 3
print(f"gemm bwd (residual_grad accumulated) T{T} m{m} H{H}: {us:.1f} us, {nbytes / us / 1e3 / copy * 100:.1f}% of copy")
# host time of the pre-norm forward ops at one token (the call plans' path once warm)
r1, f1 = torch.randn(1, m, H, device="cuda").bfloat16(), torch.randn(24, m * H, device="cuda")
pm, ps = tilebake.mhc.mhc_pre_norm_gemm_fwd(r1, f1, 16)
om, sq, out = tilebake.mhc.mhc_reduce_partials_and_rmsnorm_fwd(pm, ps, rms_group_size=m * H)
og = torch.randn_like(out)
for name, fn in (("mhc_pre_norm_gemm_fwd", lambda: tilebake.mhc.mhc_pre_norm_gemm_fwd(r1, f1, 16)),
                 ("mhc_reduce_partials_and_rmsnorm_fwd", lambda: tilebake.mhc.mhc_reduce_partials_and_rmsnorm_fwd(pm, ps, rms_group_size=m * H)),
                 ("mhc_reduce_partials_and_rmsnorm_bwd", lambda: tilebake.mhc.mhc_reduce_partials_and_rmsnorm_bwd(og, om, sq, rms_group_size=m * H))):
    print(f"host {name} T1: {harness.host_us_per_call(fn, ()):.2f} us (torch.mul(out=) {mul:.2f} us)")
