"""The mix-math references of tilebake.torch.mhc (the oracles of the kernels to come), each
against float64 arithmetic written out another way; and the original's names in tilebake.torch."""

import math

import torch

import tilebake
from tilebake.torch import mhc as ref


def test_sinkhorn_is_near_doubly_stochastic():
    x = torch.randn(64, 4, 4)
    y = ref.sinkhorn_normalize_ref(x, repeat=30, eps=1e-6)
    assert (y > 0).all() and not y.isnan().any()
    torch.testing.assert_close(y.sum(-2), torch.ones(64, 4), atol=1e-5, rtol=0)  # the last step: columns
    torch.testing.assert_close(y.sum(-1), torch.ones(64, 4), atol=1e-3, rtol=0)
    one = ref.sinkhorn_normalize_ref(x, repeat=1, eps=0.0)  # softmax rows, then the columns once
    soft = x.double().exp() / x.double().exp().sum(-1, keepdim=True)
    torch.testing.assert_close(one.double(), soft / soft.sum(-2, keepdim=True))


def test_head_compute_mix_and_split_mixes():
    m = 4
    mix, scale, base = torch.randn(9, 5, m), torch.tensor([0.7]), torch.randn(m)
    want = 1 / (1 + (-(mix.double() * 0.7 + base.double())).exp()) + 1e-6
    torch.testing.assert_close(ref.mhc_head_compute_mix_ref(mix, scale, base, 1e-6).double(), want, rtol=1e-6, atol=1e-6)
    mixes, scale3, base3 = torch.randn(9, 5, m * (m + 2)), torch.tensor([0.5, 2.0, 3.0]), torch.randn(m * (m + 2))
    pre, post, comb = ref.mhc_pre_split_mixes_ref(mixes, scale3, base3, m, 2.0, 1e-6)
    assert pre.shape == post.shape == (9, 5, m, 1) and comb.shape == (9, 5, m, m)
    y = mixes.double() * torch.tensor([0.5] * m + [2.0] * m + [3.0] * m * m, dtype=torch.float64) + base3.double()
    fp32 = dict(rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(pre[..., 0].double(), torch.sigmoid(y[..., :m]) + 1e-6, **fp32)
    torch.testing.assert_close(post[..., 0].double(), 2.0 * torch.sigmoid(y[..., m : 2 * m]), **fp32)
    torch.testing.assert_close(comb.double().flatten(-2), y[..., 2 * m :], **fp32)


def test_pre_norm_fn_and_its_partials():
    m, hidden = 4, 64
    residual = torch.randn(3, 5, m, hidden).bfloat16()
    fn, weight = torch.randn(m * (m + 2), m * hidden), torch.rand(m * hidden) + 0.5
    got = ref.mhc_pre_norm_fn_ref(residual, fn, weight, 1e-6)
    x = residual.double().reshape(15, m * hidden)
    want = torch.stack([(fn.double() * weight.double()) @ row / math.sqrt(row.square().mean() + 1e-6) for row in x])
    torch.testing.assert_close(got.double().reshape(15, -1), want, rtol=1e-4, atol=1e-4)  # fp32 sums of 256 terms
    out_mul, sqrsum = ref.mhc_pre_norm_fn_partials_ref(residual, fn, 4)
    assert out_mul.shape == (4, 15, 1, m * (m + 2)) and sqrsum.shape == (4, 15, 1)
    rstd = (sqrsum.sum(0) / (m * hidden) + 1e-6).rsqrt()
    torch.testing.assert_close((out_mul.sum(0) * rstd.unsqueeze(-1))[:, 0], ref.mhc_pre_norm_fn_ref(residual, fn, None, 1e-6).reshape(15, -1),
                               rtol=1e-5, atol=1e-5)  # fmt: skip


def test_original_names_in_tilebake_torch():
    for name in ("expand_to_mhc_ref", "mhc_head_compute_mix_ref", "mhc_post_ref", "mhc_pre_apply_mix_ref",
                 "mhc_pre_norm_fn_partials_ref", "mhc_pre_norm_fn_ref", "mhc_pre_split_mixes_ref", "sinkhorn_normalize_ref"):  # fmt: skip
        assert getattr(tilebake.torch, name) is getattr(ref, name)


def _fma_exact(a: float, b: float, c: float) -> float:
    """a * b + c rounded once to fp32 (nearest, ties to even), from exact rational arithmetic."""
    from fractions import Fraction

    v = Fraction(a) * Fraction(b) + Fraction(c)
    near = torch.tensor(float(v), dtype=torch.float32)
    candidates = [torch.nextafter(near, torch.tensor(d, dtype=torch.float32)) for d in (-math.inf, math.inf)] + [near]
    key = lambda t: (abs(Fraction(t.item()) - v), t.view(torch.int32).item() & 1)  # noqa: E731
    return min(candidates, key=key).item()


def test_fma32_rounds_once():
    """ref.fma32 is the GPU's fp32 fused multiply-add bit for bit: on random operands and on sums
    crafted to lie a hair off halfway between two floats, where rounding a float64 sum to fp32
    (two roundings) gives the other neighbour."""
    g = torch.Generator().manual_seed(0)
    a, b, c = (torch.rand(3000, generator=g) * 8 - 4 for _ in range(3))
    # c + b * (1 + 2^-23) with b = +-2^-24 c-ulps (1 -+ 2^-23): just below or above c's halfway points
    c_bits = (torch.rand(2000, generator=g) + 1).view(torch.int32) | torch.arange(2000, dtype=torch.int32) % 2  # odd, even ends
    tiny_a = torch.full((2000,), 1 + 2**-23)
    tiny_b = torch.tensor([(1 if i % 4 < 2 else -1) * 2**-24 * (1 - 2**-23 if i % 8 < 4 else 1 + 2**-22)
                           for i in range(2000)])  # fmt: skip
    a, b, c = torch.cat([a, tiny_a]), torch.cat([b, tiny_b.float()]), torch.cat([c, c_bits.view(torch.float32)])
    got = ref.fma32(a, b, c)
    want = torch.tensor([_fma_exact(x, y, z) for x, y, z in zip(a.tolist(), b.tolist(), c.tolist())])
    assert torch.equal(got, want)
    double_rounded = (a.double() * b.double() + c.double()).float()
    assert not torch.equal(double_rounded, want)  # the crafted cases do catch two roundings
    # differentiable as a * b + c; float64 operands computed plainly
    a64, b64, c64 = (t[:5].double().requires_grad_() for t in (a, b, c))
    ref.fma32(a64, b64, c64).sum().backward()
    assert torch.equal(a64.grad, b64.detach()) and torch.equal(c64.grad, torch.ones(5, dtype=torch.float64))
