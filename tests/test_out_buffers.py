"""Preallocated single-tensor outputs of every other op with an out=-style argument (out_sf,
out, residual_out, out_bf16, weight_grad, scores, moe_topk_gate_forward's (topk_idx,
topk_weights) pair): the call forms the original takes (None, or the tensor; the gate's pair both
or none, as there), the given tensor returned itself with the allocating call's shape, strides
and bytes. CPU tensors take the references; the GPU tests run the same checks on the kernels.
The (data, sf) pairs of the cast ops are in test_partial_out.py."""

import pytest
import torch

import tilebake
from tests.helpers import assert_bytes_equal
from tests.test_partial_out import like, make_x
from tilebake.torch import stable_topk

EPS = 1e-6


def check_outs(call, picks) -> None:
    """call(**buffers) -> result; picks: {argument name: result -> that output}. The allocating
    call, then each buffer given alone and all together (poisoned, laid out as the allocating
    call's output): the given ones come back themselves, every output with the same bytes."""
    expected = call()
    wanted = {name: pick(expected) for name, pick in picks.items()}
    for names in [[name] for name in picks] + ([list(picks)] if len(picks) > 1 else []):
        buffers = {name: like(wanted[name]) for name in names}
        result = call(**buffers)
        for name, pick in picks.items():
            got = pick(result)
            if name in buffers:
                assert got is buffers[name], name
            assert got.stride() == wanted[name].stride() or got.shape[0] <= 1, (name, got.stride())
            assert_bytes_equal(got, wanted[name], f"{name} (given: {names})")


def sf_only_and_precomputed(device, num_tokens=37, hidden=384):
    x = make_x(num_tokens, hidden, device=device)
    for col in (False, True):
        for fmt in ("e4m3", "e2m1"):
            kw = dict(use_tma_aligned_col_major_sf=col, round_sf=True)
            check_outs(
                lambda out_sf=None: tilebake.quant.per_token_cast_with_sf_only(x, fmt, 32, out_sf=out_sf, **kw),
                {"out_sf": lambda r: r},
            )
            check_outs(
                lambda out_sf=None: tilebake.quant.per_block_cast_with_sf_only(x, fmt, (32, 128), out_sf=out_sf, **kw),
                {"out_sf": lambda r: r},
            )
            block_sf = tilebake.quant.per_block_cast(x, fmt, (32, 128), **kw)[1]
            check_outs(
                lambda out=None: tilebake.quant.per_block_cast_with_precomputed_sf(
                    x, fmt, (32, 128), block_sf, out=out
                ),
                {"out": lambda r: r},
            )
        token_sf = tilebake.quant.per_token_cast(x, "e4m3", 32)[1]
        check_outs(
            lambda out=None: tilebake.quant.per_token_cast_with_precomputed_sf(x, "e4m3", 32, token_sf, out=out),
            {"out": lambda r: r},
        )


def norm_outputs(device, shape=(37, 256), dtype=torch.bfloat16):
    x, residual = make_x(*shape[-2:], dtype, device, *shape[:-2]), make_x(*shape[-2:], dtype, device, *shape[:-2])
    weight = torch.randn(shape[-1], device=device).to(dtype)
    check_outs(
        lambda **b: tilebake.quant.norm_forward(x, weight, EPS, residual, 1.5, with_rstd=True, **b),
        {"out": lambda r: r[0], "residual_out": lambda r: r[2]},
    )
    check_outs(
        lambda **b: tilebake.quant.norm_forward_and_per_token_cast(
            x, weight, EPS, "e4m3", 32, residual, with_out_bf16=True, **b
        ),
        {"out_bf16": lambda r: r[1], "residual_out": lambda r: r[3]},
    )


def norm_weight_grad(device, dtype):
    """weight_grad is accumulated into: a given buffer comes back itself holding buffer + the
    gradient, rounded once from fp32 (exactly the allocating call's gradient from zeros)."""
    x, grad = make_x(37, 256, dtype, device), make_x(37, 256, dtype, device)
    weight = torch.randn(256, device=device).to(dtype)
    _, rstd, _ = tilebake.quant.norm_forward(x, weight, EPS, with_rstd=True)
    _, dw = tilebake.quant.norm_backward(grad, x, weight, rstd)
    zeros = torch.zeros(256, dtype=dtype, device=device)
    x_grad, got = tilebake.quant.norm_backward(grad, x, weight, rstd, weight_grad=zeros)
    assert got is zeros and torch.equal(got, dw)
    if dtype == torch.float32:  # fp32 dw: from a non-zero buffer, the sum of the two
        start = torch.randn(256, device=device)
        buffer = start.clone()
        assert tilebake.quant.norm_backward(grad, x, weight, rstd, weight_grad=buffer)[1] is buffer
        assert_bytes_equal(buffer, start + dw, "weight_grad + dw")
    with pytest.raises(ValueError, match="weight_grad is given but weight is None"):
        tilebake.quant.norm_backward(grad, x, None, rstd, weight_grad=zeros)


def gate_outputs(device, num_tokens=37, num_experts=64, k=6):
    logits = torch.randn(num_tokens, num_experts, device=device) * 3

    def call(out=None, scores=None):
        return tilebake.moe.moe_topk_gate_forward(logits, k, True, 1, 2.5, 0, out=out, scores=scores)

    idx, weights = call()
    out = (like(idx), like(weights))
    scores = like(logits)
    result = call(out, scores)
    assert result[0] is out[0] and result[1] is out[1]
    assert_bytes_equal(out[0], idx, "topk_idx")
    assert_bytes_equal(out[1], weights, "topk_weights")
    assert torch.isfinite(scores).all() and (scores >= 0).all()
    for partial, missing in (((out[0], None), "out\\[1\\]"), ((None, out[1]), "out\\[0\\]")):
        with pytest.raises(ValueError, match=f"{missing} must be a torch"):  # the original wants both, too
            call(partial)

    u = scores.clone()
    topk_idx = stable_topk(u, k)
    topk_weights = u.gather(1, topk_idx) / u.gather(1, topk_idx).sum(1, keepdim=True)
    grad = torch.randn(num_tokens, k, device=device)
    check_outs(
        lambda out=None: tilebake.moe.moe_topk_gate_backward(u, topk_idx, topk_weights, grad, 2.5, out=out),
        {"out": lambda r: r},
    )


def reduce_outputs(device, num_tokens=37, k=4, hidden=384):
    num_rows = num_tokens * k
    pos = torch.randperm(num_rows, device=device).view(num_tokens, k).int()
    pos[torch.rand(num_tokens, k, device=device) < 0.2] = -1
    x = make_x(num_rows, hidden, device=device)
    weights = torch.rand(num_tokens, k, device=device)
    for fp8 in ("", "e4m3"):
        check_outs(
            lambda out=None: tilebake.moe.reduce_fused(x, weights, pos, fp8, out=out),
            {"out": lambda r: r},
        )


# --- CPU ---


def test_cpu_sf_only_and_precomputed_outs():
    sf_only_and_precomputed("cpu")


@pytest.mark.parametrize("shape", [(37, 256), (3, 5, 256)])
def test_cpu_norm_outs(shape):
    norm_outputs("cpu", shape)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_cpu_norm_backward_weight_grad(dtype):
    norm_weight_grad("cpu", dtype)


def test_cpu_gate_outs():
    gate_outputs("cpu")


def test_cpu_reduce_fused_out():
    reduce_outputs("cpu")


def test_cpu_single_outs_reject_overlap_and_layout():
    x = make_x(4, 128)
    with pytest.raises(ValueError, match="out_sf must not overlap itself"):
        tilebake.quant.per_token_cast_with_sf_only(x, "e4m3", 32, out_sf=torch.empty(1, 4).expand(4, 4))
    with pytest.raises(ValueError, match="out_sf must be TMA-aligned column-major"):
        tilebake.quant.per_block_cast_with_sf_only(
            make_x(64, 128), "e4m3", (32, 32), use_tma_aligned_col_major_sf=True, out_sf=torch.empty(2, 4)
        )
    with pytest.raises(ValueError, match="out must not overlap itself"):
        tilebake.quant.per_token_cast_with_precomputed_sf(
            x, "e2m1", 32, torch.ones(4, 4), out=torch.empty(1, 64, dtype=torch.int8).expand(4, 64)
        )
    with pytest.raises(ValueError, match="residual_out must not overlap itself"):
        tilebake.quant.norm_forward(x, None, EPS, x, residual_out=torch.empty(1, 128, dtype=x.dtype).expand(4, 128))
    with pytest.raises(ValueError, match="out_bf16 must not overlap itself"):
        tilebake.quant.norm_forward_and_per_token_cast(
            x, None, EPS, "e4m3", 32, with_out_bf16=True, out_bf16=torch.empty(1, 128, dtype=x.dtype).expand(4, 128)
        )


# --- GPU ---


@pytest.mark.gpu
@pytest.mark.parametrize("num_tokens,hidden", [(1, 128), (8001, 384), (129, 7168)])
def test_gpu_sf_only_and_precomputed_outs(num_tokens, hidden):
    sf_only_and_precomputed("cuda", num_tokens, hidden)


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(1, 128), (8001, 256), (3, 5, 256), (129, 7168)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_gpu_norm_outs(shape, dtype):
    norm_outputs("cuda", shape, dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_gpu_norm_backward_weight_grad(dtype):
    norm_weight_grad("cuda", dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("num_tokens", [1, 8001])
def test_gpu_gate_outs(num_tokens):
    gate_outputs("cuda", num_tokens)


@pytest.mark.gpu
@pytest.mark.parametrize("num_tokens", [1, 8001])
def test_gpu_reduce_fused_out(num_tokens):
    reduce_outputs("cuda", num_tokens)
