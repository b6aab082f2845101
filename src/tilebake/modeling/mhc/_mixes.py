"""The autograd Functions over the per-token mixes: mhc_pre_split_mixes, sinkhorn_normalize and
mhc_head_compute_mix. fp32 mixes call tilebake.mhc's entry points (our kernels on CUDA, their
references on the CPU) with the tokens flattened; any other dtype (fp64: gradcheck) takes the
references of tilebake.torch.mhc. scale and base follow the Megatron main_grad convention.
"""

from __future__ import annotations

import torch

import tilebake.mhc as kernels
from tilebake.modeling.mhc import _reference
from tilebake.modeling.mhc._common import autograd_of, mix_count, param_grad, reference_mixes, tokens


class MhcPreSplitMixesFn(torch.autograd.Function):
    """input_mixes (..., m3) -> (pre (..., m, 1), post (..., m, 1), comb (..., m, m))."""

    @staticmethod
    def forward(ctx, input_mixes, mhc_scale, mhc_base, mhc_mult: int, mhc_post_mult_value: float, mhc_pre_eps: float):
        m, m3 = mhc_mult, mix_count(mhc_mult)
        if input_mixes.shape[-1] != m3 or tuple(mhc_base.shape) != (m3,) or mhc_scale.numel() != 3:
            raise ValueError(f"mhc_pre_split_mixes with mhc_mult = {m} needs input_mixes (..., {m3}), mhc_scale (3,) "
                             f"and mhc_base ({m3},), got {tuple(input_mixes.shape)}, {tuple(mhc_scale.shape)} and "
                             f"{tuple(mhc_base.shape)}")  # fmt: skip
        ctx.reference = reference_mixes(input_mixes)
        ctx.args = (m, mhc_post_mult_value, mhc_pre_eps)
        ctx.lead = input_mixes.shape[:-1]
        ctx.params = (mhc_scale, mhc_base)  # the caller's tensors: main_grad is read from them in backward
        if ctx.reference:
            ctx.save_for_backward(input_mixes, mhc_scale, mhc_base)
            return _reference.split_mixes(input_mixes, mhc_scale, mhc_base, m, mhc_post_mult_value, mhc_pre_eps)
        flat, scale, base = tokens(input_mixes, m3), mhc_scale.contiguous().view(3), mhc_base.contiguous()
        pre, post, comb = kernels.mhc_pre_split_mixes_fwd(
            flat, scale, base, mhc_post_mult_value=mhc_post_mult_value, mhc_pre_eps=mhc_pre_eps
        )
        ctx.save_for_backward(flat, scale, base, post)
        return pre.view(*ctx.lead, m, 1), post.view(*ctx.lead, m, 1), comb.view(*ctx.lead, m, m)

    @staticmethod
    def backward(ctx, pre_grad, post_grad, comb_grad):
        m, post_mult, pre_eps = ctx.args
        needs = ctx.needs_input_grad[:3]
        if ctx.reference:
            mixes, scale, base = ctx.saved_tensors
            grads = autograd_of(lambda x, s, b: _reference.split_mixes(x, s, b, m, post_mult, pre_eps),
                                (mixes, scale, base), [True] * 3, (pre_grad, post_grad, comb_grad))  # fmt: skip
        else:
            flat, scale, base, post = ctx.saved_tensors
            grads = kernels.mhc_pre_split_mixes_bwd(
                tokens(pre_grad, m, 1), tokens(post_grad, m, 1), tokens(comb_grad, m, m), flat, post, scale, base,
                mhc_post_mult_value=post_mult,
            )  # fmt: skip
        params = ctx.params
        mixes_grad = grads[0].view(*ctx.lead, mix_count(m)) if needs[0] else None
        return (mixes_grad, param_grad(params[0], grads[1], needs[1]), param_grad(params[1], grads[2], needs[2]),
                None, None, None)  # fmt: skip


class SinkhornNormalizeFn(torch.autograd.Function):
    """(..., m, m) -> near doubly stochastic (row softmax + eps, then repeat column/row
    normalisations); the backward recomputes the iterations from the saved input."""

    @staticmethod
    def forward(ctx, x, repeat: int, eps: float):
        if x.dim() < 2 or x.shape[-1] != x.shape[-2]:
            raise ValueError(f"sinkhorn_normalize needs (..., m, m) matrices, got shape {tuple(x.shape)}")
        ctx.reference = reference_mixes(x)
        ctx.args = (repeat, eps)
        if ctx.reference:
            ctx.save_for_backward(x)
            return _reference.sinkhorn(x, repeat, eps)
        m = x.shape[-1]
        flat = tokens(x, m, m)
        ctx.save_for_backward(flat)
        return kernels.mhc_sinkhorn_fwd(flat, repeat=repeat, eps=eps).view(x.shape)

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        repeat, eps = ctx.args
        if ctx.reference:
            return autograd_of(lambda t: _reference.sinkhorn(t, repeat, eps), (x,), (True,), (grad,))[0], None, None
        m = x.shape[-1]
        return kernels.mhc_sinkhorn_bwd(tokens(grad, m, m), x, repeat=repeat, eps=eps).view(grad.shape), None, None


class MhcHeadComputeMixFn(torch.autograd.Function):
    """sigmoid(input_mix * scale + base) + eps: input_mix (..., m), scale a scalar or (1,), base
    (m,); the kernel's per-CTA partials of the scale and base gradients are summed here."""

    @staticmethod
    def forward(ctx, input_mix, mhc_scale, mhc_base, mhc_pre_eps: float):
        m = input_mix.shape[-1]
        if mhc_scale.numel() != 1 or tuple(mhc_base.shape) != (m,):
            raise ValueError(f"mhc_head_compute_mix needs mhc_scale of one element and mhc_base ({m},) for "
                             f"input_mix {tuple(input_mix.shape)}, got {tuple(mhc_scale.shape)} and "
                             f"{tuple(mhc_base.shape)}")  # fmt: skip
        ctx.reference = reference_mixes(input_mix)
        ctx.eps = mhc_pre_eps
        ctx.params = (mhc_scale, mhc_base)  # the caller's tensors: main_grad is read from them in backward
        if ctx.reference:
            ctx.save_for_backward(input_mix, mhc_scale, mhc_base)
            return _reference.head_compute_mix(input_mix, mhc_scale, mhc_base, mhc_pre_eps)
        flat, scale, base = tokens(input_mix, m), mhc_scale.contiguous().view(1), mhc_base.contiguous()
        ctx.save_for_backward(flat, scale, base)
        return kernels.mhc_head_compute_mix_fwd(flat, scale, base, mhc_pre_eps=mhc_pre_eps).view(input_mix.shape)

    @staticmethod
    def backward(ctx, grad):
        needs = ctx.needs_input_grad[:3]
        if ctx.reference:
            mix, scale, base = ctx.saved_tensors
            eps = ctx.eps
            grads = autograd_of(lambda x, s, b: _reference.head_compute_mix(x, s, b, eps), (mix, scale, base),
                                [True] * 3, (grad,))  # fmt: skip
            mhc_scale, mhc_base = ctx.params
            return grads[0], param_grad(mhc_scale, grads[1], needs[1]), param_grad(mhc_base, grads[2], needs[2]), None
        flat, scale, base = ctx.saved_tensors
        mix_grad, scale_partial, base_partial = head_mix_bwd(tokens(grad, flat.shape[-1]), flat, scale, base)
        mhc_scale, mhc_base = ctx.params
        return (mix_grad.view(grad.shape), param_grad(mhc_scale, scale_partial, needs[1]),
                param_grad(mhc_base, base_partial, needs[2]), None)  # fmt: skip


def head_mix_bwd(grad, mix, scale, base):
    """(input_mix_grad (T, m), scale_grad (1,), base_grad (m,)) of the head mix, the kernel's
    per-CTA partials summed over their rows (torch's sum: a fixed order, no atomics)."""
    # CPU tensors: one partial row (the default, the SM count, would ask CUDA for its device)
    num_sms = None if mix.is_cuda else 1
    mix_grad, scale_partial, base_partial = kernels.mhc_head_compute_mix_bwd(grad, mix, scale, base, num_sms=num_sms)
    return mix_grad, scale_partial.sum(0), base_partial.sum(0)


def mhc_pre_split_mixes(input_mixes, mhc_scale, mhc_base, mhc_mult: int, mhc_post_mult_value: float,
                        mhc_pre_eps: float):  # fmt: skip
    """input_mixes (..., m3) fp32 -> (pre (..., m, 1), post (..., m, 1), comb (..., m, m)), fp32:
    y = input_mixes * scale[segment] + base (scale (3,): pre, post, comb), pre = sigmoid(y[:m]) + eps,
    post = sigmoid(y[m:2m]) * post_mult, comb = y[2m:] as m x m. Differentiable in the mixes,
    scale and base (main_grad honoured)."""
    return MhcPreSplitMixesFn.apply(input_mixes, mhc_scale, mhc_base, mhc_mult, mhc_post_mult_value, mhc_pre_eps)


def sinkhorn_normalize(x: torch.Tensor, repeat: int = 10, eps: float = 1e-6) -> torch.Tensor:
    """(..., m, m) fp32 -> near doubly stochastic: softmax over the last dim + eps, a column
    normalisation, then repeat - 1 rounds of row and column normalisation (x / (sum + eps)).
    Differentiable (the backward recomputes the iterations)."""
    return SinkhornNormalizeFn.apply(x, repeat, eps)


def mhc_head_compute_mix(input_mix, mhc_scale, mhc_base, mhc_pre_eps: float) -> torch.Tensor:
    """sigmoid(input_mix * scale + base) + eps: input_mix (..., m) fp32, scale a scalar or (1,),
    base (m,). Differentiable; the scale and base gradients are reduced over the tokens
    (main_grad honoured)."""
    return MhcHeadComputeMixFn.apply(input_mix, mhc_scale, mhc_base, mhc_pre_eps)
