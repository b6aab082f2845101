"""Plain-PyTorch reference of batched_transpose_weight_sf: fp32 power-of-two weight block scales ->
the packed UE8M0 scale layouts DeepGEMM's SM100 FP8 GEMMs read.

Interpretation (api.md 1.2.4 gives only the signature and one sentence; this is the layout DeepGEMM's
``transform_sf_into_required_layout`` produces for a (bs, bs) block-scaled B operand with UE8M0 scales):

A weight ``W`` (n, k) quantised in (bs, bs) blocks has fp32 scales ``sf`` (n/bs, k/bs), or (G, n/bs, k/bs)
for G grouped weights (MoE experts). DeepGEMM wants the scales of a K-major operand at (1, bs)
granularity: one scale per *row* and per bs-wide K block, as UE8M0 exponent bytes packed four to an
int32 along K, stored MN-major (column-major) with the row count padded to 4 words (16 bytes, TMA
alignment), as a (rows, words) view with strides (1, padded rows); grouped: (G, rows, words) with the
group stride words * padded rows.

* ``sf0``: the scales of ``W`` as the B operand of the forward GEMM ``x @ W^T`` (contraction over k):
  int32 (n, ceil(k/bs/4)); byte j of word w of row i is the exponent byte of ``sf[i // bs, 4w + j]``.
* ``sf1``: with ``transpose_sf1 = True``, the scales of ``W^T`` (k, n), the B operand of the backward
  GEMM ``dy @ W`` (contraction over n): int32 (k, ceil(n/bs/4)); byte j of word w of row i is the
  exponent byte of ``sf[4w + j, i // bs]``. With ``transpose_sf1 = False`` no second layout is made
  and ``sf1`` is None.

Unused bytes of a last partial word are zero. The exponent byte of an fp32 power of two ``2^e`` is
``e + 127`` (its fp32 exponent field); any other scale (not a positive normal power of two) is an error.
"""

from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import torch

__all__ = ["batched_transpose_weight_sf", "weight_sf_layout"]

WEIGHT_SF_BLOCK_SIZES = (32, 128)


def _ceil_div(a: int, b: int) -> int:
    return (a + b - 1) // b


def weight_sf_layout(rows: int, cols: int, num_groups: Optional[int], device, dtype=torch.int32) -> torch.Tensor:
    """An empty MN-major TMA-aligned packed layout: (G?, rows, ceil(cols/4)) int32, strides (.., 1, padded rows)."""
    words = _ceil_div(cols, 4)
    padded = _ceil_div(rows, 4) * 4
    g = 1 if num_groups is None else num_groups
    buf = torch.zeros((g, words, padded), dtype=dtype, device=device)
    view = buf.transpose(1, 2)[:, :rows]
    return view[0] if num_groups is None else view


def check_power_of_two_scales(sf: torch.Tensor, name: str) -> None:
    """Raise ValueError naming `name` unless every entry is a positive normal fp32 power of two."""
    bits = sf.contiguous().view(torch.int32)
    exponent = (bits >> 23) & 0xFF
    bad = ((bits & 0x807FFFFF) != 0) | (exponent == 0) | (exponent == 255)
    if bool(bad.any()):
        index = tuple(bad.nonzero()[0].tolist())
        raise ValueError(
            f"{name} must hold positive normal fp32 powers of two (UE8M0 scales); {name}{list(index)} = "
            f"{sf[index].item()!r}"
        )


def _pack_rows(blocks: torch.Tensor, bs: int, out: torch.Tensor) -> torch.Tensor:
    """blocks (G, R, C) exponent bytes -> out (G, R*bs, ceil(C/4)) packed words, rows repeated bs times."""
    g, r, c = blocks.shape
    words = _ceil_div(c, 4)
    padded = torch.zeros((g, r, 4 * words), dtype=torch.int64, device=blocks.device)
    padded[:, :, :c] = blocks
    p = padded.view(g, r, words, 4)
    word = p[..., 0] | (p[..., 1] << 8) | (p[..., 2] << 16) | (p[..., 3] << 24)
    word = torch.where(word >= 2**31, word - 2**32, word).to(torch.int32)
    out.copy_(word.repeat_interleave(bs, dim=1))
    return out


def batched_transpose_weight_sf(
    sf: Sequence[torch.Tensor],
    block_size: int,
    transpose_sf1s: Sequence[bool],
    outs: Optional[Sequence[Optional[Tuple[torch.Tensor, Optional[torch.Tensor]]]]] = None,
) -> List[Tuple[torch.Tensor, Optional[torch.Tensor]]]:
    """For each weight's fp32 power-of-two block scales, the DeepGEMM UE8M0 layouts ``(sf0, sf1)``
    described in the module docstring; ``outs[i]`` (optional) receives them in place."""
    if block_size not in WEIGHT_SF_BLOCK_SIZES or isinstance(block_size, bool):
        raise ValueError(f"block_size must be one of {WEIGHT_SF_BLOCK_SIZES}, got {block_size!r}")
    sf = list(sf)
    transpose_sf1s = list(transpose_sf1s)
    if len(transpose_sf1s) != len(sf):
        raise ValueError(f"transpose_sf1s must have one flag per weight ({len(sf)}), got {len(transpose_sf1s)}")
    outs = [None] * len(sf) if outs is None else list(outs)
    if len(outs) != len(sf):
        raise ValueError(f"outs must have one entry (or None) per weight ({len(sf)}), got {len(outs)}")
    results = []
    for i, (s, transpose, out) in enumerate(zip(sf, transpose_sf1s, outs)):
        if not isinstance(s, torch.Tensor) or s.dtype != torch.float32 or s.dim() not in (2, 3):
            raise TypeError(f"sf[{i}] must be a float32 tensor (n/bs, k/bs) or (G, n/bs, k/bs), got {s!r:.80}")
        check_power_of_two_scales(s, f"sf[{i}]")
        grouped = s.dim() == 3
        s3 = s if grouped else s.unsqueeze(0)
        g, nb, kb = s3.shape
        exps = (s3.contiguous().view(torch.int32) >> 23) & 0xFF
        sf0 = out[0] if out is not None else weight_sf_layout(nb * block_size, kb, g if grouped else None, s.device)
        _pack_rows(exps, block_size, sf0 if grouped else sf0.unsqueeze(0))
        sf1 = None
        if transpose:
            sf1 = out[1] if out is not None else weight_sf_layout(kb * block_size, nb, g if grouped else None, s.device)
            _pack_rows(exps.transpose(1, 2), block_size, sf1 if grouped else sf1.unsqueeze(0))
        results.append((sf0, sf1))
    return results
