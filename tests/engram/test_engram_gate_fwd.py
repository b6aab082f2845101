"""engram_gate_fwd against the reference (tilebake.torch.engram.engram_gate_fwd_ref) within the
original's tolerances (output rtol = atol = 8e-3, dot 2e-4, gate_score 1e-4, rstd the defaults);
the no-save and inplace outputs bit-equal to the saving path; image tokens passed through
exactly; argument errors on the CPU."""

import pytest
import torch

import tilebake
from tilebake.torch.engram import engram_gate_fwd_ref

EPS, CLAMP = 1e-6, 1e-4
SHAPES = [(1, 4, 7168), (8001, 4, 7168), (65536, 1, 256), (37, 1, 256), (19, 2, 4096), (5, 8, 16384), (3, 3, 264), (2, 4, 100), (123, 8, 1024), (777, 4, 1544)]


def inputs(num_tokens, hc, hidden, device, mask=False):
    x = torch.randn(num_tokens, hc, hidden, device=device).bfloat16()
    kv = torch.randn(num_tokens, hc + 1, hidden, device=device).bfloat16()
    w = torch.randn(hc, hidden, device=device).bfloat16().float() * torch.rand(hc, hidden, device=device).bfloat16().float()
    m = torch.rand(num_tokens, device=device) < 0.3 if mask else None
    return x, kv, w, m


def check_against_reference(outs, x, kv, w, m):
    want = engram_gate_fwd_ref(x.cpu(), kv.cpu(), w.cpu(), EPS, CLAMP, m.cpu() if m is not None else None)
    out, dot, gate, rx, rk = (t.cpu() for t in outs)
    for t in (out, dot, gate, rx, rk):
        assert not t.float().isnan().any()
    torch.testing.assert_close(out.float(), want[0].float(), rtol=8e-3, atol=8e-3)
    torch.testing.assert_close(dot, want[1], rtol=2e-4, atol=2e-4)
    torch.testing.assert_close(gate, want[2], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(rx, want[3])
    torch.testing.assert_close(rk, want[4])
    if m is not None:
        assert torch.equal(out[m.cpu()], x.cpu()[m.cpu()])


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("num_tokens,hc,hidden", SHAPES)
@pytest.mark.parametrize("mask", [False, True])
def test_gate_forward(device, num_tokens, hc, hidden, mask):
    if device == "cpu" and num_tokens * hc * hidden > 2**22:
        pytest.skip("the CPU path is the reference itself; large shapes on the GPU only")
    x, kv, w, m = inputs(num_tokens, hc, hidden, device, mask)
    outs = tilebake.engram.engram_gate_fwd(x, kv, w, EPS, CLAMP, image_token_mask=m)
    assert outs[0].shape == x.shape and outs[0].dtype == torch.bfloat16
    assert all(t.shape == (num_tokens, hc) and t.dtype == torch.float32 for t in outs[1:])
    check_against_reference(outs, x, kv, w, m)
    bare = tilebake.engram.engram_gate_fwd(x, kv, w, EPS, CLAMP, save_for_backward=False, image_token_mask=m)
    assert bare[1:] == (None, None, None, None) and torch.equal(bare[0], outs[0])
    y = x.clone()
    version = y._version
    inplace = tilebake.engram.engram_gate_fwd(y, kv, w, EPS, CLAMP, False, m, inplace=True)
    assert inplace[0] is y and y._version > version and torch.equal(y, outs[0])


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_strided_rows_and_special_values(device):
    x, kv, w, _ = inputs(64, 4, 1024, device)
    big = torch.randn(64, 6, 1032, device=device).bfloat16()  # x as a view with padded rows
    big[:, 1:5, :1024] = x
    xs = big[:, 1:5, :1024]
    kv[3] = 0  # d = 0: gate 1/2
    kv[5, :4] = 1e-3  # |d| below the clamp
    outs = tilebake.engram.engram_gate_fwd(xs, kv, w, EPS, CLAMP)
    check_against_reference(outs, x, kv, w, None)
    assert torch.all(outs[2][3].cpu() == 0.5)
    kv[7, 0, 5] = float("nan")  # NaN in k: that head's gate and output are NaN, as the reference's
    outs = tilebake.engram.engram_gate_fwd(x, kv, w, EPS, CLAMP)
    assert outs[2][7, 0].isnan() and outs[0][7, 0].isnan().all() and not outs[2][7, 1:].isnan().any()


def test_rejects_bad_arguments():
    x, kv, w, _ = inputs(4, 4, 256, "cpu")
    gate = tilebake.engram.engram_gate_fwd
    with pytest.raises(TypeError, match="hidden_states must be bfloat16"):
        gate(x.float(), kv, w, EPS, CLAMP)
    with pytest.raises(ValueError, match="kv must be"):
        gate(x, kv[:, :4], w, EPS, CLAMP)
    with pytest.raises(ValueError, match="1 <= hc <= 8"):
        gate(torch.zeros(4, 9, 256).bfloat16(), kv, w, EPS, CLAMP)
    with pytest.raises(TypeError, match="weight_fused must be float32"):
        gate(x, kv, w.bfloat16(), EPS, CLAMP)
    with pytest.raises(ValueError, match="weight_fused must be"):
        gate(x, kv, w[:3], EPS, CLAMP)
    with pytest.raises(ValueError, match="inplace=True needs save_for_backward=False"):
        gate(x, kv, w, EPS, CLAMP, inplace=True)
    with pytest.raises(TypeError, match="image_token_mask must be bool"):
        gate(x, kv, w, EPS, CLAMP, image_token_mask=torch.zeros(4))
    with pytest.raises(ValueError, match="image_token_mask must be"):
        gate(x, kv, w, EPS, CLAMP, image_token_mask=torch.zeros(5, dtype=torch.bool))
    with pytest.raises(TypeError, match="eps must be a float"):
        gate(x, kv, w, None, CLAMP)
    with pytest.raises(ValueError, match="kv must be on a CUDA device, an NPU or the CPU, got meta"):
        gate(x, kv.to("meta"), w, EPS, CLAMP)
    if torch.cuda.is_available():
        with pytest.raises(ValueError, match="kv must be on"):
            gate(x.cuda(), kv, w.cuda(), EPS, CLAMP)
