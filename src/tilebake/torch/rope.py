"""Plain-PyTorch reference of rotary position embedding (RoPE), the oracle for
tilebake.transform.apply_rotary (issue 5).

For each row (token) r of the rotated part x (rot_dim values, in fp32), with the cache row
p = position[r] + seqlen_offset holding [cos(p * f_i) | sin(p * f_i)], i < rot_dim / 2:
    NeoX (half split):   x1 = x[:half], x2 = x[half:]
    GPT-J (interleaved): x1 = x[0::2],  x2 = x[1::2]
    out1 = x1 * cos - x2 * sin,  out2 = x2 * cos + x1 * sin   (sin negated when conjugate:
    the inverse rotation), rounded to x's dtype. Positions default to the token's index
    (its sequence index for [B, S, H, rot] inputs).

fp32 operation order (the kernel's, bit for bit): each second product is rounded to fp32,
then one fused multiply-add rounds once:
    out1 = fma(x1, cos, -fp32(x2 * sin)),  out2 = fma(x2, cos, fp32(x1 * sin))
torch has no fma, so `fma_f32` computes it exactly in float64 (round to odd, then to fp32).

A token whose cache row (position + seqlen_offset) is outside [0, S_max) is left unchanged
(query and key): what the kernel does, which checks rows on the device rather than syncing.
"""

from __future__ import annotations

from typing import Optional

import torch

__all__ = ["fma_f32", "rotary_embedding_ref"]

ROT_DIMS = (64, 128)


def fma_f32(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """a * b + c of fp32 tensors (broadcast), rounded once to fp32 (as CUDA's __fmaf_rn).

    In float64 the product is exact (24 + 24 bits) and TwoSum gives the sum's rounding error
    exactly; the sum rounded to odd (the odd one of its two float64 neighbours when inexact)
    then rounds to fp32 as the exact value does, float64 having more than 24 + 1 bits.
    Non-finite sums (inf, NaN) are the float64 sum's."""
    p = a.double() * b.double()
    cd = c.double()
    s = p + cd
    bv = s - p
    err = (p - (s - bv)) + (cd - bv)  # p + cd == s + err exactly (TwoSum)
    even = (s.view(torch.int64) & 1) == 0
    toward = torch.where(err > 0, torch.inf, -torch.inf).to(s.dtype)
    bump = even & (err != 0) & s.isfinite()
    return torch.where(bump, torch.nextafter(s, toward), s).float()


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool) -> torch.Tensor:
    """x (..., H, rot) in any float dtype, cos/sin (..., rot/2) fp32 broadcast over heads."""
    xf = x.float()
    if interleaved:
        x1, x2 = xf[..., 0::2], xf[..., 1::2]
    else:
        half = xf.shape[-1] // 2
        x1, x2 = xf[..., :half], xf[..., half:]
    cos, sin = cos.unsqueeze(-2), sin.unsqueeze(-2)  # broadcast over the heads dim
    out1 = fma_f32(x1, cos, -(x2 * sin))
    out2 = fma_f32(x2, cos, x1 * sin)
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
    int [T] or [B, S] (default: the token's index). A token whose cache row is out of range is
    returned unchanged."""
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
    # Out-of-range rows: the token stays as it was (no host sync to check them).
    inside = (rows >= 0) & (rows < cos_sin_cache.shape[0])
    cache = cos_sin_cache.float()[torch.where(inside, rows, 0)] if cos_sin_cache.shape[0] else None
    if cache is None:  # an empty cache: every row is out of range
        return query.clone(), (None if key is None else key.clone())
    cos, sin = cache[..., : rot // 2], cache[..., rot // 2 :]
    if conjugate:
        sin = -sin
    keep = ~inside[..., None, None]
    q = torch.where(keep, query, _rotate(query, cos, sin, interleaved))
    k = None if key is None else torch.where(keep, key, _rotate(key, cos, sin, interleaved))
    return q, k
