"""mhc_pre_apply_mix_fwd (bit-exact with the stream-ordered reference; within the original's
tolerance of its (x * mix).sum form) and mhc_pre_apply_mix_bwd (x_grad accumulated bit-exactly,
mix_grad against float64), m = 1 to 8, on the CPU and the GPU; argument errors on the CPU."""

import pytest
import torch

import tilebake
from tests.helpers import assert_bytes_equal, poison_
from tilebake.torch.mhc import mhc_pre_apply_mix_bwd_ref, mhc_pre_apply_mix_ref

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]
SHAPES = [((1,), 4, 128), ((8001,), 4, 1280), ((2, 517), 2, 7168), ((3,), 8, 16384), ((65,), 3, 136), ((1, 7), 1, 8)]


def inputs(lead, mhc_mult, hidden, device):
    x = torch.randn(*lead, mhc_mult, hidden, device=device).bfloat16()
    mix = torch.rand(*lead, mhc_mult, *((1,) if mhc_mult % 2 else ()), device=device) + 1e-6
    return x, mix


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("lead,mhc_mult,hidden", SHAPES)
def test_forward(device, lead, mhc_mult, hidden):
    x, mix = inputs(lead, mhc_mult, hidden, device)
    want = mhc_pre_apply_mix_ref(x.cpu(), mix.cpu())
    assert_bytes_equal(tilebake.mhc.mhc_pre_apply_mix_fwd(x, mix).cpu(), want, "o")
    like_original = (x.cpu() * mix.cpu().reshape(*x.shape[:-1], 1)).sum(-2).bfloat16()
    torch.testing.assert_close(want, like_original, atol=1e-2, rtol=1e-3)
    given = poison_(torch.empty(*lead, hidden, dtype=torch.bfloat16, device=device))
    assert tilebake.mhc.mhc_pre_apply_mix_fwd(x, mix, given) is given
    assert_bytes_equal(given.cpu(), want, "given o")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("lead,mhc_mult,hidden", SHAPES)
def test_backward(device, lead, mhc_mult, hidden):
    x, mix = inputs(lead, mhc_mult, hidden, device)
    o_grad = torch.randn(*lead, hidden, device=device).bfloat16()
    start = torch.randn_like(x.float()).bfloat16()
    x_grad = start.clone()
    mix_grad = tilebake.mhc.mhc_pre_apply_mix_bwd(o_grad, x, mix, x_grad)
    want_x_grad, want_mix_grad = mhc_pre_apply_mix_bwd_ref(o_grad.cpu(), x.cpu(), mix.cpu(), start.cpu())
    assert_bytes_equal(x_grad.cpu(), want_x_grad, "x_grad")
    assert mix_grad.shape == mix.shape and mix_grad.dtype == torch.float32
    torch.testing.assert_close(mix_grad.cpu(), want_mix_grad, rtol=1e-4, atol=1e-3)
    alone = tilebake.mhc.mhc_pre_apply_mix_bwd(o_grad, x, mix)  # no x_grad: mix_grad only
    assert_bytes_equal(alone.cpu(), mix_grad.cpu(), "mix_grad without x_grad (and a second run)")


def test_backward_variant_by_streams_and_hidden():
    """A thread a vector of the token's for m <= 4, in multiples of 128 threads up to 1024; 8-stream
    registers and 128 threads beyond 4 streams."""
    key = tilebake.mhc.mhc_pre_apply_mix.backward_key
    assert [key(4, h)[1] for h in (8, 1024, 1032, 2048, 7168, 8192, 8200, 16384)] == [128, 128, 256, 256, 896, 1024,
                                                                                      1024, 1024]  # fmt: skip
    assert key(1, 7168) == ("bwd", 896, 4) and key(5, 7168) == key(8, 8) == ("bwd", 128, 8)
    variants = tilebake.mhc.mhc_pre_apply_mix.MhcPreApplyMixVariant.all()
    assert {key(m, h) for m in range(1, 9) for h in range(8, 16385, 8)} == {
        (v.direction, v.threads, v.max_mult) for v in variants if v.direction == "bwd"
    }


@pytest.mark.gpu
@pytest.mark.parametrize("hidden", [1024 * k - 8 for k in range(1, 9)] + [9000], ids=lambda h: f"h{h}")
@pytest.mark.parametrize("mhc_mult", [1, 4])
def test_backward_every_thread_count(mhc_mult, hidden):
    test_backward("cuda", (33,), mhc_mult, hidden)


BAD = [
    (lambda x, mix: (x.float(), mix), TypeError, "x must be bfloat16"),
    (lambda x, mix: (x, mix.bfloat16()), TypeError, "mix must be float32"),
    (lambda x, mix: (x, mix[:, :3].contiguous()), ValueError, r"mix must have shape \(5, 4\)"),
    (lambda x, mix: (x[:, :, :100].contiguous(), mix[:, :3]), ValueError, "mix must"),
]


@pytest.mark.parametrize("make,error,match", BAD)
def test_rejects_bad_arguments(make, error, match):
    x, mix = torch.randn(5, 4, 256).bfloat16(), torch.rand(5, 4)
    with pytest.raises(error, match=match):
        tilebake.mhc.mhc_pre_apply_mix_fwd(*make(x, mix))
    with pytest.raises(error, match=match):
        tilebake.mhc.mhc_pre_apply_mix_bwd(torch.zeros(5, 256).bfloat16(), *make(x, mix))
    with pytest.raises(ValueError, match=r"o_grad must have shape \(5, 256\)"):
        tilebake.mhc.mhc_pre_apply_mix_bwd(torch.zeros(5, 255).bfloat16(), x, mix)
    with pytest.raises(ValueError, match=r"x_grad must have shape \(5, 4, 256\)"):
        tilebake.mhc.mhc_pre_apply_mix_bwd(torch.zeros(5, 256).bfloat16(), x, mix, torch.zeros(5, 3, 256).bfloat16())
