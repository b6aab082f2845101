"""Plain-PyTorch reference of block FP8 (e4m3) / FP4 (e2m1) quantisation and dequantisation.

These functions are the bit-exact oracles for the GPU kernels. Every fp32 operation is done in the
order given by ``spec/numerics.md``; do not "simplify" the arithmetic (e.g. ``1 / sf`` instead of
``fmt_max / c``), that changes bytes.

The storage formats (element codes, SF encodings and layouts) are in ``cast_formats.py``, whose
public names are importable from here too.
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

from tilebake.torch.cast_formats import (
    _E4M3,
    E2M1_MAGNITUDES,
    _decode_data,
    _decode_input_sf,
    _encode_data,
    _layout_sf,
    compute_sf_and_inv,
    e2m1_decode,
    e2m1_encode,
    e4m3_encode,
    pack_e2m1,
    pack_ue8m0,
    round_sf_exponent,
    to_tma_aligned_col_major,
    ue8m0_to_fp32,
    unpack_from_e2m1fn_x2,
    unpack_ue8m0,
)
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

_DEFAULT_AMAX_CLAMP = {
    ("e4m3", False): 1e-4,
    ("e4m3", True): 448.0 * 2.0**-9,
    ("e2m1", False): 6.0 * 2.0**-126,
    ("e2m1", True): 6.0 * 2.0**-9,
}


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
# Blocks
# ---------------------------------------------------------------------------------------------


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
