"""mhc_head_compute_mix_fwd (within the original's tolerance, rtol 1e-4 / atol 1e-5, of
mhc_head_compute_mix_ref) and _bwd (the per-CTA partials summed against float64 autograd of the
reference; the same bits twice; any partial count), m = 1 to 8, on the CPU and the GPU; argument
errors on the CPU."""

import pytest
import torch

import tilebake
from tests.helpers import assert_bytes_equal, poison_
from tilebake.torch.mhc import mhc_head_compute_mix_bwd_ref, mhc_head_compute_mix_ref

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]
SHAPES = [((1,), 4, 5), ((8001,), 4, 132), ((2, 517), 2, 1), ((65,), 8, 200), ((7,), 1, 3), ((1, 3), 3, 2)]
TOL = dict(rtol=1e-4, atol=1e-5)  # the original's (tests/mhc/test_head_compute_mix.py)


def inputs(lead, m, device):
    return torch.randn(*lead, m, device=device), torch.rand(1, device=device) + 0.5, torch.randn(m, device=device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("lead,m,parts", SHAPES)
def test_forward(device, lead, m, parts):
    x, scale, base = inputs(lead, m, device)
    got = tilebake.mhc.mhc_head_compute_mix_fwd(x, scale, base, mhc_pre_eps=1e-4)
    want = mhc_head_compute_mix_ref(x.cpu(), scale.cpu(), base.cpu(), 1e-4)
    assert got.shape == x.shape and got.dtype == torch.float32
    torch.testing.assert_close(got.cpu(), want, **TOL)
    given = poison_(torch.empty_like(x))
    assert tilebake.mhc.mhc_head_compute_mix_fwd(x, scale, base, given, 1e-4, 32) is given
    assert_bytes_equal(given.cpu(), got.cpu(), "given output_mix")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("lead,m,parts", SHAPES)
def test_backward(device, lead, m, parts):
    x, scale, base = inputs(lead, m, device)
    g = torch.randn_like(x)
    x_grad, sp, bp = tilebake.mhc.mhc_head_compute_mix_bwd(g, x, scale, base, num_sms=parts)
    assert (sp.shape, bp.shape) == ((parts, 1), (parts, m))
    leaves = [t.cpu().double().requires_grad_() for t in (x, scale, base)]
    mhc_head_compute_mix_ref(*leaves, 1e-6).backward(g.cpu().double())
    torch.testing.assert_close(x_grad.cpu().double(), leaves[0].grad, **TOL)
    torch.testing.assert_close(sp.cpu().double().sum(0), leaves[1].grad, **TOL)
    torch.testing.assert_close(bp.cpu().double().sum(0), leaves[2].grad, **TOL)
    # the rows are the token ranges' sums (the reference's split): rows past the tokens are 0
    ref = mhc_head_compute_mix_bwd_ref(g.cpu(), x.cpu(), scale.cpu(), base.cpu(), parts)
    torch.testing.assert_close(sp.cpu(), ref[1], **TOL)
    torch.testing.assert_close(bp.cpu(), ref[2], **TOL)
    given = [poison_(torch.empty_like(x)), poison_(torch.empty(parts, 1, device=device)),
             poison_(torch.empty(parts, m, device=device))]  # fmt: skip
    again = tilebake.mhc.mhc_head_compute_mix_bwd(g, x, scale, base, *given)
    for name, a, t, b in zip(("input_mix_grad", "scale partials", "base partials"), again, given, (x_grad, sp, bp)):
        assert a is t, name
        assert_bytes_equal(a.cpu(), b.cpu(), f"given {name} (a second run)")


@pytest.mark.gpu
def test_backward_default_partials_are_the_sm_count():
    x, scale, base = inputs((100,), 4, "cuda")
    tilebake.config.set_num_sms(3)
    _, sp, bp = tilebake.mhc.mhc_head_compute_mix_bwd(torch.randn_like(x), x, scale, base)
    assert sp.shape == (3, 1) and bp.shape == (3, 4)


BAD = [
    (lambda x, s, b: (x.double(), s, b), {}, TypeError, "input_mix must be float32"),
    (lambda x, s, b: (torch.zeros(5, 9), s, torch.zeros(9)), {}, ValueError, "last dim .* 1 to 8, got 9"),
    (lambda x, s, b: (x, torch.ones(2), b), {}, ValueError, r"mhc_scale must have shape \(1,\)"),
    (lambda x, s, b: (x, s, b[:3]), {}, ValueError, r"mhc_base must have shape \(4,\)"),
    (lambda x, s, b: (x.t(), s, b), {}, ValueError, "input_mix must be contiguous"),
    (lambda x, s, b: (x, s, b), {"token_block_size": 48}, ValueError, "power of two <= 64, got 48"),
    (lambda x, s, b: (x, s, b), {"token_block_size": 128}, ValueError, "power of two <= 64, got 128"),
]


@pytest.mark.parametrize("make,kwargs,error,match", BAD)
def test_rejects_bad_arguments(make, kwargs, error, match):
    x, s, b = torch.randn(5, 4), torch.ones(1), torch.zeros(4)
    with pytest.raises(error, match=match):
        tilebake.mhc.mhc_head_compute_mix_fwd(*make(x, s, b), **kwargs)
    args = make(x, s, b)
    with pytest.raises(error, match=match):
        tilebake.mhc.mhc_head_compute_mix_bwd(torch.zeros(args[0].shape), *args, **kwargs)


def test_rejects_bad_partials():
    x, s, b = torch.randn(5, 4), torch.ones(1), torch.zeros(4)
    g = torch.zeros(5, 4)
    with pytest.raises(ValueError, match=r"mhc_base_grad_partial must have shape \(7, 4\)"):
        tilebake.mhc.mhc_head_compute_mix_bwd(g, x, s, b, None, torch.empty(7, 1), torch.empty(6, 4))
    with pytest.raises(ValueError, match="num_sms must be >= 1, got 0"):
        tilebake.mhc.mhc_head_compute_mix_bwd(g, x, s, b, num_sms=0)
    with pytest.raises(ValueError, match=r"output_mix_grad must have shape \(5, 4\)"):
        tilebake.mhc.mhc_head_compute_mix_bwd(torch.zeros(5, 3), x, s, b)
