"""fused_weight (bit-exact: a bf16 product is exact in fp32) and grad_w_reduce (the partials
added in order, then one product and one sum per buffer: bit-exact with the reference), on the
CPU and the GPU; argument errors on the CPU."""

import pytest
import torch

import tilebake
from tilebake.torch.engram import fused_weight_ref, grad_w_reduce_ref

SHAPES = [(1, 256), (4, 7168), (8, 16384), (3, 260), (2, 1)]


def weights(hc, hidden, device):
    return (torch.randn(hc, hidden, device=device) * 2).bfloat16(), torch.randn(hc, hidden, device=device).bfloat16()


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("hc,hidden", SHAPES)
def test_fused_weight(device, hc, hidden):
    wh, we = weights(hc, hidden, device)
    for _ in range(2):  # on CUDA: the Python path, then the plan
        w = tilebake.engram.fused_weight(wh, we)
        assert w.dtype == torch.float32 and w.shape == (hc, hidden)
        assert torch.equal(w, fused_weight_ref(wh, we))
    strided = tilebake.engram.fused_weight(wh.t().contiguous().t(), we)  # a column-major view
    assert torch.equal(strided, fused_weight_ref(wh, we))


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("hc,hidden", SHAPES[:4])
@pytest.mark.parametrize("parts", [1, 3, 132, 397])
def test_grad_w_reduce(device, hc, hidden, parts):
    wh, we = weights(hc, hidden, device)
    partial = torch.randn(parts, hc, hidden, device=device)
    gwh, gwe = torch.randn(hc, hidden, device=device), torch.randn(hc, hidden, device=device)
    want_h, want_e = gwh.clone(), gwe.clone()
    grad_w_reduce_ref(partial.cpu(), wh.cpu(), we.cpu(), want_h_cpu := want_h.cpu(), want_e_cpu := want_e.cpu())
    tilebake.engram.grad_w_reduce(partial, wh, we, gwh, gwe)
    assert torch.equal(gwh.cpu(), want_h_cpu) and torch.equal(gwe.cpu(), want_e_cpu)


def test_rejects_bad_arguments():
    wh, we = weights(4, 256, "cpu")
    with pytest.raises(TypeError, match="weight_hidden must be bfloat16"):
        tilebake.engram.fused_weight(wh.float(), we)
    with pytest.raises(ValueError, match="weight_embed must have weight_hidden's shape"):
        tilebake.engram.fused_weight(wh, we[:, :128])
    with pytest.raises(ValueError, match="1 <= hc <= 8"):
        tilebake.engram.fused_weight(*weights(9, 256, "cpu"))
    g = torch.zeros(4, 256)
    with pytest.raises(ValueError, match="grad_w_partial must be"):
        tilebake.engram.grad_w_reduce(torch.zeros(2, 4, 128), wh, we, g, g.clone())
    with pytest.raises(ValueError, match="grad_w_partial must be"):
        tilebake.engram.grad_w_reduce(torch.zeros(0, 4, 256), wh, we, g, g.clone())
    with pytest.raises(TypeError, match="grad_weight_embed must be float32"):
        tilebake.engram.grad_w_reduce(torch.zeros(2, 4, 256), wh, we, g, g.bfloat16())
    with pytest.raises(ValueError, match="grad_weight_hidden must be contiguous"):
        tilebake.engram.grad_w_reduce(torch.zeros(2, 4, 256), wh, we, torch.zeros(256, 4).t(), g)
