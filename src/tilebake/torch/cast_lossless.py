"""Plain-PyTorch reference of per_block_cast_lossless: FP4 (e2m1) blocks -> FP8 (e4m3) blocks, exactly.

An e2m1 value is one of +-{0, 0.5, 1, 1.5, 2, 3, 4, 6} (exponents -1..2, one mantissa bit). With
power-of-two input scales, re-quantising to a coarser block of e4m3 with the scale
``sf_out = max(sf_in) * 2^-6`` multiplies each e2m1 value by ``sf_in / sf_out = 2^k`` with
``k = 6 - log2(max / sf_in)``: the largest code (6 * 2^6 = 384) stays below 448, and while
``max / sf_in <= 2^11`` (k >= -5) the smallest nonzero code (0.5 * 2^-5 = 2^-6) stays a normal
e4m3 number, so every product is exact: the residual scale lands in the e4m3 exponent bits.

The fp32 operations (mirrored by the kernel, so the bytes agree even at the edges):
``sf_out = max * 2^-6``, ``inv = 64 / max`` (a division of fp32 tensors), ``q = data * (sf_in * inv)``,
then e4m3 round-to-nearest-even (exact here).

A block is *re-quantisable* when every input scale of it is a positive normal fp32 power of two
(UE8M0 bytes 1..254), ``max <= 2048 * min`` and ``max >= 2^-120`` (so that ``sf_out`` is a normal
power of two, representable as UE8M0).
"""

from __future__ import annotations

from typing import Sequence, Tuple

import torch

from tilebake.utils import ceil_div

from .cast import (
    _check_block,
    _check_flag,
    _decode_input_sf,
    _expand_blocks,
    _layout_sf,
    e4m3_encode,
    unpack_from_e2m1fn_x2,
)

__all__ = ["per_block_cast_lossless", "MAX_SCALE_RATIO"]

#: Largest ratio of input scales within one output block that keeps the cast exact.
MAX_SCALE_RATIO = 2.0**11
#: Smallest block maximum: sf_out = max * 2^-6 must stay a normal fp32 (and UE8M0) power of two.
MIN_BLOCK_MAX = 2.0**-120


def _is_normal_power_of_two(s: torch.Tensor) -> torch.Tensor:
    bits = s.float().contiguous().view(torch.int32)
    exponent = (bits >> 23) & 0xFF
    return ((bits & 0x807FFFFF) == 0) & (exponent >= 1) & (exponent <= 254)


def _block_max(v: torch.Tensor, bm: int, bk: int) -> torch.Tensor:
    """max(0, v) over each block's valid elements, NaN ignored (like the kernel's fmaxf); fp32 ``(Tb, Kb)``."""
    T, H = v.shape
    Tb, Kb = ceil_div(T, bm), ceil_div(H, bk)
    padded = torch.zeros((Tb * bm, Kb * bk), dtype=torch.float32, device=v.device)
    padded[:T, :H] = torch.where(torch.isnan(v), torch.zeros_like(v), v)
    if padded.numel() == 0:
        return torch.zeros((Tb, Kb), dtype=torch.float32, device=v.device)
    return padded.view(Tb, bm, Kb, bk).amax(dim=(1, 3)).clamp(min=0.0)


def _block_min(v: torch.Tensor, bm: int, bk: int) -> torch.Tensor:
    """min over each block's valid elements (padding is +inf); fp32 ``(Tb, Kb)``."""
    T, H = v.shape
    Tb, Kb = ceil_div(T, bm), ceil_div(H, bk)
    padded = torch.full((Tb * bm, Kb * bk), float("inf"), dtype=torch.float32, device=v.device)
    padded[:T, :H] = v
    if padded.numel() == 0:
        return torch.zeros((Tb, Kb), dtype=torch.float32, device=v.device)
    return padded.view(Tb, bm, Kb, bk).amin(dim=(1, 3))


def per_block_cast_lossless(
    x: Tuple[torch.Tensor, torch.Tensor],
    fmt: str,
    x_block_size: Sequence[int],
    out_block_size: Sequence[int],
    use_tma_aligned_col_major_sf: bool = False,
    round_sf: bool = False,
    use_packed_ue8m0: bool = False,
    *,
    on_error: str = "raise",
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Re-quantise packed e2m1 ``x = (data int8 (T, H/2), sf)`` to e4m3 with ``out_block_size`` blocks, exactly.

    Args:
        x: the FP4 QuantTensor; ``sf`` per ``x_block_size`` block, fp32 or packed UE8M0 (int32, along K),
            any strides; its values must be powers of two.
        fmt: ``'e4m3'``.
        x_block_size, out_block_size: ``(bm, bk)``; each output block must be a whole number of input blocks.
        use_tma_aligned_col_major_sf, use_packed_ue8m0: the output SF layout, as in ``cast``.
        round_sf: accepted for signature compatibility; the output scales are powers of two anyway.
        on_error: ``'raise'`` (ValueError naming the first bad block) or ``'nan'`` (that block's scale
            becomes NaN, UE8M0 byte 0xFF, as the GPU kernel reports it).

    Returns:
        ``(data e4m3 (T, H), sf)`` with ``cast_back(out) == cast_back(x)`` exactly.
    """
    if fmt != "e4m3":
        raise ValueError(f"fmt must be 'e4m3' (the lossless target), got {fmt!r}")
    bm_in, bk_in = _check_block(x_block_size, "x_block_size")
    bm, bk = _check_block(out_block_size, "out_block_size")
    if bm % bm_in or bk % bk_in:
        raise ValueError(
            f"out_block_size {(bm, bk)} must be a whole number of x_block_size {(bm_in, bk_in)} blocks in each dim"
        )
    _check_flag(use_tma_aligned_col_major_sf, "use_tma_aligned_col_major_sf")
    _check_flag(round_sf, "round_sf")
    _check_flag(use_packed_ue8m0, "use_packed_ue8m0")
    if on_error not in ("raise", "nan"):
        raise ValueError(f"on_error must be 'raise' or 'nan', got {on_error!r}")
    if not isinstance(x, (tuple, list)) or len(x) != 2 or not all(isinstance(t, torch.Tensor) for t in x):
        raise TypeError("x must be a QuantTensor (data, sf) of two tensors")
    data, sf = x
    if data.dtype not in (torch.int8, torch.uint8) or data.dim() != 2:
        raise TypeError(f"x[0] must be 2-D int8 (packed e2m1 pairs), got {data.dtype} of shape {tuple(data.shape)}")

    values = unpack_from_e2m1fn_x2(data, torch.float32)
    T, H = values.shape
    sf_in = _decode_input_sf(sf, bm_in, bk_in, T, H)
    sf_full = _expand_blocks(sf_in, bm_in, bk_in, T, H)
    valid = _is_normal_power_of_two(sf_full)

    block_max = _block_max(sf_full, bm, bk)
    block_min = _block_min(torch.where(valid, sf_full, torch.zeros_like(sf_full)), bm, bk)
    ok = (block_min > 0) & (block_max <= block_min * MAX_SCALE_RATIO) & (block_max >= MIN_BLOCK_MAX)
    if on_error == "raise" and not bool(ok.all()):
        i, j = (~ok).nonzero()[0].tolist()
        raise ValueError(
            f"per_block_cast_lossless: output block ({i}, {j}) (rows {i * bm}.., columns {j * bk}..) cannot be "
            f"re-quantised exactly: its input scales must be normal powers of two within a ratio of 2^11 "
            f"(max {block_max[i, j].item()!r}, min {block_min[i, j].item()!r})"
        )

    sf_out = block_max * torch.full_like(block_max, 2.0**-6)
    inv = torch.full_like(block_max, 64.0) / block_max
    q = values * (sf_full * _expand_blocks(inv, bm, bk, T, H))
    out_data = e4m3_encode(q).contiguous()

    nan = torch.full_like(sf_out, float("nan"))
    if use_packed_ue8m0:
        stored = ((sf_out.contiguous().view(torch.int32) >> 23) & 0xFF).to(torch.int32)
        stored = torch.where(ok, stored, torch.full_like(stored, 0xFF))
    else:
        stored = torch.where(ok, sf_out, nan)
    return out_data, _layout_sf(stored, bk, use_packed_ue8m0, use_tma_aligned_col_major_sf)
