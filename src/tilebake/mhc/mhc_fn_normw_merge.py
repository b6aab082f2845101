"""mhc_fn_normw_merge_fwd / _bwd: the pre-norm RMSNorm weight folded into the projection,
fn' = fn * normw (each row scaled by the weight), and its gradients.

Validate, allocate, launch (kernels_tl/mhc/mhc_fn_normw_merge.py: 4-column vectors, so on CUDA
K % 4 == 0 and every tensor 16-byte aligned); CPU tensors take the same arithmetic in torch (fp32,
the weight gradient's rows added in order: the same bits).
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import torch

from tilebake._runtime import plan
from tilebake._runtime.loader import KernelTable
from tilebake._variants import Variant, i32, ptr
from tilebake.mhc import _plans_norm
from tilebake.mhc._common import MhcAscendVariant, check_aligned, check_shape, check_streams

_SIZES = i32("num_mixes", "num_cols")


@dataclasses.dataclass(frozen=True)
class MhcFnNormwMergeVariant(Variant):
    family = "mhc"
    op = "mhc_fn_normw_merge"

    direction: str  # 'fwd' | 'bwd'

    @classmethod
    def all(cls):
        return (cls("fwd"), cls("bwd"))

    def params(self):
        if self.direction == "fwd":
            return ptr("FN", "W", "OUT") + _SIZES
        return ptr("FN", "W", "OG", "FG", "WG") + _SIZES


@dataclasses.dataclass(frozen=True)
class MhcFnNormwMergeAscendVariant(MhcAscendVariant):
    """The Ascend 950 kernels (kernels_tl/ascend/mhc/mhc_fn_normw_merge.py): every size at run time."""

    op = "mhc_fn_normw_merge"
    params = MhcFnNormwMergeVariant.params


_KERNELS = KernelTable(MhcFnNormwMergeVariant)
_PLANS = plan.cache()  # by direction and which outputs are given


def _check(fn, normw):
    check_streams(fn, "fn", torch.float32, 2)
    if fn.dim() != 2:
        raise ValueError(f"fn must be 2-D (mixes, m * hidden), got shape {tuple(fn.shape)}")
    check_streams(normw, "normw", torch.float32, 1)
    check_shape(normw, "normw", (fn.shape[1],), fn, "fn")
    if fn.is_cuda and fn.shape[1] % 4:
        raise ValueError(f"fn's columns must be a multiple of 4 on CUDA, got {fn.shape[1]}")
    if fn.is_cuda:
        check_aligned(fn=fn, normw=normw)
    if fn.numel() >= 2**31:
        raise ValueError(f"fn must have fewer than 2^31 elements, got {fn.numel()}")


def _out(t, name, like: torch.Tensor, shape) -> torch.Tensor:
    if t is None:
        return like.new_empty(shape, dtype=torch.float32)
    check_streams(t, name, torch.float32, len(shape))
    check_shape(t, name, shape, like, "fn")
    if t.is_cuda:
        check_aligned(**{name: t})
    return t


def mhc_fn_normw_merge_fwd(fn: torch.Tensor, normw: torch.Tensor, out_fn: Optional[torch.Tensor] = None) -> torch.Tensor:
    """out_fn = fn * normw: fn (N, K) fp32, normw (K,) fp32; written into out_fn if given, else a
    new tensor; returns it."""
    key = ("fwd", out_fn is None)
    if not torch.compiler.is_compiling():  # dynamo can neither hash the key nor trace the native call
        try:
            call = _PLANS[key]
        except KeyError:
            pass
        else:
            result = plan.run(call, fn, normw, out_fn)
            if result is not NotImplemented:
                return result
    _check(fn, normw)
    out_fn = _out(out_fn, "out_fn", fn, tuple(fn.shape))
    if fn.numel() == 0:
        return out_fn
    if fn.device.type == "npu":  # the Ascend kernel
        from tilebake.mhc._mhc_ascend import launch

        launch("mhc_fn_normw_merge", "fwd", fn, fn.data_ptr(), normw.data_ptr(), out_fn.data_ptr(), *fn.shape)
        plan.bump(out_fn)
        return out_fn
    if not fn.is_cuda:
        return torch.mul(fn, normw, out=out_fn)
    kernel = _KERNELS["fwd",]
    kernel(fn.get_device(), fn.data_ptr(), normw.data_ptr(), out_fn.data_ptr(), *fn.shape)
    plan.bump(out_fn)
    plan.remember(_PLANS, key, _plans_norm.fn_merge_fwd, kernel, fn.get_device(), key[1] is False)
    return out_fn


def mhc_fn_normw_merge_bwd(fn, normw, out_fn_grad, fn_grad: Optional[torch.Tensor] = None,
                           normw_grad: Optional[torch.Tensor] = None):  # fmt: skip
    """(fn_grad = out_fn_grad * normw, normw_grad[k] = sum over rows n in order of
    out_fn_grad[n, k] * fn[n, k]), fp32, written into the given tensors, else new ones."""
    key = ("bwd", fn_grad is None, normw_grad is None)
    if not torch.compiler.is_compiling():
        try:
            call = _PLANS[key]
        except KeyError:
            pass
        else:
            result = plan.run(call, fn, normw, out_fn_grad, fn_grad, normw_grad)
            if result is not NotImplemented:
                return result
    _check(fn, normw)
    check_streams(out_fn_grad, "out_fn_grad", torch.float32, 2)
    check_shape(out_fn_grad, "out_fn_grad", fn.shape, fn, "fn")
    if fn.is_cuda:
        check_aligned(out_fn_grad=out_fn_grad)
    fn_grad = _out(fn_grad, "fn_grad", fn, tuple(fn.shape))
    normw_grad = _out(normw_grad, "normw_grad", fn, (fn.shape[1],))
    if fn.device.type == "npu" and fn.numel():  # the Ascend kernel
        from tilebake.mhc._mhc_ascend import launch

        launch("mhc_fn_normw_merge", "bwd", fn, fn.data_ptr(), normw.data_ptr(), out_fn_grad.data_ptr(),
               fn_grad.data_ptr(), normw_grad.data_ptr(), *fn.shape)  # fmt: skip
        plan.bump(fn_grad, normw_grad)
        return fn_grad, normw_grad
    if not fn.is_cuda:
        acc = torch.zeros(fn.shape[1], dtype=torch.float32)
        for n in range(fn.shape[0]):
            acc = acc + out_fn_grad[n] * fn[n]
        torch.mul(out_fn_grad, normw, out=fn_grad)
        return fn_grad, normw_grad.copy_(acc)
    if fn.shape[0] == 0:
        return fn_grad, normw_grad.zero_()
    kernel = _KERNELS["bwd",]
    kernel(fn.get_device(), fn.data_ptr(), normw.data_ptr(), out_fn_grad.data_ptr(), fn_grad.data_ptr(),
           normw_grad.data_ptr(), *fn.shape)  # fmt: skip
    given = (key[1] is False, key[2] is False)
    plan.bump(*(t for t, g in zip((fn_grad, normw_grad), given) if g))
    plan.remember(_PLANS, key, _plans_norm.fn_merge_bwd, kernel, fn.get_device(), given)
    return fn_grad, normw_grad
