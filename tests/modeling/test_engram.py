"""tilebake.modeling.engram.engram_gate: gradcheck in float64 (the reference path), both call
forms giving the same bits, leading dims and flat kv, Megatron main_grad accumulation, and the
bf16 path against float64 autograd of the reference (tolerances as tests/engram/test_engram_gate_bwd.py)."""

import pytest
import torch

from tests.engram.test_engram_gate_bwd import CLAMP, EPS, assert_close_scaled, inputs
from tilebake.modeling.engram import EngramGateFn, engram_gate
from tilebake.torch.engram import engram_gate_ref


def leaves(*tensors):
    return [t.detach().clone().requires_grad_() for t in tensors]


@pytest.mark.parametrize("mask", [False, True])
def test_gradcheck_float64(mask):
    x, kv, wh, we, _, m = inputs(3, 2, 16, "cpu", mask)
    args = leaves(x.double(), kv.double(), wh.double(), we.double())
    assert torch.autograd.gradcheck(lambda a, b, c, d: engram_gate(a, b, c, d, CLAMP, EPS, m), args)
    k, v = leaves(kv[:, :2].double(), kv[:, 2].double())
    assert torch.autograd.gradcheck(lambda a, b, c, d, e: engram_gate(a, b, c, d, e, CLAMP, EPS), [args[0], k, v, *args[2:]])


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("num_tokens,hc,hidden", [(1, 4, 7168), (300, 4, 1024), (77, 1, 256), (9, 8, 2048), (5, 3, 264)])
def test_bf16_against_float64(device, num_tokens, hc, hidden):
    x, kv, wh, we, g, m = inputs(num_tokens, hc, hidden, device, mask=True)
    a = leaves(x, kv, wh, we)
    out = engram_gate(*a, CLAMP, EPS, m)
    out.backward(g)
    r = leaves(*(t.cpu().double() for t in (x, kv, wh, we)))
    want = engram_gate_ref(*r, CLAMP, EPS, image_token_mask=m.cpu())
    want.backward(g.cpu().double())
    torch.testing.assert_close(out.cpu().float(), want.float(), rtol=8e-3, atol=8e-3)
    # the weights' gradients come back in bf16 (their fp32 sums: 1e-4 / 2e-4 in test_engram_gate_bwd.py)
    for got, ref, tol, name in zip(a, r, (8e-3, 7e-3, 8e-3, 8e-3), ("x", "kv", "wh", "we")):
        assert got.grad.dtype == got.dtype and got.grad.shape == got.shape
        assert_close_scaled(got.grad, ref.grad, tol, f"grad_{name}")


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_forms_shapes_and_main_grad(device):
    x, kv, wh, we, g, _ = inputs(12, 4, 512, device)
    a = leaves(x, kv, wh, we)
    out = engram_gate(*a, CLAMP, EPS)
    out.backward(g)
    # the 1.0 form (k and v apart) gives the same bits
    b = leaves(x, kv[:, :4], kv[:, 4], wh, we)
    out10 = engram_gate(*b, CLAMP, EPS)
    out10.backward(g)
    assert torch.equal(out10, out) and torch.equal(b[0].grad, a[0].grad)
    assert torch.equal(b[1].grad, a[1].grad[:, :4]) and torch.equal(b[2].grad, a[1].grad[:, 4])
    assert torch.equal(b[3].grad, a[2].grad) and torch.equal(b[4].grad, a[3].grad)
    # leading dims [B, S, hc, H] and a flat [B, S, (hc + 1) H] kv
    c = leaves(x.view(3, 4, 4, 512), kv.reshape(3, 4, 5 * 512), wh, we)
    out_bs = engram_gate(*c, CLAMP, EPS)
    out_bs.backward(g.view(3, 4, 4, 512))
    assert out_bs.shape == (3, 4, 4, 512) and torch.equal(out_bs.view_as(out), out)
    assert c[1].grad.shape == (3, 4, 5 * 512) and torch.equal(c[1].grad.view_as(kv), a[1].grad)
    # Megatron: main_grad accumulated in place, None returned
    d = leaves(x, kv, wh, we)
    start = torch.randn(4, 512, device=device)
    d[2].main_grad = start.clone()
    d[3].main_grad = torch.zeros(4, 512, device=device)
    engram_gate(*d, CLAMP, EPS).backward(g)
    assert d[2].grad is None and d[3].grad is None
    torch.testing.assert_close(d[2].main_grad, start + a[2].grad.float(), rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(d[3].main_grad.bfloat16(), a[3].grad, rtol=0, atol=0)
    assert torch.equal(d[0].grad, a[0].grad)


def test_rejects_bad_arguments():
    x, kv, wh, we, _, _ = inputs(4, 4, 256, "cpu")
    with pytest.raises(ValueError, match="kv must be"):
        engram_gate(x, kv[:, :3], wh, we, CLAMP, EPS)
    with pytest.raises(TypeError, match="engram_gate"):
        engram_gate(x, kv, wh, we, CLAMP)
    with pytest.raises(TypeError, match="weight_hidden must be bfloat16"):
        engram_gate(x, kv, wh.half(), we, CLAMP, EPS)
    assert engram_gate == EngramGateFn.apply
