"""mhc_fn_normw_merge_fwd / _bwd: fn * normw and its gradients, bit-exact between the CPU and the
GPU (IEEE fp32, the weight gradient's rows in order) and against float64; argument errors."""

import pytest
import torch

import tilebake
from tests.helpers import assert_bytes_equal, poison_

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]
SHAPES = [(24, 28672), (3, 128), (80, 65536), (1, 4), (15, 1036)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("mixes,cols", SHAPES)
def test_forward_and_backward(device, mixes, cols):
    fn, w = torch.randn(mixes, cols, device=device), torch.randn(cols, device=device)
    merged = tilebake.mhc.mhc_fn_normw_merge_fwd(fn, w)
    assert_bytes_equal(merged.cpu(), fn.cpu() * w.cpu(), "out_fn")
    given = poison_(torch.empty_like(fn))
    assert tilebake.mhc.mhc_fn_normw_merge_fwd(fn, w, given) is given
    assert_bytes_equal(given.cpu(), merged.cpu(), "given out_fn")
    g = torch.randn_like(fn)
    fn_grad, w_grad = tilebake.mhc.mhc_fn_normw_merge_bwd(fn, w, g)
    assert_bytes_equal(fn_grad.cpu(), g.cpu() * w.cpu(), "fn_grad")
    torch.testing.assert_close(w_grad.cpu().double(), (g.cpu().double() * fn.cpu().double()).sum(0), rtol=1e-5, atol=1e-5)
    if device == "cuda":
        assert_bytes_equal(w_grad.cpu(), tilebake.mhc.mhc_fn_normw_merge_bwd(fn.cpu(), w.cpu(), g.cpu())[1], "normw_grad")
    given = (poison_(torch.empty_like(fn)), poison_(torch.empty_like(w)))
    got = tilebake.mhc.mhc_fn_normw_merge_bwd(fn, w, g, *given)
    assert got[0] is given[0] and got[1] is given[1]
    assert_bytes_equal(given[1].cpu(), w_grad.cpu(), "given normw_grad")


def test_rejects_bad_arguments():
    fn, w = torch.randn(24, 256), torch.randn(256)
    with pytest.raises(ValueError, match=r"normw must have shape \(256,\)"):
        tilebake.mhc.mhc_fn_normw_merge_fwd(fn, w[:255].contiguous())
    with pytest.raises(TypeError, match="fn must be float32"):
        tilebake.mhc.mhc_fn_normw_merge_fwd(fn.bfloat16(), w)
    with pytest.raises(ValueError, match="fn must be 2-D"):
        tilebake.mhc.mhc_fn_normw_merge_fwd(fn.reshape(2, 12, 256), w)
    with pytest.raises(ValueError, match=r"out_fn_grad must have shape \(24, 256\)"):
        tilebake.mhc.mhc_fn_normw_merge_bwd(fn, w, torch.zeros(23, 256))
    with pytest.raises(ValueError, match=r"normw_grad must have shape \(256,\)"):
        tilebake.mhc.mhc_fn_normw_merge_bwd(fn, w, torch.zeros(24, 256), None, torch.zeros(24))


@pytest.mark.gpu
def test_rejects_misaligned_views_on_cuda():
    """The kernels move 16-byte vectors: a view one element into its buffer is refused by name."""

    def off_by_one(*shape):
        return torch.randn(torch.Size(shape).numel() + 1, device="cuda")[1:].view(shape)

    fn, w = torch.randn(24, 256, device="cuda"), torch.randn(256, device="cuda")
    with pytest.raises(ValueError, match="fn's data must be 16-byte aligned"):
        tilebake.mhc.mhc_fn_normw_merge_fwd(off_by_one(24, 256), w)
    with pytest.raises(ValueError, match="normw's data must be 16-byte aligned"):
        tilebake.mhc.mhc_fn_normw_merge_fwd(fn, off_by_one(256))
    with pytest.raises(ValueError, match="out_fn's data must be 16-byte aligned"):
        tilebake.mhc.mhc_fn_normw_merge_fwd(fn, w, off_by_one(24, 256))
    with pytest.raises(ValueError, match="out_fn_grad's data must be 16-byte aligned"):
        tilebake.mhc.mhc_fn_normw_merge_bwd(fn, w, off_by_one(24, 256))
    with pytest.raises(ValueError, match="fn_grad's data must be 16-byte aligned"):
        tilebake.mhc.mhc_fn_normw_merge_bwd(fn, w, torch.randn_like(fn), off_by_one(24, 256))
