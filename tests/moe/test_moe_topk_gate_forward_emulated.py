"""The moe_topk_gate_forward kernels' generated CUDA C++, run on the CPU by build_tools/warp_emu.py
(a std::thread per CUDA thread, barriers at every warp collective and block barrier) against the
reference: the kernels' logic (selection, groups, hashing, options, non-finite tokens; the
one-warp kernels up to 512 experts and the one-CTA kernels above) checked without a GPU. Opt-in
(TILEBAKE_EMULATE=1: it lowers the nine variants and compiles them with g++, a few minutes);
needs tilelang and g++. Math functions are glibc's here, so weights and scores are compared with
the GPU tests' tolerances and the inputs are the GPU tests' separated logits."""

import ctypes
import importlib
import json
import math
import os
import sys
from pathlib import Path

import pytest
import torch

from tests.helpers import EMULATED, poison_
from tests.moe.gate_forward_helpers import (
    ALL,
    FUNCS,
    assert_gate_equal,
    call_both,
    make_options,
    separated_logits,
    unscored_rows,
)
from tilebake.torch import moe_topk_gate_forward_ref

pytestmark = EMULATED

ROOT = Path(__file__).resolve().parents[2]
op = importlib.import_module("tilebake.moe.moe_topk_gate_forward")


class _EmulatedKernel:
    def __init__(self, so: str, arg_names, grid):
        self.lib = ctypes.CDLL(so)
        params = Path(so + ".params").read_text().split("\n")[:-1]
        self.order = [p.split()[-1] for p in params]
        self.kinds = ["p" if "*" in p else "f" if p.startswith("float ") else "i" for p in params]
        self.arg_names = arg_names
        self.grid = grid  # the manifest's grid expression (x) of the kernel's parameters

    def __call__(self, device, *args):
        given = dict(zip(self.arg_names, args))
        c = {"p": ctypes.c_void_p, "f": ctypes.c_float, "i": ctypes.c_int}
        grid = eval(self.grid, {"__builtins__": {}}, dict(given))
        self.lib.run(*[c[k](given[n]) for n, k in zip(self.order, self.kinds)], ctypes.c_int(grid))


class _LazyTable(dict):
    """Variant key -> emulated kernel, lowered and compiled on first use (a -k run builds only what it needs)."""

    def __init__(self, out):
        super().__init__()
        self.out = out

    def __missing__(self, key):
        sys.path.insert(0, str(ROOT / "build_tools"))
        try:
            import aot
            import warp_emu
        finally:
            sys.path.remove(str(ROOT / "build_tools"))
        v = op.MoeTopkGateForwardVariant(*key)
        # TILEBAKE_EMULATE_KWARGS (JSON): the fast kernel's tuning knobs, to check a candidate.
        kwargs = json.loads(os.environ.get("TILEBAKE_EMULATE_KWARGS", "{}")) if key[1] <= 512 else {}
        aot.lower_one(v, "sm_90a", self.out, build_kwargs=kwargs)
        meta = json.loads((self.out / "sm_90a" / f"{v.id}.json").read_text())
        so = str(self.out / f"{v.id}.so")
        warp_emu.build(str(self.out / "sm_90a" / f"{v.id}.cu"), so, int(meta["block"][0]))
        self[key] = _EmulatedKernel(so, v.arg_names, meta["grid"][0])
        return self[key]


@pytest.fixture(scope="module")
def kernels(tmp_path_factory):
    return _LazyTable(tmp_path_factory.mktemp("emu"))


def emulated(kernels):
    def run(logits, num_topk, use_shared, num_shared, rsf, ep_rank, func="sqrtsoftplus", *, num_groups=1,
            num_topk_groups=1, out=None, scores=None, **opts):  # fmt: skip
        from tilebake.moe._router import check_gate_args

        names = ("mask", "bias", "image_bias", "image_token_mask", "fix_routing_mask", "to_physical_map",
                 "logical_count", "unmapped_topk_idx", "force_random")  # fmt: skip
        t = [opts.get(n) for n in names]
        sizes = check_gate_args(logits, num_topk, use_shared, num_shared, rsf, ep_rank, func, *t, out, scores,
                                num_groups, num_topk_groups)  # fmt: skip
        return op._forward(logits, num_topk, use_shared, num_shared, rsf, ep_rank, func, *t, out, scores, num_groups,
                           num_topk_groups, *sizes, kernels=kernels)  # fmt: skip

    return run


SHAPES = [  # (tokens, experts, k, use_shared, num_shared, num_groups, num_topk_groups)
    (1, 8, 1, False, 0, 1, 1),
    (37, 256, 8, True, 1, 1, 1),
    (37, 256, 8, False, 0, 8, 4),
    (13, 512, 32, False, 0, 1, 1),
    (21, 512, 16, True, 2, 32, 4),
    (29, 72, 6, True, 2, 1, 1),
    (9, 160, 30, True, 2, 1, 1),
    (33, 64, 4, True, 1, 8, 2),
    (17, 33, 5, False, 0, 1, 1),
    (8, 12, 12, True, 1, 3, 3),
    (19, 512, 8, False, 0, 8, 4),  # groups of 64 experts: whole slots
    (11, 128, 6, True, 1, 4, 2),  # groups of 32
    (7, 96, 5, False, 0, 3, 1),  # groups of 32, a partial chunk
    (5, 600, 8, True, 1, 1, 1),  # one CTA per token from here
    (6, 1024, 32, False, 0, 8, 3),
    (3, 2000, 13, True, 2, 20, 5),  # groups of 100: not whole slots
    (2, 8192, 9, False, 0, 32, 4),
]


@pytest.mark.parametrize("func", FUNCS)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("which", ["none", "bias", "all"])
def test_emulated_kernel_matches_reference(kernels, func, shape, which):
    num_tokens, num_experts, k, use_shared, num_shared, groups, top_groups = shape
    shared = num_shared if use_shared else 0
    opts = make_options(num_tokens, num_experts, k, shared, {"none": set(), "bias": {"bias"}, "all": ALL}[which])
    logits = separated_logits(num_tokens, num_experts, k, func, opts.get("bias"), groups, top_groups)
    if "image_bias" in opts:
        img = separated_logits(num_tokens, num_experts, k, func, opts["image_bias"], groups, top_groups)
        logits = torch.where(opts["image_token_mask"][:, None], img, logits)
    if which == "all" and num_tokens > 4:
        logits[2, 1] = math.nan
        logits[3, 0] = -math.inf
    got, ref = call_both(
        emulated(kernels), logits, k, use_shared, num_shared, 1.5, 3, func, opts, num_groups=groups,
        num_topk_groups=top_groups,
    )  # fmt: skip
    assert_gate_equal(got, ref, ~torch.isfinite(logits).all(dim=1), unscored_rows(opts, num_tokens))


@pytest.mark.parametrize("num_experts,k", [(32, 32), (8, 8), (512, 32), (300, 3)])
def test_emulated_force_random(kernels, num_experts, k):
    logits = torch.randn(40, num_experts)
    opts = {"force_random": torch.ones(40, dtype=torch.bool)}
    got, ref = call_both(emulated(kernels), logits, k, False, 0, 1.0, 123, "sqrtsoftplus", opts)
    assert_gate_equal(got, ref, zero_rows=torch.ones(40, dtype=torch.bool))


def test_emulated_strided_out_and_nan_bias(kernels):
    num_tokens, num_experts, k = 23, 200, 7
    logits = torch.randn(num_tokens, 264)[:, 40:240]
    opts = make_options(num_tokens, num_experts, k, 2, ALL)
    unmapped = torch.empty(num_tokens, 20, dtype=torch.int64)[:, 3 : 3 + k]
    unmapped.copy_(opts["unmapped_topk_idx"])
    results = []
    for f in (emulated(kernels), moe_topk_gate_forward_ref):
        o = dict(opts, unmapped_topk_idx=unmapped.clone())
        out = (poison_(torch.empty(num_tokens, k + 2, dtype=torch.int64)), poison_(torch.empty(num_tokens, k + 2)))
        scores = poison_(torch.empty(num_tokens, 300))[:, 50:250]
        idx, w = f(logits, k, True, 2, 2.0, 11, "softmax", out=out, scores=scores, **o)
        results.append((idx, w, o["unmapped_topk_idx"], scores))
    assert_gate_equal(results[0], results[1])
    bias = torch.full((64,), math.nan)
    bias[:10] = 0.0
    idx, _ = emulated(kernels)(torch.randn(16, 64), 8, False, 0, 1.0, 0, bias=bias)
    assert ((idx == -1) | ((idx >= 0) & (idx < 64))).all()
