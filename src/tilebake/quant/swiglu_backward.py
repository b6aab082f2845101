"""swiglu_backward / swiglu_backward_and_per_token_cast: gradients of the fused MoE SwiGLU
(tilebake.quant.swiglu_forward), optionally with a per-token FP8 e4m3 copy of the input gradient.

Validate, allocate, launch. The kernel is kernels_tl/quant/swiglu_backward.py; the reference (and
the CPU path) is tilebake.torch.swiglu_backward (+ tilebake.torch.cast); the arithmetic
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
from tilebake.quant import _swiglu_backward_plans as _plans
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
from tilebake.quant._swiglu_compile import register_backward_ops
from tilebake.quant._swiglu_forward_plans import bools
from tilebake.quant.swiglu_forward import (
    SWIGLU_NUM_PER_CHANNELS,
    check_psum,
    check_row_vector,
    check_scalar,
    check_swiglu_input,
    psum_args,
)


@dataclasses.dataclass(frozen=True)
class SwigluBackwardVariant(Variant):
    family = "quant"
    op = "swiglu_backward"

    in_dtype: str  # x: 'bf16' | 'fp32' | 'e4m3' (with fp32 SF of (1, num_per_channels) blocks)
    grad_dtype: str  # act_x_grad (and act_out): 'bf16' | 'fp32'
    out_fmt: str  # x_grad: 'bf16' | 'fp32'
    num_per_channels: int  # SF group width of the e4m3 x and x_grad; 0 without the cast
    round_sf: bool
    packed_ue8m0: bool

    @classmethod
    def all(cls):
        plain = [cls(d, d, f, 0, False, False) for d, f in itertools.product(("bf16", "fp32"), ("bf16", "fp32"))]
        cast = [
            cls("e4m3", g, "bf16", npc, rs, packed)
            for g, npc, (rs, packed) in itertools.product(
                ("bf16", "fp32"), SWIGLU_NUM_PER_CHANNELS, ((False, False), (True, False), (True, True))
            )
        ]
        return tuple(plain + cast)

    def params(self):
        return _PARAMS + (_CAST_PARAMS if self.in_dtype == "e4m3" else ())


@dataclasses.dataclass(frozen=True)
class SwigluBackwardAscendVariant(Variant):
    """The Ascend 950 kernels (kernels_tl/ascend/quant/swiglu_backward.py): the original's Ascend
    case, SF groups of 32 (x's fp32 SF; x_grad's fp32, power-of-two fp32 or UE8M0 two to an
    int16). The row factors e (0 on padding rows) come computed (torch, as the reference), the
    weight gradient as each row's fp32 sum of g * act (the host applies s and the padding mask)."""

    family = "quant"
    op = "swiglu_backward"
    backend = "ascend"

    in_dtype: str  # x: 'bf16' | 'fp32' | 'e4m3' (with fp32 SF in (1, 32) blocks)
    grad_dtype: str  # act_x_grad (and act_out): 'bf16' | 'fp32'
    out_fmt: str  # x_grad: 'bf16' | 'fp32'
    sf_mode: str  # x_grad's e4m3 copy (e4m3 x only): 'fp32' | 'round' | 'ue8m0'; 'none' otherwise
    num_vec_cores: int

    @classmethod
    def all(cls):
        plain = [(d, d, f, "none") for d in ("bf16", "fp32") for f in ("bf16", "fp32")]
        cast = [("e4m3", g, "bf16", m) for g in ("bf16", "fp32") for m in ("fp32", "round", "ue8m0")]
        return tuple(cls(*key, cores) for key in plain + cast for cores in ASCEND_VEC_CORES)

    def params(self):
        cast = self.sf_mode != "none"
        return (
            ptr("X", "G", "DX", "E", "ACT", "WS", *(("SIN", "Q", "S") if cast else ()))
            + i32("num_tokens", "hidden", "has_weights", "has_clamp", "with_act")
            + f32("clamp_value", *(("amax_clamp",) if cast else ()))
        )


_PARAMS = (
    ptr("X", "G", "DX", "A", "WG", "W", "P")
    + i32("num_experts", "use_psum", "search_steps", "alignment", "num_tokens", "hidden", "x_stride", "g_stride")
    + i32("has_weights", "do_recompute")
    + f32("scale", "clamp_value")
)
_CAST_PARAMS = ptr("XS") + i32("xs_stride_t", "xs_stride_g") + ptr("Q", "S") + i32("sf_stride_t", "sf_stride_g")
_CAST_PARAMS += f32("amax_clamp")


_KERNELS = KernelTable(SwigluBackwardVariant)
# Call plans by call key (the fast path at the top of each op; _swiglu_backward_plans.py builds them).
_PLANS = plan.cache()
_CAST_PLANS = plan.cache()


def _check_grad(act_x_grad, x, num_tokens, hidden) -> str:
    if not isinstance(act_x_grad, torch.Tensor):
        raise TypeError(f"act_x_grad must be a torch.Tensor, got {type(act_x_grad).__name__}")
    name = FLOAT_FORMATS.get(act_x_grad.dtype)
    if name is None:
        raise TypeError(f"act_x_grad must be bfloat16 or float32, got {act_x_grad.dtype}")
    if tuple(act_x_grad.shape) != (num_tokens, hidden):
        raise ValueError(
            f"act_x_grad must have shape {(num_tokens, hidden)} (x is (E, 2H)), got {tuple(act_x_grad.shape)}"
        )
    check_rows(act_x_grad, "act_x_grad", hidden_multiple=1)
    if act_x_grad.device != x.device:
        raise ValueError(f"act_x_grad must be on {x.device}, got {act_x_grad.device}")
    return name


def _check_options(x, psum, topk_weights, routed_scaling_factor, clamp_value, num_tokens):
    check_psum(psum, x)
    if topk_weights is not None:
        check_row_vector(topk_weights, "topk_weights", num_tokens, torch.float32, x)
    return (
        check_scalar(routed_scaling_factor, "routed_scaling_factor", positive=False),
        check_scalar(clamp_value, "clamp_value", positive=True),
    )


def _results(x_grad, quantized, weight_grad, act_out, topk_weights, do_recompute) -> tuple:
    out = (x_grad,) if quantized is None else (x_grad, quantized)
    if topk_weights is not None:
        out += (weight_grad,)
    if do_recompute:
        out += (act_out,)
    return out


def _reference(x, act_x_grad, psum, topk_weights, scale, clamp, npc=None):
    """(x_grad, weight_grad or None, act_out), all fp32, from tilebake.torch.swiglu_backward."""
    from tilebake.torch import swiglu_backward as reference

    outs = reference(x, act_x_grad, psum, topk_weights, scale, clamp, config.get_token_alignment(), npc)
    return (outs[0], None, outs[1]) if topk_weights is None else outs


def _launch(key, x, g, x_grad, act_out, weight_grad, psum, topk_weights, scale, clamp, extra=()):
    num_tokens, hidden = g.shape
    pointers = (x.data_ptr(), g.data_ptr(), x_grad.data_ptr(), act_out.data_ptr())
    for pointer, name in zip(pointers, ("x", "act_x_grad", "x_grad", "act_out")):
        if pointer % 16:
            check_aligned(pointer, name)
    _KERNELS[key](
        x.get_device(),
        *pointers, weight_grad.data_ptr(),
        topk_weights.data_ptr() if topk_weights is not None else pointers[0],
        psum.data_ptr() if psum is not None else pointers[0], *psum_args(psum, x)[1:],
        num_tokens, hidden, x.stride(0), g.stride(0),
        int(topk_weights is not None), int(act_out.numel() > 0),
        1.0 if scale is None else scale, math.inf if clamp is None else clamp,
        *extra,
    )  # fmt: skip


def _outputs(g, num_tokens, hidden, x_grad_dtype, topk_weights, do_recompute):
    x_grad = g.new_empty((num_tokens, 2 * hidden), dtype=x_grad_dtype)
    weight_grad = g.new_empty((num_tokens,), dtype=torch.float32) if topk_weights is not None else x_grad
    # Without do_recompute the kernel gets an empty act_out and writes none.
    act_out = g.new_empty((num_tokens, hidden) if do_recompute else (0, hidden), dtype=g.dtype)
    return x_grad, weight_grad, act_out


def swiglu_backward(
    x: torch.Tensor,
    act_x_grad: torch.Tensor,
    fmt: str,
    psum_num_tokens_per_expert: Optional[torch.Tensor] = None,
    topk_weights: Optional[torch.Tensor] = None,
    routed_scaling_factor: Optional[float] = None,
    clamp_value: Optional[float] = None,
    do_recompute: bool = False,
) -> tuple:
    """Gradients of swiglu_forward.

    Args:
        x: the forward input (E, 2H), bf16 or fp32, H % 64 == 0, rows 16-byte aligned.
        act_x_grad: gradient of the forward output (E, H), same dtype as x.
        fmt: dtype of x_grad, 'bf16' or 'fp32'.
        psum_num_tokens_per_expert, topk_weights, routed_scaling_factor, clamp_value: as in
            swiglu_forward (a decreasing or negative psum: which rows are padding is
            unspecified, as there); clamped elements get zero gradient. With topk_weights the
            padding rows of the psum layout get e = 0 (so +-0 gradients) and weight_grad 0; without
            them psum is not used and every row is computed (padding rows of act_x_grad must be
            0 for their gradients to be 0). routed_scaling_factor only enters with the weights.
        do_recompute: also return the forward output act_out.

    Returns:
        (x_grad (E, 2H) in fmt, [weight_grad fp32 (E,) if topk_weights], [act_out (E, H) in
        act_x_grad's dtype if do_recompute]). weight_grad[e] = sum_h(g * act) * s is a
        reduction summed in fp32 in the kernel's order; everything else is bit-equal to
        tilebake.torch.swiglu_backward on the same CUDA device, rounded to the output dtypes.
    """
    # The native path (as in swiglu_forward; the scalars' classes keep True off a plan for 1.0).
    if not torch.compiler.is_compiling():  # dynamo can neither hash the key nor trace the native call
        try:
            call = _PLANS[x.dtype, fmt, psum_num_tokens_per_expert is None, topk_weights is None, routed_scaling_factor,
                          routed_scaling_factor.__class__, clamp_value, clamp_value.__class__, do_recompute]  # fmt: skip
        except (KeyError, AttributeError, TypeError):
            pass
        else:
            result = plan.run(call, x, act_x_grad, psum_num_tokens_per_expert, topk_weights)
            if result is not NotImplemented:
                return result
    check_fmt(fmt, tuple(FLOAT_DTYPES))
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in FLOAT_FORMATS:
        raise TypeError(f"x must be bfloat16 or float32, got {x.dtype}")
    num_tokens, hidden = check_swiglu_input(x)
    grad_dtype = _check_grad(act_x_grad, x, num_tokens, hidden)
    if act_x_grad.dtype != x.dtype:
        raise TypeError(f"act_x_grad must have x's dtype {x.dtype}, got {act_x_grad.dtype}")
    psum = psum_num_tokens_per_expert
    scale, clamp = _check_options(x, psum, topk_weights, routed_scaling_factor, clamp_value, num_tokens)
    if torch.compiler.is_compiling():
        x_grad, weight_grad, act_out = torch.ops.tilebake.swiglu_backward(
            x, act_x_grad, fmt, psum, topk_weights, scale, clamp, bool(do_recompute)
        )
        return _results(x_grad, None, weight_grad, act_out, topk_weights, do_recompute)
    if x.device.type == "npu":  # the Ascend kernels
        from tilebake.quant import _swiglu_backward_ascend as npu

        dx, _, wg, act = npu.swiglu_backward(x, None, act_x_grad, fmt, psum, topk_weights, scale, clamp, do_recompute)
        return _results(dx, None, wg, act, topk_weights, do_recompute)
    if not x.is_cuda:
        dx, wg, act = _reference(x, act_x_grad, psum, topk_weights, scale, clamp)
        return _results(dx.to(FLOAT_DTYPES[fmt]), None, wg, act.to(act_x_grad.dtype), topk_weights, do_recompute)
    out_dtype = FLOAT_DTYPES[fmt]
    x_grad, weight_grad, act_out = _outputs(act_x_grad, num_tokens, hidden, out_dtype, topk_weights, do_recompute)
    if num_tokens:
        key = (grad_dtype, grad_dtype, fmt, 0, False, False)
        _launch(key, x, act_x_grad, x_grad, act_out, weight_grad, psum, topk_weights, scale, clamp)
        plan_key = (x.dtype, fmt, psum is None, topk_weights is None, routed_scaling_factor,
                    routed_scaling_factor.__class__, clamp_value, clamp_value.__class__, do_recompute)  # fmt: skip
        if bools(do_recompute) and plan_key not in _PLANS:
            plan.remember(
                _PLANS, plan_key,
                _plans.backward_plan, _KERNELS[key], x.get_device(), x.dtype, out_dtype, psum is not None,
                topk_weights is not None, scale, clamp, do_recompute,
            )  # fmt: skip
    return _results(x_grad, None, weight_grad, act_out, topk_weights, do_recompute)


def swiglu_backward_and_per_token_cast(
    x: QuantTensor,
    act_x_grad: torch.Tensor,
    fmt: str,
    num_per_channels: int,
    psum_num_tokens_per_expert: Optional[torch.Tensor] = None,
    topk_weights: Optional[torch.Tensor] = None,
    routed_scaling_factor: Optional[float] = None,
    use_tma_aligned_col_major_sf: bool = False,
    round_sf: bool = False,
    use_packed_ue8m0: bool = False,
    clamp_value: Optional[float] = None,
    do_recompute: bool = False,
) -> tuple:
    """Gradients of swiglu_forward from an FP8 forward input, with an FP8 copy of x_grad.

    Args:
        x: (data, sf): data e4m3 (E, 2H), H % 64 == 0, rows 16-byte aligned; sf fp32
            (E, 2H / num_per_channels), any strides (row-major or the TMA-aligned column-major view).
        act_x_grad: (E, H) bf16 or fp32, rows 16-byte aligned.
        fmt: 'e4m3', the format of the quantized x_grad.
        num_per_channels: 32 or 128, the SF block width of both x and the quantized x_grad.
        use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0: layout of the x_grad SF, as in
            per_token_cast.
        Others: as swiglu_backward.

    Returns:
        (x_grad bf16 (E, 2H), (x_grad_fp8 e4m3 (E, 2H), sf), [weight_grad fp32 (E,) if
        topk_weights], [act_out (E, H) in act_x_grad's dtype if do_recompute]). x_grad_fp8 is
        the per-token cast of the fp32 gradient (not of x_grad rounded to bf16).
    """
    if not torch.compiler.is_compiling():  # dynamo can neither hash the key nor trace the native call
        try:  # the native path, as in swiglu_backward
            call = _CAST_PLANS[act_x_grad.dtype, fmt, num_per_channels, psum_num_tokens_per_expert is None,
                               topk_weights is None, routed_scaling_factor, routed_scaling_factor.__class__,
                               use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0, clamp_value,
                               clamp_value.__class__, do_recompute]  # fmt: skip
        except (KeyError, AttributeError, TypeError):
            pass
        else:
            result = plan.run(call, x, act_x_grad, psum_num_tokens_per_expert, topk_weights)
            if result is not NotImplemented:
                return result
    check_fmt(fmt, ("e4m3",))
    if num_per_channels not in SWIGLU_NUM_PER_CHANNELS or isinstance(num_per_channels, bool):
        raise ValueError(f"num_per_channels must be one of {SWIGLU_NUM_PER_CHANNELS}, got {num_per_channels!r}")
    check_sf_options(round_sf, use_packed_ue8m0)
    try:
        data, x_sf = x
    except (TypeError, ValueError):
        raise TypeError("x must be a (data, sf) tuple of tensors (a QuantTensor)") from None
    if not isinstance(data, torch.Tensor) or not isinstance(x_sf, torch.Tensor):
        raise TypeError("x must be a (data, sf) tuple of tensors (a QuantTensor)")
    if data.dtype != torch.float8_e4m3fn:
        raise TypeError(f"x[0] must be torch.float8_e4m3fn, got {data.dtype}")
    num_tokens, hidden = check_swiglu_input(data, "x[0]")
    if x_sf.dtype != torch.float32:
        if x_sf.dtype == torch.int32:
            raise NotImplementedError("x[1] as packed UE8M0 (int32) is not built yet; pass fp32 scale factors")
        raise TypeError(f"x[1] must be torch.float32, got {x_sf.dtype}")
    sf_groups = 2 * hidden // num_per_channels
    if tuple(x_sf.shape) != (num_tokens, sf_groups):
        raise ValueError(f"x[1] must have shape {(num_tokens, sf_groups)}, got {tuple(x_sf.shape)}")
    if x_sf.device != data.device:
        raise ValueError(f"x[1] must be on {data.device}, got {x_sf.device}")
    grad_dtype = _check_grad(act_x_grad, data, num_tokens, hidden)
    psum = psum_num_tokens_per_expert
    scale, clamp = _check_options(data, psum, topk_weights, routed_scaling_factor, clamp_value, num_tokens)
    if torch.compiler.is_compiling():
        x_grad, q, sf, weight_grad, act_out = torch.ops.tilebake.swiglu_backward_and_per_token_cast(
            data, x_sf, act_x_grad, num_per_channels, psum, topk_weights, scale,
            bool(use_tma_aligned_col_major_sf), bool(round_sf), bool(use_packed_ue8m0), clamp, bool(do_recompute),
        )  # fmt: skip
        return _results(x_grad, (q, sf), weight_grad, act_out, topk_weights, do_recompute)
    amax_clamp = config.get_amax_clamp_for_quant("e4m3", False)
    if data.device.type == "npu" and num_per_channels == 32 and not use_tma_aligned_col_major_sf:
        from tilebake.quant import _swiglu_backward_ascend as npu  # the Ascend kernels (their SF layouts)

        mode = ascend_sf_mode(round_sf, use_packed_ue8m0)
        dx, quantized, wg, act = npu.swiglu_backward(
            data, x_sf, act_x_grad, "bf16", psum, topk_weights, scale, clamp, do_recompute, mode
        )
        return _results(dx, quantized, wg, act, topk_weights, do_recompute)
    amax_clamp = config.get_amax_clamp_for_quant("e4m3", False)
    if not data.is_cuda:
        from tilebake.torch import cast

        dx, wg, act = _reference((data, x_sf), act_x_grad, psum, topk_weights, scale, clamp, num_per_channels)
        quantized = cast(
            dx,
            "e4m3",
            (1, num_per_channels),
            round_sf=bool(round_sf),
            use_packed_ue8m0=bool(use_packed_ue8m0),
            use_tma_aligned_col_major_sf=bool(use_tma_aligned_col_major_sf),
            amax_clamp=amax_clamp,
        )
        return _results(dx.to(torch.bfloat16), quantized, wg, act.to(act_x_grad.dtype), topk_weights, do_recompute)
    x_grad, weight_grad, act_out = _outputs(act_x_grad, num_tokens, hidden, torch.bfloat16, topk_weights, do_recompute)
    q = data.new_empty((num_tokens, 2 * hidden))
    sf = alloc_sf(data, num_tokens, sf_groups, use_packed_ue8m0, use_tma_aligned_col_major_sf)
    if num_tokens:
        q_ptr = q.data_ptr()
        if q_ptr % 16:
            check_aligned(q_ptr, "x_grad_fp8")
        key = ("e4m3", grad_dtype, "bf16", num_per_channels, bool(round_sf), bool(use_packed_ue8m0))
        sf_stride_t, sf_stride_g = sf_strides_for_kernel(sf, use_packed_ue8m0)
        extra = (x_sf.data_ptr(), x_sf.stride(0), x_sf.stride(1), q_ptr, sf.data_ptr(), sf_stride_t, sf_stride_g,
                 amax_clamp)  # fmt: skip
        _launch(key, data, act_x_grad, x_grad, act_out, weight_grad, psum, topk_weights, scale, clamp,
                extra)  # fmt: skip
        flags = (use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0, do_recompute)
        plan_key = (act_x_grad.dtype, fmt, num_per_channels, psum is None, topk_weights is None, routed_scaling_factor,
                    routed_scaling_factor.__class__, *flags[:3], clamp_value, clamp_value.__class__, do_recompute)
        if bools(*flags) and plan_key not in _CAST_PLANS:
            plan.remember(
                _CAST_PLANS, plan_key,
                _plans.backward_cast_plan, _KERNELS[key], data.get_device(), act_x_grad.dtype, int(num_per_channels),
                psum is not None, topk_weights is not None, scale, clamp, use_tma_aligned_col_major_sf,
                use_packed_ue8m0, do_recompute,
            )  # fmt: skip
    return _results(x_grad, (q, sf), weight_grad, act_out, topk_weights, do_recompute)


# torch.library: the ops torch.compile traces (_swiglu_compile.py), run by these functions.
register_backward_ops(swiglu_backward, swiglu_backward_and_per_token_cast)
