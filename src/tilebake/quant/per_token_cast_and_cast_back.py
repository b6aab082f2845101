"""per_token_cast_and_cast_back: in-place fake quantisation of x (quantise per (1, npc) block to
FP8 e4m3 or FP4 e2m1, dequantise, write back in x's dtype) in one pass over x.

Validate, launch. The kernel is kernels_tl/quant/per_token_cast_and_cast_back.py; the reference
(and the CPU path) is tilebake.torch.per_token_cast_and_cast_back_ref.
"""

from __future__ import annotations

import dataclasses
import itertools

import torch

from tilebake import config
from tilebake._library import register
from tilebake._runtime import plan
from tilebake._runtime.loader import KernelTable
from tilebake._variants import ASCEND_VEC_CORES, Variant, f32, i32, ptr
from tilebake.quant._common import (
    FLOAT_FORMATS,
    NUM_PER_CHANNELS,
    check_aligned,
    check_fmt,
    check_num_per_channels,
    check_rows,
)


@dataclasses.dataclass(frozen=True)
class PerTokenCastAndCastBackVariant(Variant):
    family = "quant"
    op = "per_token_cast_and_cast_back"
    PARAMS = ptr("X") + f32("amax_clamp") + i32("round_sf", "use_e4m3_sf", "num_tokens", "hidden", "x_stride")

    in_dtype: str  # 'bf16' | 'fp32'
    fmt: str  # 'e4m3' | 'e2m1'
    num_per_channels: int

    @classmethod
    def all(cls):
        return tuple(cls(*key) for key in itertools.product(("bf16", "fp32"), ("e4m3", "e2m1"), NUM_PER_CHANNELS))


@dataclasses.dataclass(frozen=True)
class PerTokenCastAndCastBackAscendVariant(Variant):
    """The Ascend 950 kernels (kernels_tl/ascend/quant/per_token_cast_and_cast_back.py): e4m3,
    32-column groups, an fp32 or power-of-two scale (the original's Ascend case without e4m3 SF)."""

    family = "quant"
    op = "per_token_cast_and_cast_back"
    backend = "ascend"
    PARAMS = ptr("X") + f32("amax_clamp") + i32("num_tokens", "hidden", "x_stride")

    in_dtype: str  # 'bf16' | 'fp32'
    round_sf: bool
    num_vec_cores: int

    @classmethod
    def all(cls):
        return tuple(cls(*key) for key in itertools.product(("bf16", "fp32"), (False, True), ASCEND_VEC_CORES))


_KEYS: dict[tuple, tuple] = {}  # validated (dtype, fmt, npc, round_sf, use_e4m3_sf) -> variant key


def _key_of(x, fmt, num_per_channels, round_sf, use_e4m3_sf) -> tuple:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    in_dtype = FLOAT_FORMATS.get(x.dtype)
    if in_dtype is None:
        raise TypeError(f"x must be bfloat16 or float32, got {x.dtype}")
    check_fmt(fmt, ("e4m3", "e2m1"))
    check_num_per_channels(num_per_channels)
    for name, flag in (("round_sf", round_sf), ("use_e4m3_sf", use_e4m3_sf)):
        if not isinstance(flag, bool):
            raise TypeError(f"{name} must be a bool, got {flag!r}")
    if round_sf and use_e4m3_sf:
        raise ValueError("use_e4m3_sf=True is incompatible with round_sf=True")
    key = (in_dtype, fmt, num_per_channels)
    _KEYS[x.dtype, fmt, num_per_channels, round_sf, use_e4m3_sf] = key
    return key


_KERNELS = KernelTable(PerTokenCastAndCastBackVariant)


def per_token_cast_and_cast_back(
    x: torch.Tensor, fmt: str, num_per_channels: int, round_sf: bool = False, use_e4m3_sf: bool = False
) -> None:
    """Fake-quantise `x` in place: x <- cast_back(per_token_cast(x, fmt, npc, ...)) in x's dtype.

    Args:
        x: (T, H) bf16 or fp32, last dim contiguous, rows 16-byte aligned (any row stride that
            is a multiple of 16 bytes), H a multiple of 16 (a last partial block is scaled over
            its valid elements).
        fmt: 'e4m3' or 'e2m1'.
        num_per_channels: block width, one of 16, 32, 64, 128.
        round_sf: scales rounded up to powers of two.
        use_e4m3_sf: scales stored as float8_e4m3fn (not with round_sf).
    The amax clamp is config.get_amax_clamp_for_quant(fmt, use_e4m3_sf). CPU tensors take the
    pure-torch reference path (same bytes). x's version counter is bumped, as by torch's
    in-place ops.
    """
    # The native path: a call whose key has been seen runs as one plan (validate and launch in
    # C); a call the plan does not take (NotImplemented) goes on below. torch.compile traces
    # the Python path (its torch.library op), never the native call.
    if not torch.compiler.is_compiling():  # dynamo can neither hash the key nor trace the native call
        try:
            call = _PLANS[x.dtype, fmt, num_per_channels, round_sf, use_e4m3_sf]
        except (KeyError, AttributeError, TypeError):
            pass
        else:
            result = plan.run(call, x)
            if result is not NotImplemented:
                return None
    try:
        key = _KEYS[x.dtype, fmt, num_per_channels, round_sf, use_e4m3_sf]
    except (KeyError, AttributeError, TypeError):
        key = _key_of(x, fmt, num_per_channels, round_sf, use_e4m3_sf)
    num_tokens, hidden = check_rows(x, "x", hidden_multiple=16)
    amax_clamp = config.get_amax_clamp_for_quant(fmt, use_e4m3_sf)
    if torch.compiler.is_compiling():
        torch.ops.tilebake.per_token_cast_and_cast_back(x, fmt, num_per_channels, round_sf, use_e4m3_sf)
        return None
    if x.device.type == "npu":  # the Ascend kernels where they apply (else the reference below)
        from tilebake.quant import _cast_back_ascend

        if _cast_back_ascend.fake_quant(x, fmt, num_per_channels, round_sf, use_e4m3_sf, amax_clamp):
            return None
    if not x.is_cuda:  # the slow path
        from tilebake.torch import per_token_cast_and_cast_back_ref

        x.copy_(per_token_cast_and_cast_back_ref(x, fmt, num_per_channels, round_sf, use_e4m3_sf, amax_clamp))
        return None
    torch.autograd.graph.increment_version(x)  # the kernel writes x behind autograd's back
    if num_tokens == 0 or hidden == 0:
        return None
    x_ptr = x.data_ptr()
    if x_ptr % 16:
        check_aligned(x_ptr, "x")
    _KERNELS[key](x.get_device(), x_ptr, amax_clamp, int(round_sf), int(use_e4m3_sf), num_tokens, hidden, x.stride(0))
    plan_key = (x.dtype, fmt, num_per_channels, round_sf, use_e4m3_sf)
    if plan_key not in _PLANS:
        plan.remember(
            _PLANS, plan_key, _plan, _KERNELS[key], x.get_device(), x.dtype, amax_clamp, round_sf, use_e4m3_sf
        )
    return None


_PLANS = plan.cache()


def _plan(kernel, device, dtype, amax_clamp, round_sf, use_e4m3_sf):
    """The CUDA path above as a call plan: the same checks (a non-empty x only: an empty one
    takes the Python path), the same kernel arguments and the version bump."""
    b = plan.Builder()
    x = b.tensor(0, dtype, ("T", "H"), strides=("xs", 1))
    b.check(f"T >= 1 and H >= 16 and H % 16 == 0 and (T == 1 or xs % {16 // dtype.itemsize} == 0)")
    b.launch(
        kernel, device, X=x, amax_clamp=amax_clamp, round_sf=int(round_sf), use_e4m3_sf=int(use_e4m3_sf),
        num_tokens="T", hidden="H", x_stride="xs",
    )  # fmt: skip
    b.bump(x)
    b.returns(None)
    return b.build()


# --- torch.library: lets torch.compile(fullgraph=True) trace the op; eager calls skip it ---

register(
    "per_token_cast_and_cast_back(Tensor(a!) x, str fmt, int num_per_channels, bool round_sf, bool use_e4m3_sf) -> ()",
    per_token_cast_and_cast_back,
    lambda x, fmt, npc, round_sf, use_e4m3_sf: None,
)
