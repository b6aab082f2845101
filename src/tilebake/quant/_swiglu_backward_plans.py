"""Call plans (tilebake/_runtime/plan.py) of swiglu_backward and swiglu_backward_and_per_token_cast:
what the op's Python path does for one call key (same checks or stricter, same allocations and
kernel arguments, the same result tuple); built once per key after a successful launch."""

from __future__ import annotations

import torch

from tilebake import config
from tilebake._runtime import plan
from tilebake.quant._swiglu_forward_plans import alloc_sf, read_psum_and_weights, read_swiglu_input, scalar_args


def _read_grad(b: plan.Builder, dtype: torch.dtype):
    """act_x_grad (T, H) as _check_grad takes it (x's T and H), rows 16-byte aligned."""
    g = b.tensor(1, dtype, ("T", "H"), strides=("gs", 1))
    b.check(f"T == 1 or gs % {16 // dtype.itemsize} == 0")
    return g


def _outputs(b: plan.Builder, x_grad_dtype, g_dtype, has_weights, do_recompute):
    """_outputs' tensors: x_grad (T, 2H), weight_grad (T,) with weights, act_out (T, H) with
    do_recompute; the kernel arguments DX, WG, A (x_grad's pointer for an absent weight_grad,
    and a null one for the empty act_out the Python path passes without do_recompute)."""
    x_grad = b.alloc(x_grad_dtype, ("T", "W"))
    weight_grad = b.alloc(torch.float32, ("T",)) if has_weights else None
    act_out = b.alloc(g_dtype, ("T", "H")) if do_recompute else None
    args = dict(DX=x_grad, WG=x_grad if weight_grad is None else weight_grad, A=act_out, do_recompute=int(do_recompute))
    return x_grad, weight_grad, act_out, args


def _results(x_grad, quantized, weight_grad, act_out) -> tuple:
    out = (x_grad,) if quantized is None else (x_grad, quantized)
    return out + tuple(t for t in (weight_grad, act_out) if t is not None)


def backward_plan(kernel, device, dtype, out_dtype, has_psum, has_weights, scale, clamp, do_recompute):
    """swiglu_backward: run(plan, x, act_x_grad, psum, topk_weights)."""
    b = plan.Builder()
    x = read_swiglu_input(b, 0, dtype)
    g = _read_grad(b, dtype)
    options = read_psum_and_weights(b, 2, 3, x, has_psum, has_weights)
    x_grad, weight_grad, act_out, outs = _outputs(b, out_dtype, dtype, has_weights, do_recompute)
    b.launch(
        kernel, device, X=x, G=g, num_tokens="T", hidden="H", x_stride="xs", g_stride="gs",
        **outs, **options, **scalar_args(scale, clamp),
    )  # fmt: skip
    b.returns(_results(x_grad, None, weight_grad, act_out))
    return b.build()


def backward_cast_plan(
    kernel, device, g_dtype, npc, has_psum, has_weights, scale, clamp, col_major, packed, do_recompute
):
    """swiglu_backward_and_per_token_cast: run(plan, (data, sf), act_x_grad, psum, topk_weights)."""
    b = plan.Builder()
    x = read_swiglu_input(b, (0, 0), torch.float8_e4m3fn)
    x_sf = b.tensor((0, 1), torch.float32, ("T", f"W // {npc}"), strides=("xst", "xsg"), align=4)
    g = _read_grad(b, g_dtype)
    options = read_psum_and_weights(b, 2, 3, x, has_psum, has_weights)
    x_grad, weight_grad, act_out, outs = _outputs(b, torch.bfloat16, g_dtype, has_weights, do_recompute)
    q = b.alloc(torch.float8_e4m3fn, ("T", "W"))
    sf, sf_stride_t, sf_stride_g = alloc_sf(b, f"W // {npc}", packed, col_major)
    b.launch(
        kernel, device, X=x, G=g, num_tokens="T", hidden="H", x_stride="xs", g_stride="gs",
        XS=x_sf, xs_stride_t="xst", xs_stride_g="xsg", Q=q, S=sf, sf_stride_t=sf_stride_t, sf_stride_g=sf_stride_g,
        amax_clamp=config.get_amax_clamp_for_quant("e4m3", False), **outs, **options, **scalar_args(scale, clamp),
    )  # fmt: skip
    b.returns(_results(x_grad, (q, sf), weight_grad, act_out))
    return b.build()
