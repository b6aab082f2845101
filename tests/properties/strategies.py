"""Shared pieces of the property-based tests (hypothesis): the settings, value generators with
special values, a byte comparison and the device parametrization.

CI runs a fixed example list (derandomized, TILEBAKE_HYPOTHESIS_EXAMPLES=25 each); the H200 runs a
larger, random budget: TILEBAKE_HYPOTHESIS_EXAMPLES=500 TILEBAKE_HYPOTHESIS_RANDOM=1.
"""

import os

import pytest
import torch
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

EXAMPLES = int(os.environ.get("TILEBAKE_HYPOTHESIS_EXAMPLES", "25"))
PROPERTY = settings(max_examples=EXAMPLES, deadline=None, derandomize=not os.environ.get("TILEBAKE_HYPOTHESIS_RANDOM"),
                    suppress_health_check=[HealthCheck.too_slow], database=None)  # fmt: skip
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]
E4M3_MAX, BF16_MAX = 448.0, torch.finfo(torch.bfloat16).max
SEEDS = st.integers(0, 2**31 - 1)
FLOATS = st.sampled_from([torch.bfloat16, torch.float32])

# Zeros, denormals, the formats' maxima (e4m3 448, e2m1 6) and values near fp32's top. Not 3e38:
# there a code rounded up times a power-of-two scale can pass fp32's range (e2m1: 3e38 / 2^126
# = 3.5 -> 4, and 4 * 2^126 = 2^128), the formats' arithmetic, as in the original.
FINITE_SPECIALS = (0.0, -0.0, 1e-39, -1e-39, 2.0**-126, 448.0, -448.0, 6.0, 1e38, -1e38)
NONFINITE = (float("nan"), float("inf"), float("-inf"))


def values(seed: int, shape: tuple, dtype, specials: tuple = (), special_rate: float = 0.0) -> torch.Tensor:
    """Normal values over many binades (2^-30 to 2^30), then a share of the elements replaced by
    `specials`; from `seed` (torch's generator: fast for large tensors)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g) * torch.exp2(torch.randint(-30, 31, shape, generator=g).float())
    if specials and special_rate:
        where = torch.rand(shape, generator=g) < special_rate
        pick = torch.randint(0, len(specials), shape, generator=g)
        x = torch.where(where, torch.tensor(specials, dtype=torch.float32)[pick], x)
    return x.to(dtype)


def normal(seed: int, shape: tuple, dtype=torch.float32, scale: float = 1.0, specials: tuple = (),
           special_rate: float = 0.0) -> torch.Tensor:  # fmt: skip
    """Standard normal values times `scale` (one binade range: for ops whose contract is a
    tolerance), a share replaced by `specials`."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g) * scale
    if specials and special_rate:
        where = torch.rand(shape, generator=g) < special_rate
        pick = torch.randint(0, len(specials), shape, generator=g)
        x = torch.where(where, torch.tensor(specials, dtype=torch.float32)[pick], x)
    return x.to(dtype)


def strided_rows(x: torch.Tensor, pad: int, device=None) -> torch.Tensor:
    """x (..., H) as a view whose rows are `pad` elements longer than H (the pad filled with NaN
    bytes, 0xFF, so that an op reading past the row cannot pass), on `device` (default x's: a
    strided view moved by .to() would come back dense)."""
    device = x.device if device is None else device
    if pad == 0:
        return x.contiguous().to(device)
    wide = torch.empty(*x.shape[:-1], x.shape[-1] + pad, dtype=x.dtype, device=device)
    wide.view(torch.uint8).fill_(0xFF)
    wide[..., : x.shape[-1]] = x
    return wide[..., : x.shape[-1]]


def dense(t: torch.Tensor) -> torch.Tensor:
    """A CPU copy with row-major strides (even for size-1 dims, which .contiguous() keeps)."""
    return torch.empty(t.shape, dtype=t.dtype).copy_(t)


def assert_bytes_equal(got: torch.Tensor, want: torch.Tensor, what: str):
    assert got.shape == want.shape, f"{what}: shape {tuple(got.shape)} != {tuple(want.shape)}"
    got, want = (dense(t).reshape(-1) for t in (got, want))
    assert got.shape == want.shape and got.dtype == want.dtype, (
        f"{what}: {tuple(got.shape)} {got.dtype} != {tuple(want.shape)} {want.dtype}"
    )
    same = got.view(torch.uint8) == want.view(torch.uint8)
    assert bool(same.all()), f"{what}: {int((~same).sum())} bytes differ"


def assert_within(got: torch.Tensor, want: torch.Tensor, atol, rtol: float, what: str, nonfinite: bool = False):
    """|got - want| <= atol + rtol |want| elementwise (want usually float64), no NaN in either:
    a NaN never passes. With `nonfinite` (where NaN and infinities are the documented result)
    got must be NaN exactly where want is, and equal to want where want is infinite."""
    got, want = got.detach().cpu().double(), want.detach().cpu().double()
    assert got.shape == want.shape, f"{what}: shape {tuple(got.shape)} != {tuple(want.shape)}"
    if nonfinite:
        assert torch.equal(got.isnan(), want.isnan()), f"{what}: NaN pattern ({int(got.isnan().sum())} NaN, want "\
            f"{int(want.isnan().sum())})"  # fmt: skip
        inf = want.isinf()
        assert torch.equal(got[inf], want[inf]), f"{what}: infinities"
        keep = want.isfinite()
        got, want = got[keep], want[keep]
        atol = atol[keep] if isinstance(atol, torch.Tensor) else atol
    assert not got.isnan().any(), f"{what}: NaN in the result"
    assert not want.isnan().any(), f"{what}: NaN in the expected values (the test's mistake)"
    err = (got - want).abs()
    bound = (atol.detach().cpu().double() if isinstance(atol, torch.Tensor) else atol) + rtol * want.abs()
    bad = err > bound
    if bad.any():
        i = int((err - bound).flatten().argmax())
        raise AssertionError(
            f"{what}: {int(bad.sum())} of {got.numel()} outside the bound, worst got "
            f"{got.flatten()[i].item()} want {want.flatten()[i].item()}"
        )
