"""mhc_pre_norm_gemm_fwd (split-K partials of x @ fn^T and of sum x^2, against float64 over the
same splits: fn goes through bf16 hi + lo parts, so 16 mantissa bits) and mhc_pre_norm_gemm_bwd
(residual_grad accumulated in place, fn_grad summed over tokens in a fixed order), on the CPU
and the GPU; argument errors on the CPU."""

import importlib

import pytest
import torch

import tilebake
from tests.helpers import assert_bytes_equal, poison_
from tilebake.mhc.mhc_pre_norm_gemm import split_columns

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]
# (leading dims, m, hidden, mixes, n_splits): m (m + 2) mixes, or fewer (the head's), or the most
SHAPES = [((1,), 4, 128, 24, 16), ((8001,), 4, 1024, 24, 16), ((2, 517), 4, 7168, 24, 16), ((65,), 1, 128, 3, 1),
          ((130,), 2, 192, 8, 5), ((3,), 8, 512, 80, 3), ((70,), 4, 256, 4, 40), ((9,), 3, 136, 15, 2)]


def inputs(lead, m, hidden, mixes, device):
    residual = torch.randn(*lead, m, hidden, device=device).bfloat16()
    fn = torch.randn(mixes, m * hidden, device=device) / (m * hidden) ** 0.5
    return residual, fn


def split_reference(residual, fn, n_splits):
    """float64 partials over the kernel's splits."""
    x = residual.double().reshape(-1, fn.shape[1])
    c = split_columns(fn.shape[1], n_splits)
    out = torch.stack([x[:, s * c : (s + 1) * c] @ fn.double()[:, s * c : (s + 1) * c].t() for s in range(n_splits)])
    sq = torch.stack([x[:, s * c : (s + 1) * c].square().sum(-1) for s in range(n_splits)])
    return out.unsqueeze(2), sq.unsqueeze(2)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("lead,m,hidden,mixes,n_splits", SHAPES)
def test_forward(device, lead, m, hidden, mixes, n_splits):
    residual, fn = inputs(lead, m, hidden, mixes, device)
    out_mul, sqrsum = tilebake.mhc.mhc_pre_norm_gemm_fwd(residual, fn, n_splits)
    want_out, want_sq = split_reference(residual.cpu(), fn.cpu(), n_splits)
    assert out_mul.shape == want_out.shape and sqrsum.shape == want_sq.shape
    torch.testing.assert_close(out_mul.cpu().double(), want_out, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(sqrsum.cpu().double(), want_sq, rtol=1e-5, atol=1e-5)
    # the sum over splits is the whole product (the layer's use)
    x = residual.cpu().double().reshape(-1, m * hidden)
    torch.testing.assert_close(out_mul.sum(0).cpu().double().squeeze(1), x @ fn.cpu().double().t(), rtol=1e-4, atol=1e-4)
    given = (poison_(torch.empty_like(out_mul)), poison_(torch.empty_like(sqrsum)))
    got = tilebake.mhc.mhc_pre_norm_gemm_fwd(residual, fn, n_splits, *given)
    assert got[0] is given[0] and got[1] is given[1]
    assert_bytes_equal(given[0].cpu(), out_mul.cpu(), "given out_mul_splitted (and a second run)")
    assert_bytes_equal(given[1].cpu(), sqrsum.cpu(), "given sqrsum_splitted")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("lead,m,hidden,mixes,n_splits", SHAPES)
def test_backward(device, lead, m, hidden, mixes, n_splits):
    residual, fn = inputs(lead, m, hidden, mixes, device)
    tokens = residual.numel() // (m * hidden)
    dom = torch.randn(tokens, 1, mixes, device=device)
    dsq = torch.randn(tokens, 1, device=device) / hidden
    start = torch.randn_like(residual.float()).bfloat16()
    residual_grad = start.clone()
    got_rg, fn_grad = tilebake.mhc.mhc_pre_norm_gemm_bwd(residual, fn, dom, dsq, residual_grad)
    assert got_rg is residual_grad and fn_grad.shape == fn.shape and fn_grad.dtype == torch.float32
    x = residual.cpu().double().reshape(tokens, -1)
    d = dom.cpu().double().reshape(tokens, mixes)
    want_g = d @ fn.cpu().double() + 2 * dsq.cpu().double().reshape(tokens, 1) * x
    want_rg = (start.cpu().double().reshape(tokens, -1) + want_g).reshape(residual.shape)
    # bf16 output: one rounding of an fp32 sum
    torch.testing.assert_close(residual_grad.cpu().double(), want_rg, rtol=8e-3, atol=1e-2)
    torch.testing.assert_close(fn_grad.cpu().double(), d.t() @ x, rtol=1e-4, atol=1e-3)
    alone, again = tilebake.mhc.mhc_pre_norm_gemm_bwd(residual, fn, dom, dsq)
    torch.testing.assert_close(alone.cpu().double(), want_g.reshape(residual.shape), rtol=8e-3, atol=1e-2)
    assert_bytes_equal(again.cpu(), fn_grad.cpu(), "fn_grad of a second run")


def test_rejects_bad_arguments():
    residual, fn = torch.randn(5, 4, 64).bfloat16(), torch.randn(24, 256)
    gemm = tilebake.mhc.mhc_pre_norm_gemm_fwd
    with pytest.raises(TypeError, match="residual must be bfloat16"):
        gemm(residual.float(), fn)
    with pytest.raises(TypeError, match="fn must be float32"):
        gemm(residual, fn.double())
    with pytest.raises(ValueError, match=r"fn must have shape \(N, 256\)"):
        gemm(residual, fn[:, :128].contiguous())
    with pytest.raises(ValueError, match=r"1 <= N <= 80"):
        gemm(residual, torch.randn(81, 256))
    with pytest.raises(ValueError, match="n_splits must be a positive int"):
        gemm(residual, fn, 0)
    with pytest.raises(ValueError, match=r"out_mul_splitted must have shape \(2, 5, 1, 24\)"):
        gemm(residual, fn, 2, torch.empty(2, 5, 24))
    with pytest.raises(ValueError, match="residual must be contiguous"):
        gemm(residual.transpose(0, 1), fn)
    bwd = tilebake.mhc.mhc_pre_norm_gemm_bwd
    with pytest.raises(ValueError, match="out_mul_grad must hold 5 x 24 values"):
        bwd(residual, fn, torch.zeros(5, 23), torch.zeros(5))
    with pytest.raises(ValueError, match="sqrsum_grad must hold 5 values"):
        bwd(residual, fn, torch.zeros(5, 24), torch.zeros(4))
    with pytest.raises(ValueError, match=r"residual_grad must have shape \(5, 4, 64\)"):
        bwd(residual, fn, torch.zeros(5, 24), torch.zeros(5), torch.zeros(5, 4, 63).bfloat16())


@pytest.mark.gpu
def test_forward_plans_keep_to_their_variant():
    """A call plan built for the 80-mix kernel is not used for 3 mixes (the 24-mix kernel's tile
    sums the squares in another order): the bits do not depend on which call came first."""
    gemm = importlib.import_module("tilebake.mhc.mhc_pre_norm_gemm")
    residual, fn3 = inputs((65,), 1, 128, 3, "cuda")
    fn80 = torch.randn(80, 128, device="cuda")
    gemm._PLANS.clear()
    want = tilebake.mhc.mhc_pre_norm_gemm_fwd(residual, fn3, 1)
    gemm._PLANS.clear()
    for _ in range(2):  # the second call through the plan the first one built
        tilebake.mhc.mhc_pre_norm_gemm_fwd(residual, fn80, 1)
    for _ in range(2):
        got = tilebake.mhc.mhc_pre_norm_gemm_fwd(residual, fn3, 1)
        assert_bytes_equal(got[0].cpu(), want[0].cpu(), "out_mul_splitted")
        assert_bytes_equal(got[1].cpu(), want[1].cpu(), "sqrsum_splitted")
