"""swiglu_backward's reference (tilebake.torch.swiglu_backward), CPU: against float64 autograd
(clamped elements get zero gradient, the recomputed activation is the forward's), 2.1.0's
arithmetic written out, padding rows (e = 0 only with weights, psum unused without them), and
tilebake.torch.swiglu.fma32 against exact rational arithmetic. The op itself:
test_swiglu_backward.py."""

from fractions import Fraction

import pytest
import torch

import tilebake
from tests.helpers import assert_bytes_equal
from tests.quant.swiglu_inputs import make_x, psum_layout


@pytest.mark.parametrize("with_weights", [True, False], ids=["weights", "no-weights"])
def test_reference_matches_float64_autograd(with_weights):
    E, H, c, s = 33, 192, 2.0, 1.5
    x = make_x(E, 2 * H, torch.float32, "cpu")
    g = torch.randn(E, H)
    w = torch.rand(E)
    x64 = x.double().requires_grad_()
    w64 = w.double().requires_grad_()
    y = torch.nn.functional.silu(x64[:, :H].clamp(max=c)) * x64[:, H:].clamp(-c, c)
    if with_weights:
        y = y * w64[:, None] * s
    y.backward(g.double())
    outs = tilebake.torch.swiglu_backward(x, g, None, w if with_weights else None, s, c)
    assert len(outs) == (3 if with_weights else 2)
    dx, act = outs[0], outs[-1]
    scale = x64.grad.abs().amax(dim=1, keepdim=True) + 1e-30
    assert ((dx.double() - x64.grad).abs() / scale).max() < 1e-5
    if with_weights:
        torch.testing.assert_close(outs[1].double(), w64.grad, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(act.double(), y.detach(), rtol=1e-5, atol=1e-30)
    # Clamped elements get exactly zero gradient.
    assert torch.all(dx[:, :H][x[:, :H] > c] == 0) and torch.all(dx[:, H:][x[:, H:].abs() > c] == 0)
    # The recomputed activation is the forward's, bit for bit (s ignored without weights).
    assert torch.equal(act, tilebake.torch.swiglu_forward(x, None, w if with_weights else None, s, c))


def test_reference_arithmetic_is_2_1_0s():
    """gws = (g * e) * sig, d l = (gws * r) * fma(l, 1 - sig, 1), d r = gws * l, written out
    (the fma by fma32, which test_fma32_is_exactly_rounded checks)."""
    E, H, s = 65, 128, 0.7
    x, g, w = make_x(E, 2 * H, torch.float32, "cpu"), torch.randn(E, H), torch.rand(E)
    left, right = x[:, :H], x[:, H:]
    t = 1 + torch.exp(-left)
    sig = torch.ones_like(t) / t
    gws = (g * (w * torch.tensor(s))[:, None]) * sig
    fma = tilebake.torch.swiglu.fma32(left, 1 - sig, torch.ones_like(t))
    dx, wg, act = tilebake.torch.swiglu_backward(x, g, None, w, s)
    assert torch.equal(dx, torch.cat([(gws * right) * fma, gws * left], dim=1))
    assert torch.equal(act, left / t * right * (w * torch.tensor(s))[:, None])
    dx_plain, act_plain = tilebake.torch.swiglu_backward(x, g, None, None, s)
    assert torch.equal(dx_plain, torch.cat([(g * sig * right) * fma, g * sig * left], dim=1))
    assert torch.equal(act_plain, left / t * right)


def test_reference_psum_rows():
    """With weights, padding rows have e = 0: +-0 gradients and act_out, weight_grad +0. Without
    weights psum is not used: every row is computed from whatever the inputs hold."""
    psum, rows = psum_layout([3, 0, 5], extra_rows=2)
    x, g, w = make_x(rows, 128, torch.float32, "cpu"), torch.randn(rows, 64), torch.rand(rows)
    dx, wg, act = tilebake.torch.swiglu_backward(x, g, psum, w, -2.0, None)
    valid = tilebake.torch.get_mapping_from_psum(psum, rows, 128) >= 0
    assert torch.all(dx[~valid] == 0) and torch.all(act[~valid] == 0)
    assert torch.all(wg[~valid] == 0) and not torch.signbit(wg[~valid]).any()
    full = tilebake.torch.swiglu_backward(x, g, None, w, -2.0, None)
    for a, b in zip((dx, wg, act), full):
        assert torch.equal(a[valid], b[valid])
    plain = tilebake.torch.swiglu_backward(x, g, psum, None, -2.0, None)
    assert (plain[0][~valid] != 0).any()
    for a, b in zip(plain, tilebake.torch.swiglu_backward(x, g)):
        assert_bytes_equal(a, b, "no weights: psum and s unused")


def _fp32_nearest(exact):
    """The fp32 nearest to a Fraction, ties to even (the oracle of an fma)."""
    import numpy as np

    f = np.float32(float(exact))
    candidates = [np.nextafter(f, np.float32(-np.inf)), f, np.nextafter(f, np.float32(np.inf))]
    return min(candidates, key=lambda c: (abs(Fraction(float(c)) - exact), int(c.view(np.int32)) & 1))


def test_fma32_is_exactly_rounded():
    """tilebake.torch.swiglu.fma32 against exact rational arithmetic on near-midpoint cases
    (where fp64 evaluation then rounding to fp32 rounds twice wrongly) and SwiGLU's domain."""
    g = torch.Generator().manual_seed(5)
    n = 4000
    a = 1 + torch.randint(0, 1 << 23, (n,), generator=g).float() * 2.0**-23
    b = ((2.0**-24 + torch.randint(-4, 5, (n,), generator=g).double() * 2.0**-50) / a.double()).float()
    left = torch.randn(n, generator=g) * torch.exp2(torch.randint(-30, 8, (n,), generator=g).float())
    sig = 1 / (1 + torch.exp(-left))
    a, b = torch.cat([a, left]), torch.cat([b, 1 - sig])
    c = torch.ones_like(a)
    got = tilebake.torch.swiglu.fma32(a, b, c)
    want = torch.tensor(
        [float(_fp32_nearest(Fraction(p) * Fraction(q) + 1)) for p, q in zip(a.tolist(), b.tolist())]
    ).float()
    assert_bytes_equal(got, want, "fma32")
    naive = (a.double() * b.double() + 1).float()
    assert not torch.equal(naive, want)  # the cases do reach the double rounding
