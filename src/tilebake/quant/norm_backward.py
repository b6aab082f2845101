"""norm_backward: RMSNorm backward.

Validate, allocate, launch. The kernel (kernels_tl/quant/norm_backward.py) is persistent:
min(CTAS_PER_SM * num_sms, num_tokens) CTAs (2 per SM for bf16, 1 for fp32) each write their
fp32 weight-gradient partial sums to one row of a (num_ctas, hidden) buffer, which a second
kernel (kernels_tl/quant/norm_backward_reduce.py) sums in a fixed order and adds into
weight_grad or rounds to the weight's dtype (the original syncs the grid in a cooperative launch
instead; the plain launcher has none). The reference (and the CPU path) is
tilebake.torch.norm_backward_ref. A CUDA call whose key was seen before runs its checks,
allocations and both launches as one call plan (quant/_norm_plans.py).
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Optional

import torch

from tilebake import config
from tilebake._library import register
from tilebake._runtime import plan
from tilebake._runtime.loader import KernelTable
from tilebake._variants import ASCEND_VEC_CORES, Variant, f32, i32, ptr
from tilebake.quant import _norm_plans
from tilebake.quant._common import FLOAT_FORMATS
from tilebake.quant.norm_forward import (
    check_float,
    check_like,
    check_norm_rows,
    check_pointers,
    check_weight,
    rows_strides,
)


@dataclasses.dataclass(frozen=True)
class NormBackwardVariant(Variant):
    family = "quant"
    op = "norm_backward"

    in_dtype: str  # 'bf16' | 'fp32'
    has_weight: bool  # False: unit weight, no weight_grad
    has_residual_grad: bool

    @classmethod
    def all(cls):
        return tuple(cls(*k) for k in itertools.product(("bf16", "fp32"), (False, True), (False, True)))

    def params(self):
        """The parameters the compiled kernel keeps (the lowering drops unused buffers and dims)."""
        params = ptr("G", "X", "RSTD", "DX") + f32("out_scale") + i32("num_tokens", "hidden", "num_ctas")
        params += i32("out_grad_stride", "x_stride", "x_grad_stride")
        if self.has_weight:
            params += ptr("W", "P")
        if self.has_residual_grad:
            params += ptr("ROG") + i32("residual_out_grad_stride")
        return params


@dataclasses.dataclass(frozen=True)
class NormBackwardAscendVariant(Variant):
    """The Ascend 950 kernels (kernels_tl/ascend/quant/norm_backward.py): contiguous rows of at
    most MAX_HIDDEN columns, a multiple of 128; each vector core's weight-gradient partial sums in
    a row of P, summed on the host side by torch (as the original's Ascend path reduces)."""

    family = "quant"
    op = "norm_backward"
    backend = "ascend"

    in_dtype: str  # 'bf16' | 'fp32'
    has_weight: bool
    has_residual_grad: bool
    num_vec_cores: int

    @classmethod
    def all(cls):
        keys = itertools.product(("bf16", "fp32"), (False, True), (False, True), ASCEND_VEC_CORES)
        return tuple(cls(*k) for k in keys)

    def params(self):
        buffers = ("G", "X", "RSTD", "DX", *(("W", "P") if self.has_weight else ()))
        buffers += ("ROG",) if self.has_residual_grad else ()
        return ptr(*buffers) + f32("out_scale") + i32("num_tokens", "hidden")


# CTAs per SM by x's dtype (the kernel asks the compiler for registers to fit that many): bf16,
# two, so one CTA's loads overlap another's reduction barrier; fp32 rows need twice the
# registers, one.
CTAS_PER_SM = {torch.bfloat16: 2, torch.float32: 1}


@dataclasses.dataclass(frozen=True)
class NormBackwardReduceVariant(Variant):
    """The weight gradient: the partial rows summed in a fixed order, then added to OUT's values in
    fp32 and rounded once (accumulate: a given weight_grad, in place), or rounded to out_dtype."""

    family = "quant"
    op = "norm_backward_reduce"

    out_dtype: str  # 'bf16' | 'fp32': weight_grad's (or the weight's) dtype

    PARAMS = ptr("P", "OUT") + i32("num_partials", "num_cols", "accumulate")  # num_cols: hidden

    @classmethod
    def all(cls):
        return (cls("bf16"), cls("fp32"))


_KERNELS = KernelTable(NormBackwardVariant)
_REDUCE_KERNELS = KernelTable(NormBackwardReduceVariant)
_WEIGHT_GRAD_DTYPES = (torch.bfloat16, torch.float32)
# Call plans (_norm_plans.backward_plan) by call key: they check, allocate and launch both kernels.
_PLANS = plan.cache()


def _check(out_grad, x, weight, rstd, residual_out_grad, out_scale, weight_grad) -> float:
    check_norm_rows(x, "x", 32, dims=(2,))
    check_like(out_grad, "out_grad", x)
    check_weight(weight, x)
    if not isinstance(rstd, torch.Tensor):
        raise TypeError(f"rstd must be a torch.Tensor, got {type(rstd).__name__}")
    if rstd.dtype != torch.float32:
        raise TypeError(f"rstd must be torch.float32, got {rstd.dtype}")
    if rstd.shape != x.shape[:1]:
        raise ValueError(f"rstd must have shape {tuple(x.shape[:1])} (x.shape[:-1]), got {tuple(rstd.shape)}")
    if rstd.device != x.device:
        raise ValueError(f"rstd must be on {x.device} (as x), got {rstd.device}")
    if rstd.numel() > 1 and rstd.stride(0) != 1:
        raise ValueError(f"rstd must be contiguous, got stride {rstd.stride()}")
    if residual_out_grad is not None:
        check_like(residual_out_grad, "residual_out_grad", x)
    if weight_grad is not None:
        if weight is None:
            raise ValueError("weight_grad is given but weight is None (a unit weight has no gradient)")
        if not isinstance(weight_grad, torch.Tensor):
            raise TypeError(f"weight_grad must be a torch.Tensor, got {type(weight_grad).__name__}")
        if weight_grad.dtype not in _WEIGHT_GRAD_DTYPES:
            raise TypeError(f"weight_grad must be bfloat16 or float32, got {weight_grad.dtype}")
        if weight_grad.shape != weight.shape:
            raise ValueError(
                f"weight_grad must have shape {tuple(weight.shape)} (as weight), got {tuple(weight_grad.shape)}"
            )
        if weight_grad.device != x.device:
            raise ValueError(f"weight_grad must be on {x.device} (as x), got {weight_grad.device}")
    return check_float(out_scale, "out_scale")


def norm_backward(
    out_grad: torch.Tensor,
    x: torch.Tensor,
    weight: Optional[torch.Tensor],
    rstd: torch.Tensor,
    residual_out_grad: Optional[torch.Tensor] = None,
    out_scale: float = 1.0,
    weight_grad: Optional[torch.Tensor] = None,
) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """RMSNorm backward: the gradients of norm_forward's out w.r.t. norm_input and weight.

    Args:
        out_grad: (num_tokens, hidden) gradient of the forward's out, in x's dtype.
        x: the forward's norm_input, (num_tokens, hidden) bf16 or fp32; last dim contiguous,
            row stride a multiple of 16 bytes, hidden a multiple of 32 and <= 8192.
        weight: (hidden,) in x's dtype, or None (unit weight: no weight gradient).
        rstd: fp32 (num_tokens,), as norm_forward(..., with_rstd=True) returned it.
        residual_out_grad: optional gradient reaching norm_input from its other uses (the
            residual stream); added to x_grad.
        out_scale: the forward's out_scale.
        weight_grad: optional bf16/fp32 (hidden,) buffer the weight gradient is added to.

    Returns:
        (x_grad in x's dtype, weight_grad): weight_grad is the given buffer after the
        addition, else a new tensor in weight's dtype; None without weight. CPU tensors take
        the reference path.
    """
    if not torch.compiler.is_compiling():  # dynamo can neither hash the key nor trace the native call
        try:
            call = _PLANS[x.dtype, weight is None, residual_out_grad is None, out_scale, out_scale.__class__,
                          weight_grad is None]  # fmt: skip
        except (KeyError, AttributeError, TypeError):
            pass
        else:
            result = plan.run(call, out_grad, x, weight, rstd, residual_out_grad, weight_grad)
            if result is not NotImplemented:
                return result
    out_scale_arg = out_scale  # as passed: the plan key's
    out_scale = _check(out_grad, x, weight, rstd, residual_out_grad, out_scale, weight_grad)
    if torch.compiler.is_compiling():
        x_grad, dw = torch.ops.tilebake.norm_backward(out_grad, x, weight, rstd, residual_out_grad, out_scale)
        return x_grad, _accumulate(dw if weight is not None else None, weight, weight_grad)
    x_grad, dw = _norm_backward(out_grad, x, weight, rstd, residual_out_grad, out_scale)
    if x.is_cuda and x.shape[0]:
        plan_key = (x.dtype, weight is None, residual_out_grad is None, out_scale_arg, out_scale_arg.__class__,
                    weight_grad is None)  # fmt: skip
        key = (FLOAT_FORMATS[x.dtype], weight is not None, residual_out_grad is not None)
        wg_dtype = weight_grad.dtype if weight_grad is not None else None
        reduce = _REDUCE_KERNELS[FLOAT_FORMATS[wg_dtype or x.dtype],] if weight is not None else None
        plan.remember(
            _PLANS, plan_key, _norm_plans.backward_plan, _KERNELS[key], reduce, x.get_device(), x.dtype, *key[1:],
            out_scale, wg_dtype, config.get_num_sms(),
        )  # fmt: skip
    return x_grad, _accumulate(dw, weight, weight_grad)


def _norm_backward(out_grad, x, weight, rstd, residual_out_grad, out_scale: float):
    """(x_grad, fp32 weight gradient or None) of checked arguments."""
    num_tokens, hidden = x.shape
    if x.device.type == "npu" and num_tokens:  # the Ascend kernels where they apply
        from tilebake.quant import _norm_backward_ascend

        result = _norm_backward_ascend.norm_backward(out_grad, x, weight, rstd, residual_out_grad, out_scale)
        if result is not None:
            return result
    if not x.is_cuda or num_tokens == 0:
        from tilebake.torch.norm import norm_backward_ref

        return norm_backward_ref(out_grad, x, weight, rstd, residual_out_grad, out_scale)

    x_grad = torch.empty_like(x, memory_format=torch.contiguous_format)
    num_ctas = min(CTAS_PER_SM[x.dtype] * config.get_num_sms(), num_tokens)
    partials = x.new_empty((num_ctas, hidden), dtype=torch.float32) if weight is not None else None
    check_pointers(out_grad=out_grad, x=x, weight=weight, residual_out_grad=residual_out_grad)
    args = dict(
        G=out_grad.data_ptr(), X=x.data_ptr(), RSTD=rstd.data_ptr(), DX=x_grad.data_ptr(), out_scale=out_scale,
        num_tokens=num_tokens, hidden=hidden, num_ctas=num_ctas, out_grad_stride=rows_strides(out_grad)[1],
        x_stride=rows_strides(x)[1], x_grad_stride=rows_strides(x_grad)[1],
    )  # fmt: skip
    if weight is not None:
        args.update(W=weight.data_ptr(), P=partials.data_ptr())
    if residual_out_grad is not None:
        args.update(ROG=residual_out_grad.data_ptr(), residual_out_grad_stride=rows_strides(residual_out_grad)[1])
    has_weight, has_rog = weight is not None, residual_out_grad is not None
    kernel = _KERNELS[FLOAT_FORMATS[x.dtype], has_weight, has_rog]
    kernel(x.get_device(), *[args[name] for name in kernel.arg_names])
    if weight is None:
        return x_grad, None
    dw = x.new_empty((hidden,), dtype=torch.float32)
    _REDUCE_KERNELS["fp32",](x.get_device(), partials.data_ptr(), dw.data_ptr(), num_ctas, hidden, 0)
    return x_grad, dw


def sum_partial_rows(partials: torch.Tensor, out: torch.Tensor) -> None:
    """out (C,) fp32 = the sum of the rows of partials (P, C) fp32, in row order (two runs give the
    same bits): the reduction of per-CTA partial weight gradients, shared with the mhc
    projection's backward. Contiguous CUDA tensors; the caller checks the shapes."""
    sum_partial_rows_kernel()(partials.get_device(), partials.data_ptr(), out.data_ptr(), partials.shape[0],
                              out.numel(), 0)  # fmt: skip


def sum_partial_rows_kernel():
    """sum_partial_rows' kernel (P, OUT, num_partials, num_cols, accumulate = 0): for call plans."""
    return _REDUCE_KERNELS["fp32",]


def _accumulate(dw: Optional[torch.Tensor], weight, weight_grad):
    """fp32 dw added into the caller's buffer (in fp32, rounded once), or returned in weight's dtype."""
    if dw is None:
        return None
    if weight_grad is None:
        return dw.to(weight.dtype)
    return weight_grad.copy_(weight_grad.float() + dw)


# --- torch.library: lets torch.compile(fullgraph=True) trace norm_backward; eager calls skip it ---
#
# Functional: the op returns the fp32 weight gradient (empty without weight); adding it into a
# caller's weight_grad buffer stays in Python (traced as torch ops).


def _op_impl(out_grad, x, weight, rstd, residual_out_grad, out_scale):
    x_grad, dw = _norm_backward(out_grad, x, weight, rstd, residual_out_grad, out_scale)
    return x_grad, (dw if dw is not None else x.new_empty(0, dtype=torch.float32))


def _meta(out_grad, x, weight, rstd, residual_out_grad, out_scale):
    dw = x.new_empty(x.shape[-1] if weight is not None else 0, dtype=torch.float32)
    return torch.empty_like(x, memory_format=torch.contiguous_format), dw


# Meta kernels rather than register_fake: free at import (see per_token_cast.py).
register(
    "norm_backward(Tensor out_grad, Tensor x, Tensor? weight, Tensor rstd, Tensor? residual_out_grad,"
    " float out_scale) -> (Tensor, Tensor)",
    _op_impl,
    _meta,
)
