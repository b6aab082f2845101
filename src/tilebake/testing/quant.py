"""Helpers for checking quantised outputs: an order-preserving rank of codes (to test that two
roundings picked adjacent levels) and zeroing of the padding lanes of packed UE8M0 scales."""

from __future__ import annotations

import torch

from tilebake.testing.numeric import flat_bytes
from tilebake.utils import align, ceil_div

__all__ = ["clear_unused_sf", "clear_unused_sf_col_pack", "quant_level_rank"]

# Code of the largest finite value: bf16 0x7F7F, e4m3fn 0x7E (0x7F is NaN), e2m1 0x7.
_MAX_FINITE_CODE = {"bf16": 0x7F7F, "e4m3": 0x7E, "e2m1": 0x7}


def quant_level_rank(xc: torch.Tensor, fmt: str) -> torch.Tensor:
    """Each code's position among its format's values in ascending order, as flat int32.

    fmt: "bf16" (a bf16 tensor), "e4m3" (float8_e4m3fn) or "e2m1" (int8, two codes a byte, low
    nibble first; "fp4" is accepted too). Sign-magnitude codes are mapped so that the most
    negative finite value ranks 0 and +0 and -0 share a rank; neighbouring values, across zero
    and exponent boundaries, differ by exactly 1 (raw code differences do not)."""
    if fmt == "fp4":
        fmt = "e2m1"
    if fmt not in _MAX_FINITE_CODE:
        raise ValueError(f"fmt must be 'bf16', 'e4m3' or 'e2m1', got {fmt!r}")
    if fmt == "bf16":
        code, sign_bit = xc.view(torch.int16).to(torch.int32) & 0xFFFF, 0x8000
    elif fmt == "e4m3":
        code, sign_bit = xc.view(torch.uint8).to(torch.int32), 0x80
    else:
        byte = xc.view(torch.uint8).to(torch.int32)
        code, sign_bit = torch.stack((byte & 0xF, byte >> 4), dim=-1), 0x8
    magnitude = code & (sign_bit - 1)
    offset = _MAX_FINITE_CODE[fmt]
    # Negative values count down from the middle, positive ones up: the order of the values.
    rank = torch.where((code & sign_bit) != 0, offset - magnitude, offset + magnitude)
    return rank.flatten()


def _pack_factor(sf: torch.Tensor) -> int:
    """UE8M0 bytes a packed SF element holds: 2 in an int16 (Ascend), else 4 (an int32)."""
    return 2 if sf.dtype == torch.int16 else 4


def clear_unused_sf(sf: torch.Tensor, hidden: int, num_per_channels: int) -> torch.Tensor:
    """Zero the padding lanes of packed UE8M0 scales laid out along the channels.

    Each row of sf packs ceil(hidden / num_per_channels) one-byte scales into whole int32 (or,
    on Ascend, int16) words; the lanes past the last real block hold whatever the writer left.
    Returns the bytes as uint8 (rows, aligned block count) with those lanes zeroed. When sf is
    contiguous the zeroing happens in sf itself, as a view."""
    num_blocks = ceil_div(hidden, num_per_channels)
    sf_bytes = flat_bytes(sf).view(-1, align(num_blocks, _pack_factor(sf)))
    sf_bytes[:, num_blocks:] = 0
    return sf_bytes


def clear_unused_sf_col_pack(sf: torch.Tensor, num_tokens: int, num_per_tokens: int) -> torch.Tensor:
    """Zero the padding lanes of packed UE8M0 scales laid out along the tokens (per-channel casts).

    Word (r, c) packs the scales of token blocks r * pack .. r * pack + pack - 1 of channel c,
    one byte each; bytes of blocks at or past ceil(num_tokens / num_per_tokens) are zeroed.
    Returns the bytes as uint8 (word rows, channels * pack), in place when sf is contiguous."""
    num_blocks = ceil_div(num_tokens, num_per_tokens)
    pack = _pack_factor(sf)
    rows = align(num_blocks, pack) // pack
    if sf.numel() == 0:
        return sf.view(torch.uint8)
    sf_bytes = flat_bytes(sf)
    lanes = sf_bytes.view(rows, -1, pack)
    block = torch.arange(rows, device=sf.device).view(-1, 1, 1) * pack + torch.arange(pack, device=sf.device)
    lanes.masked_fill_(block >= num_blocks, 0)
    return sf_bytes.view(rows, -1)
