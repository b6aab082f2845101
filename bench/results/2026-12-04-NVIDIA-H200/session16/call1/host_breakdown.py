"""Where the host time of the given-output calls above torch.mul(out=) goes (T = 1, H = 7168):
the whole call, the plan key, plan.run alone, the plan traced (everything but the launches), one
launch-free torch.empty_like, and torch.mul(out=)."""
import sys
import torch
sys.path.insert(0, "bench")
import harness
import tilebake
from tilebake._runtime.loader import _native
from tilebake.mhc import mhc_pre_big_fuse as bf, mhc_pre_split_mixes as sm, mhc_pre_apply_mix as am

mh, T, H, dev = tilebake.mhc, 1, 7168, "cuda"
nat = _native()
hu = lambda f: harness.host_us_per_call(f, ())
x = torch.randn(T, H, device=dev).to(torch.bfloat16)
y = torch.empty_like(x)
print(f"torch.mul(out=) {hu(lambda: torch.mul(x, 2, out=y)):.2f} us")
print(f"torch.empty_like(x) {hu(lambda: torch.empty_like(x)):.2f} us; x.new_empty((1, 4)) {hu(lambda: x.new_empty((1, 4))):.2f} us")
residual = torch.randn(T, 4, H, device=dev).to(torch.bfloat16)
pm, ps = mh.mhc_pre_norm_gemm_fwd(residual, torch.randn(24, 4 * H, device=dev), 16)
scale3, base3 = torch.rand(3, device=dev), torch.rand(24, device=dev)
post, comb, li = torch.empty(T, 4, 1, device=dev), torch.empty(T, 4, 4, device=dev), torch.empty(T, H, device=dev).to(torch.bfloat16)
args = (pm, ps, scale3, base3, residual, post, comb, li)
mh.mhc_pre_big_fuse_fwd(*args)
key = bf._key(pm, residual, post, comb, li, 1e-6, 1e-6, 1e-6, 1.0, 10, 16)
call = bf._PLANS[key]
print(f"big fuse: call {hu(lambda: mh.mhc_pre_big_fuse_fwd(*args)):.2f}, key {hu(lambda: bf._key(pm, residual, post, comb, li, 1e-6, 1e-6, 1e-6, 1.0, 10, 16)):.2f}, "
      f"run {hu(lambda: nat.run(call, *args)):.2f}, trace {hu(lambda: nat.trace(call, *args)):.2f} us")
mixes = torch.rand(T, 24, device=dev)
pre, post2, comb2 = torch.rand(T, 4, 1, device=dev), torch.rand(T, 4, 1, device=dev), torch.rand(T, 4, 4, device=dev)
mg, sg, bg = torch.empty_like(mixes), torch.empty_like(scale3), torch.empty_like(base3)
sargs = (pre, post2, comb2, mixes, post2, scale3, base3, mg, sg, bg)
mh.mhc_pre_split_mixes_bwd(*sargs)
print(f"split bwd: call {hu(lambda: mh.mhc_pre_split_mixes_bwd(*sargs)):.2f} us")
for k, c in [kv for kv in sm._PLANS.items() if kv[0][0] == 'bwd']:
    try:
        print(f"  key {k}: run {hu(lambda: nat.run(c, *sargs)):.2f}, trace {hu(lambda: nat.trace(c, *sargs)):.2f} us")
    except Exception as e:
        print("  key", k, "not runnable with these args:", e)
d_o, xx = torch.randn(T, 4, H, device=dev).to(torch.bfloat16), torch.randn(T, H, device=dev).to(torch.bfloat16)
aargs = (xx, residual, post2, d_o)
mh.mhc_pre_apply_mix_bwd(*aargs)
print(f"apply bwd: call {hu(lambda: mh.mhc_pre_apply_mix_bwd(*aargs)):.2f} us")
for k, c in am._PLANS.items():
    try:
        print(f"  key {k}: run {hu(lambda: nat.run(c, *aargs)):.2f}, trace {hu(lambda: nat.trace(c, *aargs)):.2f} us")
    except Exception as e:
        print("  key", k, "not runnable:", e)
