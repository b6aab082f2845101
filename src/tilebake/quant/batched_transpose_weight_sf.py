"""batched_transpose_weight_sf: fp32 power-of-two weight block scales -> DeepGEMM UE8M0 layouts.

Validate, allocate, launch (two launches per weight at most: sf0, and sf1 when transposed). The kernel
is kernels_tl/quant/batched_transpose_weight_sf.py; the reference (and the CPU path) and the full
description of the layouts (an interpretation of the thin spec) are in src/tilebake/torch/weight_sf.py.
"""

from __future__ import annotations

import dataclasses
from typing import List, Optional, Sequence, Tuple

import torch

from tilebake._runtime.loader import KernelTable
from tilebake._variants import Variant
from tilebake.torch.weight_sf import WEIGHT_SF_BLOCK_SIZES, check_power_of_two_scales, weight_sf_layout
from tilebake.utils import ceil_div


@dataclasses.dataclass(frozen=True)
class BatchedTransposeWeightSfVariant(Variant):
    family = "quant"
    op = "batched_transpose_weight_sf"

    in_dtype: str  # 'fp32': the only input; block size, shapes and layouts are runtime

    @classmethod
    def all(cls):
        return (cls("fp32"),)


_KERNELS = KernelTable(
    BatchedTransposeWeightSfVariant,
    (
        "SF", "OUT", "num_words_total", "rows", "words", "cols", "shift", "in_stride_g", "in_stride_r",
        "in_stride_c", "out_stride_g", "out_stride_r", "out_stride_w",
    ),
)  # fmt: skip


def _check_out(t, name: str, rows: int, cols: int, num_groups: Optional[int], like: torch.Tensor) -> torch.Tensor:
    shape = (rows, ceil_div(cols, 4)) if num_groups is None else (num_groups, rows, ceil_div(cols, 4))
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype != torch.int32:
        raise TypeError(f"{name} must be torch.int32 (packed UE8M0), got {t.dtype}")
    if tuple(t.shape) != shape:
        raise ValueError(f"{name} must have shape {shape}, got {tuple(t.shape)}")
    if t.device != like.device:
        raise ValueError(f"{name} must be on {like.device}, got {t.device}")
    return t


def _launch(src: torch.Tensor, out: torch.Tensor, bs: int, transpose: bool) -> None:
    """src (G, R, C) fp32 block scales -> out (G, R*bs, ceil(C/4)) words; transpose reads src as (G, C, R)."""
    g, r, c = src.shape
    sg, sr, sc = src.stride()
    if transpose:
        r, c, sr, sc = c, r, sc, sr
    rows, words = r * bs, ceil_div(c, 4)
    total = g * rows * words
    if total == 0:
        return
    og, orow, ow = out.stride()
    _KERNELS["fp32",](
        src.get_device(),
        src.data_ptr(), out.data_ptr(), total, rows, words, c, bs.bit_length() - 1, sg, sr, sc, og, orow, ow,
    )  # fmt: skip


def batched_transpose_weight_sf(
    sf: Sequence[torch.Tensor],
    block_size: int,
    transpose_sf1s: Sequence[bool],
    outs: Optional[Sequence[Optional[Tuple[torch.Tensor, Optional[torch.Tensor]]]]] = None,
) -> List[Tuple[torch.Tensor, Optional[torch.Tensor]]]:
    """Transform per-weight fp32 power-of-two block scales into DeepGEMM's UE8M0 layouts.

    Interpretation of the original's one-line spec (details in tilebake.torch.weight_sf): for a
    weight W (n, k) with scales sf[i] (n/bs, k/bs) (or (G, n/bs, k/bs) for G experts):

    * sf0: W's scales at (1, bs) granularity, UE8M0 bytes packed 4 to an int32 along K, MN-major
      and TMA-aligned: int32 (n, ceil(k/bs/4)) with strides (1, align(n, 4)) (grouped: (G, n, ..)).
    * sf1: if transpose_sf1s[i], the same for W^T: int32 (k, ceil(n/bs/4)); otherwise None.

    Args:
        sf: fp32 tensors (any strides) of positive normal powers of two; anything else raises
            ValueError naming the entry (checked on the host: one sync; this is a weight-load op).
        block_size: bs, 32 or 128.
        transpose_sf1s: one bool per weight.
        outs: optional, one entry per weight: None, or (sf0, sf1) int32 tensors of the shapes above
            (any strides; sf1 None when not transposed), written in place.

    Returns:
        [(sf0, sf1)] per weight. CPU tensors take the reference path.
    """
    if block_size not in WEIGHT_SF_BLOCK_SIZES or isinstance(block_size, bool):
        raise ValueError(f"block_size must be one of {WEIGHT_SF_BLOCK_SIZES}, got {block_size!r}")
    sf, transpose_sf1s = list(sf), list(transpose_sf1s)
    if len(transpose_sf1s) != len(sf):
        raise ValueError(f"transpose_sf1s must have one flag per weight ({len(sf)}), got {len(transpose_sf1s)}")
    outs = [None] * len(sf) if outs is None else list(outs)
    if len(outs) != len(sf):
        raise ValueError(f"outs must have one entry (or None) per weight ({len(sf)}), got {len(outs)}")
    for i, (s, transpose, out) in enumerate(zip(sf, transpose_sf1s, outs)):
        if not isinstance(transpose, bool):
            raise TypeError(f"transpose_sf1s[{i}] must be a bool, got {transpose!r}")
        if not isinstance(s, torch.Tensor):
            raise TypeError(f"sf[{i}] must be a torch.Tensor, got {type(s).__name__}")
        if s.dtype != torch.float32:
            raise TypeError(f"sf[{i}] must be torch.float32, got {s.dtype}")
        if s.dim() not in (2, 3):
            raise ValueError(f"sf[{i}] must be (n/bs, k/bs) or (G, n/bs, k/bs), got shape {tuple(s.shape)}")
        if not (s.is_cuda or s.is_cpu):
            raise ValueError(f"sf[{i}] must be on a CUDA device or the CPU, got {s.device}")
        groups = s.shape[0] if s.dim() == 3 else None
        nb, kb = s.shape[-2:]
        if out is not None:
            if not isinstance(out, (tuple, list)) or len(out) != 2:
                raise TypeError(f"outs[{i}] must be None or a (sf0, sf1) pair, got {type(out).__name__}")
            _check_out(out[0], f"outs[{i}][0]", nb * block_size, kb, groups, s)
            if transpose:
                _check_out(out[1], f"outs[{i}][1]", kb * block_size, nb, groups, s)
            elif out[1] is not None:
                raise ValueError(f"outs[{i}][1] must be None when transpose_sf1s[{i}] is False")
        # One host sync; impossible while a CUDA graph is captured, where the kernel instead
        # writes the UE8M0 NaN byte 0xFF for a bad scale.
        if not (s.is_cuda and torch.cuda.is_current_stream_capturing()):
            check_power_of_two_scales(s, f"sf[{i}]")

    if not all(s.is_cuda for s in sf):
        from tilebake.torch import batched_transpose_weight_sf as reference

        return reference(sf, block_size, transpose_sf1s, outs)

    results = []
    for s, transpose, out in zip(sf, transpose_sf1s, outs):
        groups = s.shape[0] if s.dim() == 3 else None
        nb, kb = s.shape[-2:]
        s3 = s if groups is not None else s.unsqueeze(0)
        if out is not None:
            sf0, sf1 = out
        else:
            sf0 = weight_sf_layout(nb * block_size, kb, groups, s.device)
            sf1 = weight_sf_layout(kb * block_size, nb, groups, s.device) if transpose else None
        _launch(s3, sf0 if groups is not None else sf0.unsqueeze(0), block_size, False)
        if transpose:
            _launch(s3, sf1 if groups is not None else sf1.unsqueeze(0), block_size, True)
        results.append((sf0, sf1))
    return results
