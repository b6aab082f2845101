"""expand_to_mhc_fwd / _bwd against the references (bit-exact: a copy, and fp32 sums in stream
order rounded once), on the CPU and the GPU; argument errors on the CPU."""

import pytest
import torch

import tilebake
from tests.helpers import assert_bytes_equal, poison_
from tilebake.torch.mhc import expand_to_mhc_bwd_ref, expand_to_mhc_ref

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]
SHAPES = [((1,), 1, 128), ((8001,), 4, 1280), ((2, 517), 2, 7168), ((3,), 8, 16384), ((5,), 3, 136), ((1, 1), 4, 8)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("lead,mhc_mult,hidden", SHAPES)
def test_expand_forward_and_backward(device, lead, mhc_mult, hidden):
    x = torch.randn(*lead, hidden, device=device).bfloat16()
    o = poison_(torch.empty(*lead, mhc_mult, hidden, dtype=torch.bfloat16, device=device))
    assert tilebake.mhc.expand_to_mhc_fwd(x, o) is o
    assert_bytes_equal(o.cpu(), expand_to_mhc_ref(x.cpu(), mhc_mult), "o")
    o_grad = (torch.randn(*lead, mhc_mult, hidden, device=device) * 4).bfloat16()
    o_grad.view(-1)[:8] = -0.0  # a single stream's -0.0 must stay -0.0
    want = expand_to_mhc_bwd_ref(o_grad.cpu())
    assert_bytes_equal(tilebake.mhc.expand_to_mhc_bwd(o_grad).cpu(), want, "x_grad")
    given = poison_(torch.empty(*lead, hidden, dtype=torch.bfloat16, device=device))
    assert tilebake.mhc.expand_to_mhc_bwd(o_grad, given) is given
    assert_bytes_equal(given.cpu(), want, "given x_grad")


def test_backward_reference_is_the_float_sum():
    o_grad = torch.randn(64, 4, 256).bfloat16()
    torch.testing.assert_close(expand_to_mhc_bwd_ref(o_grad).float(), o_grad.double().sum(-2).float(), rtol=8e-3, atol=1e-5)


BAD = [
    (lambda x, o: (x.float(), o), TypeError, "x must be bfloat16"),
    (lambda x, o: (x, o.float()), TypeError, "o must be bfloat16"),
    (lambda x, o: ("x", o), TypeError, "x must be a torch.Tensor"),
    (lambda x, o: (x[:3], o), ValueError, r"o must have shape \(3, 4, 256\)"),
    (lambda x, o: (x, torch.empty(4, 9, 256).bfloat16()), ValueError, "stream count .* 1 to 8, got 9"),
    (lambda x, o: (x, o.transpose(0, 1)), ValueError, "o must be contiguous"),
]


@pytest.mark.parametrize("make,error,match", BAD)
def test_rejects_bad_arguments(make, error, match):
    x, o = torch.randn(4, 256).bfloat16(), torch.empty(4, 4, 256).bfloat16()
    with pytest.raises(error, match=match):
        tilebake.mhc.expand_to_mhc_fwd(*make(x, o))
    with pytest.raises(ValueError, match=r"x_grad must have shape \(4, 256\)"):
        tilebake.mhc.expand_to_mhc_bwd(o, torch.empty(4, 255).bfloat16())
    with pytest.raises(TypeError, match="o_grad must be bfloat16"):
        tilebake.mhc.expand_to_mhc_bwd(o.half())


@pytest.mark.gpu
def test_gpu_rejects_hidden_not_a_multiple_of_8():
    with pytest.raises(ValueError, match="multiple of 8 on CUDA, got 100"):
        tilebake.mhc.expand_to_mhc_fwd(torch.zeros(2, 100, device="cuda").bfloat16(),
                                       torch.empty(2, 4, 100, device="cuda").bfloat16())  # fmt: skip
