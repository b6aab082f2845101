"""Plain-PyTorch reference of rotary position embedding (RoPE), the oracle for
tilebake.transform.apply_rotary (issue 5).

For each row (token) r of the rotated part x (rot_dim values, in fp32), with the cache row
p = position[r] + seqlen_offset holding [cos(p * f_i) | sin(p * f_i)], i < rot_dim / 2:
    NeoX (half split):   x1 = x[:half], x2 = x[half:]
    GPT-J (interleaved): x1 = x[0::2],  x2 = x[1::2]
    out1 = x1 * cos - x2 * sin,  out2 = x2 * cos + x1 * sin   (sin negated when conjugate:
    the inverse rotation), rounded to x's dtype. Positions default to the token's index
    (its sequence index for [B, S, H, rot] inputs).
"""

from __future__ import annotations

from typing import Optional

import torch

__all__ = ["rotary_embedding_ref"]

ROT_DIMS = (64, 128)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool) -> torch.Tensor:
    """x (..., H, rot) in any float dtype, cos/sin (..., rot/2) fp32 broadcast over heads."""
    xf = x.float()
    if interleaved:
        x1, x2 = xf[..., 0::2], xf[..., 1::2]
    else:
        half = xf.shape[-1] // 2
        x1, x2 = xf[..., :half], xf[..., half:]
    cos, sin = cos.unsqueeze(-2), sin.unsqueeze(-2)  # broadcast over the heads dim
    out1 = x1 * cos - x2 * sin
    out2 = x2 * cos + x1 * sin
    out = torch.stack((out1, out2), dim=-1).flatten(-2) if interleaved else torch.cat((out1, out2), dim=-1)
    return out.to(x.dtype)


def rotary_embedding_ref(
    query: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    key: Optional[torch.Tensor] = None,
    positions: Optional[torch.Tensor] = None,
    interleaved: bool = False,
    conjugate: bool = False,
    seqlen_offset: int = 0,
) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """Rotated copies (query, key or None) of query (and key): [T, H, rot] or [B, S, H, rot],
    bf16 or fp32, rot in (64, 128); cos_sin_cache fp32 [S_max, rot] = [cos | sin]; positions
    int [T] or [B, S] (default: the token's index). Raises ValueError for a cache row out of range."""
    if query.dim() not in (3, 4):
        raise ValueError(f"query must be [T, H, rot] or [B, S, H, rot], got shape {tuple(query.shape)}")
    if query.dtype not in (torch.bfloat16, torch.float32):
        raise TypeError(f"query must be torch.bfloat16 or torch.float32, got {query.dtype}")
    if key is not None and key.dtype != query.dtype:
        raise TypeError(f"key must have query's dtype {query.dtype}, got {key.dtype}")
    if cos_sin_cache.dtype != torch.float32:
        raise TypeError(f"cos_sin_cache must be torch.float32, got {cos_sin_cache.dtype}")
    if positions is not None and (positions.is_floating_point() or positions.dtype == torch.bool):
        raise TypeError(f"positions must be an integer tensor, got {positions.dtype}")
    for name, t in (("cos_sin_cache", cos_sin_cache), ("key", key), ("positions", positions)):
        if t is not None and t.device != query.device:
            raise ValueError(f"{name} must be on {query.device} (as query), got {t.device}")
    rot = query.shape[-1]
    if rot not in ROT_DIMS:
        raise ValueError(f"query.shape[-1] (rot_dim) must be one of {ROT_DIMS}, got {rot}")
    if cos_sin_cache.dim() != 2 or cos_sin_cache.shape[1] != rot:
        raise ValueError(f"cos_sin_cache must be [max_positions, {rot}], got shape {tuple(cos_sin_cache.shape)}")
    lead = query.shape[:-2]  # (T,) or (B, S)
    if key is not None and (tuple(key.shape[:-2]) != tuple(lead) or key.shape[-1] != rot):
        raise ValueError(f"key must be {tuple(lead)} + (heads, {rot}) like query, got shape {tuple(key.shape)}")
    if positions is None:
        positions = torch.arange(lead[-1], device=query.device).expand(lead)
    elif tuple(positions.shape) != tuple(lead):
        raise ValueError(f"positions must have shape {tuple(lead)}, got {tuple(positions.shape)}")
    rows = positions.long() + seqlen_offset
    if rows.numel() and (int(rows.min()) < 0 or int(rows.max()) >= cos_sin_cache.shape[0]):
        raise ValueError(f"positions + seqlen_offset must lie in [0, {cos_sin_cache.shape[0]}), got "
                         f"[{int(rows.min())}, {int(rows.max())}]")  # fmt: skip
    cache = cos_sin_cache.float()[rows]  # lead + (rot,)
    cos, sin = cache[..., : rot // 2], cache[..., rot // 2 :]
    if conjugate:
        sin = -sin
    q = _rotate(query, cos, sin, interleaved)
    k = None if key is None else _rotate(key, cos, sin, interleaved)
    return q, k
