"""per_channel_cast: column-wise (num_per_tokens x 1) quantisation to FP8 e4m3.

Validate, allocate, launch. The kernel is kernels_tl/quant/per_channel_cast.py; the reference
(and the CPU path) is tilebake.torch.cast with block (num_per_tokens, 1), and with
x_block_size (1, num_per_channels) for an already quantized input.
"""

from __future__ import annotations

import dataclasses
import itertools

import torch

from tilebake import utils
from tilebake import config
from tilebake._library import register
from tilebake._runtime import plan
from tilebake._runtime.loader import KernelTable
from tilebake._variants import ASCEND_VEC_CORES, Variant, f32, i32, ptr
from tilebake.quant import _cast_plans as plans
from tilebake.quant._common import (
    FLOAT_FORMATS,
    NUM_PER_CHANNELS,
    QuantTensor,
    check_aligned,
    check_fmt,
    check_out_sf,
    check_rows,
    check_sf_options,
)
from tilebake.utils import ceil_div

NUM_PER_TOKENS = (32, 128)


@dataclasses.dataclass(frozen=True)
class PerChannelCastVariant(Variant):
    family = "quant"
    op = "per_channel_cast"

    in_dtype: str  # 'bf16' | 'fp32' | 'e4m3' (a QuantTensor with (1, npc) SF)
    num_per_tokens: int

    @classmethod
    def all(cls):
        return tuple(cls(d, npt) for d, npt in itertools.product(("bf16", "fp32", "e4m3"), NUM_PER_TOKENS))

    def params(self):
        # A quantized input's kernel also takes its SF (the float kernels have no such parameters).
        return _PARAMS + (_QUANTIZED_PARAMS if self.in_dtype == "e4m3" else ())


_PARAMS = ptr("X", "Y", "S32", "S8") + f32("amax_clamp")
_PARAMS += i32("round_sf", "packed_sf", "num_tokens", "hidden", "x_stride")
_QUANTIZED_PARAMS = ptr("SIN") + i32("in_sf_packed", "in_sf_stride_t", "in_sf_stride_g", "num_per_channels")


# The Ascend 950 kernels (kernels_tl/ascend/quant/per_channel_cast.py; the original's Ascend
# constraints: 32-token blocks, a quantized input's SF 32 columns wide; packed UE8M0 two row
# blocks' bytes to an int16, along the tokens).
ASCEND_NUM_PER_TOKENS = 32


@dataclasses.dataclass(frozen=True)
class PerChannelCastAscendVariant(Variant):
    family = "quant"
    op = "per_channel_cast"
    backend = "ascend"

    in_dtype: str  # 'bf16' | 'fp32' | 'e4m3' (a QuantTensor with (1, 32) SF)
    in_sf: str  # a quantized input's SF: 'fp32' | 'ue8m0' (two bytes to an int16); 'none' otherwise
    sf_mode: str  # 'fp32' | 'round' (power-of-two fp32) | 'ue8m0' (packed two to an int16)
    num_vec_cores: int

    @classmethod
    def all(cls):
        keys = [(d, "none") for d in ("bf16", "fp32")] + [("e4m3", s) for s in ("fp32", "ue8m0")]
        modes = ("fp32", "round", "ue8m0")
        return tuple(cls(*key, mode, cores) for key in keys for mode in modes for cores in ASCEND_VEC_CORES)

    def params(self):
        data = ptr("X", "Y", "S") + (ptr("SIN") if self.in_sf != "none" else ())
        return data + f32("amax_clamp") + i32("num_tokens", "hidden", "x_stride", "sf_rows")


_KERNELS = KernelTable(PerChannelCastVariant)
_PLANS = plan.cache()  # a plain input's calls, by the fast path's key (with the flags' types: they must be bools)


def _check_flag(value, name: str) -> None:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, got {value!r}")


def _parse_x(x, num_per_channels):
    """-> (in_dtype key, data tensor, input SF or None)."""
    if isinstance(x, torch.Tensor):
        if num_per_channels is not None:
            raise ValueError(
                f"num_per_channels must be None for a plain tensor x (it describes a QuantTensor's SF), "
                f"got {num_per_channels!r}"
            )
        in_dtype = FLOAT_FORMATS.get(x.dtype)
        if in_dtype is None:
            raise TypeError(f"x must be bfloat16 or float32 (or a QuantTensor (e4m3 data, sf)), got {x.dtype}")
        return in_dtype, x, None
    if not isinstance(x, (tuple, list)) or len(x) != 2 or not all(isinstance(t, torch.Tensor) for t in x):
        raise TypeError(f"x must be a torch.Tensor or a QuantTensor (data, sf) of two tensors, got {type(x).__name__}")
    data, sf = x
    if data.dtype != torch.float8_e4m3fn:
        raise TypeError(f"x[0] (the data of a QuantTensor) must be torch.float8_e4m3fn, got {data.dtype}")
    if num_per_channels not in NUM_PER_CHANNELS or isinstance(num_per_channels, bool):
        raise ValueError(
            f"num_per_channels (the SF block width of the QuantTensor x) must be one of {NUM_PER_CHANNELS}, "
            f"got {num_per_channels!r}"
        )
    return "e4m3", data, sf


def per_channel_cast(
    x,
    fmt: str,
    num_per_tokens: int,
    round_sf: bool = False,
    num_per_channels=None,
    use_packed_ue8m0: bool = False,
) -> QuantTensor:
    """Quantise each column of `x` in blocks of `num_per_tokens` rows to FP8 e4m3.

    Args:
        x: (T, H) bf16 or fp32 (last dim contiguous, rows 16-byte aligned, H a multiple of
            16), or a QuantTensor (data e4m3 (T, H), sf) quantised per token in (1,
            num_per_channels) blocks, to re-scale: sf fp32 (T, ceil(H/npc)) or packed UE8M0
            int32 (T, ceil(ceil(H/npc)/4)), row-major or TMA-aligned column-major (any
            strides, so a slice along tokens works). T need not be a multiple of
            num_per_tokens: the last row block is scaled over its valid rows.
        fmt: 'e4m3'.
        num_per_tokens: rows per scale, 32 or 128.
        round_sf: round each scale up to a power of two.
        num_per_channels: the SF block width of a QuantTensor x (16, 32, 64, 128); None otherwise.
        use_packed_ue8m0: SF as UE8M0 bytes packed 4 to an int32 along tokens (needs
            round_sf): int32 (ceil(ceil(T/npt)/4), H); on an NPU int16 (ceil(ceil(T/npt)/2), H).

    Returns:
        (data, sf): e4m3 (T, H) and fp32 (ceil(T/npt), H) row-major (or the packed int32).
        CPU tensors take the reference path.
    """
    # The native path (see per_token_cast): a call whose key has been seen runs as one plan. A
    # QuantTensor x has no plan (getattr: dynamo cannot hash a tuple's x.dtype while it traces).
    if not torch.compiler.is_compiling():  # dynamo can neither hash the key nor trace the native call
        try:
            call = _PLANS[getattr(x, "dtype", None), fmt, num_per_tokens, round_sf, num_per_channels, use_packed_ue8m0,
                          round_sf.__class__, use_packed_ue8m0.__class__]  # fmt: skip
        except (KeyError, AttributeError, TypeError):
            pass
        else:
            result = plan.run(call, x)
            if result is not NotImplemented:
                return result
    check_fmt(fmt, ("e4m3",))
    if num_per_tokens not in NUM_PER_TOKENS or isinstance(num_per_tokens, bool):
        raise ValueError(f"num_per_tokens must be one of {NUM_PER_TOKENS}, got {num_per_tokens!r}")
    _check_flag(round_sf, "round_sf")
    _check_flag(use_packed_ue8m0, "use_packed_ue8m0")
    check_sf_options(round_sf, use_packed_ue8m0)
    in_dtype, data_in, sf_in = _parse_x(x, num_per_channels)
    num_tokens, hidden = check_rows(data_in, "x[0]" if sf_in is not None else "x", hidden_multiple=16)
    if data_in.device.type == "npu":  # the Ascend kernels where they apply (its own SF layouts: int16 UE8M0)
        from tilebake.quant import _per_channel_cast_ascend

        result = _per_channel_cast_ascend.per_channel_cast(
            data_in, sf_in, num_per_tokens, num_per_channels, round_sf, use_packed_ue8m0
        )
        if result is not None:
            return result
    in_sf_packed = False
    if sf_in is not None:
        in_sf_packed = sf_in.dtype == utils.ue8m0_word(data_in.device)[0]  # int16 on an NPU
        check_out_sf(sf_in, "x[1]", num_tokens, ceil_div(hidden, num_per_channels), in_sf_packed, data_in)
    num_row_blocks = ceil_div(num_tokens, num_per_tokens)
    if torch.compiler.is_compiling():
        if sf_in is None:
            return torch.ops.tilebake.per_channel_cast(data_in, num_per_tokens, round_sf, use_packed_ue8m0)
        return torch.ops.tilebake.per_channel_cast_quantized(
            data_in, sf_in, num_per_tokens, num_per_channels, round_sf, use_packed_ue8m0
        )

    if not data_in.is_cuda:  # the slow path: the reference
        from tilebake.torch import cast

        return cast(
            x,
            "e4m3",
            (num_per_tokens, 1),
            x_block_size=(1, num_per_channels) if sf_in is not None else None,
            round_sf=round_sf,
            use_packed_ue8m0=use_packed_ue8m0,
            amax_clamp=config.get_amax_clamp_for_quant("e4m3", False),
        )

    data = data_in.new_empty((num_tokens, hidden), dtype=torch.float8_e4m3fn)
    if use_packed_ue8m0:
        sf = data_in.new_empty((ceil_div(num_row_blocks, 4), hidden), dtype=torch.int32)
    else:
        sf = data_in.new_empty((num_row_blocks, hidden), dtype=torch.float32)
    if num_tokens == 0 or hidden == 0:
        return data, sf
    x_ptr = data_in.data_ptr()
    if x_ptr % 16:
        check_aligned(x_ptr, "x[0]" if sf_in is not None else "x")
    args = (
        x_ptr, data.data_ptr(), sf.data_ptr(), sf.data_ptr(), config.get_amax_clamp_for_quant("e4m3", False),
        int(round_sf), int(use_packed_ue8m0), num_tokens, hidden, data_in.stride(0),
    )  # fmt: skip
    if sf_in is None:
        _KERNELS[in_dtype, num_per_tokens](data_in.get_device(), *args)
        plan.remember(
            _PLANS, (x.dtype, fmt, num_per_tokens, round_sf, None, use_packed_ue8m0, bool, bool),
            plans.per_channel_plan, _KERNELS[in_dtype, num_per_tokens], data_in.get_device(), x.dtype, num_per_tokens,
            round_sf, use_packed_ue8m0, config.get_amax_clamp_for_quant("e4m3", False),
        )  # fmt: skip
    else:
        size = sf_in.element_size()  # the kernel addresses the input SF in bytes
        _KERNELS[in_dtype, num_per_tokens](
            data_in.get_device(),
            *args, sf_in.data_ptr(), int(in_sf_packed), sf_in.stride(0) * size, sf_in.stride(1) * size,
            num_per_channels,
        )  # fmt: skip
    return data, sf


# --- torch.library: lets torch.compile(fullgraph=True) trace per_channel_cast; eager calls skip it ---


def _op_impl(x, npt, round_sf, packed_ue8m0):
    data, sf = per_channel_cast(x, "e4m3", npt, round_sf, None, packed_ue8m0)
    return data, sf


def _op_quantized_impl(data, sf, npt, npc, round_sf, packed_ue8m0):
    out, out_sf = per_channel_cast((data, sf), "e4m3", npt, round_sf, npc, packed_ue8m0)
    return out, out_sf


def _meta(x, npt, round_sf, packed_ue8m0, *_):
    num_tokens, hidden = x.shape
    num_row_blocks = ceil_div(num_tokens, npt)
    if packed_ue8m0:
        sf = x.new_empty((ceil_div(num_row_blocks, 4), hidden), dtype=torch.int32)
    else:
        sf = x.new_empty((num_row_blocks, hidden), dtype=torch.float32)
    return x.new_empty((num_tokens, hidden), dtype=torch.float8_e4m3fn), sf


register(
    "per_channel_cast(Tensor x, int npt, bool round_sf, bool packed_ue8m0) -> (Tensor, Tensor)",
    _op_impl,
    _meta,
)
register(
    "per_channel_cast_quantized(Tensor data, Tensor sf, int npt, int npc, bool round_sf, bool packed_ue8m0)"
    " -> (Tensor, Tensor)",
    _op_quantized_impl,
    lambda data, sf, npt, npc, round_sf, packed_ue8m0: _meta(data, npt, round_sf, packed_ue8m0),
)
