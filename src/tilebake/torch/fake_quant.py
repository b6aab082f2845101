"""Plain-PyTorch reference of in-place fake quantisation (quantise, then dequantise)."""

from __future__ import annotations

from typing import Optional

import torch

from .cast import cast, cast_back

__all__ = ["per_token_cast_and_cast_back_ref"]


def per_token_cast_and_cast_back_ref(
    x: torch.Tensor,
    fmt: str,
    num_per_channels: int,
    round_sf: bool = False,
    use_e4m3_sf: bool = False,
    amax_clamp: Optional[float] = None,
) -> torch.Tensor:
    """``cast_back(cast(x, fmt, (1, npc)), ...)`` in x's dtype, returned as a new tensor.

    The bytes tilebake.quant.per_token_cast_and_cast_back writes into x: fp32/e4m3 scale factors
    as cast produces them (round_sf gives powers of two), then y = data * sf rounded to x.dtype.
    """
    q = cast(x, fmt, (1, num_per_channels), round_sf=round_sf, use_e4m3_sf=use_e4m3_sf, amax_clamp=amax_clamp)
    return cast_back(q, fmt, (1, num_per_channels), out_dtype=x.dtype)
