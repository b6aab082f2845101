"""Plain-PyTorch reference of tilebake's stochastic rounding (SR): the oracle for the kernels'
SR helpers (kernels_tl/quant/common.py) and the CPU path of tilebake.quant.cast.

SR rounds x to one of its two neighbouring representable values, up (away from zero) with
probability equal to its distance from the lower neighbour over the gap, so E[SR(x)] = x. Each
element takes 16 random bits (the precision of NVIDIA's cvt.rs), so that probability is resolved
to 2^-16 (truncated: at most 2^-16 of a gap too low; exact for bf16 -> e4m3 and fp32 -> bf16).
The bits come from one hash per pair of elements (flat positions 2p, 2p + 1: the even one takes
the low half, the odd one the high half): MurmurHash3's fmix32 of the pair's value word with the
key p * GOLDEN + SR_OFFSET (tilebake._hash) xored in after its first xorshift (sr_random_bits), so
equal inputs give equal outputs on every device (no RNG state), and the arithmetic is
integer-only (plus exact power-of-two scalings and, on the GPU, the exact satfinite e4m3
conversion of a representable value), so sm_90a (which has no cvt.rs) and sm_100a produce the
same bytes.

All integer work is in int64 tensors masked to 32 bits (torch has few uint32 ops); every step
mirrors the TileLang helper of the same name.

Special values:
* fp32 -> bf16: overflow past the largest finite bf16 can round to inf (the next value up); NaN
  keeps its sign and top payload bits and is made quiet (bit 6 of the bf16 pattern set).
* -> e2m1 (sr_float32_to_e2m1_codes): |x| >= 6 (inf included) saturates to +-6; NaN -> +-6
  with the sign bit of x (code 7 | sign), as the round-to-nearest e2m1 encoder does.
* -> e4m3: |x| >= 448 (inf included) saturates to +-448, as the satfinite conversion and the
  quant kernels' clamp do; NaN becomes 0x7F (the conversion's NaN; the GPU's NaN is positive).
"""

from __future__ import annotations

from typing import Optional

import torch

from tilebake._hash import GOLDEN, SR_OFFSET

__all__ = [
    "fmix32",
    "sr_random_bits",
    "sr_float32_to_bfloat16_bits",
    "sr_float32_to_e4m3_value",
    "sr_float32_to_e4m3_bits",
    "sr_float32_to_e2m1_codes",
    "stochastic_cast",
]

_M32 = 0xFFFFFFFF


def fmix32(h: torch.Tensor) -> torch.Tensor:
    """MurmurHash3's 32-bit finaliser on int64 tensors holding uint32 values."""
    h = h & _M32
    h = h ^ (h >> 16)
    h = (h * 0x85EBCA6B) & _M32
    h = h ^ (h >> 13)
    h = (h * 0xC2B2AE35) & _M32
    return h ^ (h >> 16)


def _fp32_bits(x: torch.Tensor) -> torch.Tensor:
    """fp32 bit patterns as int64 values in [0, 2^32)."""
    return x.float().contiguous().view(torch.int32).to(torch.int64) & _M32


def _from_bits(u: torch.Tensor) -> torch.Tensor:
    """int64 values in [0, 2^32) -> the fp32 tensor with those bit patterns."""
    return torch.where(u >= 1 << 31, u - (1 << 32), u).to(torch.int32).view(torch.float32)


def sr_random_bits(value_bits: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """16 random bits per element (int64, 0..0xFFFF), for elements whose fp32 bit patterns are
    ``value_bits`` (int64 in [0, 2^32)) at flat indices ``index`` (same shape; taken flat,
    consecutive positions 2k, 2k + 1 are a pair: index[2k] even and index[2k + 1] = index[2k] + 1).

    Pair p = index[2k] / 2 mod 2^31 has the value word w = rotr(bits_2k, 16) ^ bits_2k+1 (for bf16
    values: the packed pair); h = w ^ (w >> 16) ^ (p * GOLDEN + SR_OFFSET mod 2^32), then
    fmix32's rounds h *= 0x85EBCA6B, h ^= h >> 13, h *= 0xC2B2AE35, h ^= h >> 16 (fmix32 with the
    key xored in after its first xorshift); the even element takes h & 0xFFFF, the odd one
    h >> 16. An odd count pairs the last element with a zero."""
    shape = value_bits.shape
    v = (value_bits.reshape(-1) & _M32).to(torch.int64)
    i = index.reshape(-1).to(torch.int64)
    n = v.numel()
    if n % 2:
        v = torch.cat([v, v.new_zeros(1)])
        i = torch.cat([i, i[-1:] + 1])
    v0, v1 = v[0::2], v[1::2]
    word = (((v0 >> 16) | (v0 << 16)) & _M32) ^ v1
    p = (i[0::2] & _M32) >> 1
    h = word ^ (word >> 16) ^ ((p * GOLDEN + SR_OFFSET) & _M32)
    h = (h * 0x85EBCA6B) & _M32
    h = h ^ (h >> 13)
    h = (h * 0xC2B2AE35) & _M32
    h = h ^ (h >> 16)
    r = torch.stack([h & 0xFFFF, h >> 16], dim=1).reshape(-1)[:n]
    return r.reshape(shape)


def sr_float32_to_bfloat16_bits(x: torch.Tensor, rbits: torch.Tensor) -> torch.Tensor:
    """SR fp32 -> bf16 bit patterns (int64, 0..0xFFFF): add the 16 random bits (rbits & 0xFFFF)
    to the 16 dropped bits, truncate; NaN -> its top half with the quiet bit set."""
    bits = _fp32_bits(x)
    is_nan = (bits & 0x7FFFFFFF) > 0x7F800000
    rounded = ((bits + (rbits & 0xFFFF)) & _M32) >> 16
    return torch.where(is_nan, (bits >> 16) | 0x40, rounded)


def _sr_e4m3_scaled(x: torch.Tensor, rbits: torch.Tensor, scale: Optional[torch.Tensor]):
    """(t, sign, magnitude bits) of the SR result in the 2^-120-scaled domain, t the scaled input
    (see sr_float32_to_e4m3_value); sign and magnitude are meaningless where t is NaN."""
    x = x.float()
    if scale is None:
        t = x * 2.0**-120  # e4m3's 2^-6 -> fp32's 2^-126: its step 2^-9 -> bit 20
    else:
        # The kernels' single multiply by the exact prescale where scale >= 2^-6, else two.
        scale = scale.float()
        t = torch.where(scale >= 2.0**-6, x * (scale * 2.0**-120), (x * scale) * 2.0**-120)
    bits = _fp32_bits(t)
    sign = bits & 0x80000000
    mag = ((bits & 0x7FFFFFFF) + ((rbits & 0xFFFF) << 4)) & 0x7FF00000
    return t, sign, mag


def sr_float32_to_e4m3_value(
    x: torch.Tensor, rbits: torch.Tensor, scale: Optional[torch.Tensor] = None
) -> torch.Tensor:
    """SR fp32 -> float8_e4m3fn of ``x`` (times ``scale`` if given), as the fp32 value the kernels
    convert (satfinite, exact): t = x * 2^-120 (e4m3's subnormal step 2^-9 becomes bit 20 of the
    fp32 pattern, every e4m3 value keeps its top 12 bits), add the 16 random bits at bits 4..19,
    drop the low 20 bits, scale back by 2^120. Rounds up iff floor(dropped / 16) + random >= 2^16.
    Values past 448 give 480 or more (inf included), which the conversion saturates; NaN stays
    NaN. With ``scale`` (per element): t = x * (scale * 2^-120) where scale >= 2^-6 (that
    prescale is exact: one rounding, as the kernels' one multiply), else (x * scale) * 2^-120."""
    t, sign, mag = _sr_e4m3_scaled(x, rbits, scale)
    v = _from_bits(mag | sign) * 2.0**120
    return torch.where(torch.isnan(t), t, v)


def sr_float32_to_e4m3_bits(x: torch.Tensor, rbits: torch.Tensor, scale: Optional[torch.Tensor] = None) -> torch.Tensor:
    """SR fp32 -> float8_e4m3fn bytes (int64, 0..0xFF): the satfinite conversion of
    sr_float32_to_e4m3_value, from its bits (the scaled pattern >> 20 is the code; codes past
    0x7E saturate to 0x7E; NaN -> 0x7F)."""
    t, sign, mag = _sr_e4m3_scaled(x, rbits, scale)
    code = (mag >> 20).clamp(max=0x7E) | (sign >> 24)
    return torch.where(torch.isnan(t), 0x7F, code)


def stochastic_cast(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """SR cast of ``x`` (any shape; the element index is its position in row-major order).

    Pairs: fp32 -> bf16, fp32 -> float8_e4m3fn, bf16 -> float8_e4m3fn. The random bits use the
    fp32 bit patterns of the input values (a bf16 value widened exactly) and their flat indices
    (sr_random_bits).
    """
    pairs = {
        (torch.float32, torch.bfloat16),
        (torch.float32, torch.float8_e4m3fn),
        (torch.bfloat16, torch.float8_e4m3fn),
    }
    if (x.dtype, dtype) not in pairs:
        raise ValueError(
            f"stochastic rounding supports fp32->bf16, fp32->e4m3 and bf16->e4m3, got {x.dtype} -> {dtype}"
        )
    flat = x.reshape(-1).float()
    index = torch.arange(flat.numel(), dtype=torch.int64, device=x.device)
    rbits = sr_random_bits(_fp32_bits(flat), index)
    if dtype == torch.bfloat16:
        out = sr_float32_to_bfloat16_bits(flat, rbits).to(torch.int16).view(torch.bfloat16)
    else:
        out = sr_float32_to_e4m3_bits(flat, rbits).to(torch.uint8).view(torch.float8_e4m3fn)
    return out.reshape(x.shape)


def sr_float32_to_e2m1_codes(q: torch.Tensor, rbits: torch.Tensor) -> torch.Tensor:
    """SR fp32 -> e2m1 codes (int64, 0..15, bit 3 = the sign bit of q).

    m = |q| (NaN and >= 6 -> 6); t = m * 2^-126 maps e2m1's smallest normal 1 onto fp32's
    2^-126, so its step 0.5 below 1 becomes bit 22 of the fp32 pattern and pattern >> 22 is the
    magnitude code (6 -> 7). Add the 16 random bits (rbits & 0xFFFF) at bits 6..21 and shift:
    rounds up iff floor(dropped / 64) + random >= 2^16, i.e. with probability (m - lower) / gap
    truncated to 16 bits. Mirrors kernels_tl.quant.common.sr_float32_to_e2m1_code."""
    bits = _fp32_bits(q)
    a = _from_bits(bits & 0x7FFFFFFF)
    six = torch.full_like(a, 6.0)
    m = torch.where(a < six, a, six)  # NaN compares false: 6
    t = _fp32_bits(m * 2.0**-126)
    mag = (t + ((rbits & 0xFFFF) << 6)) >> 22
    return mag | ((bits >> 28) & 8)
