"""Comparisons the tests use: byte-exact equality, a relative squared error, a test for a
rounding-direction bias, and the byte count bandwidth figures are computed from."""

from __future__ import annotations

import math

import torch

__all__ = ["assert_equal", "calc_diff", "check_bias", "count_bytes"]


def flat_bytes(t: torch.Tensor) -> torch.Tensor:
    """t's elements as one uint8 row, in logical order (a view of t's storage when t is
    contiguous, so writes through it reach t)."""
    flat = t.contiguous().reshape(-1)
    # A tensor of at most one element may be "contiguous" with any stride, and view(uint8)
    # refuses a last stride other than 1: restate the (dense) layout explicitly.
    flat = flat.as_strided((flat.numel(),), (1,))
    return flat.view(torch.uint8)


def assert_equal(
    x: torch.Tensor,
    y: torch.Tensor,
    check_dtype: bool = True,
    check_shape: bool = True,
    check_stride: bool = True,
) -> None:
    """Raise AssertionError unless x and y hold the same bytes, on the same device.

    Bytes, not values: NaN payloads, -0.0 against +0.0 and packed codes all count. dtype, shape
    and strides (the last ignored for empty tensors) are compared too unless switched off; with
    a check off, the elements are still compared byte for byte in logical (row-major) order.
    """
    assert not check_dtype or x.dtype == y.dtype, f"dtypes differ: {x.dtype} vs {y.dtype}"
    assert not check_shape or x.shape == y.shape, f"shapes differ: {tuple(x.shape)} vs {tuple(y.shape)}"
    assert not check_stride or x.numel() == 0 or x.stride() == y.stride(), (
        f"strides differ: {x.stride()} vs {y.stride()}"
    )
    assert x.device == y.device, f"devices differ: {x.device} vs {y.device}"
    xb, yb = flat_bytes(x), flat_bytes(y)
    if torch.equal(xb, yb):
        return
    if xb.numel() != yb.numel() or x.element_size() != y.element_size():
        raise AssertionError(f"byte sizes differ: {xb.numel()} vs {yb.numel()} ({x.dtype} vs {y.dtype})")
    # Which elements differ, found on the bytes so every dtype (fp8, packed fp4) works.
    differs = (xb.view(-1, x.element_size()) != yb.view(-1, y.element_size())).any(dim=1)
    where = differs.nonzero().flatten()[:8].tolist()
    shape = tuple(x.shape)
    index = [tuple(int(i) for i in torch.unravel_index(torch.tensor(w), shape)) if shape else () for w in where]
    xs, ys = x.reshape(-1), y.reshape(-1)
    pairs = ", ".join(f"{i}: {xs[w].item()!r} vs {ys[w].item()!r}" for i, w in zip(index, where))
    raise AssertionError(f"{int(differs.sum())} of {differs.numel()} elements differ (shape {shape}); first: {pairs}")


def calc_diff(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """sum((x - y)^2) / sum(x^2 + y^2) in float64, as a 0-d tensor on x's device.

    0 for equal inputs, 1 for x against zeros (or an orthogonal y), 2 (the most) for x against -x.
    Both inputs all zero give 0. A NaN or infinity anywhere makes the result NaN, so `calc_diff(...) < tol` fails.
    """
    x, y = x.double(), y.double()
    denominator = (x * x + y * y).sum()
    if bool(denominator == 0):
        return torch.zeros((), dtype=torch.float64, device=x.device)
    # The squared difference directly: 1 - 2*sum(x*y)/denominator (the same in exact
    # arithmetic) loses every digit to cancellation when x is close to y.
    return ((x - y) * (x - y)).sum() / denominator


def check_bias(x: torch.Tensor, ref_x: torch.Tensor) -> None:
    """Raise AssertionError if x (a rounded copy of ref_x) rounds one way more often than chance.

    Unbiased rounding lands below ref_x about as often as above it. With ties counted half, the
    fraction below is, for n independent elements, about normal with mean 0.5 and standard
    deviation 1/(2*sqrt(n)); it must lie within 10/sqrt(n) (20 standard deviations) of 0.5.
    """
    n = x.numel()
    if n == 0:
        return
    below = int((x < ref_x).sum())
    equal = int((x == ref_x).sum())
    fraction = (below + equal / 2) / n
    allowed = 10 / math.sqrt(n)
    assert abs(fraction - 0.5) < allowed, (
        f"rounding is biased: {fraction:.4f} of {n} elements rounded down (ties half), allowed 0.5 +- {allowed:.4f}; "
        f"below {below}, equal {equal}, above {n - below - equal}"
    )


def count_bytes(*tensors) -> int:
    """Bytes held by the tensors, looking into tuples and lists and skipping None."""
    total = 0
    for t in tensors:
        if isinstance(t, (tuple, list)):
            total += count_bytes(*t)
        elif t is not None:
            total += t.numel() * t.element_size()
    return total
