"""mhc_pre and mhc_head as single autograd Functions over the kernel entry points, so that the
residual's gradient takes one full-size buffer.

The residual-gradient scheme. A layer's residual (..., m, H) feeds two paths inside mhc_pre (the
pre-norm projection, and the mix into the layer input) and, outside it, mhc_post. Composed of
separate Functions, the first two would each allocate a full-size gradient and autograd would
add them (a third buffer while the sum is formed). Here the backward allocates the residual's
gradient once, zeroed, and:
  1. mhc_pre_apply_mix_bwd(layer_input_grad, residual, pre, x_grad=buffer) accumulates
     pre[i] * layer_input_grad into it and returns pre's gradient;
  2. pre's, post's and comb's gradients go back through sinkhorn, split mixes and the RMS
     reduction (per-token, small);
  3. mhc_pre_norm_gemm_bwd(..., residual_grad=buffer) adds the projection's part in place.
The buffer is the gradient this Function returns for residual; autograd then adds mhc_post's
gradient of the same tensor into it (or it into that one), the one add any graph must do.
Saved for backward: residual and fn (inputs), the per-token mixes and the RMS partial sums.

mhc_head does the same with the head mix in place of split mixes and Sinkhorn. fp32/fp64 residuals
take the reference math, their gradients by torch autograd (what gradcheck runs).
"""

from __future__ import annotations

import torch

import tilebake.mhc as kernels
from tilebake.modeling.mhc import _reference
from tilebake.modeling.mhc._common import autograd_of, check_fn, mix_count, param_grad, reference_streams, tokens
from tilebake.modeling.mhc._mixes import head_mix_bwd
from tilebake.modeling.mhc._norm_fn import project_bwd, project_fwd


class MhcPreFn(torch.autograd.Function):
    """(residual (..., m, H) bf16, fn' (m3, m H) fp32, scale (3,), base (m3,)) -> (layer_input
    (..., H) bf16, post (..., m, 1) fp32, comb (..., m, m) fp32)."""

    @staticmethod
    def forward(ctx, residual, fn, mhc_scale, mhc_base, mhc_mult: int, post_mult_value: float, pre_eps: float,
                sinkhorn_eps: float, sinkhorn_repeat: int, norm_eps: float, n_splits: int):  # fmt: skip
        m, m3 = mhc_mult, mix_count(mhc_mult)
        check_fn(fn, m3, residual)
        if mhc_scale.numel() != 3 or tuple(mhc_base.shape) != (m3,):
            raise ValueError(f"mhc_pre with mhc_mult = {m} needs scale (3,) and base ({m3},), "
                             f"got {tuple(mhc_scale.shape)} and {tuple(mhc_base.shape)}")  # fmt: skip
        ctx.reference = reference_streams(residual)
        ctx.args = (m, post_mult_value, pre_eps, sinkhorn_eps, sinkhorn_repeat, norm_eps)
        ctx.params = (fn, mhc_scale, mhc_base)  # the caller's tensors: main_grad is read from them in backward
        lead = residual.shape[:-2]
        residual, fn = residual.contiguous(), fn.contiguous()
        scale, base = mhc_scale.contiguous().view(3), mhc_base.contiguous()
        if ctx.reference:
            ctx.save_for_backward(residual, fn, scale, base)
            return _reference.mhc_pre(residual, fn, scale, base, *ctx.args)
        mixes, out_mul, sqrsum = project_fwd(residual, fn, norm_eps, n_splits)
        pre, post, comb_logits = kernels.mhc_pre_split_mixes_fwd(
            mixes, scale, base, mhc_post_mult_value=post_mult_value, mhc_pre_eps=pre_eps
        )
        comb = kernels.mhc_sinkhorn_fwd(comb_logits, repeat=sinkhorn_repeat, eps=sinkhorn_eps)
        pre = pre.view(*lead, m, 1)
        layer_input = kernels.mhc_pre_apply_mix_fwd(residual, pre)
        ctx.save_for_backward(residual, fn, scale, base, out_mul, sqrsum, mixes, pre, post, comb_logits)
        return layer_input, post.view(*lead, m, 1), comb.view(*lead, m, m)

    @staticmethod
    def backward(ctx, layer_input_grad, post_grad, comb_grad):
        m, post_mult, _, sinkhorn_eps, repeat, norm_eps = ctx.args
        need_res, need_fn, need_scale, need_base = ctx.needs_input_grad[:4]
        fn_param, scale_param, base_param = ctx.params
        if ctx.reference:
            residual, fn, scale, base = ctx.saved_tensors
            args = ctx.args
            grads = autograd_of(lambda r, f, s, b: _reference.mhc_pre(r, f, s, b, *args), (residual, fn, scale, base),
                                (need_res, need_fn, need_scale, need_base),
                                (layer_input_grad, post_grad, comb_grad))  # fmt: skip
            residual_grad, fn_grad, scale_grad, base_grad = grads
        else:
            residual, fn, scale, base, out_mul, sqrsum, mixes, pre, post, comb_logits = ctx.saved_tensors
            residual_grad = torch.zeros_like(residual) if need_res else None
            pre_grad = kernels.mhc_pre_apply_mix_bwd(layer_input_grad.contiguous(), residual, pre, x_grad=residual_grad)
            comb_logits_grad = kernels.mhc_sinkhorn_bwd(tokens(comb_grad, m, m), comb_logits, repeat=repeat,
                                                        eps=sinkhorn_eps)  # fmt: skip
            mixes_grad, scale_grad, base_grad = kernels.mhc_pre_split_mixes_bwd(
                tokens(pre_grad, m, 1), tokens(post_grad, m, 1), comb_logits_grad, mixes, post, scale, base,
                mhc_post_mult_value=post_mult,
            )  # fmt: skip
            fn_grad = None
            if need_res or need_fn:
                residual_grad, fn_grad = project_bwd(mixes_grad, residual, fn, out_mul, sqrsum, norm_eps,
                                                     residual_grad=residual_grad)  # fmt: skip
        return (residual_grad if need_res else None, param_grad(fn_param, fn_grad, need_fn),
                param_grad(scale_param, scale_grad, need_scale), param_grad(base_param, base_grad, need_base),
                *([None] * 7))  # fmt: skip


class MhcHeadFn(torch.autograd.Function):
    """(residual (..., m, H) bf16, fn' (m3, m H) fp32 with rows m.. zero, scale (1,) or a scalar,
    base (m,)) -> (..., H) bf16: the first m mixes through the head mix, applied to the streams."""

    @staticmethod
    def forward(ctx, residual, fn, mhc_scale, mhc_base, pre_eps: float, norm_eps: float, n_splits: int):
        m = residual.shape[-2]
        check_fn(fn, mix_count(m), residual)
        if mhc_scale.numel() != 1 or tuple(mhc_base.shape) != (m,):
            raise ValueError(f"mhc_head with mhc_mult = {m} needs scale of one element and base ({m},), "
                             f"got {tuple(mhc_scale.shape)} and {tuple(mhc_base.shape)}")  # fmt: skip
        ctx.reference = reference_streams(residual)
        ctx.args = (pre_eps, norm_eps)
        ctx.params = (fn, mhc_scale, mhc_base)
        lead = residual.shape[:-2]
        residual, fn = residual.contiguous(), fn.contiguous()
        scale, base = mhc_scale.contiguous().view(1), mhc_base.contiguous()
        if ctx.reference:
            ctx.save_for_backward(residual, fn, scale, base)
            return _reference.mhc_head(residual, fn, scale, base, pre_eps, norm_eps)
        mixes, out_mul, sqrsum = project_fwd(residual, fn, norm_eps, n_splits)
        head_in = mixes[:, :m].contiguous()  # the kernel reads (T, m) rows; the padded mixes are unused
        mix = kernels.mhc_head_compute_mix_fwd(head_in, scale, base, mhc_pre_eps=pre_eps).view(*lead, m)
        ctx.save_for_backward(residual, fn, scale, base, out_mul, sqrsum, head_in, mix)
        return kernels.mhc_pre_apply_mix_fwd(residual, mix)

    @staticmethod
    def backward(ctx, grad):
        pre_eps, norm_eps = ctx.args
        need_res, need_fn, need_scale, need_base = ctx.needs_input_grad[:4]
        fn_param, scale_param, base_param = ctx.params
        if ctx.reference:
            residual, fn, scale, base = ctx.saved_tensors
            residual_grad, fn_grad, scale_grad, base_grad = autograd_of(
                lambda r, f, s, b: _reference.mhc_head(r, f, s, b, pre_eps, norm_eps), (residual, fn, scale, base),
                (need_res, need_fn, need_scale, need_base), (grad,),
            )  # fmt: skip
        else:
            residual, fn, scale, base, out_mul, sqrsum, head_in, mix = ctx.saved_tensors
            m = residual.shape[-2]
            residual_grad = torch.zeros_like(residual) if need_res else None  # see the module docstring
            mix_grad = kernels.mhc_pre_apply_mix_bwd(grad.contiguous(), residual, mix, x_grad=residual_grad)
            head_in_grad, scale_grad, base_grad = head_mix_bwd(tokens(mix_grad, m), head_in, scale, base)
            fn_grad = None
            if need_res or need_fn:
                mixes_grad = head_in_grad.new_zeros((head_in_grad.shape[0], fn.shape[0]))
                mixes_grad[:, :m] = head_in_grad
                residual_grad, fn_grad = project_bwd(mixes_grad, residual, fn, out_mul, sqrsum, norm_eps,
                                                     residual_grad=residual_grad)  # fmt: skip
        return (residual_grad if need_res else None, param_grad(fn_param, fn_grad, need_fn),
                param_grad(scale_param, scale_grad, need_scale), param_grad(base_param, base_grad, need_base),
                None, None, None)  # fmt: skip
