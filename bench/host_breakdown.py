"""Where the host time of the mHC calls that exceed torch.mul(out=) goes (outputs given, T = 1,
H = 7168): the whole call, the plan's key, plan.run alone (the native program: checks, allocations,
launches) and the program traced without its launches; with torch.mul(out=), torch.empty_like
and a bare launch of a one-pointer kernel beside them (same run).

    python bench/host_breakdown.py
"""

import importlib
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402

import tilebake  # noqa: E402
from tilebake._runtime.loader import _native  # noqa: E402
from tilebake.mhc import mhc_pre_big_fuse as bf  # noqa: E402
from tilebake.mhc import mhc_pre_split_mixes as sm  # noqa: E402

ml = importlib.import_module("tilebake.mhc.mhc_multilayer_recompute")  # (tilebake.mhc's name is the function)
mh, T, H, dev = tilebake.mhc, 1, 7168, "cuda"
nat = _native()


def hu(f):
    return harness.host_us_per_call(f, ())


def plans(name, table, args):
    for key, call in table.items():
        try:
            run, trace = hu(lambda: nat.run(call, *args)), hu(lambda: nat.trace(call, *args))
        except Exception as e:  # a plan of another key's argument kinds
            print(f"  {name} key {key}: not runnable with these arguments ({e})")
            continue
        print(f"  {name} key {key}: run {run:.2f}, traced {trace:.2f} us")


x = torch.randn(T, H, device=dev).to(torch.bfloat16)
y = torch.empty_like(x)
print(f"torch.mul(out=) {hu(lambda: torch.mul(x, 2, out=y)):.2f} us; torch.empty_like {hu(lambda: torch.empty_like(x)):.2f} us")
residual = torch.randn(T, 4, H, device=dev).to(torch.bfloat16)
pm, ps = mh.mhc_pre_norm_gemm_fwd(residual, torch.randn(24, 4 * H, device=dev), 16)
scale3, base3 = torch.rand(3, device=dev), torch.rand(24, device=dev)
post, comb, li = torch.empty(T, 4, 1, device=dev), torch.empty(T, 4, 4, device=dev), torch.empty_like(x)
args = (pm, ps, scale3, base3, residual, post, comb, li)
mh.mhc_pre_big_fuse_fwd(*args)
big_key = bf._key(pm, residual, post, comb, li, 1e-6, 1e-6, 1e-6, 1.0, 10, 16)
print(f"big fuse: call {hu(lambda: mh.mhc_pre_big_fuse_fwd(*args)):.2f}, key "
      f"{hu(lambda: bf._key(pm, residual, post, comb, li, 1e-6, 1e-6, 1e-6, 1.0, 10, 16)):.2f} us")
plans("big fuse", {big_key: bf._PLANS[big_key]}, args)
mixes = torch.rand(T, 24, device=dev)
pre, post2, comb2 = torch.rand(T, 4, 1, device=dev), torch.rand(T, 4, 1, device=dev), torch.rand(T, 4, 4, device=dev)
sargs = (pre, post2, comb2, mixes, post2, scale3, base3, torch.empty_like(mixes), torch.empty_like(scale3),
         torch.empty_like(base3))  # fmt: skip
mh.mhc_pre_split_mixes_bwd(*sargs)
print(f"split mixes bwd: call {hu(lambda: mh.mhc_pre_split_mixes_bwd(*sargs)):.2f} us")
plans("split mixes bwd", {k: c for k, c in sm._PLANS.items() if k[0] == "bwd"}, sargs)
margs = (residual, [post], [li], [post], [comb], [torch.empty_like(x)], [torch.empty_like(residual)])
mh.mhc_multilayer_recompute(*margs)
print(f"multilayer, 1 layer: call {hu(lambda: mh.mhc_multilayer_recompute(*margs)):.2f}, key {hu(lambda: ml._key(*margs)):.2f} us")
plans("multilayer", dict(ml._PLANS), margs)
