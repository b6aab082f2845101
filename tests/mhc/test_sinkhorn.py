"""mhc_sinkhorn_fwd / _bwd, m = 1 to 8, any repeat: on the CPU bit-exact with the ordered
references (sinkhorn_ordered_ref / sinkhorn_bwd_ordered_ref: the CUDA kernels' sums, IEEE
divisions where the kernels' steps use div.approx), and on both devices within the original's
tolerance (rtol 1e-5, atol 1e-6) of sinkhorn_normalize_ref and of float64 autograd of it;
argument errors on the CPU."""

import pytest
import torch

import tilebake
from tests.helpers import assert_bytes_equal, poison_
from tilebake.torch.mhc import sinkhorn_bwd_ordered_ref, sinkhorn_normalize_ref, sinkhorn_ordered_ref

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]
# (leading dims, m, repeat, eps): repeat 13, 20 and 30 pass the backward's 24 stored steps
# (recomputed); token counts that leave a CTA's last slots empty (4 tokens a CTA at m <= 4)
SHAPES = [((1,), 4, 10, 1e-6), ((8001,), 4, 10, 1e-6), ((2, 517), 3, 1, 1e-6), ((65,), 8, 13, 1e-6),
          ((7,), 1, 10, 1e-6), ((33,), 2, 30, 0.0), ((1, 1), 5, 2, 1e-3), ((9,), 4, 20, 1e-6),
          ((3,), 6, 20, 1e-6), ((5,), 7, 1, 1e-6)]  # fmt: skip
TOL = dict(rtol=1e-5, atol=1e-6)  # the original's (tests/mhc/test_sinkhorn.py)


def _input(lead, m, device):
    return torch.randn(*lead, m, m, device=device) * 2


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("lead,m,repeat,eps", SHAPES)
def test_forward(device, lead, m, repeat, eps):
    x = _input(lead, m, device)
    got = tilebake.mhc.mhc_sinkhorn_fwd(x, repeat=repeat, eps=eps)
    assert got.shape == x.shape and got.dtype == torch.float32
    want = sinkhorn_ordered_ref(x.cpu(), repeat, eps)
    if device == "cpu":
        assert_bytes_equal(got, want, "out")
    torch.testing.assert_close(got.cpu(), want, **TOL)
    torch.testing.assert_close(got.cpu(), sinkhorn_normalize_ref(x.cpu(), repeat, eps), **TOL)
    given = poison_(torch.empty_like(x))
    assert tilebake.mhc.mhc_sinkhorn_fwd(x, given, repeat, eps) is given
    assert_bytes_equal(given.cpu(), got.cpu(), "given out (and a second run)")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("lead,m,repeat,eps", SHAPES)
def test_backward(device, lead, m, repeat, eps):
    x = _input(lead, m, device)
    grad = torch.randn_like(x)
    got = tilebake.mhc.mhc_sinkhorn_bwd(grad, x, repeat=repeat, eps=eps)
    assert got.shape == x.shape and got.dtype == torch.float32
    if device == "cpu":
        assert_bytes_equal(got, sinkhorn_bwd_ordered_ref(grad, x, repeat, eps), "grad_input")
    leaf = x.cpu().double().requires_grad_()
    sinkhorn_normalize_ref(leaf, repeat, eps).backward(grad.cpu().double())
    torch.testing.assert_close(got.cpu().double(), leaf.grad, **TOL)
    given = poison_(torch.empty_like(x))
    assert tilebake.mhc.mhc_sinkhorn_bwd(grad, x, given, repeat, eps) is given
    assert_bytes_equal(given.cpu(), got.cpu(), "given grad_input (and a second run)")


def test_ordered_reference_matches_autograd_of_itself():
    """sinkhorn_bwd_ordered_ref is the gradient of sinkhorn_ordered_ref (in float64: to rounding)."""
    x = torch.randn(20, 3, 3, dtype=torch.float64, requires_grad=True)
    g = torch.randn(20, 3, 3, dtype=torch.float64)
    sinkhorn_ordered_ref(x, 4, 1e-2).backward(g)
    torch.testing.assert_close(sinkhorn_bwd_ordered_ref(g, x.detach(), 4, 1e-2), x.grad, rtol=1e-12, atol=1e-12)


BAD = [
    (lambda x: (x.double(),), {}, TypeError, "comb_res_mix must be float32"),
    (lambda x: (x[..., :3].contiguous(),), {}, ValueError, r"\(..., m, m\) with 1 <= m <= 8, got shape \(5, 4, 3\)"),
    (lambda x: (torch.zeros(5, 9, 9),), {}, ValueError, "1 <= m <= 8"),
    (lambda x: (x.transpose(-1, -2),), {}, ValueError, "comb_res_mix must be contiguous"),
    (lambda x: (x,), {"repeat": 0}, ValueError, "repeat must be >= 1, got 0"),
    (lambda x: (x,), {"repeat": 2.0}, TypeError, "repeat must be a Python int"),
    (lambda x: (x,), {"eps": "1e-6"}, TypeError, "eps must be a Python float"),
    (lambda x: (x, torch.empty(5, 4, 3)), {}, ValueError, r"comb_res_mix_out must have shape \(5, 4, 4\)"),
]


@pytest.mark.parametrize("make,kwargs,error,match", BAD)
def test_rejects_bad_arguments(make, kwargs, error, match):
    x = torch.randn(5, 4, 4)
    with pytest.raises(error, match=match):
        tilebake.mhc.mhc_sinkhorn_fwd(*make(x), **kwargs)
    if len(make(x)) == 1:
        with pytest.raises(error, match=match.replace("comb_res_mix", "x")):
            tilebake.mhc.mhc_sinkhorn_bwd(torch.zeros(make(x)[0].shape), make(x)[0], **kwargs)
    with pytest.raises(ValueError, match=r"grad_output must have shape \(5, 4, 4\)"):
        tilebake.mhc.mhc_sinkhorn_bwd(torch.zeros(5, 4, 3), x)
    with pytest.raises(ValueError, match=r"grad_input must have shape \(5, 4, 4\)"):
        tilebake.mhc.mhc_sinkhorn_bwd(torch.zeros(5, 4, 4), x, torch.empty(4, 4, 4))
