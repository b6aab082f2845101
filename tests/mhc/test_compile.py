"""torch.compile(fullgraph=True) traces every mhc op (torch.ops.tilebake.*, one opaque node each)
and gives the eager bytes, outputs given or allocated; on the CPU (the references) and the GPU."""

import pytest
import torch

import tilebake
from tests.helpers import assert_bytes_equal

mh = tilebake.mhc


def all_ops(x, residual, post, comb, d_o, o, x_grad):
    expanded = mh.expand_to_mhc_fwd(x, o)
    summed = mh.expand_to_mhc_bwd(d_o)
    summed_into = mh.expand_to_mhc_bwd(d_o, torch.empty_like(x))
    merged = mh.mhc_post_fwd(x, residual, post, comb)
    grads = mh.mhc_post_bwd(x, residual, post, comb, d_o)
    mixed = mh.mhc_pre_apply_mix_fwd(residual, post)
    mix_grad = mh.mhc_pre_apply_mix_bwd(x, residual, post, x_grad)
    return expanded * 1, summed, summed_into, merged, *grads, mixed, mix_grad, x_grad * 1


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_fullgraph_matches_eager(device):
    g = torch.Generator().manual_seed(5)
    x, d_o = torch.randn(3, 7, 64, generator=g).bfloat16(), torch.randn(3, 7, 4, 64, generator=g).bfloat16()
    residual = torch.randn(3, 7, 4, 64, generator=g).bfloat16()
    post, comb = torch.rand(3, 7, 4, 1, generator=g), torch.rand(3, 7, 4, 4, generator=g)
    args = [t.to(device) for t in (x, residual, post, comb, d_o)]

    def fresh():
        return [*args, torch.empty(3, 7, 4, 64, dtype=torch.bfloat16, device=device), torch.ones_like(args[1])]

    eager = all_ops(*fresh())
    compiled = torch.compile(all_ops, fullgraph=True, backend="aot_eager")(*fresh())
    for i, (a, b) in enumerate(zip(compiled, eager, strict=True)):
        assert_bytes_equal(a.cpu(), b.cpu(), f"output {i}")


def mix_ops(comb, g_comb, comb_out):
    normalised = mh.mhc_sinkhorn_fwd(comb, repeat=3, eps=1e-5)
    into = mh.mhc_sinkhorn_fwd(comb, comb_out)
    grad = mh.mhc_sinkhorn_bwd(g_comb, comb, repeat=3, eps=1e-5)
    mixes = torch.cat([comb.flatten(-2), g_comb.flatten(-2)[..., :8]], dim=-1)  # (..., 24): m = 4
    scale3, base3 = comb[0, 0, 0, :3].contiguous(), g_comb[0, :6].flatten()[:24].contiguous()
    pre, post, split_comb = mh.mhc_pre_split_mixes_fwd(mixes, scale3, base3, mhc_post_mult_value=2.0)
    split_grads = mh.mhc_pre_split_mixes_bwd(pre, post, split_comb, mixes, post, scale3, base3)
    head = mh.mhc_head_compute_mix_fwd(comb[..., 0].contiguous(), scale3[:1], base3[:4])
    head_grads = mh.mhc_head_compute_mix_bwd(head, comb[..., 0].contiguous(), scale3[:1], base3[:4], num_sms=3)
    return normalised, into * 1, grad, pre, post, split_comb, *split_grads, head, *head_grads


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_mix_ops_fullgraph_matches_eager(device):
    g = torch.Generator().manual_seed(6)
    comb, g_comb = torch.randn(3, 7, 4, 4, generator=g), torch.randn(3, 7, 4, 4, generator=g)
    args = [t.to(device) for t in (comb, g_comb)]

    def fresh():
        return [*args, torch.empty(3, 7, 4, 4, device=device)]

    eager = mix_ops(*fresh())
    compiled = torch.compile(mix_ops, fullgraph=True, backend="aot_eager")(*fresh())
    for i, (a, b) in enumerate(zip(compiled, eager, strict=True)):
        assert_bytes_equal(a.cpu(), b.cpu(), f"output {i}")
