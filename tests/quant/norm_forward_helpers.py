"""Inputs and the rstd tolerance shared by the norm_forward and norm_forward_and_per_token_cast
tests (test_norm_forward*.py)."""

import torch

DTYPES = [torch.bfloat16, torch.float32]
EPS = 1e-6


def make_input(shape, dtype, device, row_stride=None):
    """Random values over many binades (per-row scales 2^-8 .. 2^8), sliced from a wider
    buffer when row_stride is given so the kernel sees a real row stride."""
    *lead, hidden = shape
    width = row_stride or hidden
    base = torch.randn(*lead, width, device=device) * torch.exp2(
        torch.randint(-8, 9, (*lead, 1), device=device).float()
    )
    return base.to(dtype)[..., :hidden]


def make_weight(hidden, dtype, device):
    return (torch.rand(hidden, device=device) * 2 - 0.5).to(dtype)


def assert_rstd_close(actual, expected):
    torch.testing.assert_close(actual, expected, rtol=2e-6, atol=1e-7)
