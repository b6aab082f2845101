"""swiglu_forward / _backward (and their _and_per_token_cast) under torch.compile(fullgraph=True):
their torch.library ops and shape functions. Apart from swiglu_forward.py / swiglu_backward.py
because eager calls never come here; those modules register the ops on import, handing in the
functions the ops run.
"""

from __future__ import annotations

import torch

from tilebake._library import register
from tilebake.quant._common import FLOAT_DTYPES, alloc_sf
from tilebake.utils import ceil_div


def register_forward_ops(swiglu_forward, swiglu_forward_and_per_token_cast) -> None:
    def op_impl(x, fmt, psum, topk_weights, routed_scaling_factor, clamp_value, clamped_count):
        return swiglu_forward(x, fmt, psum, topk_weights, routed_scaling_factor, clamp_value, clamped_count)

    def op_cast_impl(x, npc, psum, topk_weights, scale, col_major_sf, round_sf, packed, clamp_value, clamped_count):
        return swiglu_forward_and_per_token_cast(
            x, "e4m3", npc, psum, topk_weights, scale, col_major_sf, round_sf, packed, clamp_value, clamped_count
        )

    # Shape functions as Meta kernels (what torch.compile's fake tensors run).
    def meta(x, fmt, psum, topk_weights, routed_scaling_factor, clamp_value, clamped_count):
        return x.new_empty((x.shape[0], x.shape[1] // 2), dtype=FLOAT_DTYPES[fmt])

    def meta_cast(x, npc, psum, topk_weights, scale, col_major_sf, round_sf, packed, clamp_value, clamped_count):
        num_tokens, hidden = x.shape[0], x.shape[1] // 2
        data = x.new_empty((num_tokens, hidden), dtype=torch.float8_e4m3fn)
        return data, alloc_sf(x, num_tokens, ceil_div(hidden, npc), packed, col_major_sf)

    register(
        "swiglu_forward(Tensor x, str fmt, Tensor? psum, Tensor? topk_weights, float? routed_scaling_factor,"
        " float? clamp_value, Tensor(a!)? clamped_count) -> Tensor",
        op_impl,
        meta,
    )
    register(
        "swiglu_forward_and_per_token_cast(Tensor x, int num_per_channels, Tensor? psum, Tensor? topk_weights,"
        " float? routed_scaling_factor, bool col_major_sf, bool round_sf, bool packed_ue8m0, float? clamp_value,"
        " Tensor(a!)? clamped_count) -> (Tensor, Tensor)",
        op_cast_impl,
        meta_cast,
    )


# The backward ops always return weight_grad and act_out (empty when not asked for), so their
# schemas have a fixed arity; the public functions drop them again.


def _fill_optional(outs: tuple, g: torch.Tensor, topk_weights, do_recompute) -> tuple:
    """(weight_grad, act_out) from a public result's tail, fresh empty tensors where absent."""
    outs = list(outs)
    act_out = outs.pop() if do_recompute else g.new_empty((0, g.shape[1]))
    weight_grad = outs.pop() if topk_weights is not None else g.new_empty((0,), dtype=torch.float32)
    return weight_grad, act_out


def _meta_optional(g, topk_weights, do_recompute):
    num_tokens, hidden = g.shape
    weight_grad = g.new_empty((num_tokens if topk_weights is not None else 0,), dtype=torch.float32)
    return weight_grad, g.new_empty((num_tokens if do_recompute else 0, hidden))


def register_backward_ops(swiglu_backward, swiglu_backward_and_per_token_cast) -> None:
    def op_impl(x, g, fmt, psum, topk_weights, scale, clamp, do_recompute):
        outs = swiglu_backward(x, g, fmt, psum, topk_weights, scale, clamp, do_recompute)
        return (outs[0], *_fill_optional(outs[1:], g, topk_weights, do_recompute))

    def op_cast_impl(data, x_sf, g, npc, psum, topk_weights, scale, col, round_sf, packed, clamp, do_recompute):
        outs = swiglu_backward_and_per_token_cast(
            (data, x_sf), g, "e4m3", npc, psum, topk_weights, scale, col, round_sf, packed, clamp, do_recompute
        )
        return (outs[0], *outs[1], *_fill_optional(outs[2:], g, topk_weights, do_recompute))

    def meta(x, g, fmt, psum, topk_weights, scale, clamp, do_recompute):
        x_grad = g.new_empty((g.shape[0], 2 * g.shape[1]), dtype=FLOAT_DTYPES[fmt])
        return (x_grad, *_meta_optional(g, topk_weights, do_recompute))

    def meta_cast(data, x_sf, g, npc, psum, topk_weights, scale, col, round_sf, packed, clamp, do_recompute):
        num_tokens, width = data.shape
        x_grad = g.new_empty((num_tokens, width), dtype=torch.bfloat16)
        q = data.new_empty((num_tokens, width))
        sf = alloc_sf(data, num_tokens, width // npc, packed, col)
        return (x_grad, q, sf, *_meta_optional(g, topk_weights, do_recompute))

    register(
        "swiglu_backward(Tensor x, Tensor act_x_grad, str fmt, Tensor? psum, Tensor? topk_weights,"
        " float? routed_scaling_factor, float? clamp_value, bool do_recompute) -> (Tensor, Tensor, Tensor)",
        op_impl,
        meta,
    )
    register(
        "swiglu_backward_and_per_token_cast(Tensor x_data, Tensor x_sf, Tensor act_x_grad, int num_per_channels,"
        " Tensor? psum, Tensor? topk_weights, float? routed_scaling_factor, bool col_major_sf, bool round_sf,"
        " bool packed_ue8m0, float? clamp_value, bool do_recompute) -> (Tensor, Tensor, Tensor, Tensor, Tensor)",
        op_cast_impl,
        meta_cast,
    )
