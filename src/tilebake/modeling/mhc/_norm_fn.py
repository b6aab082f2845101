"""The pre-norm projection: mixes = (flatten(residual) @ fn'^T) * rsqrt(mean(flatten(residual)^2) + eps)
with fn' = fn * norm_weight (its own autograd node) where a norm weight is given.

Kernel path (bf16 residual): mhc_pre_norm_gemm_fwd leaves split-K partials of x @ fn'^T (fn'
rounded to TF32) and of sum x^2, mhc_reduce_partials_and_rmsnorm_fwd reduces them and applies the
RMS scale; the backward runs mhc_reduce_partials_and_rmsnorm_bwd, then mhc_pre_norm_gemm_bwd,
which adds the residual's gradient into a given buffer (project_bwd's residual_grad: how the
fused mhc_pre / mhc_head Functions keep one residual-gradient buffer). fp32/fp64 residuals take
the reference math. fn, fn' and norm_weight follow the Megatron main_grad convention.
"""

from __future__ import annotations

from typing import Optional

import torch

import tilebake.mhc as kernels
from tilebake.modeling.mhc import _reference
from tilebake.modeling.mhc._common import autograd_of, check_fn, param_grad, reference_mixes, reference_streams


def project_fwd(residual, fn, norm_eps: float, n_splits: int):
    """(mixes (T, m3), out_mul (T, 1, m3), sqrsum (T, 1)) of the projection, fp32."""
    k = fn.shape[1]
    out_mul_s, sqrsum_s = kernels.mhc_pre_norm_gemm_fwd(residual, fn, n_splits=n_splits)
    out_mul, sqrsum, mixes = kernels.mhc_reduce_partials_and_rmsnorm_fwd(
        out_mul_s, sqrsum_s, rms_group_size=k, rms_eps=norm_eps, n_splits=n_splits
    )
    return mixes, out_mul, sqrsum


def project_bwd(mixes_grad, residual, fn, out_mul, sqrsum, norm_eps: float, residual_grad=None):
    """(residual_grad, fn_grad) of the projection; residual_grad, if given, is added into in place
    and returned (else allocated), fn_grad (m3, K) fp32 is new."""
    k = fn.shape[1]
    out_mul_grad, sqrsum_grad = kernels.mhc_reduce_partials_and_rmsnorm_bwd(
        mixes_grad.contiguous().view(-1, fn.shape[0]), out_mul, sqrsum, rms_group_size=k, rms_eps=norm_eps
    )
    return kernels.mhc_pre_norm_gemm_bwd(residual, fn, out_mul_grad, sqrsum_grad, residual_grad=residual_grad)


class MhcFnNormwMergeFn(torch.autograd.Function):
    """fn' = fn * norm_weight (fn (rows, K), norm_weight (K,), fp32): the norm weight folded into
    the projection, with both gradients (mhc_fn_normw_merge_bwd)."""

    @staticmethod
    def forward(ctx, fn, norm_weight):
        if fn.dim() != 2 or tuple(norm_weight.shape) != (fn.shape[1],):
            raise ValueError(f"mhc_norm_weight must have shape ({fn.shape[-1]},) for fn {tuple(fn.shape)}, "
                             f"got {tuple(norm_weight.shape)}")  # fmt: skip
        ctx.reference = reference_mixes(fn)  # fp32 takes the merge kernel, fp64 the reference
        ctx.params = (fn, norm_weight)  # the caller's tensors: main_grad is read from them in backward
        fn, norm_weight = fn.contiguous(), norm_weight.contiguous()
        ctx.save_for_backward(fn, norm_weight)
        if ctx.reference:
            return fn * norm_weight
        return kernels.mhc_fn_normw_merge_fwd(fn, norm_weight)

    @staticmethod
    def backward(ctx, grad):
        fn, norm_weight = ctx.saved_tensors
        grad = grad.contiguous()
        if ctx.reference:
            fn_grad, nw_grad = grad * norm_weight, (grad * fn).sum(0)
        else:
            fn_grad, nw_grad = kernels.mhc_fn_normw_merge_bwd(fn, norm_weight, grad)
        fn_param, nw_param = ctx.params
        needs = ctx.needs_input_grad
        return param_grad(fn_param, fn_grad, needs[0]), param_grad(nw_param, nw_grad, needs[1])


class ZeroPadRowsFn(torch.autograd.Function):
    """fn (r, K) -> (rows, K), the rows past r zero (mhc_head's (m, m H) fn padded to m3 rows for
    the shared projection); the backward keeps the first r rows of the gradient."""

    @staticmethod
    def forward(ctx, fn, rows: int):
        ctx.param = fn
        padded = fn.new_zeros((rows, fn.shape[1]))
        padded[: fn.shape[0]] = fn
        return padded

    @staticmethod
    def backward(ctx, grad):
        fn = ctx.param
        return param_grad(fn, grad[: fn.shape[0]], ctx.needs_input_grad[0]), None


class MhcPreNormFn(torch.autograd.Function):
    """residual (..., m, H), fn' (m3, m H) fp32 -> mixes (..., m3) fp32 (the projection above)."""

    @staticmethod
    def forward(ctx, residual, fn, norm_eps: float, n_splits: int):
        check_fn(fn, fn.shape[0], residual)
        ctx.reference = reference_streams(residual)
        ctx.args = (norm_eps, n_splits)
        ctx.param = fn
        residual, fn = residual.contiguous(), fn.contiguous()
        lead = residual.shape[:-2]
        if ctx.reference:
            ctx.save_for_backward(residual, fn)
            return _reference.pre_norm_fn(residual, fn, norm_eps)
        mixes, out_mul, sqrsum = project_fwd(residual, fn, norm_eps, n_splits)
        ctx.save_for_backward(residual, fn, out_mul, sqrsum)
        return mixes.view(*lead, fn.shape[0])

    @staticmethod
    def backward(ctx, grad):
        norm_eps, _ = ctx.args
        needs = ctx.needs_input_grad[:2]
        if ctx.reference:
            residual, fn = ctx.saved_tensors
            residual_grad, fn_grad = autograd_of(lambda r, f: _reference.pre_norm_fn(r, f, norm_eps), (residual, fn),
                                                 needs, (grad,))  # fmt: skip
        else:
            residual, fn, out_mul, sqrsum = ctx.saved_tensors
            residual_grad, fn_grad = project_bwd(grad, residual, fn, out_mul, sqrsum, norm_eps)
        return (residual_grad if needs[0] else None), param_grad(ctx.param, fn_grad, needs[1]), None, None


def merged_fn(fn: torch.Tensor, norm_weight: Optional[torch.Tensor]) -> torch.Tensor:
    """fn' = fn * norm_weight as its own autograd node, or fn itself without a weight."""
    return fn if norm_weight is None else MhcFnNormwMergeFn.apply(fn, norm_weight)


def mhc_pre_norm_fn(residual, mhc_fn, mhc_norm_weight, mhc_norm_eps: float, fuse_grad_acc: bool = True,
                    n_splits: int = 16) -> torch.Tensor:  # fmt: skip
    """mixes = (flatten(residual) @ fn'^T) * rsqrt(mean(flatten(residual)^2) + eps), fn' = mhc_fn *
    mhc_norm_weight where a weight is given: residual (..., m, H) bf16, mhc_fn (m3, m H) fp32,
    mhc_norm_weight (m H,) fp32 or None -> (..., m3) fp32. The GEMM runs with fn' rounded to TF32,
    split-K over n_splits (partials reduced afterwards).

    fuse_grad_acc is accepted for the original's signature and changes nothing: the original
    used it to add this gradient into a buffer mhc_post's backward had left on the residual's
    storage; here the residual's gradient is written once into the tensor autograd returns (no
    pairing between calls needed), so both settings give the same gradients.
    """
    del fuse_grad_acc
    return MhcPreNormFn.apply(residual, merged_fn(mhc_fn, mhc_norm_weight), mhc_norm_eps, n_splits)
