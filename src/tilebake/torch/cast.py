"""Plain-PyTorch reference of block FP8 (e4m3) / FP4 (e2m1) quantisation and dequantisation.

These functions are the bit-exact oracles for the GPU kernels. Every fp32 operation is done in the
order given by ``spec/numerics.md``; do not "simplify" the arithmetic (e.g. ``1 / sf`` instead of
``fmt_max / c``), that changes bytes.

Only ``torch`` and the standard library are imported, so this file can be loaded on its own.
All arithmetic runs on the input's device (CPU or CUDA) in fp32 tensors. Divisions are always
tensor-by-tensor (true IEEE divisions; a division by a Python scalar may become a reciprocal
multiply on CUDA).

Conventions
-----------
* ``block_size = (bm, bk)``: ``bm`` tokens (rows) by ``bk`` channels (columns) share one scale.
  Per-token casts use ``(1, npc)``, per-block ``(bm, bk)``, per-channel ``(npt, 1)``.
* A QuantTensor is a pair ``(data, sf)``: ``data`` is e4m3 ``(T, H)`` or int8 packed e2m1
  ``(T, H // 2)`` (low nibble = even element, high nibble = odd element); ``sf`` holds one scale per
  block in one of the layouts below.
* SF layouts: fp32 ``(ceil(T/bm), ceil(H/bk))`` row-major; packed UE8M0 (int32, four exponent bytes
  per word, little-endian, along K, or along M when ``bk == 1``); float8_e4m3fn; optionally stored
  column-major with the leading (token-block) dimension padded to 16 bytes and returned as the
  transposed view.
"""

from __future__ import annotations

import math
import operator
from typing import Optional, Sequence, Tuple, Union

import torch

from tilebake.torch.stochastic import _fp32_bits, sr_float32_to_e2m1_codes, sr_float32_to_e4m3_bits, sr_random_bits
from tilebake.utils import FMT_MAX, ceil_div

__all__ = [
    "FMT_MAX",
    "E2M1_MAGNITUDES",
    "default_amax_clamp",
    "cast",
    "cast_back",
    "cast_with_precomputed_sf",
    "compute_sf_and_inv",
    "round_sf_exponent",
    "e4m3_encode",
    "e2m1_encode",
    "e2m1_decode",
    "pack_e2m1",
    "unpack_from_e2m1fn_x2",
    "pack_ue8m0",
    "unpack_ue8m0",
    "ue8m0_to_fp32",
    "to_tma_aligned_col_major",
]

QuantTensor = Tuple[torch.Tensor, torch.Tensor]

#: Magnitudes of the eight e2m1 codes 0..7 (bit 3 is the sign).
E2M1_MAGNITUDES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)

_DEFAULT_AMAX_CLAMP = {
    ("e4m3", False): 1e-4,
    ("e4m3", True): 448.0 * 2.0**-9,
    ("e2m1", False): 6.0 * 2.0**-126,
    ("e2m1", True): 6.0 * 2.0**-9,
}

_E4M3 = torch.float8_e4m3fn
_SF_INPUT_DTYPES = (torch.float32, torch.int32, torch.float8_e4m3fn)


# ---------------------------------------------------------------------------------------------
# Argument validation
# ---------------------------------------------------------------------------------------------


def _check_fmt(fmt, name: str = "fmt") -> str:
    if not isinstance(fmt, str):
        raise TypeError(f"{name} must be 'e4m3' or 'e2m1', got {fmt!r} of type {type(fmt).__name__}")
    if fmt not in FMT_MAX:
        raise ValueError(f"{name} must be 'e4m3' or 'e2m1', got {fmt!r}")
    return fmt


def _check_block(block, name: str) -> Tuple[int, int]:
    if not isinstance(block, (tuple, list, torch.Size)) or len(block) != 2:
        raise TypeError(f"{name} must be a pair (bm, bk) of positive ints, got {block!r}")
    out = []
    for v in block:
        if isinstance(v, bool):
            raise TypeError(f"{name} must be a pair (bm, bk) of positive ints, got {block!r}")
        try:
            iv = operator.index(v)
        except TypeError:
            raise TypeError(f"{name} must be a pair (bm, bk) of positive ints, got {block!r}") from None
        if iv < 1:
            raise ValueError(f"{name} must be a pair (bm, bk) of positive ints, got {block!r}")
        out.append(iv)
    return out[0], out[1]


def _check_flag(value, name: str) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, got {value!r}")
    return value


def default_amax_clamp(fmt: str, use_e4m3_sf: bool = False) -> float:
    """The default amax clamp of numerics.md for ``(fmt, use_e4m3_sf)``."""
    _check_fmt(fmt)
    return _DEFAULT_AMAX_CLAMP[(fmt, bool(use_e4m3_sf))]


def _check_amax_clamp(amax_clamp, fmt: str, use_e4m3_sf: bool) -> float:
    if amax_clamp is None:
        return _DEFAULT_AMAX_CLAMP[(fmt, use_e4m3_sf)]
    if isinstance(amax_clamp, bool) or not isinstance(amax_clamp, (int, float)):
        raise TypeError(f"amax_clamp must be None or a positive finite float, got {amax_clamp!r}")
    v = float(amax_clamp)
    if not (math.isfinite(v) and v > 0.0):
        raise ValueError(f"amax_clamp must be None or a positive finite float, got {amax_clamp!r}")
    return v


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
    """Pack UE8M0 bytes ``(R, C)`` into int32 words, four bytes per word, little-endian.

    Along K (default): ``(R, ceil(C/4))``, byte ``i`` of word ``w`` = column ``4w + i``.
    Along M: ``(ceil(R/4), C)``, byte ``i`` of word ``w`` = row ``4w + i``. Unused bytes are zero.
    """
    if along_m:
        return pack_ue8m0(b.t(), along_m=False).t().contiguous()
    R, C = b.shape
    W = ceil_div(C, 4)
    padded = torch.zeros((R, 4 * W), dtype=torch.int64, device=b.device)
    padded[:, :C] = b.to(torch.int64) & 0xFF
    p = padded.view(R, W, 4)
    word = p[..., 0] | (p[..., 1] << 8) | (p[..., 2] << 16) | (p[..., 3] << 24)
    word = torch.where(word >= 2**31, word - 2**32, word)
    return word.to(torch.int32)


def unpack_ue8m0(words: torch.Tensor, n: int, along_m: bool = False) -> torch.Tensor:
    """Inverse of :func:`pack_ue8m0`: int32 words -> int32 bytes, ``n`` entries along the packed dim."""
    if along_m:
        return unpack_ue8m0(words.t(), n, along_m=False).t().contiguous()
    R, W = words.shape
    w = words.to(torch.int64) & 0xFFFFFFFF
    shifts = torch.tensor([0, 8, 16, 24], dtype=torch.int64, device=words.device)
    b = (w.unsqueeze(-1) >> shifts) & 0xFF
    return b.reshape(R, 4 * W)[:, :n].to(torch.int32)


def to_tma_aligned_col_major(sf: torch.Tensor) -> torch.Tensor:
    """Store ``sf`` ``(R, C)`` column-major with ``R`` padded to 16 bytes; return the ``(R, C)`` view.

    The returned tensor has stride ``(1, padded_R)``; the padding entries are zero.
    """
    R, C = sf.shape
    align = max(1, 16 // sf.element_size())
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
    if sf.dtype not in _SF_INPUT_DTYPES:
        raise TypeError(f"x[1] (the SF) must be float32, int32 (packed UE8M0) or float8_e4m3fn, got {sf.dtype}")
    if sf.dim() != 2:
        raise ValueError(f"x[1] (the SF) must be 2-D, got shape {tuple(sf.shape)}")
    if sf.dtype == torch.int32:
        along_m = bk == 1
        expected = (ceil_div(Tb, 4), Kb) if along_m else (Tb, ceil_div(Kb, 4))
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


def _expand_blocks(s: torch.Tensor, bm: int, bk: int, T: int, H: int) -> torch.Tensor:
    """Per-block values ``(Tb, Kb)`` -> per-element ``(T, H)``."""
    Tb, Kb = s.shape
    full = s[:, None, :, None].expand(Tb, bm, Kb, bk).reshape(Tb * bm, Kb * bk)
    return full[:T, :H]


def _block_amax(x: torch.Tensor, bm: int, bk: int) -> torch.Tensor:
    """max |x| over each block's valid elements (NaN ignored, like fmaxf); fp32 ``(Tb, Kb)``."""
    T, H = x.shape
    Tb, Kb = ceil_div(T, bm), ceil_div(H, bk)
    a = x.abs()
    a = torch.where(torch.isnan(a), torch.zeros_like(a), a)
    # Zero padding never raises a maximum of absolute values, so it is excluded in effect.
    padded = torch.zeros((Tb * bm, Kb * bk), dtype=torch.float32, device=x.device)
    padded[:T, :H] = a
    if padded.numel() == 0:
        return torch.zeros((Tb, Kb), dtype=torch.float32, device=x.device)
    return padded.view(Tb, bm, Kb, bk).amax(dim=(1, 3))


# ---------------------------------------------------------------------------------------------
# Input parsing
# ---------------------------------------------------------------------------------------------


class _Input:
    """A parsed cast input: the fp32 values and, for a QuantTensor, its data and expanded SF."""

    def __init__(self, x_fp32, data_fp32=None, sf_full=None):
        self.x = x_fp32
        self.data = data_fp32
        self.sf = sf_full

    @property
    def quantized(self) -> bool:
        return self.data is not None


def _parse_input(x, x_block_size) -> _Input:
    if isinstance(x, torch.Tensor):
        if x_block_size is not None:
            raise ValueError(
                "x_block_size must be None when x is a plain tensor "
                f"(it describes the SF blocks of a QuantTensor input), got {x_block_size!r}"
            )
        if x.dim() != 2:
            raise ValueError(f"x must be a 2-D (T, H) tensor, got shape {tuple(x.shape)}")
        if x.dtype not in (torch.bfloat16, torch.float32):
            raise TypeError(f"x must be bfloat16 or float32 (or a QuantTensor (data, sf)), got {x.dtype}")
        return _Input(x.float())
    if isinstance(x, (tuple, list)):
        if len(x) != 2 or not all(isinstance(t, torch.Tensor) for t in x):
            raise TypeError("x must be a 2-D tensor or a QuantTensor (data, sf) of two tensors")
        data, sf = x
        if x_block_size is None:
            raise ValueError("x_block_size must be given (bm, bk) when x is a QuantTensor (data, sf)")
        bm, bk = _check_block(x_block_size, "x_block_size")
        if data.dim() != 2:
            raise ValueError(f"x[0] (the data) must be 2-D, got shape {tuple(data.shape)}")
        if data.dtype == _E4M3:
            in_fmt = "e4m3"
        elif data.dtype in (torch.int8, torch.uint8):
            in_fmt = "e2m1"
        else:
            raise TypeError(f"x[0] (the data) must be float8_e4m3fn or int8/uint8 (packed e2m1), got {data.dtype}")
        if sf.device != data.device:
            raise ValueError(f"x[1] (the SF) must be on the data's device {data.device}, got {sf.device}")
        data_fp32 = _decode_data(data, in_fmt)
        T, H = data_fp32.shape
        sf_full = _expand_blocks(_decode_input_sf(sf, bm, bk, T, H), bm, bk, T, H)
        return _Input(data_fp32 * sf_full, data_fp32, sf_full)
    raise TypeError(f"x must be a 2-D torch.Tensor or a QuantTensor (data, sf), got {type(x).__name__}")


# ---------------------------------------------------------------------------------------------
# Public references
# ---------------------------------------------------------------------------------------------


def _layout_sf(stored: torch.Tensor, bk: int, packed: bool, col_major: bool) -> torch.Tensor:
    if packed:
        stored = pack_ue8m0(stored, along_m=(bk == 1))
    elif stored.dtype == torch.int32:  # UE8M0 bytes kept as fp32 powers of two
        stored = _pow2_from_biased(stored)
    if col_major:
        return to_tma_aligned_col_major(stored)
    return stored.contiguous()


def cast(
    x: Union[torch.Tensor, QuantTensor],
    fmt: str,
    block_size: Sequence[int],
    x_block_size: Optional[Sequence[int]] = None,
    *,
    round_sf: bool = False,
    use_packed_ue8m0: bool = False,
    use_tma_aligned_col_major_sf: bool = False,
    use_e4m3_sf: bool = False,
    amax_clamp: Optional[float] = None,
    stochastic_rounding: bool = False,
) -> QuantTensor:
    """Cast a 2-D tensor to FP8/FP4 with 2-D block-shared scale factors (MX-style with ``round_sf``).

    Args:
        x: bf16/fp32 ``(T, H)`` (any strides), or a QuantTensor ``(data, sf)`` to re-quantise, whose
            SF blocks are ``x_block_size``. The input SF may be fp32, packed UE8M0 (int32) or e4m3,
            row-major or the TMA-aligned column-major view.
        fmt: ``'e4m3'`` or ``'e2m1'``.
        block_size: ``(bm, bk)`` of the output scale blocks.
        x_block_size: ``(bm, bk)`` of the input SF blocks (QuantTensor input only).
        round_sf: round scales up to powers of two.
        use_packed_ue8m0: store the power-of-two scales as packed UE8M0 bytes in int32 (needs round_sf).
        use_tma_aligned_col_major_sf: store the SF column-major, token blocks padded to 16 bytes.
        use_e4m3_sf: float8_e4m3fn scales (not with round_sf).
        amax_clamp: the minimum block amax; None means the numerics.md default for the format.
        stochastic_rounding: round each quantised value ``q`` (the same ``q`` as above, the same SF)
            to one of its two neighbouring codes, up with probability equal to its distance from
            the lower one over the gap (unbiased), instead of to nearest even: e4m3 through
            ``sr_float32_to_e4m3_bits`` (which saturates at +-448 like the clamp), e2m1 through
            ``sr_float32_to_e2m1_codes`` (tilebake.torch.stochastic). The 16 random bits of
            element ``(t, h)`` are ``sr_random_bits`` of the fp32 bits of the input values at the
            flat indices ``t * H + h`` (one hash per pair of flat indices 2p, 2p + 1), the input
            value being the stored data decoded to fp32 (unscaled) for a QuantTensor:
            deterministic, and bit-exact with per_token_cast(..., stochastic_cast=True).

    Returns:
        ``(data, sf)``: data e4m3 ``(T, H)`` or int8 ``(T, H // 2)``; sf per the flags.
    """
    fmt = _check_fmt(fmt)
    bm, bk = _check_block(block_size, "block_size")
    round_sf = _check_flag(round_sf, "round_sf")
    use_packed_ue8m0 = _check_flag(use_packed_ue8m0, "use_packed_ue8m0")
    use_tma_aligned_col_major_sf = _check_flag(use_tma_aligned_col_major_sf, "use_tma_aligned_col_major_sf")
    use_e4m3_sf = _check_flag(use_e4m3_sf, "use_e4m3_sf")
    stochastic_rounding = _check_flag(stochastic_rounding, "stochastic_rounding")
    if use_packed_ue8m0 and not round_sf:
        raise ValueError("use_packed_ue8m0=True requires round_sf=True (UE8M0 holds powers of two only)")
    if use_e4m3_sf and round_sf:
        raise ValueError("use_e4m3_sf=True is incompatible with round_sf=True")
    clamp = _check_amax_clamp(amax_clamp, fmt, use_e4m3_sf)

    src = _parse_input(x, x_block_size)
    T, H = src.x.shape
    if fmt == "e2m1" and H % 2:
        raise ValueError(f"fmt='e2m1' packs two values per byte, so H must be even, got H={H}")

    amax = _block_amax(src.x, bm, bk)
    c = torch.maximum(amax, torch.full_like(amax, clamp))
    stored, inv = compute_sf_and_inv(c, fmt, round_sf=round_sf, use_e4m3_sf=use_e4m3_sf)
    inv_full = _expand_blocks(inv, bm, bk, T, H)
    if src.quantized and bk != 1:
        x_values, scale = src.data, src.sf * inv_full  # scales multiplied first
    else:
        x_values, scale = src.x, inv_full
    q = x_values * scale
    if stochastic_rounding:
        seed_values = src.data if src.quantized else src.x
        data = _encode_data_stochastic(q, fmt, seed_values, x_values, scale)
    else:
        data = _encode_data(q, fmt)
    sf = _layout_sf(stored, bk, use_packed_ue8m0, use_tma_aligned_col_major_sf)
    return data, sf


def _encode_data_stochastic(
    q: torch.Tensor, fmt: str, seed_values: torch.Tensor, x_values: torch.Tensor, scale: torch.Tensor
) -> torch.Tensor:
    """SR encoding of ``q = x_values * scale`` (T, H); the random bits of element (t, h) come from
    the fp32 bits of ``seed_values`` at flat indices 2p, 2p + 1 (the pair holding t * H + h) and
    p. e4m3 takes x_values and scale (its scaled domain may be reached in one multiply)."""
    T, H = q.shape
    index = torch.arange(T * H, dtype=torch.int64, device=q.device).reshape(T, H)
    rbits = sr_random_bits(_fp32_bits(seed_values), index)
    if fmt == "e4m3":
        codes = sr_float32_to_e4m3_bits(x_values.float(), rbits, scale.float())
        return codes.to(torch.uint8).view(_E4M3).reshape(T, H)
    return pack_e2m1(sr_float32_to_e2m1_codes(q.float().contiguous(), rbits).reshape(T, H))


def cast_with_precomputed_sf(x: torch.Tensor, fmt: str, block_size: Sequence[int], sf: torch.Tensor) -> torch.Tensor:
    """Quantise ``x`` with a given fp32 row-major SF: ``q = x_fp32 * (1 / sf)`` (reciprocal first)."""
    fmt = _check_fmt(fmt)
    bm, bk = _check_block(block_size, "block_size")
    src = _parse_input(x, None)
    T, H = src.x.shape
    if fmt == "e2m1" and H % 2:
        raise ValueError(f"fmt='e2m1' packs two values per byte, so H must be even, got H={H}")
    if not isinstance(sf, torch.Tensor) or sf.dtype != torch.float32:
        raise TypeError(f"sf must be a float32 tensor, got {getattr(sf, 'dtype', type(sf).__name__)}")
    Tb, Kb = ceil_div(T, bm), ceil_div(H, bk)
    if tuple(sf.shape) != (Tb, Kb):
        raise ValueError(
            f"sf must have shape {(Tb, Kb)} for T={T}, H={H}, block_size={(bm, bk)}, got {tuple(sf.shape)}"
        )
    inv = torch.ones_like(sf) / sf
    q = src.x * _expand_blocks(inv, bm, bk, T, H)
    return _encode_data(q, fmt)


def cast_back(
    x: QuantTensor, fmt: str, x_block_size: Sequence[int], out_dtype: torch.dtype = torch.bfloat16
) -> torch.Tensor:
    """Dequantise ``(data, sf)``: ``y = data_fp32 * sf_fp32`` per element, then to ``out_dtype``.

    ``sf`` may be fp32, packed UE8M0 int32 (byte b -> 2^(b-127)) or e4m3 (widened), row-major or
    the TMA-aligned column-major view. ``out_dtype`` is bfloat16 (round-to-nearest-even) or float32.
    """
    fmt = _check_fmt(fmt)
    bm, bk = _check_block(x_block_size, "x_block_size")
    if out_dtype not in (torch.bfloat16, torch.float32):
        raise ValueError(f"out_dtype must be torch.bfloat16 or torch.float32, got {out_dtype!r}")
    if not isinstance(x, (tuple, list)) or len(x) != 2 or not all(isinstance(t, torch.Tensor) for t in x):
        raise TypeError("x must be a QuantTensor (data, sf) of two tensors")
    data, sf = x
    if data.dim() != 2:
        raise ValueError(f"x[0] (the data) must be 2-D, got shape {tuple(data.shape)}")
    if fmt == "e4m3" and data.dtype != _E4M3:
        raise TypeError(f"fmt='e4m3' needs x[0] of dtype float8_e4m3fn, got {data.dtype}")
    if fmt == "e2m1" and data.dtype not in (torch.int8, torch.uint8):
        raise TypeError(f"fmt='e2m1' needs x[0] of dtype int8/uint8 (packed pairs), got {data.dtype}")
    if sf.device != data.device:
        raise ValueError(f"x[1] (the SF) must be on the data's device {data.device}, got {sf.device}")
    data_fp32 = _decode_data(data, fmt)
    T, H = data_fp32.shape
    sf_full = _expand_blocks(_decode_input_sf(sf, bm, bk, T, H), bm, bk, T, H)
    return (data_fp32 * sf_full).to(out_dtype)
