"""Storage formats of the quantised tensors: e4m3 / e2m1 element codes (e2m1 packed in pairs)
and the scale factors (fp32, e4m3 or UE8M0 from the clamped block amax, UE8M0 packed four to an
int32, the TMA-aligned column-major layout), encoded and decoded bit by bit.

The SF layouts follow the tensors' device, as the original's do: on an Ascend NPU, UE8M0 bytes
are packed two to an int16 and a column-major SF has no alignment padding (utils.npu_layouts).

Apart from cast.py (the casts: argument checks, input parsing, block amax, the quantising
multiply), which re-exports the public names: the formats are the same for every cast
(cast_lossless.py reads them too). The fp32 operations follow ``spec/numerics.md`` as in cast.py.
"""

from __future__ import annotations

from typing import Tuple

import torch

from tilebake import utils
from tilebake.utils import FMT_MAX, ceil_div

#: Magnitudes of the eight e2m1 codes 0..7 (bit 3 is the sign).
E2M1_MAGNITUDES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)

_E4M3 = torch.float8_e4m3fn


# ---------------------------------------------------------------------------------------------
# Element encodings
# ---------------------------------------------------------------------------------------------


def e4m3_encode(q: torch.Tensor) -> torch.Tensor:
    """fp32 ``q`` -> float8_e4m3fn: ``clamp(q, -448, 448)`` then round-to-nearest-even."""
    return q.float().clamp(-448.0, 448.0).to(_E4M3)


def e2m1_encode(q: torch.Tensor) -> torch.Tensor:
    """fp32 ``q`` -> e2m1 codes (uint8, 0..15, bit 3 = sign of ``q``), per numerics.md step 4.

    ``m = |q|`` with NaN and +inf mapped to 6 and clamped to at most 6; the magnitude code is
    ``rne(2m)`` for ``m < 2``, ``rne(m) + 2`` for ``2 <= m < 4``, ``rne(m / 2) + 4`` otherwise.
    """
    q = q.float()
    six = torch.full_like(q, 6.0)
    m = q.abs()
    m = torch.where(torch.isnan(m) | torch.isinf(m), six, m)
    m = torch.minimum(m, six)
    # torch.round is round-half-to-even; 2m and m/2 are exact in fp32.
    lo = torch.round(m * 2.0)
    mid = torch.round(m) + 2.0
    hi = torch.round(m * 0.5) + 4.0
    mag = torch.where(m < 2.0, lo, torch.where(m < 4.0, mid, hi)).to(torch.int32)
    sign = torch.signbit(q).to(torch.int32) << 3
    return (mag | sign).to(torch.uint8)


def e2m1_decode(codes: torch.Tensor, out_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """e2m1 codes (any integer dtype, only the low 4 bits are used) -> values."""
    c = codes.to(torch.int64) & 0xF
    table = torch.tensor(E2M1_MAGNITUDES + tuple(-v for v in E2M1_MAGNITUDES), dtype=torch.float32, device=codes.device)
    return table[c].to(out_dtype)


def pack_e2m1(codes: torch.Tensor) -> torch.Tensor:
    """e2m1 codes ``[..., 2K]`` -> int8 ``[..., K]``: even element in the low nibble."""
    if codes.shape[-1] % 2:
        raise ValueError(f"the last dimension must be even to pack e2m1 pairs, got {tuple(codes.shape)}")
    c = codes.to(torch.int32) & 0xF
    lo = c[..., 0::2]
    hi = c[..., 1::2]
    return (lo | (hi << 4)).to(torch.uint8).view(torch.int8).contiguous()


def unpack_from_e2m1fn_x2(x: torch.Tensor, out_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Decode packed e2m1 ``[..., K]`` int8/uint8 -> ``[..., 2K]`` values of ``out_dtype``.

    The low nibble of each byte is the even element, the high nibble the odd element.
    """
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in (torch.int8, torch.uint8):
        raise TypeError(f"x must be int8 or uint8 (packed e2m1), got {x.dtype}")
    if not isinstance(out_dtype, torch.dtype) or not out_dtype.is_floating_point:
        raise TypeError(f"out_dtype must be a floating torch.dtype, got {out_dtype!r}")
    if x.dim() == 0:
        raise ValueError("x must have at least one dimension")
    b = x.to(torch.int32) & 0xFF
    codes = torch.stack((b & 0xF, (b >> 4) & 0xF), dim=-1)
    codes = codes.reshape(*x.shape[:-1], 2 * x.shape[-1])
    return e2m1_decode(codes, out_dtype)


def _decode_data(data: torch.Tensor, fmt: str) -> torch.Tensor:
    if fmt == "e4m3":
        return data.float()
    return unpack_from_e2m1fn_x2(data, torch.float32)


def _encode_data(q: torch.Tensor, fmt: str) -> torch.Tensor:
    if fmt == "e4m3":
        return e4m3_encode(q).contiguous()
    return pack_e2m1(e2m1_encode(q))


# ---------------------------------------------------------------------------------------------
# Scale factors
# ---------------------------------------------------------------------------------------------


def _pow2_from_biased(biased: torch.Tensor) -> torch.Tensor:
    """int32 biased exponents -> fp32 ``2^(biased - 127)`` via the bits (0 -> 0.0, 255 -> inf)."""
    return (biased.clamp(0, 255).to(torch.int32) << 23).view(torch.float32)


def round_sf_exponent(s: torch.Tensor) -> torch.Tensor:
    """Unbiased exponent ``e`` of ``s`` (> 0, fp32) rounded up to a power of two, via its bits.

    ``e = ((bits(s) - 1) >> 23) + 1 - 127``, so that ``2^e >= s`` and ``2^e < 2 s``.
    """
    bits = s.float().contiguous().view(torch.int32)
    return ((bits - 1) >> 23) + 1 - 127


def compute_sf_and_inv(
    c: torch.Tensor, fmt: str, *, round_sf: bool = False, use_e4m3_sf: bool = False
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Scale from the clamped block amax ``c`` (fp32), numerics.md step 2.

    Returns ``(stored_sf, inv)``; ``stored_sf`` is fp32 (plain), float8_e4m3fn (``use_e4m3_sf``) or
    int32 UE8M0 bytes ``e + 127`` (``round_sf``); ``inv`` is the fp32 quantising multiplier.
    """
    c = c.float()
    fmt_max = torch.full_like(c, FMT_MAX[fmt])
    if round_sf:
        # The fp32 constant 1/fmt_max (a correctly rounded fp32 division), then a multiplication.
        recip = torch.ones_like(c) / fmt_max
        s = c * recip
        e = round_sf_exponent(s)
        return (e + 127).to(torch.int32), _pow2_from_biased(127 - e)
    if use_e4m3_sf:
        # Saturate like the device conversion (satfinite) instead of producing NaN above 448.
        sf = (c / fmt_max).clamp(max=448.0).to(_E4M3)
        inv = torch.ones_like(c) / sf.float()
        return sf, inv
    sf = c / fmt_max
    inv = fmt_max / c
    return sf, inv


def ue8m0_to_fp32(b: torch.Tensor) -> torch.Tensor:
    """UE8M0 bytes (integer tensor, 0..255) -> fp32 ``2^(b - 127)`` (byte 0 -> 2^-127, 255 -> inf)."""
    b = b.to(torch.int32) & 0xFF
    bits = torch.where(b == 0, torch.full_like(b, 1 << 22), b << 23)
    return bits.view(torch.float32)


def pack_ue8m0(b: torch.Tensor, along_m: bool = False) -> torch.Tensor:
    """Pack UE8M0 bytes ``(R, C)`` into words of utils.ue8m0_word(b.device) (int32 of four bytes; int16
    of two on an NPU), little-endian.

    Along K (default): ``(R, ceil(C/n))``, byte ``i`` of word ``w`` = column ``n w + i``.
    Along M: ``(ceil(R/n), C)``, byte ``i`` of word ``w`` = row ``n w + i``. Unused bytes are zero.
    """
    if along_m:
        return pack_ue8m0(b.t(), along_m=False).t().contiguous()
    dtype, n = utils.ue8m0_word(b.device)
    R, C = b.shape
    W = ceil_div(C, n)
    padded = torch.zeros((R, n * W), dtype=torch.int64, device=b.device)
    padded[:, :C] = b.to(torch.int64) & 0xFF
    p = padded.view(R, W, n)
    word = p[..., 0]
    for i in range(1, n):
        word = word | (p[..., i] << (8 * i))
    word = torch.where(word >= 2 ** (8 * n - 1), word - 2 ** (8 * n), word)
    return word.to(dtype)


def unpack_ue8m0(words: torch.Tensor, n: int, along_m: bool = False) -> torch.Tensor:
    """Inverse of :func:`pack_ue8m0`: int32 (or int16) words -> int32 bytes, ``n`` entries along
    the packed dim."""
    if along_m:
        return unpack_ue8m0(words.t(), n, along_m=False).t().contiguous()
    per = words.element_size()
    R, W = words.shape
    w = words.to(torch.int64) & ((1 << (8 * per)) - 1)
    shifts = torch.arange(0, 8 * per, 8, dtype=torch.int64, device=words.device)
    b = (w.unsqueeze(-1) >> shifts) & 0xFF
    return b.reshape(R, per * W)[:, :n].to(torch.int32)


def to_tma_aligned_col_major(sf: torch.Tensor) -> torch.Tensor:
    """Store ``sf`` ``(R, C)`` column-major with ``R`` padded to 16 bytes (not padded on an NPU:
    the original's Ascend layout); return the ``(R, C)`` view.

    The returned tensor has stride ``(1, padded_R)``; the padding entries are zero.
    """
    R, C = sf.shape
    align = 1 if utils.npu_layouts(sf.device) else max(1, 16 // sf.element_size())
    padded_r = ceil_div(R, align) * align
    buf = torch.zeros((C, padded_r), dtype=sf.dtype, device=sf.device)
    if R and C:
        buf[:, :R] = sf.t()
    return buf.t()[:R]


def _decode_input_sf(sf: torch.Tensor, bm: int, bk: int, T: int, H: int) -> torch.Tensor:
    """Input SF (fp32 / packed UE8M0 int32 / e4m3; any strides) -> fp32 ``(ceil(T/bm), ceil(H/bk))``.

    A column-major (TMA-aligned) SF is the transposed view of the same logical shape, so it is read
    through its strides like any other view.
    """
    Tb, Kb = ceil_div(T, bm), ceil_div(H, bk)
    if not isinstance(sf, torch.Tensor):
        raise TypeError(f"x[1] (the SF) must be a torch.Tensor, got {type(sf).__name__}")
    packed, n = utils.ue8m0_word(sf.device)
    if sf.dtype not in (torch.float32, packed, torch.float8_e4m3fn):
        raise TypeError(f"x[1] (the SF) must be float32, {packed} (packed UE8M0 on {sf.device.type}) or "
                        f"float8_e4m3fn, got {sf.dtype}")  # fmt: skip
    if sf.dim() != 2:
        raise ValueError(f"x[1] (the SF) must be 2-D, got shape {tuple(sf.shape)}")
    if sf.dtype == packed:
        along_m = bk == 1
        expected = (ceil_div(Tb, n), Kb) if along_m else (Tb, ceil_div(Kb, n))
        if tuple(sf.shape) != expected:
            raise ValueError(
                f"x[1] (packed UE8M0 SF) must have shape {expected} for T={T}, H={H}, "
                f"x_block_size={(bm, bk)}, got {tuple(sf.shape)}"
            )
        return ue8m0_to_fp32(unpack_ue8m0(sf, Tb if along_m else Kb, along_m=along_m))
    if tuple(sf.shape) != (Tb, Kb):
        raise ValueError(
            f"x[1] (the SF) must have shape {(Tb, Kb)} for T={T}, H={H}, x_block_size={(bm, bk)}, got {tuple(sf.shape)}"
        )
    return sf.float()


def _layout_sf(stored: torch.Tensor, bk: int, packed: bool, col_major: bool) -> torch.Tensor:
    if packed:
        stored = pack_ue8m0(stored, along_m=(bk == 1))
    elif stored.dtype == torch.int32:  # UE8M0 bytes kept as fp32 powers of two
        stored = _pow2_from_biased(stored)
    if col_major:
        return to_tma_aligned_col_major(stored)
    return stored.contiguous()
