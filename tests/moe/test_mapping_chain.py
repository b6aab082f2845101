"""The chain a MoE layer runs: route (topk_idx with dropped slots) -> get_fused_mapping ->
expand_to_fused -> expert (identity here) -> reduce_fused gives back, per token, the weighted
sum over its routed slots of x[t] * w[t, j]: bit for bit the fmaf chain over those slots in slot
order, and within bf16 rounding of the exact sum. On the CPU with the references, on the GPU with
the kernels (bit for bit equal to the reference chain)."""

import pytest
import torch

import tilebake
from tests.moe.mapping_helpers import assert_same, random_topk_idx
from tilebake.torch.mapping import fma_fp32


def run_chain(ops, topk_idx, x, w, num_experts, alignment):
    p2e, _, _, ttp, *_ = ops.get_fused_mapping(topk_idx, num_experts, 0, alignment)
    expanded = ops.expand_to_fused(x, ttp, p2e)
    expert_out = expanded  # the identity expert
    return ops.reduce_fused(expert_out, w, ttp), expanded, p2e


def direct(topk_idx, x, w):
    """sum_j w[t, j] * x[t] over the routed slots, as the fused layout must reproduce it."""
    acc = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    for j in range(topk_idx.shape[1]):
        routed = (topk_idx[:, j] >= 0)[:, None]
        acc = torch.where(routed, fma_fp32(x.float(), w[:, j : j + 1], acc), acc)
    return acc


@pytest.mark.parametrize(
    "num_tokens,num_topk,num_experts,alignment", [(1, 1, 8, 1), (97, 6, 16, 16), (300, 9, 72, 128)]
)
def test_chain_on_cpu(num_tokens, num_topk, num_experts, alignment):
    topk_idx = random_topk_idx(num_tokens, num_topk, num_experts, drop=0.15)
    x = torch.randn(num_tokens, 256).bfloat16()
    w = torch.rand(num_tokens, num_topk)
    out, expanded, p2e = run_chain(tilebake.torch, topk_idx, x, w, num_experts, alignment)
    expected = direct(topk_idx, x, w)
    assert_same(out, expected.to(torch.bfloat16), "chain")
    assert bool((expanded[p2e < 0].float() == 0).all())
    exact = (x.double()[:, None, :] * (w.double() * (topk_idx >= 0))[:, :, None]).sum(1)
    bound = (x.double().abs() * w.double().sum(1, keepdim=True)) * 2**-22 + exact.abs() * 2**-8
    assert bool(((out.double() - exact).abs() <= bound).all())


@pytest.mark.gpu
@pytest.mark.parametrize(
    "num_tokens,num_topk,num_experts,alignment,hidden",
    [(1, 1, 8, 1, 128), (8001, 9, 256, 128, 7168), (4096, 8, 512, 16, 2048), (777, 6, 72, 1, 200)],
)
def test_chain_on_gpu(num_tokens, num_topk, num_experts, alignment, hidden):
    topk_idx = random_topk_idx(num_tokens, num_topk, num_experts, device="cuda", drop=0.15)
    x = torch.randn(num_tokens, hidden, device="cuda").bfloat16()
    w = torch.rand(num_tokens, num_topk, device="cuda")
    out, expanded, _ = run_chain(tilebake.moe, topk_idx, x, w, num_experts, alignment)
    ref, ref_expanded, _ = run_chain(tilebake.torch, topk_idx, x, w, num_experts, alignment)
    assert_same(expanded, ref_expanded, "expanded (kernel chain vs reference chain)")
    assert_same(out, ref, "reduced (kernel chain vs reference chain)")
    assert_same(out, direct(topk_idx, x, w).to(torch.bfloat16), "reduced vs the direct weighted sum")
