"""engram_gate_bwd + grad_w_reduce against autograd of the reference gate in float64 (the
original's tolerances as rtol = atol: grad_x 8e-3, grad_kv 7e-3, grad_we 2e-4, grad_wh 1e-4), with and without the image mask, hc 1 to 8; two runs give the same bits;
argument errors on the CPU."""

import pytest
import torch

import tilebake
from tilebake.engram.engram_gate_bwd import CTAS_PER_SM, num_partials
from tilebake.torch.engram import engram_gate_ref

EPS, CLAMP = 1e-6, 1e-4
# (301, 3, 4104) / (301, 3, 12296): several tokens a CTA in the staged 8192 class / the unstaged
# 16384 class
SHAPES = [(1, 4, 7168), (8001, 4, 7168), (65536, 1, 256), (37, 1, 256), (300, 2, 4096), (301, 3, 4104), (5, 8, 16384), (301, 3, 12296), (3, 3, 264), (2, 4, 100), (123, 8, 1024), (777, 4, 1544)]


def inputs(num_tokens, hc, hidden, device, mask=False):
    """k correlated with x (a random sign per token and head), so |d| is about 6 +- 1: the
    gradient of sqrt(|d|) is ill-conditioned near d = 0, where fp32 and fp64 part ways."""
    x = torch.randn(num_tokens, hc, hidden, device=device)
    kv = torch.randn(num_tokens, hc + 1, hidden, device=device)
    sign = torch.randint(0, 2, (num_tokens, hc, 1), device=device) * 2 - 1
    kv[:, :hc] += sign * (6 / hidden**0.5) * x
    x, kv = x.bfloat16(), kv.bfloat16()
    wh = (torch.rand(hc, hidden, device=device) + 0.5).bfloat16()
    we = (torch.rand(hc, hidden, device=device) + 0.5).bfloat16()
    g = torch.randn(num_tokens, hc, hidden, device=device).bfloat16()
    m = torch.rand(num_tokens, device=device) < 0.3 if mask else None
    return x, kv, wh, we, g, m


def reference_grads(x, kv, wh, we, g, m):
    leaves = [t.detach().cpu().double().requires_grad_() for t in (x, kv, wh, we)]
    out = engram_gate_ref(*leaves, CLAMP, EPS, image_token_mask=m.cpu() if m is not None else None)
    out.backward(g.cpu().double())
    return [t.grad for t in leaves]


def assert_close_scaled(got, want, tol, name):
    """|got - want| <= tol + tol |want| elementwise (assert_close with rtol = atol = tol)."""
    got = got.cpu().double()
    assert not got.isnan().any(), name
    torch.testing.assert_close(got, want, rtol=tol, atol=tol, msg=lambda m: f"{name}: {m}")


def kernel_grads(x, kv, wh, we, g, m):
    w = tilebake.engram.fused_weight(wh, we)
    _, dot, gate, rx, rk = tilebake.engram.engram_gate_fwd(x, kv, w, EPS, CLAMP, image_token_mask=m)
    dx, dkv, partial = tilebake.engram.engram_gate_bwd(g, x, kv, w, dot, gate, rx, rk, CLAMP, image_token_mask=m)
    gwh, gwe = torch.zeros_like(w), torch.zeros_like(w)
    tilebake.engram.grad_w_reduce(partial, wh, we, gwh, gwe)
    return dx, dkv, gwh, gwe, partial


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("num_tokens,hc,hidden", SHAPES)
@pytest.mark.parametrize("mask", [False, True])
def test_gate_backward(device, num_tokens, hc, hidden, mask):
    if device == "cpu" and num_tokens * hc * hidden > 2**22:
        pytest.skip("the CPU path is the reference itself; large shapes on the GPU only")
    x, kv, wh, we, g, m = inputs(num_tokens, hc, hidden, device, mask)
    dx, dkv, gwh, gwe, partial = kernel_grads(x, kv, wh, we, g, m)
    assert dx.shape == x.shape and dx.dtype == torch.bfloat16 and dkv.shape == kv.shape and dkv.dtype == torch.bfloat16
    if device == "cuda":
        assert partial.shape == (num_partials(num_tokens, hc, hidden), hc, hidden)
    want = reference_grads(x, kv, wh, we, g, m)
    assert_close_scaled(dx, want[0], 8e-3, "grad_x")
    assert_close_scaled(dkv, want[1], 7e-3, "grad_kv")
    assert_close_scaled(gwh, want[2], 1e-4, "grad_wh")
    assert_close_scaled(gwe, want[3], 2e-4, "grad_we")
    if m is not None:
        mc = m.cpu()
        assert torch.equal(dx.cpu()[mc], g.cpu()[mc]) and not dkv.cpu()[mc].any()
    again = kernel_grads(x, kv, wh, we, g, m)  # a fixed order: the same bits
    assert all(torch.equal(a, b) for a, b in zip(again[:4], (dx, dkv, gwh, gwe)))


@pytest.mark.gpu
def test_partials_follow_set_num_sms():
    x, kv, wh, we, g, _ = inputs(500, 4, 1024, "cuda")
    full = kernel_grads(x, kv, wh, we, g, None)
    per_sm = CTAS_PER_SM[1024]  # hidden 1024: the 1024 class
    assert full[4].shape[0] == num_partials(500, 4, 1024) == min(500, per_sm * tilebake.get_num_sms() // 4)
    tilebake.set_num_sms(7)
    few = kernel_grads(x, kv, wh, we, g, None)
    assert few[4].shape[0] == 7 * per_sm // 4
    assert torch.equal(few[0], full[0]) and torch.equal(few[1], full[1])
    assert_close_scaled(few[2], full[2].cpu().double(), 1e-5, "grad_wh over 7 partials")  # another order


def test_rejects_bad_arguments():
    x, kv, wh, we, g, _ = inputs(4, 4, 256, "cpu")
    w = tilebake.engram.fused_weight(wh, we)
    _, dot, gate, rx, rk = tilebake.engram.engram_gate_fwd(x, kv, w, EPS, CLAMP)
    bwd = tilebake.engram.engram_gate_bwd
    with pytest.raises(TypeError, match="grad_out must be bfloat16"):
        bwd(g.float(), x, kv, w, dot, gate, rx, rk, CLAMP)
    with pytest.raises(ValueError, match="grad_out must be hidden_states' shape"):
        bwd(g[:3], x, kv, w, dot, gate, rx, rk, CLAMP)
    with pytest.raises(ValueError, match="gate_score must be"):
        bwd(g, x, kv, w, dot, gate[:, :3], rx, rk, CLAMP)
    with pytest.raises(TypeError, match="rstd_k must be float32"):
        bwd(g, x, kv, w, dot, gate, rx, rk.double(), CLAMP)
    with pytest.raises(TypeError, match="clamp_value must be a float"):
        bwd(g, x, kv, w, dot, gate, rx, rk, "1e-4")
    with pytest.raises(ValueError, match="kv must be"):
        bwd(g, x, kv[:, 1:], w, dot, gate, rx, rk, CLAMP)
    with pytest.raises(ValueError, match="dot must be on a CUDA device, an NPU or the CPU, got meta"):
        bwd(g, x, kv, w, dot.to("meta"), gate, rx, rk, CLAMP)
