"""swiglu_forward / swiglu_forward_and_per_token_cast: fused SwiGLU of MoE expert rows,
out = l / (1 + exp(-l)) * r [* (topk_weights * routed_scaling_factor)] with l, r the clamped
halves of x, to bf16/fp32 or per-token FP8 e4m3.

Validate, allocate, launch. The kernel is kernels_tl/quant/swiglu_forward.py; the reference (and
the CPU path) is tilebake.torch.swiglu_forward followed by tilebake.torch.cast; the arithmetic
(TileKernels 2.1.0's) is written out in src/tilebake/torch/swiglu.py.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from typing import Optional

import torch

from tilebake import config
from tilebake._runtime import plan
from tilebake._runtime.loader import KernelTable
from tilebake._variants import ASCEND_VEC_CORES, Variant, f32, i32, ptr
from tilebake.quant import _swiglu_forward_plans as _plans
from tilebake.quant._common import (
    FLOAT_DTYPES,
    FLOAT_FORMATS,
    QuantTensor,
    alloc_sf,
    ascend_sf_mode,
    check_aligned,
    check_fmt,
    check_rows,
    check_sf_options,
    sf_strides_for_kernel,
)
from tilebake.quant._swiglu_compile import register_forward_ops
from tilebake.utils import ceil_div

SWIGLU_NUM_PER_CHANNELS = (32, 128)


@dataclasses.dataclass(frozen=True)
class SwigluForwardVariant(Variant):
    family = "quant"
    op = "swiglu_forward"

    in_dtype: str  # x: 'bf16' | 'fp32'
    out_fmt: str  # 'bf16' | 'fp32' | 'e4m3'
    num_per_channels: int  # e4m3 SF group width; 0 for bf16/fp32 output
    round_sf: bool
    packed_ue8m0: bool

    @classmethod
    def all(cls):
        plain = [cls(d, f, 0, False, False) for d, f in itertools.product(("bf16", "fp32"), ("bf16", "fp32"))]
        cast = [
            cls(d, "e4m3", npc, rs, packed)
            for d, npc, (rs, packed) in itertools.product(
                ("bf16", "fp32"), SWIGLU_NUM_PER_CHANNELS, ((False, False), (True, False), (True, True))
            )
        ]
        return tuple(plain + cast)

    def params(self):
        return _PARAMS + (_CAST_PARAMS if self.out_fmt == "e4m3" else ())


_PARAMS = (
    ptr("X", "Y", "W", "P", "C")
    + i32("num_experts", "use_psum", "search_steps", "alignment", "num_tokens", "hidden", "x_stride", "y_stride")
    + i32("has_weights", "count_clamps")
    + f32("scale", "clamp_value")
)
_CAST_PARAMS = ptr("S") + i32("sf_stride_t", "sf_stride_g") + f32("amax_clamp")


@dataclasses.dataclass(frozen=True)
class SwigluForwardAscendVariant(Variant):
    """The Ascend 950 kernels (kernels_tl/ascend/quant/swiglu_forward.py): the original's Ascend
    case, the cast's SF in (1, 32) groups (fp32, power-of-two fp32 or UE8M0 two to an int16);
    weights, scale and clamp run-time arguments; no clamp statistics (those calls take the
    reference)."""

    family = "quant"
    op = "swiglu_forward"
    backend = "ascend"

    in_dtype: str  # 'bf16' | 'fp32'
    out_fmt: str  # 'bf16' | 'fp32' | 'e4m3'
    sf_mode: str  # e4m3: 'fp32' | 'round' | 'ue8m0'; 'none' otherwise
    num_vec_cores: int

    @classmethod
    def all(cls):
        outs = [("bf16", "none"), ("fp32", "none")] + [("e4m3", m) for m in ("fp32", "round", "ue8m0")]
        return tuple(cls(d, *o, cores) for d in ("bf16", "fp32") for o in outs for cores in ASCEND_VEC_CORES)

    def params(self):
        cast = self.out_fmt == "e4m3"
        return (
            ptr("X", "Y", "W", *(("S",) if cast else ()))
            + i32("num_tokens", "hidden", "x_stride", "has_weights", "has_clamp")
            + f32("scale", "clamp_value", *(("amax_clamp",) if cast else ()))
        )


_KERNELS = KernelTable(SwigluForwardVariant)
# Call plans by call key (the fast path at the top of each op; _swiglu_forward_plans.py builds them).
_PLANS = plan.cache()
_CAST_PLANS = plan.cache()


def check_swiglu_input(x, name: str = "x") -> tuple[int, int]:
    """x (E, 2H) with H a multiple of 64 (what the original accepts), rows as check_rows wants."""
    if isinstance(x, torch.Tensor) and x.dim() == 2 and x.shape[1] % 128:
        raise ValueError(f"{name}.shape[1] (2 * hidden) must be a multiple of 128 (hidden % 64 == 0), got {x.shape[1]}")
    num_tokens, width = check_rows(x, name, hidden_multiple=128)
    return num_tokens, width // 2


def check_row_vector(t, name: str, num_tokens: int, dtype: torch.dtype, like: torch.Tensor) -> None:
    """A (num_tokens,) tensor of `dtype`, contiguous, on `like`'s device."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be None or a torch.Tensor, got {type(t).__name__}")
    if t.dtype != dtype:
        raise TypeError(f"{name} must be {dtype}, got {t.dtype}")
    if tuple(t.shape) != (num_tokens,):
        raise ValueError(f"{name} must have shape ({num_tokens},), got {tuple(t.shape)}")
    if num_tokens > 1 and t.stride(0) != 1:
        raise ValueError(f"{name} must be contiguous, got stride {t.stride()}")
    if t.device != like.device:
        raise ValueError(f"{name} must be on {like.device}, got {t.device}")


def check_psum(psum, like: torch.Tensor) -> None:
    if psum is None:
        return
    if not isinstance(psum, torch.Tensor):
        raise TypeError(f"psum_num_tokens_per_expert must be None or a torch.Tensor, got {type(psum).__name__}")
    if psum.dtype != torch.int32:
        raise TypeError(f"psum_num_tokens_per_expert must be torch.int32, got {psum.dtype}")
    if psum.dim() != 1 or psum.shape[0] == 0:
        raise ValueError(f"psum_num_tokens_per_expert must be 1-D (num_experts,), got shape {tuple(psum.shape)}")
    if psum.shape[0] > 1 and psum.stride(0) != 1:
        raise ValueError(f"psum_num_tokens_per_expert must be contiguous, got stride {psum.stride()}")
    if psum.device != like.device:
        raise ValueError(f"psum_num_tokens_per_expert must be on {like.device}, got {psum.device}")


def check_scalar(value, name: str, positive: bool) -> Optional[float]:
    """None, or a finite real number (positive if asked), returned as a float."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be None or a float, got {value!r}")
    value = float(value)
    if not math.isfinite(value) or (positive and value <= 0):
        raise ValueError(f"{name} must be None or a {'positive ' if positive else ''}finite float, got {value!r}")
    return value


def psum_args(psum, fallback: torch.Tensor) -> tuple:
    """Kernel arguments (P, num_experts, use_psum, search_steps, alignment) of the psum layout."""
    if psum is None:
        return fallback.data_ptr(), 0, 0, 0, 1
    num_experts = psum.shape[0]
    return psum.data_ptr(), num_experts, 1, num_experts.bit_length(), config.get_token_alignment()


def _check_clamped_count(clamped_count, like: torch.Tensor) -> None:
    if not isinstance(clamped_count, torch.Tensor):
        raise TypeError(f"clamped_count must be None or a torch.Tensor, got {type(clamped_count).__name__}")
    if clamped_count.dtype != torch.int64 or tuple(clamped_count.shape) != (4,):
        raise ValueError(
            f"clamped_count must be int64 of shape (4,), got {clamped_count.dtype} {tuple(clamped_count.shape)}"
        )
    if clamped_count.device != like.device:
        raise ValueError(f"clamped_count must be on {like.device}, got {clamped_count.device}")


def _check_common(x, psum, topk_weights, routed_scaling_factor, clamp_value, clamped_count):
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    in_dtype = FLOAT_FORMATS.get(x.dtype)
    if in_dtype is None:
        raise TypeError(f"x must be bfloat16 or float32, got {x.dtype}")
    num_tokens, hidden = check_swiglu_input(x)
    check_psum(psum, x)
    if topk_weights is not None:
        check_row_vector(topk_weights, "topk_weights", num_tokens, torch.float32, x)
    scale = check_scalar(routed_scaling_factor, "routed_scaling_factor", positive=False)
    clamp = check_scalar(clamp_value, "clamp_value", positive=True)
    if clamped_count is not None:
        _check_clamped_count(clamped_count, x)
    return in_dtype, num_tokens, hidden, scale, clamp


def _reference(x, psum, topk_weights, scale, clamp, clamped_count):
    from tilebake.torch import swiglu_forward as reference

    return reference(
        x, psum, topk_weights, scale, clamp, clamped_count=clamped_count, alignment=config.get_token_alignment()
    )


def _launch(key, x, y, num_tokens, hidden, psum, topk_weights, scale, clamp, clamped_count, extra=()):
    x_ptr, y_ptr = x.data_ptr(), y.data_ptr()
    if (x_ptr | y_ptr) % 16:
        check_aligned(x_ptr, "x")
        check_aligned(y_ptr, "output")
    counts = x.new_empty((num_tokens, 4), dtype=torch.int32) if clamped_count is not None else None
    _KERNELS[key](
        x.get_device(),
        x_ptr, y_ptr,
        topk_weights.data_ptr() if topk_weights is not None else x_ptr,
        *_psum_and_counts(psum, x, counts),
        num_tokens, hidden, x.stride(0), y.stride(0),
        int(topk_weights is not None), int(counts is not None),
        1.0 if scale is None else scale, math.inf if clamp is None else clamp,
        *extra,
    )  # fmt: skip
    if counts is not None:
        clamped_count += counts.sum(dim=0)


def _psum_and_counts(psum, x, counts):
    p_ptr, num_experts, use_psum, steps, alignment = psum_args(psum, x)
    return p_ptr, counts.data_ptr() if counts is not None else x.data_ptr(), num_experts, use_psum, steps, alignment


def swiglu_forward(
    x: torch.Tensor,
    fmt: str,
    psum_num_tokens_per_expert: Optional[torch.Tensor] = None,
    topk_weights: Optional[torch.Tensor] = None,
    routed_scaling_factor: Optional[float] = None,
    clamp_value: Optional[float] = None,
    clamped_count: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """out = silu(clamp(x_left)) * clamp(x_right) [* (topk_weights * routed_scaling_factor)].

    Args:
        x: (E, 2H) bf16 or fp32, H a multiple of 64, last dim contiguous, rows 16-byte aligned;
            x_left = x[:, :H], x_right = x[:, H:].
        fmt: output format, 'bf16' or 'fp32'.
        psum_num_tokens_per_expert: int32 (num_experts,): expert e owns rows
            [align(psum[e-1], config.get_token_alignment()), psum[e]); all other rows are
            padding. It only selects the rows clamped_count counts: every row's output is
            computed, padding rows' too (from whatever x holds there), as 2.1.0 does. Entries
            past the tensor's rows are fine (the layout is cut at E rows). It is meant to be
            non-decreasing and >= 0, which is not checked (that would sync): otherwise every
            row is still either an expert's or padding and nothing is read out of bounds, but
            which rows count is unspecified (the GPU binary-searches psum, the CPU reference
            takes the union of the ranges, tilebake.torch.get_mapping_from_psum, and the two
            may disagree).
        topk_weights: fp32 (E,), one factor per row.
        routed_scaling_factor: s, applied with the weights as e = topk_weights * s (fp32,
            once per row); without topk_weights it is not used.
        clamp_value: c > 0: x_left clamped to at most c, x_right to [-c, c].
        clamped_count: int64 (4,), incremented in place by [#(x_left > c), #(x_right > c),
            #(x_right < -c), #x_left elements] over the valid rows.

    Returns:
        (E, H) in `fmt`: the fp32 result of tilebake.torch.swiglu_forward, rounded; bit-equal to
        that reference evaluated on the same CUDA device (CPU tensors take the reference path,
        whose CPU exp may differ from CUDA's expf in the last bit).
    """
    # The native path: a call whose key has been seen runs as one plan (validate, allocate and
    # launch in C); a call the plan does not take (NotImplemented) goes on below. Not while
    # torch.compile traces (dynamo cannot trace the native call; the traced op runs it later).
    # The scalars' classes are in the key: True == 1.0 would otherwise find a plan the Python
    # path refuses.
    if not torch.compiler.is_compiling():  # dynamo can neither hash the key nor trace the native call
        try:
            call = _PLANS[x.dtype, fmt, psum_num_tokens_per_expert is None, topk_weights is None,
                          routed_scaling_factor, routed_scaling_factor.__class__, clamp_value, clamp_value.__class__,
                          clamped_count is None]  # fmt: skip
        except (KeyError, AttributeError, TypeError):
            pass
        else:
            result = plan.run(call, x, psum_num_tokens_per_expert, topk_weights)
            if result is not NotImplemented:
                return result
    check_fmt(fmt, tuple(FLOAT_DTYPES))
    in_dtype, num_tokens, hidden, scale, clamp = _check_common(
        x, psum_num_tokens_per_expert, topk_weights, routed_scaling_factor, clamp_value, clamped_count
    )
    if torch.compiler.is_compiling():
        return torch.ops.tilebake.swiglu_forward(
            x, fmt, psum_num_tokens_per_expert, topk_weights, scale, clamp, clamped_count
        )
    if x.device.type == "npu" and clamped_count is None:  # the Ascend kernels
        from tilebake.quant import _swiglu_forward_ascend

        return _swiglu_forward_ascend.swiglu_forward(x, fmt, topk_weights, scale, clamp)[0]
    if not x.is_cuda:
        y = _reference(x, psum_num_tokens_per_expert, topk_weights, scale, clamp, clamped_count)
        return y.to(FLOAT_DTYPES[fmt])
    y = x.new_empty((num_tokens, hidden), dtype=FLOAT_DTYPES[fmt])
    if num_tokens == 0:
        return y
    key = (in_dtype, fmt, 0, False, False)
    _launch(key, x, y, num_tokens, hidden, psum_num_tokens_per_expert, topk_weights, scale, clamp,
            clamped_count)  # fmt: skip
    if clamped_count is None:  # (its accumulation, a torch sum, stays on this path)
        plan_key = (x.dtype, fmt, psum_num_tokens_per_expert is None, topk_weights is None, routed_scaling_factor,
                    routed_scaling_factor.__class__, clamp_value, clamp_value.__class__, True)  # fmt: skip
        if plan_key not in _PLANS:
            plan.remember(
                _PLANS, plan_key,
                _plans.forward_plan, _KERNELS[key], x.get_device(), x.dtype, y.dtype,
                psum_num_tokens_per_expert is not None, topk_weights is not None, scale, clamp,
            )  # fmt: skip
    return y


def swiglu_forward_and_per_token_cast(
    x: torch.Tensor,
    fmt: str,
    num_per_channels: int,
    psum_num_tokens_per_expert: Optional[torch.Tensor] = None,
    topk_weights: Optional[torch.Tensor] = None,
    routed_scaling_factor: Optional[float] = None,
    use_tma_aligned_col_major_sf: bool = False,
    round_sf: bool = False,
    use_packed_ue8m0: bool = False,
    clamp_value: Optional[float] = None,
    clamped_count: Optional[torch.Tensor] = None,
) -> QuantTensor:
    """swiglu_forward, then a per-token (1 x num_per_channels) FP8 e4m3 cast of its fp32 result.

    Args: as swiglu_forward, and
        fmt: 'e4m3'.
        num_per_channels: 32 or 128. With H % 128 == 64 the last group of a row is partial.
        use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0: the SF layout, as in
            per_token_cast (the amax clamp is config.get_amax_clamp_for_quant('e4m3', False)).

    Returns:
        (data e4m3 (E, H), sf): bit-equal to tilebake.torch.cast of the fp32 reference values
        (not of values rounded to bf16), padding rows included.
    """
    if not torch.compiler.is_compiling():  # dynamo can neither hash the key nor trace the native call
        try:  # the native path, as in swiglu_forward
            call = _CAST_PLANS[x.dtype, fmt, num_per_channels, psum_num_tokens_per_expert is None,
                               topk_weights is None, routed_scaling_factor, routed_scaling_factor.__class__,
                               use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0, clamp_value,
                               clamp_value.__class__, clamped_count is None]  # fmt: skip
        except (KeyError, AttributeError, TypeError):
            pass
        else:
            result = plan.run(call, x, psum_num_tokens_per_expert, topk_weights)
            if result is not NotImplemented:
                return result
    check_fmt(fmt, ("e4m3",))
    if num_per_channels not in SWIGLU_NUM_PER_CHANNELS or isinstance(num_per_channels, bool):
        raise ValueError(f"num_per_channels must be one of {SWIGLU_NUM_PER_CHANNELS}, got {num_per_channels!r}")
    check_sf_options(round_sf, use_packed_ue8m0)
    in_dtype, num_tokens, hidden, scale, clamp = _check_common(
        x, psum_num_tokens_per_expert, topk_weights, routed_scaling_factor, clamp_value, clamped_count
    )
    if torch.compiler.is_compiling():
        return torch.ops.tilebake.swiglu_forward_and_per_token_cast(
            x, num_per_channels, psum_num_tokens_per_expert, topk_weights, scale,
            bool(use_tma_aligned_col_major_sf), bool(round_sf), bool(use_packed_ue8m0), clamp, clamped_count,
        )  # fmt: skip
    amax_clamp = config.get_amax_clamp_for_quant("e4m3", False)
    if x.device.type == "npu" and clamped_count is None and num_per_channels == 32 and not use_tma_aligned_col_major_sf:
        from tilebake.quant import _swiglu_forward_ascend  # the Ascend kernels (their (1, 32) SF layouts)

        sf_mode = ascend_sf_mode(round_sf, use_packed_ue8m0)
        return _swiglu_forward_ascend.swiglu_forward(x, "e4m3", topk_weights, scale, clamp, sf_mode)
    if not x.is_cuda:
        from tilebake.torch import cast

        y = _reference(x, psum_num_tokens_per_expert, topk_weights, scale, clamp, clamped_count)
        return cast(
            y,
            "e4m3",
            (1, num_per_channels),
            round_sf=bool(round_sf),
            use_packed_ue8m0=bool(use_packed_ue8m0),
            use_tma_aligned_col_major_sf=bool(use_tma_aligned_col_major_sf),
            amax_clamp=amax_clamp,
        )
    data = x.new_empty((num_tokens, hidden), dtype=torch.float8_e4m3fn)
    sf = alloc_sf(x, num_tokens, ceil_div(hidden, num_per_channels), use_packed_ue8m0, use_tma_aligned_col_major_sf)
    if num_tokens == 0:
        return data, sf
    key = (in_dtype, "e4m3", num_per_channels, bool(round_sf), bool(use_packed_ue8m0))
    sf_stride_t, sf_stride_g = sf_strides_for_kernel(sf, use_packed_ue8m0)
    _launch(key, x, data, num_tokens, hidden, psum_num_tokens_per_expert, topk_weights, scale, clamp,
            clamped_count, extra=(sf.data_ptr(), sf_stride_t, sf_stride_g, amax_clamp))  # fmt: skip
    if clamped_count is None and _plans.bools(use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0):
        plan_key = (x.dtype, fmt, num_per_channels, psum_num_tokens_per_expert is None, topk_weights is None,
                    routed_scaling_factor, routed_scaling_factor.__class__, use_tma_aligned_col_major_sf, round_sf,
                    use_packed_ue8m0, clamp_value, clamp_value.__class__, True)  # fmt: skip
        if plan_key not in _CAST_PLANS:
            plan.remember(
                _CAST_PLANS, plan_key,
                _plans.forward_cast_plan, _KERNELS[key], x.get_device(), x.dtype, int(num_per_channels),
                psum_num_tokens_per_expert is not None, topk_weights is not None, scale, clamp,
                use_tma_aligned_col_major_sf, use_packed_ue8m0,
            )  # fmt: skip
    return data, sf


# torch.library: the ops torch.compile traces (_swiglu_compile.py), run by these functions.
register_forward_ops(swiglu_forward, swiglu_forward_and_per_token_cast)
