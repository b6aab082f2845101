"""expand_to_mhc_fwd / _bwd: a hidden state broadcast to the m residual streams, and its gradient
(the streams' gradients summed).

Validate, launch (kernels_tl/mhc/expand_to_mhc.py, one kernel a direction; m and every size at
run time); CPU tensors take the references (tilebake.torch.mhc), with the same bits.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import torch

from tilebake._library import register
from tilebake._runtime import plan
from tilebake._runtime.loader import KernelTable
from tilebake._variants import Variant, i32, ptr
from tilebake.mhc import _plans
from tilebake.mhc._common import MhcAscendVariant, check_aligned, check_mult_and_hidden, check_shape, check_streams

_SIZES = i32("num_tokens", "mhc_mult", "hidden")


@dataclasses.dataclass(frozen=True)
class ExpandToMhcVariant(Variant):
    family = "mhc"
    op = "expand_to_mhc"

    direction: str  # 'fwd' | 'bwd'

    @classmethod
    def all(cls):
        return (cls("fwd"), cls("bwd"))

    def params(self):
        return (ptr("X", "O") if self.direction == "fwd" else ptr("OG", "XG")) + _SIZES


@dataclasses.dataclass(frozen=True)
class ExpandToMhcAscendVariant(MhcAscendVariant):
    """The Ascend 950 kernels (kernels_tl/ascend/mhc/expand_to_mhc.py): m and every size at run time."""

    op = "expand_to_mhc"
    params = ExpandToMhcVariant.params


_KERNELS = KernelTable(ExpandToMhcVariant)
_PLANS = plan.cache()  # by direction and the arguments' ranks (and which outputs are given)


def expand_to_mhc_fwd(x: torch.Tensor, o: torch.Tensor) -> torch.Tensor:
    """o[..., i, :] = x for each of o's m streams, written in place; returns o.

    x: (..., H) bf16; o: (..., m, H) bf16, 1 <= m <= 8; both contiguous (on CUDA 16-byte aligned,
    H a multiple of 8; the original needs H % 128 == 0).
    """
    if not torch.compiler.is_compiling():  # dynamo can neither hash the key nor trace the native call
        try:
            call = _PLANS["fwd", x.ndim]
        except (KeyError, AttributeError, TypeError):
            pass
        else:
            result = plan.run(call, x, o)
            if result is not NotImplemented:
                return result
    check_streams(x, "x", torch.bfloat16, 1)
    check_streams(o, "o", torch.bfloat16, 2)
    mhc_mult, hidden = o.shape[-2:]
    check_shape(o, "o", (*x.shape[:-1], mhc_mult, x.shape[-1]), x, "x")
    check_mult_and_hidden(mhc_mult, hidden, "o", o)
    if torch.compiler.is_compiling():
        torch.ops.tilebake.expand_to_mhc_fwd(x, o)
        return o
    if o.numel() == 0:
        return o
    if x.device.type == "npu":  # the Ascend kernel
        from tilebake.mhc._mhc_ascend import launch

        launch("expand_to_mhc", "fwd", x, x.data_ptr(), o.data_ptr(), x.numel() // hidden, mhc_mult, hidden)
        plan.bump(o)
        return o
    if not x.is_cuda:
        from tilebake.torch.mhc import expand_to_mhc_ref

        return o.copy_(expand_to_mhc_ref(x, mhc_mult))
    check_aligned(x=x, o=o)
    _KERNELS["fwd",](x.get_device(), x.data_ptr(), o.data_ptr(), x.numel() // hidden, mhc_mult, hidden)
    plan.bump(o)
    plan.remember(_PLANS, ("fwd", x.ndim), _plans.expand_fwd, _KERNELS["fwd",], x.get_device(), x.ndim - 1)
    return o


def expand_to_mhc_bwd(o_grad: torch.Tensor, x_grad: Optional[torch.Tensor] = None) -> torch.Tensor:
    """x_grad = the sum of o_grad's m streams (fp32, in stream order, rounded to bf16 once),
    written into x_grad if given (else a new tensor); returns it.

    o_grad: (..., m, H) bf16, 1 <= m <= 8; x_grad: (..., H) bf16; both contiguous (on CUDA
    16-byte aligned, H a multiple of 8; the original needs H % 64 == 0).
    """
    if not torch.compiler.is_compiling():  # dynamo can neither hash the key nor trace the native call
        try:
            call = _PLANS["bwd", o_grad.ndim, x_grad is None]
        except (KeyError, AttributeError, TypeError):
            pass
        else:
            result = plan.run(call, o_grad, x_grad)
            if result is not NotImplemented:
                return result
    check_streams(o_grad, "o_grad", torch.bfloat16, 2)
    mhc_mult, hidden = o_grad.shape[-2:]
    check_mult_and_hidden(mhc_mult, hidden, "o_grad", o_grad)
    shape = (*o_grad.shape[:-2], hidden)
    given = x_grad
    if torch.compiler.is_compiling():
        result = torch.ops.tilebake.expand_to_mhc_bwd(o_grad)
        return result if x_grad is None else x_grad.copy_(result)
    if x_grad is None:
        x_grad = o_grad.new_empty(shape)
    else:
        check_streams(x_grad, "x_grad", torch.bfloat16, 1)
        check_shape(x_grad, "x_grad", shape, o_grad, "o_grad")
    if x_grad.numel() == 0:
        return x_grad
    if o_grad.device.type == "npu":  # the Ascend kernel
        from tilebake.mhc._mhc_ascend import launch

        launch("expand_to_mhc", "bwd", o_grad, o_grad.data_ptr(), x_grad.data_ptr(), x_grad.numel() // hidden,
               mhc_mult, hidden)  # fmt: skip
        if given is not None:
            plan.bump(x_grad)
        return x_grad
    if not o_grad.is_cuda:
        from tilebake.torch.mhc import expand_to_mhc_bwd_ref

        return x_grad.copy_(expand_to_mhc_bwd_ref(o_grad))
    check_aligned(o_grad=o_grad, x_grad=x_grad)
    _KERNELS["bwd",](o_grad.get_device(), o_grad.data_ptr(), x_grad.data_ptr(), x_grad.numel() // hidden, mhc_mult,
                     hidden)  # fmt: skip
    if given is not None:  # written in place, as by torch's out= ops
        plan.bump(x_grad)
    plan.remember(_PLANS, ("bwd", o_grad.ndim, given is None), _plans.expand_bwd, _KERNELS["bwd",], o_grad.get_device(),
                  o_grad.ndim - 2, given is not None)  # fmt: skip
    return x_grad


# torch.library: lets torch.compile(fullgraph=True) trace the ops; eager calls skip it.
def _fwd_impl(x, o):
    expand_to_mhc_fwd(x, o)


register("expand_to_mhc_fwd(Tensor x, Tensor(a!) o) -> ()", _fwd_impl, lambda x, o: None)
register("expand_to_mhc_bwd(Tensor o_grad) -> Tensor", lambda o_grad: expand_to_mhc_bwd(o_grad),
         lambda o_grad: o_grad.new_empty((*o_grad.shape[:-2], o_grad.shape[-1])))  # fmt: skip
