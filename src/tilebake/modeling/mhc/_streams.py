"""The autograd Functions over the residual streams themselves: expand_to_mhc (broadcast to m
streams), mhc_post (a layer's output merged back) and mhc_pre_apply_mix (the streams mixed into a
layer's input). bf16 streams call tilebake.mhc's entry points (our kernels on CUDA, their
references on the CPU); fp32 and fp64 streams take the reference math (what gradcheck runs).
Inputs are made contiguous (a no-op when they are), as the kernels need.
"""

from __future__ import annotations

from typing import Optional

import torch

import tilebake.mhc as kernels
from tilebake.modeling.mhc import _reference
from tilebake.modeling.mhc._common import autograd_of, reference_streams


class ExpandToMhcFn(torch.autograd.Function):
    """(..., H) -> (..., m, H), each stream a copy; the backward sums the streams."""

    @staticmethod
    def forward(ctx, hidden, mhc_mult: int, out: Optional[torch.Tensor] = None):
        ctx.reference = reference_streams(hidden)
        hidden = hidden.contiguous()
        given = out is not None
        if out is None:
            out = hidden.new_empty((*hidden.shape[:-1], mhc_mult, hidden.shape[-1]))
        if ctx.reference:
            out.copy_(_reference.expand(hidden, mhc_mult))
        else:
            kernels.expand_to_mhc_fwd(hidden, out)
        if given:
            ctx.mark_dirty(out)
        return out

    @staticmethod
    def backward(ctx, grad):
        if ctx.reference:
            return grad.sum(-2), None, None
        return kernels.expand_to_mhc_bwd(grad.contiguous()), None, None


class MhcPostFn(torch.autograd.Function):
    """out[..., o, :] = post[..., o] x + sum_i comb[..., i, o] residual[..., i, :]; the backward is
    mhc_post_bwd (all four gradients in one pass)."""

    @staticmethod
    def forward(ctx, x, residual, post_layer_mix, comb_res_mix, out: Optional[torch.Tensor] = None):
        ctx.reference = reference_streams(residual)
        x, residual = x.contiguous(), residual.contiguous()
        post_layer_mix, comb_res_mix = post_layer_mix.contiguous(), comb_res_mix.contiguous()
        ctx.save_for_backward(x, residual, post_layer_mix, comb_res_mix)
        if ctx.reference:
            result = _reference.post(x, residual, post_layer_mix, comb_res_mix)
            if out is None:
                return result
            out.copy_(result)
        else:
            result = kernels.mhc_post_fwd(x, residual, post_layer_mix, comb_res_mix, out=out)
            if out is None:
                return result
        ctx.mark_dirty(out)
        return out

    @staticmethod
    def backward(ctx, grad):
        saved = ctx.saved_tensors
        if ctx.reference:
            grads = autograd_of(_reference.post, saved, ctx.needs_input_grad[:4], (grad,))
        else:
            grads = kernels.mhc_post_bwd(*saved, grad.contiguous())
        return (*grads, None)


class MhcPreApplyMixFn(torch.autograd.Function):
    """sum_i mix[..., i] x[..., i, :]; mix (..., m) or (..., m, 1). The backward allocates x's
    gradient zeroed and lets mhc_pre_apply_mix_bwd accumulate into it (its only write form)."""

    @staticmethod
    def forward(ctx, x, mix, out: Optional[torch.Tensor] = None):
        ctx.reference = reference_streams(x)
        x, mix = x.contiguous(), mix.contiguous()
        ctx.save_for_backward(x, mix)
        if ctx.reference:
            result = _reference.pre_apply_mix(x, mix)
            if out is None:
                return result
            out.copy_(result)
        else:
            result = kernels.mhc_pre_apply_mix_fwd(x, mix, o=out)
            if out is None:
                return result
        ctx.mark_dirty(out)
        return out

    @staticmethod
    def backward(ctx, grad):
        x, mix = ctx.saved_tensors
        if ctx.reference:
            return (*autograd_of(_reference.pre_apply_mix, (x, mix), ctx.needs_input_grad[:2], (grad,)), None)
        x_grad = torch.zeros_like(x) if ctx.needs_input_grad[0] else None
        mix_grad = kernels.mhc_pre_apply_mix_bwd(grad.contiguous(), x, mix, x_grad=x_grad)
        return x_grad, mix_grad, None


def expand_to_mhc(hidden: torch.Tensor, mhc_mult: int, out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """hidden (..., H) -> (..., mhc_mult, H), each stream a copy (written into out if given);
    differentiable (the gradient is the sum over the streams)."""
    return ExpandToMhcFn.apply(hidden, mhc_mult, out)


def mhc_post(x, residual, post_layer_mix, comb_res_mix, out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """out[..., o, :] = post_layer_mix[..., o] * x + sum_i comb_res_mix[..., i, o] * residual[..., i, :].

    x (..., H) bf16; residual (..., m, H) bf16; post_layer_mix (..., m) or (..., m, 1) fp32;
    comb_res_mix (..., m, m) fp32; out (..., m, H) bf16 if given. m = 1 to 8. Differentiable in
    all four inputs; fp32/fp64 streams take the reference math.
    """
    return MhcPostFn.apply(x, residual, post_layer_mix, comb_res_mix, out)


def mhc_pre_apply_mix(x: torch.Tensor, mix: torch.Tensor, out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """sum_i mix[..., i] * x[..., i, :]: x (..., m, H) bf16, mix (..., m) or (..., m, 1) fp32 ->
    (..., H) bf16 (into out if given). Differentiable in x and mix."""
    return MhcPreApplyMixFn.apply(x, mix, out)
