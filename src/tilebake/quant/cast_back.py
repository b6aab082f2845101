"""cast_back / per_token_cast_back: dequantise per-token FP8 e4m3 blocks to bf16 or fp32.

Validate, allocate, launch. The kernel is kernels_tl/quant/cast_back.py; the reference
(and the CPU path) is tilebake.torch.cast_back.
"""

from __future__ import annotations

import dataclasses
import itertools

import torch

from tilebake._runtime.loader import KernelTable
from tilebake._variants import Variant
from tilebake.quant._common import (
    NUM_PER_CHANNELS,
    QuantTensor,
    check_aligned,
    check_fmt,
    check_num_per_channels,
    check_out_sf,
    check_rows,
    sf_strides_for_kernel,
)
from tilebake.utils import ceil_div


@dataclasses.dataclass(frozen=True)
class CastBackVariant(Variant):
    family = "quant"
    op = "cast_back"

    out_dtype: str  # 'bf16' | 'fp32'
    num_per_channels: int
    packed_ue8m0: bool  # SF given as UE8M0 bytes packed 4 to an int32

    @classmethod
    def all(cls):
        return tuple(
            cls(out_dtype, npc, packed)
            for out_dtype, npc, packed in itertools.product(("bf16", "fp32"), NUM_PER_CHANNELS, (False, True))
        )


_OUT_DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}
_KEYS: dict[tuple, int] = {}  # validated (fmt, x_block_size, x_special_fmt) -> num_per_channels


def _key_of(fmt, x_block_size, x_special_fmt) -> int:
    """Check the non-tensor arguments; remember the valid combination."""
    if x_special_fmt is not None:
        raise ValueError(f"x_special_fmt is reserved and must be None, got {x_special_fmt!r}")
    check_fmt(fmt, tuple(_OUT_DTYPES))
    try:
        block_m, num_per_channels = x_block_size
    except (TypeError, ValueError):
        raise ValueError(f"x_block_size must be a pair (1, num_per_channels), got {x_block_size!r}") from None
    if block_m != 1:
        raise NotImplementedError(
            f"x_block_size must be (1, num_per_channels) (per-block input is not built yet), got {x_block_size!r}"
        )
    check_num_per_channels(num_per_channels)
    try:
        _KEYS[fmt, x_block_size, x_special_fmt] = num_per_channels
    except TypeError:  # an unhashable x_block_size (a list) is valid, just not cached
        pass
    return num_per_channels


_KERNELS = KernelTable(
    CastBackVariant, ("X", "S", "Y", "num_tokens", "hidden", "x_stride", "sf_stride_t", "sf_stride_g")
)


def cast_back(x: QuantTensor, fmt: str, x_block_size, x_special_fmt=None) -> torch.Tensor:
    """Dequantise `x = (data, sf)`: y = data * sf per block, rounded to `fmt`.

    Args:
        x: data e4m3 (T, H) (last dim contiguous, rows 16-byte aligned, H a multiple of
            16) and its SF: fp32 (T, ceil(H/npc)) or packed UE8M0 int32
            (T, ceil(ceil(H/npc)/4)), row-major or TMA-aligned column-major (any strides).
        fmt: output format, 'bf16' or 'fp32'.
        x_block_size: the SF block, (1, num_per_channels) with num_per_channels in 16, 32, 64, 128.
        x_special_fmt: reserved, must be None.
    """
    # Validate: the non-tensor arguments once per combination, the tensors every call.
    try:
        num_per_channels = _KEYS[fmt, x_block_size, x_special_fmt]
    except (KeyError, TypeError):
        num_per_channels = _key_of(fmt, x_block_size, x_special_fmt)
    try:
        data, sf = x
    except (TypeError, ValueError):
        raise TypeError("x must be a (data, sf) tuple of tensors") from None
    if not (isinstance(data, torch.Tensor) and data.dtype == torch.float8_e4m3fn):
        if not isinstance(data, torch.Tensor):
            raise TypeError("x must be a (data, sf) tuple of tensors")
        raise NotImplementedError(f"x[0] must be float8_e4m3fn (e2m1 input is not built yet), got {data.dtype}")
    num_tokens, hidden = check_rows(data, "x[0]", hidden_multiple=16)
    packed = isinstance(sf, torch.Tensor) and sf.dtype == torch.int32
    check_out_sf(sf, "x[1]", num_tokens, ceil_div(hidden, num_per_channels), packed, data)
    if torch.compiler.is_compiling():
        return torch.ops.tilebake.cast_back(data, sf, fmt, num_per_channels)

    if not data.is_cuda:  # the slow path: the reference allocates its own (contiguous) output
        from tilebake.torch import cast_back as reference

        return reference((data, sf), "e4m3", (1, num_per_channels), out_dtype=_OUT_DTYPES[fmt]).contiguous()

    # Allocate, then launch.
    out = data.new_empty((num_tokens, hidden), dtype=_OUT_DTYPES[fmt])
    if num_tokens == 0:
        return out
    data_ptr = data.data_ptr()
    if data_ptr % 16:
        check_aligned(data_ptr, "x[0]")
    sf_stride_t, sf_stride_g = sf_strides_for_kernel(sf, packed)
    _KERNELS[fmt, num_per_channels, packed](
        data.get_device(),
        data_ptr, sf.data_ptr(), out.data_ptr(), num_tokens, hidden, data.stride(0), sf_stride_t, sf_stride_g,
    )  # fmt: skip
    return out


def per_token_cast_back(x: QuantTensor, fmt: str, num_per_channels: int, x_special_fmt=None) -> torch.Tensor:
    """`cast_back` with SF blocks of (1, num_per_channels)."""
    return cast_back(x, fmt, (1, num_per_channels), x_special_fmt)


# --- torch.library: lets torch.compile(fullgraph=True) trace the op; eager calls skip it ---

_lib = torch.library.Library("tilebake", "FRAGMENT")
_lib.define("cast_back(Tensor data, Tensor sf, str fmt, int num_per_channels) -> Tensor")
for _key in ("CPU", "CUDA"):
    _lib.impl("cast_back", lambda data, sf, fmt, npc: cast_back((data, sf), fmt, (1, npc)), _key)
# The shape function as a Meta kernel, what torch.compile's fake tensors run.
_lib.impl("cast_back", lambda data, sf, fmt, npc: data.new_empty(data.shape, dtype=_OUT_DTYPES[fmt]), "Meta")
