"""per_token_cast: row-wise (1 x num_per_channels) block quantisation to FP8 e4m3.

Validate, allocate, launch. The kernel is kernels_tl/quant/per_token_cast.py; the
reference (and the CPU path) is tilebake.torch.cast with block (1, num_per_channels).
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Optional

import torch

from tilebake import config
from tilebake._runtime.loader import KernelTable
from tilebake._variants import Variant
from tilebake.quant._common import (
    NUM_PER_CHANNELS,
    QuantTensor,
    alloc_sf,
    check_aligned,
    check_fmt,
    check_num_per_channels,
    check_out_data,
    check_out_sf,
    check_rows,
    check_sf_options,
    sf_strides_for_kernel,
)
from tilebake.utils import ceil_div


@dataclasses.dataclass(frozen=True)
class PerTokenCastVariant(Variant):
    family = "quant"
    op = "per_token_cast"

    in_dtype: str  # 'bf16' | 'fp32'
    num_per_channels: int
    round_sf: bool
    packed_ue8m0: bool  # SF as UE8M0 bytes packed 4 to an int32 (needs round_sf)

    @classmethod
    def all(cls):
        return tuple(
            cls(in_dtype, npc, round_sf, packed)
            for in_dtype, npc, (round_sf, packed) in itertools.product(
                ("bf16", "fp32"), NUM_PER_CHANNELS, ((False, False), (True, False), (True, True))
            )
        )


_IN_DTYPES = {torch.bfloat16: "bf16", torch.float32: "fp32"}
_KEYS: dict[tuple, tuple] = {}  # validated (dtype, fmt, npc, round_sf, packed) -> variant key


def _key_of(x, fmt, num_per_channels, round_sf, use_packed_ue8m0) -> tuple:
    """Check the non-tensor arguments (and x's type and dtype); remember the valid combination."""
    if not isinstance(x, torch.Tensor):
        if isinstance(x, tuple):
            raise NotImplementedError("per_token_cast of an already quantized input (x_block_size) is not built yet")
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    in_dtype = _IN_DTYPES.get(x.dtype)
    if in_dtype is None:
        raise TypeError(f"x must be bfloat16 or float32, got {x.dtype}")
    check_fmt(fmt, ("e4m3",))
    check_num_per_channels(num_per_channels)
    check_sf_options(round_sf, use_packed_ue8m0)
    key = (in_dtype, num_per_channels, bool(round_sf), bool(use_packed_ue8m0))
    _KEYS[x.dtype, fmt, num_per_channels, round_sf, use_packed_ue8m0] = key
    return key


def _check_out(out, x, num_tokens, hidden, num_per_channels, use_packed_ue8m0) -> None:
    data, sf = out
    check_out_data(data, "out[0]", (num_tokens, hidden), torch.float8_e4m3fn, x)
    check_out_sf(sf, "out[1]", num_tokens, ceil_div(hidden, num_per_channels), use_packed_ue8m0, x)


def _reject_unbuilt(x_block_size, use_e4m3_sf, stochastic_cast):
    if x_block_size is not None:
        raise NotImplementedError("per_token_cast of an already quantized input (x_block_size) is not built yet")
    if use_e4m3_sf:
        raise NotImplementedError("use_e4m3_sf=True is not built yet; use fp32 or UE8M0 scale factors")
    raise NotImplementedError("stochastic_cast=True is not built yet")


_KERNELS = KernelTable(
    PerTokenCastVariant,
    ("X", "Y", "S", "amax_clamp", "num_tokens", "hidden", "x_stride", "y_stride", "sf_stride_t", "sf_stride_g"),
)


def per_token_cast(
    x: torch.Tensor,
    fmt: str,
    num_per_channels: int,
    x_block_size=None,
    use_tma_aligned_col_major_sf: bool = False,
    round_sf: bool = False,
    use_packed_ue8m0: bool = False,
    use_e4m3_sf: bool = False,
    stochastic_cast: bool = False,
    out: Optional[QuantTensor] = None,
) -> QuantTensor:
    """Quantise each row of `x` in blocks of `num_per_channels` to FP8 e4m3.

    Args:
        x: (T, H) bf16 or fp32, last dim contiguous, rows 16-byte aligned (any row stride
            that is a multiple of 16 bytes), H a multiple of 16.
        fmt: 'e4m3'.
        num_per_channels: block width, one of 16, 32, 64, 128. A last partial block
            (H not a multiple of it) is scaled over its valid elements.
        use_tma_aligned_col_major_sf: return the SF column-major, its token dim padded
            to 16 bytes, as a (T, ceil(H/npc)) view with stride (1, padded T).
        round_sf: round each scale up to a power of two.
        use_packed_ue8m0: SF as UE8M0 exponent bytes packed 4 to an int32 along H
            (needs round_sf); shape (T, ceil(ceil(H/npc)/4)).
        out: optional preallocated (data, sf) with the returned layout.

    Returns:
        (data, sf): e4m3 (T, H) and the scale factors, so that x ~= data * sf per block.
        CPU tensors take the pure-torch reference path (same bytes, slower).
    """
    # Validate. The non-tensor arguments are checked once per combination (the cached
    # kernel key); the tensor is checked on every call.
    try:
        key = _KEYS[x.dtype, fmt, num_per_channels, round_sf, use_packed_ue8m0]
    except (KeyError, AttributeError, TypeError):
        key = _key_of(x, fmt, num_per_channels, round_sf, use_packed_ue8m0)
    if x_block_size is not None or use_e4m3_sf or stochastic_cast:
        _reject_unbuilt(x_block_size, use_e4m3_sf, stochastic_cast)
    num_tokens, hidden = check_rows(x, "x", hidden_multiple=16)
    if torch.compiler.is_compiling():
        return _compiled_path(x, num_per_channels, use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0, out)

    if not x.is_cuda:  # the slow path: the reference builds the same layouts itself
        from tilebake.torch import cast

        result = cast(
            x,
            "e4m3",
            (1, num_per_channels),
            round_sf=round_sf,
            use_packed_ue8m0=use_packed_ue8m0,
            use_tma_aligned_col_major_sf=use_tma_aligned_col_major_sf,
            amax_clamp=config.get_amax_clamp_for_quant("e4m3", False),
        )
        if out is None:
            return result
        _check_out(out, x, num_tokens, hidden, num_per_channels, use_packed_ue8m0)
        out[0].copy_(result[0])
        out[1].copy_(result[1])
        return out

    # Allocate, then launch.
    if out is None:
        data = x.new_empty((num_tokens, hidden), dtype=torch.float8_e4m3fn)
        sf = alloc_sf(x, num_tokens, ceil_div(hidden, num_per_channels), use_packed_ue8m0, use_tma_aligned_col_major_sf)
    else:
        _check_out(out, x, num_tokens, hidden, num_per_channels, use_packed_ue8m0)
        data, sf = out
    if num_tokens == 0:
        return data, sf
    x_ptr, data_ptr = x.data_ptr(), data.data_ptr()
    if (x_ptr | data_ptr) % 16:
        check_aligned(x_ptr, "x")
        check_aligned(data_ptr, "out[0]")
    sf_stride_t, sf_stride_g = sf_strides_for_kernel(sf, use_packed_ue8m0)
    _KERNELS[key](
        x.get_device(),
        x_ptr, data_ptr, sf.data_ptr(), config.get_amax_clamp_for_quant("e4m3", False),
        num_tokens, hidden, x.stride(0), data.stride(0), sf_stride_t, sf_stride_g,
    )  # fmt: skip
    return data, sf


# --- torch.library: lets torch.compile(fullgraph=True) trace the op; eager calls skip it ---

_lib = torch.library.Library("tilebake", "FRAGMENT")
_lib.define(
    "per_token_cast(Tensor x, int num_per_channels, bool col_major_sf, bool round_sf, bool packed_ue8m0)"
    " -> (Tensor, Tensor)"
)
_lib.define(
    "per_token_cast_out(Tensor x, int num_per_channels, bool round_sf, bool packed_ue8m0,"
    " Tensor(a!) out_data, Tensor(b!) out_sf) -> ()"
)


def _op_impl(x, num_per_channels, col_major_sf, round_sf, packed_ue8m0):
    data, sf = per_token_cast(
        x,
        "e4m3",
        num_per_channels,
        use_tma_aligned_col_major_sf=col_major_sf,
        round_sf=round_sf,
        use_packed_ue8m0=packed_ue8m0,
    )
    return data, sf


def _op_out_impl(x, num_per_channels, round_sf, packed_ue8m0, out_data, out_sf):
    per_token_cast(
        x, "e4m3", num_per_channels, round_sf=round_sf, use_packed_ue8m0=packed_ue8m0, out=(out_data, out_sf)
    )


for _key in ("CPU", "CUDA"):
    _lib.impl("per_token_cast", _op_impl, _key)
    _lib.impl("per_token_cast_out", _op_out_impl, _key)


# Shape functions as Meta kernels (what torch.compile's fake tensors run): registering
# them costs nothing at import, where register_fake spends ~2 ms each reading source.
def _meta(x, num_per_channels, col_major_sf, round_sf, packed_ue8m0):
    num_tokens, hidden = x.shape
    data = x.new_empty((num_tokens, hidden), dtype=torch.float8_e4m3fn)
    return data, alloc_sf(x, num_tokens, ceil_div(hidden, num_per_channels), packed_ue8m0, col_major_sf)


def _meta_out(x, num_per_channels, round_sf, packed_ue8m0, out_data, out_sf):
    return None


_lib.impl("per_token_cast", _meta, "Meta")
_lib.impl("per_token_cast_out", _meta_out, "Meta")


def _compiled_path(x, num_per_channels, col_major_sf, round_sf, packed_ue8m0, out):
    if out is None:
        return torch.ops.tilebake.per_token_cast(x, num_per_channels, col_major_sf, round_sf, packed_ue8m0)
    torch.ops.tilebake.per_token_cast_out(x, num_per_channels, round_sf, packed_ue8m0, out[0], out[1])
    return out
