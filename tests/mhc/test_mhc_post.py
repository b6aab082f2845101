"""mhc_post_fwd (bit-exact with the stream-ordered reference; within the original's tolerance of
its einsum form) and mhc_post_bwd (against float64 autograd of the forward), m = 1 to 8, on the
CPU and the GPU; argument errors on the CPU."""

import pytest
import torch

import tilebake
from tests.helpers import assert_bytes_equal, poison_
from tilebake.torch.mhc import mhc_post_bwd_ref, mhc_post_ref, mhc_post_ref_like_original

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]
# hidden picks the backward's warps a token (mhc_post.token_warps): 1 below 2560, 2 below 5120, else 4
SHAPES = [((1,), 4, 128), ((8001,), 4, 1280), ((2, 517), 2, 7168), ((3,), 8, 16384), ((65,), 3, 136), ((1, 7), 1, 8),
          ((33,), 4, 4104), ((7,), 4, 5128)]  # fmt: skip


def skip_big_on_cpu(device, lead, mhc_mult, hidden):
    """On the CPU the op is its reference: the 8001-token case would check the reference against
    itself for half a minute of CI; the GPU runs it."""
    if device == "cpu" and torch.Size(lead).numel() * mhc_mult * hidden > 4_000_000:
        pytest.skip("CPU: the GPU runs this size (on the CPU the op is the reference itself)")


def inputs(lead, mhc_mult, hidden, device, flat_post=False):
    x = torch.randn(*lead, hidden, device=device).bfloat16()
    residual = torch.randn(*lead, mhc_mult, hidden, device=device).bfloat16()
    post = torch.rand(*lead, mhc_mult, *(() if flat_post else (1,)), device=device) * 2
    comb = torch.rand(*lead, mhc_mult, mhc_mult, device=device)
    return x, residual, post, comb


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("lead,mhc_mult,hidden", SHAPES)
def test_forward(device, lead, mhc_mult, hidden):
    skip_big_on_cpu(device, lead, mhc_mult, hidden)
    args = inputs(lead, mhc_mult, hidden, device, flat_post=mhc_mult == 3)
    want = mhc_post_ref(*(a.cpu() for a in args))
    out = tilebake.mhc.mhc_post_fwd(*args)
    assert_bytes_equal(out.cpu(), want, "out")
    torch.testing.assert_close(out.cpu(), mhc_post_ref_like_original(*(a.cpu() for a in args)))  # bf16 defaults
    given = poison_(torch.empty_like(args[1]))
    assert tilebake.mhc.mhc_post_fwd(*args, out=given) is given
    assert_bytes_equal(given.cpu(), want, "given out")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("lead,mhc_mult,hidden", SHAPES)
def test_backward(device, lead, mhc_mult, hidden):
    skip_big_on_cpu(device, lead, mhc_mult, hidden)
    args = inputs(lead, mhc_mult, hidden, device, flat_post=mhc_mult == 3)
    d_o = torch.randn_like(args[1].float()).bfloat16()
    got = tilebake.mhc.mhc_post_bwd(*args, d_o)
    # float64 autograd of the forward's formula
    leaves = [a.cpu().double().requires_grad_() for a in args]
    x, residual, post, comb = leaves
    p = post.reshape(*residual.shape[:-1], 1)
    out = x.unsqueeze(-2) * p + torch.einsum("...io,...ic->...oc", comb, residual)
    out.backward(d_o.cpu().double())
    names = ("d_x", "d_residual", "d_post", "d_comb")
    for name, g, leaf, like in zip(names, got, leaves, args):
        assert g.dtype == like.dtype and g.shape == like.shape, name
        tol = dict(rtol=1e-2, atol=1e-2) if g.dtype == torch.bfloat16 else dict(rtol=1e-4, atol=1e-3)
        torch.testing.assert_close(g.cpu().double(), leaf.grad, **tol, msg=name)
    ref = mhc_post_bwd_ref(*(a.cpu() for a in args), d_o.cpu())
    torch.testing.assert_close(ref[2], leaves[2].grad)
    again = tilebake.mhc.mhc_post_bwd(*args, d_o)
    for name, a, b in zip(names, got, again):
        assert_bytes_equal(a.cpu(), b.cpu(), f"{name} (a second run)")


BAD = [
    (lambda a: (a[0].float(), *a[1:]), TypeError, "x must be bfloat16"),
    (lambda a: (a[0], a[1], a[2].double(), a[3]), TypeError, "post_layer_mix must be float32"),
    (lambda a: (a[0], a[1], a[2][:, :3].contiguous(), a[3]), ValueError, r"post_layer_mix must have shape \(5, 4, 1\)"),
    (lambda a: (a[0], a[1], a[2], a[3][:, :3].contiguous()), ValueError, r"comb_res_mix must have shape \(5, 4, 4\)"),
    (lambda a: (a[0][:4], *a[1:]), ValueError, r"residual must have shape \(4, 4, 256\)"),
    (lambda a: (a[0], a[1].transpose(0, 1).contiguous().transpose(0, 1), *a[2:]), ValueError, "residual must be contiguous"),
]


@pytest.mark.parametrize("make,error,match", BAD)
def test_rejects_bad_arguments(make, error, match):
    args = inputs((5,), 4, 256, "cpu")
    with pytest.raises(error, match=match):
        tilebake.mhc.mhc_post_fwd(*make(args))
    with pytest.raises(error, match=match):
        tilebake.mhc.mhc_post_bwd(*make(args), torch.zeros(5, 4, 256).bfloat16())
    with pytest.raises(ValueError, match=r"d_o must have shape \(5, 4, 256\)"):
        tilebake.mhc.mhc_post_bwd(*args, torch.zeros(5, 4, 255).bfloat16())


def test_rejects_tensors_on_other_devices():
    """Every mhc op names the argument on a device it does not take (a meta tensor stands for one
    on the CPU-only CI host; tests/mhc run on the GPU for cuda:0 against the CPU)."""
    x, residual, post, comb = inputs((5,), 4, 256, "cpu")
    meta = torch.empty(5, 4, 4, device="meta")
    with pytest.raises(ValueError, match="comb_res_mix must be on a CUDA device, an NPU or the CPU, got meta"):
        tilebake.mhc.mhc_post_fwd(x, residual, post, meta)
    with pytest.raises(ValueError, match="o must be on a CUDA device, an NPU or the CPU, got meta"):
        tilebake.mhc.expand_to_mhc_fwd(x, torch.empty(5, 4, 256, dtype=torch.bfloat16, device="meta"))
    with pytest.raises(ValueError, match="mix must be on a CUDA device, an NPU or the CPU, got meta"):
        tilebake.mhc.mhc_pre_apply_mix_fwd(residual, torch.empty(5, 4, device="meta"))
    with pytest.raises(ValueError, match="d_o must be on a CUDA device, an NPU or the CPU, got meta"):
        tilebake.mhc.mhc_post_bwd(x, residual, post, comb, torch.empty(5, 4, 256, dtype=torch.bfloat16, device="meta"))


@pytest.mark.gpu
def test_gpu_rejects_mixed_devices():
    x, residual, post, comb = inputs((5,), 4, 256, "cuda")
    with pytest.raises(ValueError, match="comb_res_mix must be on cuda:0 \\(as x\\), got cpu"):
        tilebake.mhc.mhc_post_fwd(x, residual, post, comb.cpu())
