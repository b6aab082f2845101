"""normalize_weight: argument checks and the CPU path (CI); the kernel against
tilebake.torch.normalize_weight on a GPU, byte for byte (same fp32 additions in the same order,
IEEE division)."""

import pytest
import torch

import tilebake
from tests.helpers import assert_bytes_equal, poison_allocator_
from tilebake.torch import normalize_weight as reference


def make_weights(num_tokens, k, device, width=None):
    """Positive weights over many binades, some rows of zeros and some single-binade rows."""
    w = torch.rand(num_tokens, width or k, device=device) * torch.exp2(
        torch.randint(-60, 20, (num_tokens, 1), device=device).float()
    )
    w[::11] = 0
    return w[:, :k]


BAD_CALLS = [
    ([1.0], TypeError, "topk_weights must be a torch.Tensor, got list"),
    (torch.zeros(4, 8, dtype=torch.bfloat16), TypeError, "topk_weights must be torch.float32, got torch.bfloat16"),
    (torch.zeros(8), ValueError, r"topk_weights must be 2-D \(num_tokens, num_topk\), got shape \(8,\)"),
    (torch.zeros(4, 0), ValueError, r"num_topk\) must be in \[1, 32\], got 0"),
    (torch.zeros(4, 33), ValueError, r"num_topk\) must be in \[1, 32\], got 33"),
    (torch.zeros(8, 4).t(), ValueError, "contiguous in its last dim"),
]


@pytest.mark.parametrize("arg,error,match", BAD_CALLS)
def test_bad_arguments(arg, error, match):
    with pytest.raises(error, match=match):
        tilebake.moe.normalize_weight(arg)


@pytest.mark.parametrize("k", [1, 8, 32])
def test_cpu_path_is_the_reference(k):
    w = make_weights(50, k, "cpu", width=k + 3)  # strided rows
    den, norm = tilebake.moe.normalize_weight(w)
    den_ref, norm_ref = reference(w)
    assert_bytes_equal(den, den_ref, "denominator")
    assert_bytes_equal(norm, norm_ref, "normalized")
    assert norm.is_contiguous()


def test_reference_adds_left_to_right_from_1e_20():
    """Independent of torch's reductions: float32 additions one at a time, in Python."""
    import numpy as np

    w = make_weights(20, 9, "cpu")
    den, norm = reference(w)
    for t in range(20):
        acc = np.float32(1e-20)
        for x in w[t].numpy():
            acc = np.float32(acc + x)
        assert den[t].item() == acc, t
        assert (norm[t].numpy() == (w[t].numpy() / acc).astype(np.float32)).all(), t


# --- GPU: the kernel against the reference, byte for byte ---


def _check(w):
    poison_allocator_(w.device)
    den, norm = tilebake.moe.normalize_weight(w)
    den_ref, norm_ref = reference(w)
    assert_bytes_equal(den, den_ref, "denominator (token index = byte index // 4)")
    assert_bytes_equal(norm, norm_ref, "normalized (flat index = byte index // 4 = token * k + slot)")


@pytest.mark.gpu
@pytest.mark.parametrize("k", [1, 2, 6, 8, 9, 32])
@pytest.mark.parametrize("num_tokens", [1, 8001])
def test_kernel_matches_reference(num_tokens, k):
    _check(make_weights(num_tokens, k, "cuda"))


@pytest.mark.gpu
def test_kernel_many_tokens_strided_and_empty():
    _check(make_weights(65536, 8, "cuda"))
    _check(make_weights(777, 9, "cuda", width=12))  # row stride 12
    den, norm = tilebake.moe.normalize_weight(torch.zeros(0, 8, device="cuda"))
    assert den.shape == (0,) and norm.shape == (0, 8)


@pytest.mark.gpu
def test_kernel_matches_the_cpu_reference():
    """The CUDA reference and the CPU one agree too (both IEEE fp32 adds and divisions)."""
    w = make_weights(999, 6, "cuda")
    den, norm = tilebake.moe.normalize_weight(w)
    den_ref, norm_ref = reference(w.cpu())
    assert_bytes_equal(den.cpu(), den_ref, "denominator")
    assert_bytes_equal(norm.cpu(), norm_ref, "normalized")
