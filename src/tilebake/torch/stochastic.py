"""Plain-PyTorch reference of tilebake's stochastic rounding (SR): the oracle for the kernels'
SR helpers (kernels_tl/quant/common.py) and the CPU path of tilebake.quant.cast.

SR rounds x to one of its two neighbouring representable values, up (away from zero) with
probability equal to its distance from the lower neighbour over the gap, so E[SR(x)] = x. The
random bits are a hash of the element's fp32 bit pattern and its index, so equal inputs give equal
outputs on every device (no RNG state), and the arithmetic is integer-only, so sm_90a (which has no
cvt.rs) and sm_100a produce the same bytes.

All integer work is in int64 tensors masked to 32 bits (torch has few uint32 ops); every step
mirrors the TileLang helper of the same name.

Special values:
* fp32 -> bf16: overflow past the largest finite bf16 can round to inf (the next value up); NaN
  keeps its sign and top payload bits and is made quiet (bit 6 of the bf16 pattern set).
* -> e2m1 (sr_float32_to_e2m1_codes): |x| >= 6 (inf included) saturates to +-6; NaN -> +-6
  with the sign bit of x (code 7 | sign), as the round-to-nearest e2m1 encoder does.
* -> e4m3: |x| >= 448 (inf included) saturates to +-448, as the satfinite conversion and the
  quant kernels' clamp do (torch 2.13's own ``.to(float8_e4m3fn)`` saturates as well); NaN
  becomes 0x7F with the sign of x.
"""

from __future__ import annotations

import torch

__all__ = [
    "fmix32",
    "sr_random_bits",
    "sr_float32_to_bfloat16_bits",
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


def sr_random_bits(value_bits: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """32 random bits: fmix32(bits ^ fmix32(index * 0x9E3779B9 + 0x7F4A7C15)), index mod 2^32."""
    k = fmix32(((index & _M32) * 0x9E3779B9 + 0x7F4A7C15) & _M32)
    return fmix32(value_bits ^ k)


def sr_float32_to_bfloat16_bits(x: torch.Tensor, rbits: torch.Tensor) -> torch.Tensor:
    """SR fp32 -> bf16 bit patterns (int64, 0..0xFFFF): add the top 16 random bits to the 16
    dropped bits, truncate; NaN -> its top half with the quiet bit set."""
    bits = _fp32_bits(x)
    is_nan = (bits & 0x7FFFFFFF) > 0x7F800000
    rounded = ((bits + (rbits >> 16)) & _M32) >> 16
    return torch.where(is_nan, (bits >> 16) | 0x40, rounded)


def sr_float32_to_e4m3_bits(x: torch.Tensor, rbits: torch.Tensor) -> torch.Tensor:
    """SR fp32 -> float8_e4m3fn bytes (int64, 0..0xFF); see the module docstring for specials.

    |x| = sig * 2^(E-23); d = 20 + max(-6 - E, 0) low bits of sig are dropped; round up iff the
    top d random bits are < the dropped bits rem (probability rem / 2^d); for d > 32, rem is
    truncated to its top 32 bits first (|x| < 2^-18 only)."""
    bits = _fp32_bits(x)
    sign = (bits >> 24) & 0x80
    a = bits & 0x7FFFFFFF
    ef = a >> 23
    e = ef.clamp(min=1) - 127
    sig = (a & 0x7FFFFF) | torch.where(ef > 0, 0x800000, 0)
    d = 20 + (-6 - e).clamp(min=0)
    small = d < 32
    kept = torch.where(small, sig >> d.clamp(max=31), 0)
    rem = torch.where(small, sig & ((1 << d.clamp(max=31)) - 1), sig >> (d - 32).clamp(0, 63))
    threshold = torch.where(small, rbits >> (32 - d).clamp(min=1), rbits)
    up = (threshold < rem).to(torch.int64)
    code = (e.clamp(min=-6) + 6) * 8 + kept + up
    code = torch.where(a > 0x7F800000, 0x7F, torch.where(a >= 0x43E00000, 0x7E, code))
    return code | sign


def stochastic_cast(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """SR cast of ``x`` (any shape; the element index is its position in row-major order).

    Pairs: fp32 -> bf16, fp32 -> float8_e4m3fn, bf16 -> float8_e4m3fn. The random bits use the
    fp32 bit pattern of each input value (a bf16 value widened exactly) and its flat index.
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

    m = |q| (NaN and >= 6 -> 6) lies between two neighbouring magnitudes 0, .5, 1, 1.5, 2, 3, 4, 6,
    g = .5 / 1 / 2 apart; t = m / g exactly, the lower code is floor(t) (+ 2 or + 4 above 2 and 4),
    and it rounds up iff rbits < trunc((t - floor(t)) * 2^32): probability (m - lower) / g (to
    2^-32), all steps exact in fp32. Mirrors kernels_tl.quant.common.sr_float32_to_e2m1_code."""
    bits = _fp32_bits(q)
    a = (bits & 0x7FFFFFFF).to(torch.int32).view(torch.float32)
    six = torch.full_like(a, 6.0)
    m = torch.where(a < six, a, six)  # NaN compares false: 6
    t = torch.where(m < 2.0, m * 2.0, torch.where(m < 4.0, m, m * 0.5))
    base = torch.where(m < 2.0, 0, torch.where(m < 4.0, 2, 4)).to(torch.int64)
    fl = torch.floor(t)
    below = ((t - fl) * 4294967296.0).to(torch.int64)  # fp32 product, exact, < 2^32
    up = (rbits < below).to(torch.int64)
    return (fl.to(torch.int64) + base + up) | ((bits >> 28) & 8)
