"""Plain-PyTorch reference of batched_transpose_weight_sf: fp32 power-of-two weight block scales ->
the packed UE8M0 scale layouts DeepGEMM's FP8 GEMMs read (api.md 1.2.4 and 1.12).

A weight ``W`` (n, k) quantised in (bs, bs) blocks has fp32 scales ``sf`` (n/bs, k/bs), or (G, n/bs, k/bs)
for G grouped weights (MoE experts). Both layouts hold the scales at (1, bs) granularity, one per row
of the operand and per bs-wide block of its contraction dim, as UE8M0 exponent bytes packed four to an
int32 along the contraction dim (unused bytes of a last partial word are zero):

* ``sf0``: the scales of ``W`` as the B operand of the forward GEMM ``x @ W^T`` (contraction over k):
  int32 (n, ceil(k/bs/4)) MN-major, the transposed view of a (ceil(k/bs/4), n) buffer (strides (1, n));
  byte j of word w of row i is the exponent byte of ``sf[i // bs, 4w + j]``.
* ``sf1``: the scales of ``W^T`` (k, n), the B operand of the backward GEMM ``dy @ W`` (contraction over
  n), in a (ceil(n/bs/4), k) buffer: byte j of word w at column i is the exponent byte of
  ``sf[4w + j, i // bs]``. With ``transpose_sf1`` it is returned as that buffer itself (strides (k, 1)),
  without as its transposed (k, ceil(n/bs/4)) MN-major view (strides (1, k)).

Grouped: the same per group, (G, ...) with the group stride the buffer's size. n = n/bs * bs and
k = k/bs * bs are multiples of bs (32 or 128), so the MN-major buffers need no TMA padding. On an
NPU the words are int16 of two bytes (the original's Ascend packing; utils.ue8m0_word). The
exponent byte of an fp32 power of two ``2^e`` is ``e + 127`` (its fp32 exponent field); any other scale
(not a positive normal power of two) is an error.
"""

from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import torch

from tilebake import utils
from tilebake.torch.cast_formats import pack_ue8m0
from tilebake.utils import ceil_div

__all__ = ["batched_transpose_weight_sf", "weight_sf_layout", "sf1_layout", "sf_shapes"]

WEIGHT_SF_BLOCK_SIZES = (32, 128)


def weight_sf_layout(rows: int, cols: int, num_groups: Optional[int], device) -> torch.Tensor:
    """An empty MN-major packed layout: the (G?, rows, ceil(cols/n)) transposed view of a
    (G?, ceil(cols/n), rows) buffer of utils.ue8m0_word(device) words of n bytes, strides
    (.., 1, rows). Uninitialised: every word is written."""
    dtype, per_word = utils.ue8m0_word(torch.device(device))
    words = ceil_div(cols, per_word)
    g = 1 if num_groups is None else num_groups
    view = torch.empty((g, words, rows), dtype=dtype, device=device).transpose(1, 2)
    return view[0] if num_groups is None else view


def sf1_layout(nb: int, k: int, num_groups: Optional[int], transpose: bool, device) -> torch.Tensor:
    """An empty sf1 as returned: the (G?, ceil(nb/4), k) buffer when `transpose`, else its
    (G?, k, ceil(nb/4)) transposed view."""
    view = weight_sf_layout(k, nb, num_groups, device)
    return view.transpose(-1, -2) if transpose else view


def sf_shapes(s: torch.Tensor, block_size: int, transpose: bool) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The shapes of (sf0, sf1) for the scales `s` (n/bs, k/bs) or (G, n/bs, k/bs)."""
    *groups, nb, kb = s.shape
    n, k = nb * block_size, kb * block_size
    per_word = utils.ue8m0_word(s.device)[1]
    sf1 = (ceil_div(nb, per_word), k) if transpose else (k, ceil_div(nb, per_word))
    return (*groups, n, ceil_div(kb, per_word)), (*groups, *sf1)


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
    """blocks (G, R, C) exponent bytes -> out (G, R*bs, ceil(C/n)) words of n bytes (cast_formats.
    pack_ue8m0: int32 of four, or int16 of two on an NPU), rows repeated bs times."""
    g, r, c = blocks.shape
    words = pack_ue8m0(blocks.reshape(g * r, c))
    words = words.view(g, r, words.shape[1])
    out.copy_(words.repeat_interleave(bs, dim=1))
    return out


def batched_transpose_weight_sf(
    sf: Sequence[torch.Tensor],
    block_size: int,
    transpose_sf1s: Sequence[bool],
    outs: Optional[Sequence[Optional[Tuple[Optional[torch.Tensor], Optional[torch.Tensor]]]]] = None,
) -> List[Tuple[torch.Tensor, torch.Tensor]]:
    """For each weight's fp32 power-of-two block scales, the DeepGEMM UE8M0 layouts ``(sf0, sf1)``
    described in the module docstring. ``outs[i]`` (optional) is None or a pair whose tensors (of
    the returned shapes, any strides) receive them and are returned themselves; a None part is
    allocated."""
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
        groups = g if grouped else None
        sf0, sf1 = (None, None) if out is None else out
        if sf0 is None:
            sf0 = weight_sf_layout(nb * block_size, kb, groups, s.device)
        if sf1 is None:
            sf1 = sf1_layout(nb, kb * block_size, groups, transpose, s.device)
        exps = (s3.contiguous().view(torch.int32) >> 23) & 0xFF
        _pack_rows(exps, block_size, sf0 if grouped else sf0.unsqueeze(0))
        sf1_rows = sf1.transpose(-1, -2) if transpose else sf1  # (G?, k, words) either way
        _pack_rows(exps.transpose(1, 2), block_size, sf1_rows if grouped else sf1_rows.unsqueeze(0))
        results.append((sf0, sf1))
    return results
