"""batched_transpose_weight_sf: fp32 power-of-two weight block scales -> DeepGEMM UE8M0 layouts.

Validate, allocate, launch (two launches per weight: sf0 and sf1, the same kernel reading the
scales through swapped strides). The kernel is kernels_tl/quant/batched_transpose_weight_sf.py; the
reference (and the CPU path) and the full description of the layouts are in
src/tilebake/torch/weight_sf.py.
"""

from __future__ import annotations

import dataclasses
from typing import List, Optional, Sequence, Tuple

import torch

from tilebake._runtime.loader import KernelTable
from tilebake._variants import Variant, i32, ptr
from tilebake.torch.weight_sf import (
    WEIGHT_SF_BLOCK_SIZES,
    check_power_of_two_scales,
    sf1_layout,
    sf_shapes,
    weight_sf_layout,
)
from tilebake.utils import ceil_div


@dataclasses.dataclass(frozen=True)
class BatchedTransposeWeightSfVariant(Variant):
    family = "quant"
    op = "batched_transpose_weight_sf"
    PARAMS = (
        ptr("SF", "OUT")
        + i32(
            "num_words_total", "rows", "words", "cols", "shift", "in_stride_g", "in_stride_r", "in_stride_c",
            "out_stride_g", "out_stride_r", "out_stride_w"
        )
    )  # fmt: skip

    in_dtype: str  # 'fp32': the only input; block size, shapes and layouts are runtime

    @classmethod
    def all(cls):
        return (cls("fp32"),)


_KERNELS = KernelTable(BatchedTransposeWeightSfVariant)


def _check_out(t, name: str, shape: tuple[int, ...], like: torch.Tensor) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor (or None), got {type(t).__name__}")
    if t.dtype != torch.int32:
        raise TypeError(f"{name} must be torch.int32 (packed UE8M0), got {t.dtype}")
    if tuple(t.shape) != shape:
        raise ValueError(f"{name} must have shape {shape}, got {tuple(t.shape)}")
    if t.device != like.device:
        raise ValueError(f"{name} must be on {like.device}, got {t.device}")


def _launch(src: torch.Tensor, out: torch.Tensor, bs: int, transpose: bool, kernels) -> None:
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
    kernels["fp32",](
        src.get_device(),
        src.data_ptr(), out.data_ptr(), total, rows, words, c, bs.bit_length() - 1, sg, sr, sc, og, orow, ow,
    )  # fmt: skip


def batched_transpose_weight_sf(
    sf: Sequence[torch.Tensor],
    block_size: int,
    transpose_sf1s: Sequence[bool],
    outs: Optional[Sequence[Optional[Tuple[Optional[torch.Tensor], Optional[torch.Tensor]]]]] = None,
) -> List[Tuple[torch.Tensor, torch.Tensor]]:
    """Transform per-weight fp32 power-of-two block scales into DeepGEMM's UE8M0 layouts.

    For a weight W (n, k) with scales sf[i] (n/bs, k/bs) (or (G, n/bs, k/bs) for G experts; the
    same per group), both layouts hold UE8M0 bytes packed 4 to an int32 (details in
    tilebake.torch.weight_sf):

    * sf0: W's scales at (1, bs) granularity, packed along K: int32 (n, ceil(k/bs/4)) MN-major,
      the transposed view of a (ceil(k/bs/4), n) buffer (strides (1, n); grouped (G, n, ..)).
    * sf1: W^T's, packed along N, in a (ceil(n/bs/4), k) buffer: that buffer itself when
      transpose_sf1s[i] (strides (k, 1)), else its transposed (k, ceil(n/bs/4)) view (strides
      (1, k)).

    Unlike the original, n and k need not be multiples of 128, the scales may have any strides,
    and outs is optional.

    Args:
        sf: fp32 tensors (any strides) of positive normal powers of two; anything else raises
            ValueError naming the entry (checked on the host: one sync; this is a weight-load op).
        block_size: bs, 32 or 128.
        transpose_sf1s: one bool per weight.
        outs: optional, one entry per weight: None, or a (sf0, sf1) pair of int32 tensors of the
            returned shapes (any strides), filled in place and returned themselves; a None part
            is allocated.

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
        if out is not None:
            if not isinstance(out, (tuple, list)) or len(out) != 2:
                raise TypeError(f"outs[{i}] must be None or a (sf0, sf1) pair, got {type(out).__name__}")
            for j, (t, shape) in enumerate(zip(out, sf_shapes(s, block_size, transpose))):
                if t is not None:
                    _check_out(t, f"outs[{i}][{j}]", shape, s)
        # One host sync; impossible while a CUDA graph is captured, where the kernel instead
        # writes the UE8M0 NaN byte 0xFF for a bad scale.
        if not (s.is_cuda and torch.cuda.is_current_stream_capturing()):
            check_power_of_two_scales(s, f"sf[{i}]")

    if not all(s.is_cuda for s in sf):
        from tilebake.torch import batched_transpose_weight_sf as reference

        return reference(sf, block_size, transpose_sf1s, outs)

    return [transform(s, block_size, transpose, out) for s, transpose, out in zip(sf, transpose_sf1s, outs)]


def transform(s: torch.Tensor, block_size: int, transpose: bool, out, kernels=_KERNELS):
    """One weight's (sf0, sf1) (checked arguments): two launches. `kernels`: the loader's table,
    or a stand-in with the same call (tests run the kernel's C++ on the CPU through one)."""
    groups = s.shape[0] if s.dim() == 3 else None
    nb, kb = s.shape[-2:]
    sf0, sf1 = (None, None) if out is None else out
    if sf0 is None:
        sf0 = weight_sf_layout(nb * block_size, kb, groups, s.device)
    if sf1 is None:
        sf1 = sf1_layout(nb, kb * block_size, groups, transpose, s.device)
    # The kernel writes (G, rows, words) views: sf0 and sf1's (k, words) orientation.
    sf1_rows = sf1.transpose(-1, -2) if transpose else sf1
    if groups is None:
        s, sf0_rows, sf1_rows = s.unsqueeze(0), sf0.unsqueeze(0), sf1_rows.unsqueeze(0)
    else:
        sf0_rows = sf0
    _launch(s, sf0_rows, block_size, False, kernels)
    _launch(s, sf1_rows, block_size, True, kernels)
    return sf0, sf1
