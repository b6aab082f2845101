"""tilebake.torch.rotary_embedding_ref against a complex-number rotation in float64, and its
inverse (conjugate), layouts and argument checks."""

from fractions import Fraction

import pytest
import torch

from tilebake.torch import rotary_embedding_ref
from tilebake.torch.rope import fma_f32


def cache(max_pos: int, rot: int, base: float = 10000.0) -> torch.Tensor:
    freqs = base ** (-torch.arange(0, rot, 2, dtype=torch.float64) / rot)
    angles = torch.arange(max_pos, dtype=torch.float64)[:, None] * freqs[None, :]
    return torch.cat((angles.cos(), angles.sin()), dim=1).float()


def complex_rotation(x, cos_sin, rows, interleaved):
    """x (T, H, rot) rotated by e^{i angle} as complex numbers, float64."""
    rot = x.shape[-1]
    xd = x.double()
    pairs = (
        torch.stack((xd[..., 0::2], xd[..., 1::2]), -1)
        if interleaved
        else torch.stack((xd[..., : rot // 2], xd[..., rot // 2 :]), -1)
    )
    z = torch.view_as_complex(pairs.contiguous())
    c = cos_sin.double()[rows]
    turn = torch.complex(c[:, : rot // 2], c[:, rot // 2 :])[:, None, :]
    out = torch.view_as_real(z * turn)
    if interleaved:
        return out.flatten(-2)
    return torch.cat((out[..., 0], out[..., 1]), dim=-1)


@pytest.mark.parametrize("interleaved", [False, True], ids=["neox", "interleaved"])
@pytest.mark.parametrize("rot", [64, 128])
def test_matches_complex_rotation(rot, interleaved):
    cs = cache(4096, rot)
    q = torch.randn(37, 5, rot)
    k = torch.randn(37, 2, rot)
    positions = torch.randint(0, 4000, (37,))
    got_q, got_k = rotary_embedding_ref(q, cs, k, positions, interleaved, seqlen_offset=7)
    rows = positions + 7
    torch.testing.assert_close(got_q.double(), complex_rotation(q, cs, rows, interleaved), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got_k.double(), complex_rotation(k, cs, rows, interleaved), rtol=1e-5, atol=1e-5)
    back, _ = rotary_embedding_ref(got_q, cs, None, positions, interleaved, conjugate=True, seqlen_offset=7)
    torch.testing.assert_close(back, q, rtol=1e-5, atol=1e-5)


def test_default_positions_and_batched_layout():
    cs = cache(512, 64)
    q = torch.randn(3, 100, 4, 64).bfloat16()
    got, _ = rotary_embedding_ref(q, cs, seqlen_offset=11)
    explicit, _ = rotary_embedding_ref(q, cs, positions=torch.arange(100).expand(3, 100), seqlen_offset=11)
    assert got.dtype == torch.bfloat16 and torch.equal(got, explicit)
    flat, _ = rotary_embedding_ref(q[1], cs, positions=torch.arange(100) + 11)
    assert torch.equal(got[1], flat)
    assert torch.equal(rotary_embedding_ref(q[:, :1], cs, positions=torch.zeros(3, 1, dtype=torch.int32))[0], q[:, :1])


def test_rejects_bad_arguments():
    cs = cache(16, 64)
    with pytest.raises(ValueError, match=r"rot_dim\) must be one of \(64, 128\), got 96"):
        rotary_embedding_ref(torch.randn(2, 1, 96), cache(16, 96))
    with pytest.raises(ValueError, match="cos_sin_cache must be"):
        rotary_embedding_ref(torch.randn(2, 1, 64), cache(16, 128))
    with pytest.raises(ValueError, match="key must be"):
        rotary_embedding_ref(torch.randn(2, 1, 64), cs, key=torch.randn(3, 1, 64))
    with pytest.raises(ValueError, match="positions must have shape"):
        rotary_embedding_ref(torch.randn(2, 1, 64), cs, positions=torch.zeros(3, dtype=torch.int64))


def test_rejects_bad_dtypes():
    cs = cache(16, 64)
    q = torch.randn(2, 1, 64)
    with pytest.raises(TypeError, match="query must be torch.bfloat16 or torch.float32, got torch.float16"):
        rotary_embedding_ref(q.half(), cs)
    with pytest.raises(TypeError, match="key must have query's dtype"):
        rotary_embedding_ref(q, cs, key=q.bfloat16())
    with pytest.raises(TypeError, match="cos_sin_cache must be torch.float32, got torch.float64"):
        rotary_embedding_ref(q, cs.double())
    with pytest.raises(TypeError, match="positions must be an integer tensor, got torch.float32"):
        rotary_embedding_ref(q, cs, positions=torch.zeros(2))


def test_out_of_range_rows_leave_the_token_unchanged():
    cs = cache(16, 64)
    q = torch.randn(8, 3, 64).bfloat16()
    k = torch.randn(8, 1, 64).bfloat16()
    got_q, got_k = rotary_embedding_ref(q, cs, k, seqlen_offset=10)  # rows 10..17: 16, 17 outside
    inside_q, inside_k = rotary_embedding_ref(q[:6], cs, k[:6], seqlen_offset=10)
    assert torch.equal(got_q[6:], q[6:]) and torch.equal(got_k[6:], k[6:])
    assert torch.equal(got_q[:6], inside_q) and torch.equal(got_k[:6], inside_k)
    negative, _ = rotary_embedding_ref(q, cs, positions=torch.tensor([-1, 0, 1, -5, 2, 3, 2**40, 4]))
    assert torch.equal(negative[[0, 3, 6]], q[[0, 3, 6]])
    assert not torch.equal(negative[[2, 4, 5, 7]], q[[2, 4, 5, 7]])
    empty_q, _ = rotary_embedding_ref(q, torch.empty(0, 64))
    assert torch.equal(empty_q, q)


def round_fraction_to_f32(v: Fraction) -> float:
    """v rounded to the nearest fp32, ties to even (normal range)."""
    if v == 0:
        return 0.0
    sign, v = (-1 if v < 0 else 1), abs(v)
    e = v.numerator.bit_length() - v.denominator.bit_length()
    while Fraction(2) ** e > v:
        e -= 1
    while Fraction(2) ** (e + 1) <= v:
        e += 1
    ulp = Fraction(2) ** (e - 23)
    n, r = divmod(v, ulp)
    n += r > ulp / 2 or (r == ulp / 2 and n % 2)
    return sign * float(n * ulp)


def test_fma_f32_rounds_once():
    # 8(1 + 2^-23) * 8(1 - 2^-23) + (2^30 + 2^7) = 2^30 + 2^7 + 2^6 - 2^-40: just below a tie.
    # Rounded to float64 first it becomes the tie and then rounds up (to even): a double rounding.
    a, b, c = torch.tensor([8 * (1 + 2**-23)]), torch.tensor([8 * (1 - 2**-23)]), torch.tensor([2.0**30 + 2**7])
    assert (a.double() * b.double() + c.double()).float().item() == 2**30 + 2**8  # the naive way is wrong
    assert fma_f32(a, b, c).item() == 2**30 + 2**7
    assert fma_f32(-a, b, -c).item() == -(2**30 + 2**7)
    # random operands, many near-cancellations, against exact rational arithmetic
    n = 3000
    a = torch.randn(n) * torch.exp2(torch.randint(-30, 30, (n,)).float())
    b = torch.rand(n) * 2 - 1
    c = (-(a.double() * b.double()) * (1 + torch.randn(n).double() * 1e-7)).float()
    c[: n // 2] = torch.randn(n // 2) * torch.exp2(torch.randint(-40, 40, (n // 2,)).float())
    got = fma_f32(a, b, c)
    want = [
        round_fraction_to_f32(Fraction(x) * Fraction(y) + Fraction(z))
        for x, y, z in zip(a.tolist(), b.tolist(), c.tolist())
    ]
    assert got.tolist() == want
    # non-finite operands follow IEEE
    inf, nan = float("inf"), float("nan")
    out = fma_f32(
        torch.tensor([inf, inf, 1.0, 3e38]), torch.tensor([1.0, 1.0, nan, 10.0]), torch.tensor([1.0, -inf, 0.0, 0.0])
    )
    assert out[0].item() == inf and out[1].isnan() and out[2].isnan() and out[3].item() == inf
