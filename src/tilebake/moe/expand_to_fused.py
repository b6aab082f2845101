"""expand_to_fused, expand_to_fused_with_sf (TileKernels 1.0, api.md 1.11): scatter token rows
(and their SF rows) into the expert-major fused layout of get_fused_mapping.

Validate, allocate, launch. Kernel: kernels_tl/moe/expand_to_fused.py (rows moved as bytes, so
one binary serves every dtype); reference and CPU path: tilebake.torch.mapping.
"""

from __future__ import annotations

import dataclasses

import torch

from tilebake._checks import check_device
from tilebake._runtime import plan
from tilebake._runtime.loader import KernelTable
from tilebake._variants import Variant, i32, ptr
from tilebake.moe._common import alloc_fused_sf, check_positions, check_quant_input
from tilebake.utils import ceil_div

ROWS_PER_CTA = 8  # tokens a CTA covers (kernels_tl/moe/expand_to_fused.py)
PADDING_CHUNKS_PER_CTA = 8  # position chunks of ROWS_PER_CTA a CTA checks for padding, at most


@dataclasses.dataclass(frozen=True)
class ExpandToFusedVariant(Variant):
    family = "moe"
    op = "expand_to_fused"

    with_sf: bool  # also move the SF rows (expand_to_fused_with_sf)

    @classmethod
    def all(cls):
        return (cls(False), cls(True))

    def params(self):
        return _PARAMS + (_SF_PARAMS if self.with_sf else ())


_PARAMS = ptr("X", "Y", "P", "E") + i32(
    "grid_rows", "num_tokens", "num_expanded", "num_topk", "row_words", "x_stride", "y_stride"
)
_SF_PARAMS = ptr("XS", "YS") + i32("sf_cols", "xs_stride_t", "xs_stride_c", "ys_stride_t", "ys_stride_c")


_KERNELS = KernelTable(ExpandToFusedVariant)


def _check_data(x: torch.Tensor, name: str) -> int:
    """Row bytes of a (T, cols) matrix the kernel moves as 16-byte vectors."""
    if x.dim() != 2:
        raise ValueError(f"{name} must be 2-D (num_tokens, hidden), got shape {tuple(x.shape)}")
    check_device(x, name)  # an NPU tensor takes the reference path
    row_bytes = x.shape[1] * x.element_size()
    if row_bytes % 16:
        raise ValueError(
            f"{name}'s rows must be a multiple of 16 bytes (hidden a multiple of {16 // x.element_size()} for "
            f"{x.dtype}), got {x.shape[1]} elements of {x.element_size()} bytes"
        )
    if x.shape[1] > 1 and x.stride(1) != 1:
        raise ValueError(f"{name} must be contiguous in its last dim, got strides {x.stride()}")
    if x.shape[0] > 1 and (x.stride(0) * x.element_size()) % 16:
        raise ValueError(f"{name}'s row stride must be a multiple of 16 bytes, got strides {x.stride()}")
    return row_bytes


def _check_maps(x, token_topk_to_pos, pos_to_expert) -> tuple[int, int]:
    num_topk, num_expanded = check_positions(token_topk_to_pos, pos_to_expert, x.shape[0])
    for t, name in ((token_topk_to_pos, "token_topk_to_pos"), (pos_to_expert, "pos_to_expert")):
        if t.device != x.device:
            raise ValueError(f"{name} must be on x's device {x.device}, got {t.device}")
    return num_topk, num_expanded


def _launch_rows(x, out, token_topk_to_pos, pos_to_expert, sf=None, out_sf=None) -> None:
    num_tokens, num_expanded = x.shape[0], out.shape[0]
    if max(num_tokens, num_expanded) == 0:
        return
    for address, name in ((x.data_ptr(), "x"), (out.data_ptr(), "out")):
        if address % 16:
            raise ValueError(f"{name} must start at a 16-byte aligned address, got {address:#x}")
    row_words = x.shape[1] * x.element_size() // 4
    if row_words == 0:  # no columns: nothing to move (and no SF columns either)
        return
    word = x.element_size()
    # Every token chunk gets a CTA; more CTAs only where the padding check would otherwise take
    # a CTA more than PADDING_CHUNKS_PER_CTA chunks.
    grid_rows = max(ceil_div(num_tokens, ROWS_PER_CTA), ceil_div(num_expanded, ROWS_PER_CTA * PADDING_CHUNKS_PER_CTA))
    args = (
        x.data_ptr(), out.data_ptr(), token_topk_to_pos.data_ptr(), pos_to_expert.data_ptr(),
        grid_rows, num_tokens, num_expanded, token_topk_to_pos.shape[1], row_words,
        x.stride(0) * word // 4, out.stride(0) * word // 4,
    )  # fmt: skip
    if sf is None:
        _KERNELS[False,](x.get_device(), *args)
        return
    _KERNELS[True,](
        x.get_device(), *args, sf.data_ptr(), out_sf.data_ptr(), sf.shape[1],
        sf.stride(0), sf.stride(1), out_sf.stride(0), out_sf.stride(1),
    )  # fmt: skip


def expand_to_fused(x: torch.Tensor, token_topk_to_pos: torch.Tensor, pos_to_expert: torch.Tensor) -> torch.Tensor:
    """Copy each token's row x[t] to its rows token_topk_to_pos[t, j] of the fused layout.

    Args:
        x: (T, H) of any dtype; rows a multiple of 16 bytes (bf16: H % 8 == 0), last dim
            contiguous, row stride a multiple of 16 bytes.
        token_topk_to_pos: int32 (T, k), contiguous (get_fused_mapping's); -1 (or any row outside
            [0, N)) skips the slot.
        pos_to_expert: int32 (N,), contiguous; N is the output's row count, and rows with
            pos_to_expert < 0 (padding) are written as zeros.

    Returns:
        (N, H) of x's dtype. A row with pos_to_expert >= 0 must be the target of exactly one slot
        (as get_fused_mapping makes them); otherwise its content is unspecified. CPU tensors take
        the reference path (tilebake.torch.expand_to_fused).
    """
    if not torch.compiler.is_compiling():  # dynamo can neither hash the key nor trace the native call
        try:  # the native path (moe/_plans_mapping.py); NotImplemented: the Python path below
            call = _PLANS[x.dtype]
        except (KeyError, AttributeError, TypeError):
            pass
        else:
            result = plan.run(call, x, token_topk_to_pos, pos_to_expert)
            if result is not NotImplemented:
                return result
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    _check_data(x, "x")
    _, num_expanded = _check_maps(x, token_topk_to_pos, pos_to_expert)
    if not x.is_cuda:
        from tilebake.torch.mapping import expand_to_fused as reference

        return reference(x, token_topk_to_pos, pos_to_expert)
    out = x.new_empty((num_expanded, x.shape[1]))
    _launch_rows(x, out, token_topk_to_pos, pos_to_expert)
    if x.dtype not in _PLANS and x.shape[0] and x.shape[1] and x.dtype in PLAN_DTYPES:
        from tilebake.moe._plans_mapping import expand_plan

        plan.remember(_PLANS, x.dtype, expand_plan, _KERNELS[False,], x.get_device(), x.dtype)
    return out


_PLANS = plan.cache()
# The dtypes whose calls get plans (those a plan can describe; rows as 16-byte multiples).
PLAN_DTYPES = (
    torch.bfloat16, torch.float16, torch.float32, torch.float8_e4m3fn, torch.float8_e5m2, torch.int8, torch.uint8,
    torch.int32, torch.int64,
)  # fmt: skip


def expand_to_fused_with_sf(
    x,
    num_per_channels: int,
    token_topk_to_pos: torch.Tensor,
    pos_to_expert: torch.Tensor,
    use_tma_aligned_col_major_sf: bool = False,
):
    """expand_to_fused of a quantized tensor x = (data, sf): data rows and SF rows alike.

    Args:
        x: data float8_e4m3fn (T, H) or int8 packed e2m1 (T, H/2), rows as for expand_to_fused;
            sf fp32 (T, ceil(H/npc)) or packed UE8M0 int32 (T, ceil(ceil(H/npc)/4)), any strides
            (row-major, or per_token_cast's column-major view).
        num_per_channels: the SF block width (16, 32, 64 or 128); it fixes the SF column count.
        token_topk_to_pos, pos_to_expert: as for expand_to_fused.
        use_tma_aligned_col_major_sf: return the SF column-major, its row dim padded to a
            multiple of 4, as an (N, cols) view with strides (1, align(N, 4)); else row-major.
            (The original required it for packed UE8M0 SF; here either layout works for both.)

    Returns:
        (data (N, ...), sf (N, cols)), padding rows zero in both.
    """
    # The native path (moe/_plans_mapping.py); NotImplemented: the Python path below. The key
    # holds len(x): a plan reads the two items, the Python path wants exactly two.
    if not torch.compiler.is_compiling():  # dynamo can neither hash the key nor trace the native call
        try:
            call = _SF_PLANS[len(x), x[0].dtype, x[1].dtype, num_per_channels, use_tma_aligned_col_major_sf]
        except (KeyError, AttributeError, TypeError, IndexError):
            pass
        else:
            result = plan.run(call, x, token_topk_to_pos, pos_to_expert)
            if result is not NotImplemented:
                return result
    data, sf = check_quant_input(x, num_per_channels)
    _check_data(data, "x[0]")
    _, num_expanded = _check_maps(data, token_topk_to_pos, pos_to_expert)
    if not data.is_cuda:
        from tilebake.torch.mapping import expand_to_fused_with_sf as reference

        return reference(x, num_per_channels, token_topk_to_pos, pos_to_expert, use_tma_aligned_col_major_sf)
    out = data.new_empty((num_expanded, data.shape[1]))
    out_sf = alloc_fused_sf(sf, num_expanded, bool(use_tma_aligned_col_major_sf))
    _launch_rows(data, out, token_topk_to_pos, pos_to_expert, sf, out_sf)
    plan_key = (2, data.dtype, sf.dtype, num_per_channels, use_tma_aligned_col_major_sf)
    if isinstance(use_tma_aligned_col_major_sf, bool) and plan_key not in _SF_PLANS and data.shape[0] and data.shape[1]:
        from tilebake.moe._plans_mapping import expand_with_sf_plan

        plan.remember(
            _SF_PLANS, plan_key,
            expand_with_sf_plan, _KERNELS[True,], data.get_device(), data.dtype, sf.dtype, num_per_channels,
            bool(use_tma_aligned_col_major_sf),
        )  # fmt: skip
    return out, out_sf


_SF_PLANS = plan.cache()
