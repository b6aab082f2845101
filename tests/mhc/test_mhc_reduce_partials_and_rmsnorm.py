"""mhc_reduce_partials_and_rmsnorm_fwd / _bwd: the split partials added in split order and the
RMSNorm scaling (IEEE fp32 throughout: the GPU within 2 ulp of the CPU path, whose reciprocal
torch computes its own way), against float64,
and the backward against torch autograd of the scaling in float64; argument errors on the CPU."""

import pytest
import torch

import tilebake
from tests.helpers import assert_bytes_equal, poison_

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]
SHAPES = [(1, 24, 16, 28672), (8001, 24, 16, 28672), (65, 3, 1, 128), (300, 80, 3, 4096), (7, 8, 40, 384)]
EPS = 1e-6


def partials(tokens, mixes, splits, device):
    pm = torch.randn(splits, tokens, 1, mixes, device=device)
    ps = torch.rand(splits, tokens, 1, device=device) * 100 + 1
    return pm, ps


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("tokens,mixes,splits,group", SHAPES)
def test_forward(device, tokens, mixes, splits, group):
    pm, ps = partials(tokens, mixes, splits, device)
    out_mul, sqrsum, out = tilebake.mhc.mhc_reduce_partials_and_rmsnorm_fwd(pm, ps, rms_group_size=group, rms_eps=EPS)
    assert out_mul.shape == (tokens, 1, mixes) and sqrsum.shape == (tokens, 1) and out.shape == (tokens, mixes)
    torch.testing.assert_close(out_mul.cpu().double(), pm.cpu().double().sum(0), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(sqrsum.cpu().double(), ps.cpu().double().sum(0), rtol=1e-6, atol=1e-5)
    # the scaling of the fp32 sums (their own rounding is checked above)
    r = (sqrsum.cpu().double() / group + EPS).rsqrt()
    torch.testing.assert_close(out.cpu().double(), (out_mul.cpu().double() * r.unsqueeze(-1)).squeeze(1), rtol=1e-6, atol=0)
    if device == "cuda":  # the sums in split order: the CPU path's bits; the scaling within 2 ulp
        want = tilebake.mhc.mhc_reduce_partials_and_rmsnorm_fwd(pm.cpu(), ps.cpu(), rms_group_size=group, rms_eps=EPS)
        assert_bytes_equal(out_mul.cpu(), want[0], "out_mul")
        assert_bytes_equal(sqrsum.cpu(), want[1], "sqrsum")
        torch.testing.assert_close(out.cpu(), want[2], rtol=2.5e-7, atol=0)
    given = tuple(poison_(torch.empty_like(t)) for t in (out_mul, sqrsum, out))
    got = tilebake.mhc.mhc_reduce_partials_and_rmsnorm_fwd(pm, ps, *given, group, EPS, splits)
    assert all(a is b for a, b in zip(got, given))
    assert_bytes_equal(given[2].cpu(), out.cpu(), "given out")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("tokens,mixes,splits,group", SHAPES)
def test_backward(device, tokens, mixes, splits, group):
    pm, ps = partials(tokens, mixes, splits, device)
    out_mul, sqrsum = pm.sum(0), ps.sum(0)
    out_grad = torch.randn(tokens, mixes, device=device)
    omg, osg = tilebake.mhc.mhc_reduce_partials_and_rmsnorm_bwd(out_grad, out_mul, sqrsum, rms_group_size=group, rms_eps=EPS)
    om64 = out_mul.cpu().double().requires_grad_()
    sq64 = sqrsum.cpu().double().requires_grad_()
    out64 = om64.squeeze(1) * (sq64 / group + EPS).rsqrt()
    out64.backward(out_grad.cpu().double())
    torch.testing.assert_close(omg.cpu().double(), om64.grad, rtol=1e-5, atol=1e-6)
    # sqrsum_grad is a sum of N signed terms: its error is relative to the terms' magnitudes
    scale = (out_grad.cpu().double().abs() * out_mul.cpu().double().abs().squeeze(1)).sum(-1, keepdim=True)
    scale = scale * (sqrsum.cpu().double() / group + EPS).rsqrt() ** 3 / (2 * group)
    err = (osg.cpu().double() - sq64.grad).abs()
    assert not osg.isnan().any() and (err <= 1e-5 * scale).all(), f"sqrsum_grad off by {(err / scale).max():.3g} of its terms"
    if device == "cuda":
        want = tilebake.mhc.mhc_reduce_partials_and_rmsnorm_bwd(out_grad.cpu(), out_mul.cpu(), sqrsum.cpu(),
                                                                rms_group_size=group, rms_eps=EPS)  # fmt: skip
        torch.testing.assert_close(omg.cpu(), want[0], rtol=2.5e-7, atol=0)
        torch.testing.assert_close(osg.cpu(), want[1], rtol=1e-6, atol=0)


def test_rejects_bad_arguments():
    pm, ps = partials(5, 24, 2, "cpu")
    fwd = tilebake.mhc.mhc_reduce_partials_and_rmsnorm_fwd
    with pytest.raises(ValueError, match="rms_group_size must be a positive int"):
        fwd(pm, ps)
    with pytest.raises(ValueError, match=r"n_splits \(3\) must equal"):
        fwd(pm, ps, rms_group_size=256, n_splits=3)
    with pytest.raises(ValueError, match="one RMS group"):
        fwd(pm.expand(2, 5, 2, 24).contiguous(), ps, rms_group_size=256)
    with pytest.raises(ValueError, match=r"sqrsum_splitted must have shape \(2, 5, 1\)"):
        fwd(pm, ps[:, :4].contiguous(), rms_group_size=256)
    with pytest.raises(TypeError, match="out_mul_splitted must be float32"):
        fwd(pm.double(), ps, rms_group_size=256)
    bwd = tilebake.mhc.mhc_reduce_partials_and_rmsnorm_bwd
    with pytest.raises(ValueError, match=r"out_grad must have shape \(5, 24\)"):
        bwd(torch.zeros(5, 23), pm[0], ps[0], rms_group_size=256)
    with pytest.raises(ValueError, match="rms_eps must be a non-negative number"):
        bwd(torch.zeros(5, 24), pm[0], ps[0], rms_group_size=256, rms_eps=-1.0)
