"""The Engram gate as an autograd Function (the original's tile_kernels.modeling.engram).

    out = engram_gate(hidden_states, kv, weight_hidden, weight_embed, clamp_value, eps, image_token_mask=None)
    out = engram_gate(hidden_states, k, v, weight_hidden, weight_embed, clamp_value, eps)   # the 1.0 form

hidden_states [*, hc, H] bf16; kv [*, hc + 1, H] (or [*, (hc + 1) H]) bf16, k = its first hc
rows, v its last (shared by the heads); 1.0: k [*, hc, H], v [*, H]; weight_hidden, weight_embed
[hc, H] bf16. Forward: fused_weight, then engram_gate_fwd (saving dot, gate, both rstd);
backward: engram_gate_bwd, then grad_w_reduce (the partials in a fixed order). A weight with a
`main_grad` attribute (Megatron) gets its gradient added to main_grad in place and None returned.

float32 and float64 inputs (all of them) take the references (tilebake.torch.engram) on any
device: what torch.autograd.gradcheck runs.
"""

from __future__ import annotations

import torch

from tilebake.engram.engram_gate_bwd import gate_backward
from tilebake.engram.engram_gate_fwd import gate_forward
from tilebake.engram.fused_weight import fused_weight
from tilebake.engram.grad_w_reduce import grad_w_reduce
from tilebake.torch import engram as ref


def _split(hidden_states, args):
    """(k, v, kv, weight_hidden, weight_embed, clamp_value, eps, mask) of either form, k and v
    as (T, hc, H) and (T, H) views, kv (T, hc + 1, H) or None."""
    if len(args) >= 4 and isinstance(args[3], torch.Tensor):  # 1.0: k, v, wh, we, clamp, eps
        if len(args) != 6:
            raise TypeError("engram_gate(hidden_states, k, v, weight_hidden, weight_embed, clamp_value, eps)")
        k, v, wh, we, clamp_value, eps = args
        hc, hidden = hidden_states.shape[-2:]
        return k.reshape(-1, hc, hidden), v.reshape(-1, hidden), None, wh, we, clamp_value, eps, None
    if len(args) not in (5, 6):
        raise TypeError("engram_gate(hidden_states, kv, weight_hidden, weight_embed, clamp_value, eps, image_token_mask=None)")
    kv, wh, we, clamp_value, eps = args[:5]
    mask = args[5] if len(args) == 6 else None
    if not isinstance(kv, torch.Tensor) or not isinstance(hidden_states, torch.Tensor):
        raise TypeError("engram_gate: hidden_states and kv must be tensors")
    hc, hidden = hidden_states.shape[-2:]
    if kv.numel() != hidden_states.numel() // hc * (hc + 1):
        raise ValueError(f"kv must be [*, hc + 1, H] with hidden_states [*, hc, H] = {tuple(hidden_states.shape)}, got {tuple(kv.shape)}")
    kv = kv.reshape(-1, hc + 1, hidden)
    return kv[:, :hc], kv[:, hc], kv, wh, we, clamp_value, eps, mask.reshape(-1) if mask is not None else None


def _reference(t: torch.Tensor) -> bool:
    return t.dtype in (torch.float32, torch.float64)


class EngramGateFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden_states, *args):
        k, v, kv, wh, we, clamp_value, eps, mask = _split(hidden_states, args)
        hc, hidden = hidden_states.shape[-2:]
        x = hidden_states.reshape(-1, hc, hidden)
        ctx.form_kv = kv is not None
        ctx.shapes = (hidden_states.shape, None if kv is None else args[0].shape, None if kv is not None else args[0].shape,
                      None if kv is not None else args[1].shape)  # fmt: skip
        ctx.clamp_value = clamp_value
        ctx.reference = _reference(hidden_states)
        if ctx.reference:
            w = wh * we
            out, dot, gate, rx, rk = ref.engram_gate_fwd_ref(x, torch.cat([k, v[:, None]], 1), w, eps, clamp_value, mask)
        else:
            w = fused_weight(wh, we)
            out, dot, gate, rx, rk = gate_forward(x, k, v, None, w, eps, clamp_value, True, mask, False)
        ctx.save_for_backward(x, k, v, w, wh, we, dot, gate, rx, rk, mask)
        return out.view(hidden_states.shape)

    @staticmethod
    def backward(ctx, grad_out):
        x, k, v, w, wh, we, dot, gate, rx, rk, mask = ctx.saved_tensors
        g = grad_out.reshape(x.shape).to(x.dtype)
        if ctx.reference:
            dx, grad_kv, partial = ref.engram_gate_bwd_ref(g, x, torch.cat([k, v[:, None]], 1), w, dot, gate, rx, rk,
                                                           ctx.clamp_value, mask)  # fmt: skip
            hc = x.shape[1]
            dk, dv = grad_kv[:, :hc], grad_kv[:, hc]
        else:
            grad_kv = torch.empty((x.shape[0], x.shape[1] + 1, x.shape[2]), dtype=x.dtype, device=x.device)
            dk, dv = grad_kv[:, : x.shape[1]], grad_kv[:, x.shape[1]]
            dx, partial = gate_backward(g, x, k, v, w, dot, gate, rx, rk, ctx.clamp_value, mask, dk, dv)
        dwh, dwe = _weight_grads(ctx, partial, wh, we)
        hidden_shape, kv_shape, k_shape, v_shape = ctx.shapes
        dx = dx.view(hidden_shape)
        if ctx.form_kv:
            return dx, grad_kv.view(kv_shape), dwh, dwe, None, None, None
        return dx, dk.reshape(k_shape), dv.reshape(v_shape), dwh, dwe, None, None


def _weight_grads(ctx, partial, wh, we):
    """(grad of weight_hidden, grad of weight_embed): into main_grad where a weight has one
    (returning None), else new tensors in the weights' dtype."""
    first = 3 if ctx.form_kv else 4  # weight_hidden's input index (hidden_states is 1)
    need_h, need_e = ctx.needs_input_grad[first - 1], ctx.needs_input_grad[first]
    if not (need_h or need_e):
        return None, None
    buffers = []
    for weight in (wh, we):
        main = getattr(weight, "main_grad", None)
        direct = (
            main is not None and main.dtype == partial.dtype and main.shape == weight.shape and main.is_contiguous()
            and main.data_ptr() % 16 == 0 and main.device == partial.device
        )  # fmt: skip
        buffers.append(main if direct else torch.zeros(weight.shape, dtype=partial.dtype, device=partial.device))
    if ctx.reference:
        ref.grad_w_reduce_ref(partial, wh, we, *buffers)
    else:
        grad_w_reduce(partial, wh, we, *buffers)
    grads = []
    for weight, buf, needed in zip((wh, we), buffers, (need_h, need_e)):
        main = getattr(weight, "main_grad", None)
        if main is not None:
            if buf is not main:
                main.add_(buf.to(main.dtype))
            grads.append(None)
        else:
            grads.append(buf.to(weight.dtype) if needed else None)
    return tuple(grads)


engram_gate = EngramGateFn.apply

__all__ = ["EngramGateFn", "engram_gate"]
