"""mhc_reduce_partials_and_rmsnorm_fwd / _bwd: the pre-norm projection's split-K partials
(mhc_pre_norm_gemm_fwd) added in split order and scaled by the RMSNorm factor,
out = out_mul * rsqrt(sqrsum / rms_group_size + eps), and the backward of that scaling.
One RMS group a token (the original's only case). The CUDA sums equal the CPU path's bits; the
scaling is within 2 ulp of it (torch computes the reciprocal its own way).

Validate, allocate, launch (kernels_tl/mhc/mhc_reduce_partials_and_rmsnorm.py); CPU tensors take
the same arithmetic in torch; NPU tensors the Ascend 950 kernels
(kernels_tl/ascend/mhc/mhc_reduce_partials_and_rmsnorm.py: the CUDA kernels' IEEE fp32 operations,
emulated on the CPU only).
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import torch

from tilebake._runtime import plan
from tilebake._runtime.loader import KernelTable
from tilebake._variants import Variant, f32, i32, ptr
from tilebake.mhc import _plans_norm
from tilebake.mhc._common import MhcAscendVariant, check_shape, check_streams


@dataclasses.dataclass(frozen=True)
class MhcReducePartialsAndRmsnormVariant(Variant):
    family = "mhc"
    op = "mhc_reduce_partials_and_rmsnorm"

    direction: str  # 'fwd' | 'bwd'

    @classmethod
    def all(cls):
        return (cls("fwd"), cls("bwd"))

    def params(self):
        if self.direction == "fwd":
            return ptr("PM", "PS", "OM", "OS", "OUT") + i32("num_tokens", "num_mixes", "n_splits", "rms_group_size") + \
                f32("rms_eps")  # fmt: skip
        return ptr("OG", "OM", "OS", "OMG", "OSG") + i32("num_tokens", "num_mixes", "rms_group_size") + f32("rms_eps")


@dataclasses.dataclass(frozen=True)
class MhcReducePartialsAndRmsnormAscendVariant(MhcAscendVariant):
    """The Ascend 950 kernels (kernels_tl/ascend/mhc/mhc_reduce_partials_and_rmsnorm.py): every size at run time."""

    op = "mhc_reduce_partials_and_rmsnorm"
    params = MhcReducePartialsAndRmsnormVariant.params


_KERNELS = KernelTable(MhcReducePartialsAndRmsnormVariant)
_PLANS = plan.cache()  # by direction, which outputs are given, rms_group_size, rms_eps (and n_splits)


def _check_group(rms_group_size, rms_eps) -> tuple[int, float]:
    if isinstance(rms_group_size, bool) or not isinstance(rms_group_size, int) or not 1 <= rms_group_size < 2**31:
        raise ValueError(f"rms_group_size must be a positive int (the normalised columns, m * hidden), got {rms_group_size!r}")
    if not isinstance(rms_eps, (int, float)) or not rms_eps >= 0:
        raise ValueError(f"rms_eps must be a non-negative number, got {rms_eps!r}")
    return rms_group_size, float(rms_eps)


def _out(t, name, shape, like, like_name):
    if t is None:
        return like.new_empty(shape, dtype=torch.float32)
    check_streams(t, name, torch.float32, 1)
    check_shape(t, name, shape, like, like_name)
    return t


def _rstd(sqrsum, rms_group_size, rms_eps):
    return 1 / torch.sqrt(sqrsum / rms_group_size + rms_eps)


def mhc_reduce_partials_and_rmsnorm_fwd(out_mul_splitted, sqrsum_splitted, out_mul=None, sqrsum=None, out=None,
                                        rms_group_size: Optional[int] = None, rms_eps: float = 1e-6,
                                        n_splits: Optional[int] = None):  # fmt: skip
    """(out_mul (T, 1, N), sqrsum (T, 1), out (T, N)), fp32: out_mul_splitted (S, T, 1, N) and
    sqrsum_splitted (S, T, 1) added over S in order, out = out_mul * rsqrt(sqrsum / rms_group_size
    + rms_eps). rms_group_size (required): the columns a token's square sum covers (m * hidden).
    n_splits, if given, must be S. Written into the given tensors, else new ones."""
    key = ("fwd", out_mul is None, sqrsum is None, out is None, rms_group_size, rms_group_size.__class__, rms_eps,
           rms_eps.__class__, n_splits, n_splits.__class__)  # fmt: skip
    if not torch.compiler.is_compiling():  # dynamo can neither hash the key nor trace the native call
        try:
            call = _PLANS[key]
        except (KeyError, TypeError):  # TypeError: an unhashable argument, which the checks below reject
            pass
        else:
            result = plan.run(call, out_mul_splitted, sqrsum_splitted, out_mul, sqrsum, out)
            if result is not NotImplemented:
                return result
    check_streams(out_mul_splitted, "out_mul_splitted", torch.float32, 4)
    splits, num_tokens, groups, num_mixes = out_mul_splitted.shape
    if groups != 1 or out_mul_splitted.dim() != 4:
        raise ValueError(f"out_mul_splitted must have shape (n_splits, T, 1, N) (one RMS group), got {tuple(out_mul_splitted.shape)}")
    if n_splits is not None and n_splits != splits:
        raise ValueError(f"n_splits ({n_splits}) must equal out_mul_splitted's dim 0 ({splits})")
    if splits < 1:
        raise ValueError("out_mul_splitted must hold at least one split")
    check_streams(sqrsum_splitted, "sqrsum_splitted", torch.float32, 3)
    check_shape(sqrsum_splitted, "sqrsum_splitted", (splits, num_tokens, 1), out_mul_splitted, "out_mul_splitted")
    rms_group_size, rms_eps = _check_group(rms_group_size, rms_eps)
    like = (out_mul_splitted, "out_mul_splitted")
    out_mul = _out(out_mul, "out_mul", (num_tokens, 1, num_mixes), *like)
    sqrsum = _out(sqrsum, "sqrsum", (num_tokens, 1), *like)
    out = _out(out, "out", (num_tokens, num_mixes), *like)
    if out.numel() == 0:
        return out_mul, sqrsum, out
    if out_mul_splitted.device.type == "npu":  # the Ascend kernel
        from tilebake.mhc._mhc_ascend import launch

        if out_mul_splitted.numel() >= 2**31:
            raise ValueError("out_mul_splitted must have fewer than 2^31 elements")
        launch("mhc_reduce_partials_and_rmsnorm", "fwd", out_mul_splitted, out_mul_splitted.data_ptr(),
               sqrsum_splitted.data_ptr(), out_mul.data_ptr(), sqrsum.data_ptr(), out.data_ptr(), num_tokens,
               num_mixes, splits, rms_group_size, rms_eps)  # fmt: skip
        plan.bump(*(t for t, new in zip((out_mul, sqrsum, out), key[1:4]) if not new))
        return out_mul, sqrsum, out
    if not out_mul_splitted.is_cuda:
        acc, sq = out_mul_splitted[0].clone(), sqrsum_splitted[0].clone()
        for s in range(1, splits):
            acc, sq = acc + out_mul_splitted[s], sq + sqrsum_splitted[s]
        out_mul.copy_(acc)
        sqrsum.copy_(sq)
        out.copy_((acc * _rstd(sq, rms_group_size, rms_eps).unsqueeze(-1)).reshape(out.shape))
        return out_mul, sqrsum, out
    if out_mul_splitted.numel() >= 2**31:
        raise ValueError("out_mul_splitted must have fewer than 2^31 elements")
    kernel = _KERNELS["fwd",]
    kernel(out_mul_splitted.get_device(), out_mul_splitted.data_ptr(), sqrsum_splitted.data_ptr(), out_mul.data_ptr(),
           sqrsum.data_ptr(), out.data_ptr(), num_tokens, num_mixes, splits, rms_group_size, rms_eps)  # fmt: skip
    given = (key[1] is False, key[2] is False, key[3] is False)
    for t, g in zip((out_mul, sqrsum, out), given):
        if g:
            plan.bump(t)
    plan.remember(_PLANS, key, _plans_norm.reduce_partials_fwd, kernel, out_mul_splitted.get_device(), given,
                  rms_group_size, rms_eps, n_splits)  # fmt: skip
    return out_mul, sqrsum, out


def mhc_reduce_partials_and_rmsnorm_bwd(out_grad, out_mul, sqrsum, out_mul_grad=None, sqrsum_grad=None,
                                        rms_group_size: Optional[int] = None, rms_eps: float = 1e-6):  # fmt: skip
    """(out_mul_grad (T, 1, N), sqrsum_grad (T, 1)), fp32, from out_grad (T, N) through
    out = out_mul * r, r = rsqrt(sqrsum / rms_group_size + eps): out_mul_grad = out_grad * r,
    sqrsum_grad = -(sum over n in order of out_grad * out_mul) r^3 / (2 rms_group_size)."""
    key = ("bwd", out_mul_grad is None, sqrsum_grad is None, rms_group_size, rms_group_size.__class__, rms_eps,
           rms_eps.__class__)  # fmt: skip
    if not torch.compiler.is_compiling():
        try:
            call = _PLANS[key]
        except (KeyError, TypeError):  # TypeError: an unhashable argument, which the checks below reject
            pass
        else:
            result = plan.run(call, out_grad, out_mul, sqrsum, out_mul_grad, sqrsum_grad)
            if result is not NotImplemented:
                return result
    check_streams(out_mul, "out_mul", torch.float32, 3)
    num_tokens, groups, num_mixes = out_mul.shape if out_mul.dim() == 3 else (None, None, None)
    if groups != 1:
        raise ValueError(f"out_mul must have shape (T, 1, N) (one RMS group), got {tuple(out_mul.shape)}")
    check_streams(out_grad, "out_grad", torch.float32, 2)
    check_shape(out_grad, "out_grad", (num_tokens, num_mixes), out_mul, "out_mul")
    check_streams(sqrsum, "sqrsum", torch.float32, 2)
    check_shape(sqrsum, "sqrsum", (num_tokens, 1), out_mul, "out_mul")
    rms_group_size, rms_eps = _check_group(rms_group_size, rms_eps)
    out_mul_grad = _out(out_mul_grad, "out_mul_grad", (num_tokens, 1, num_mixes), out_mul, "out_mul")
    sqrsum_grad = _out(sqrsum_grad, "sqrsum_grad", (num_tokens, 1), out_mul, "out_mul")
    if num_tokens == 0:
        return out_mul_grad, sqrsum_grad
    if out_mul.device.type == "npu" and num_mixes:  # the Ascend kernel
        from tilebake.mhc._mhc_ascend import launch

        launch("mhc_reduce_partials_and_rmsnorm", "bwd", out_mul, out_grad.data_ptr(), out_mul.data_ptr(),
               sqrsum.data_ptr(), out_mul_grad.data_ptr(), sqrsum_grad.data_ptr(), num_tokens, num_mixes,
               rms_group_size, rms_eps)  # fmt: skip
        plan.bump(*(t for t, new in zip((out_mul_grad, sqrsum_grad), key[1:3]) if not new))
        return out_mul_grad, sqrsum_grad
    if not out_mul.is_cuda:
        r = _rstd(sqrsum, rms_group_size, rms_eps)  # (T, 1)
        dot = torch.zeros_like(sqrsum)
        for n in range(num_mixes):
            dot = dot + out_grad[:, n : n + 1] * out_mul[:, 0, n : n + 1]
        out_mul_grad.copy_((out_grad * r).unsqueeze(1))
        sqrsum_grad.copy_(-(dot * (r * r * r / (2 * rms_group_size))))
        return out_mul_grad, sqrsum_grad
    kernel = _KERNELS["bwd",]
    kernel(out_mul.get_device(), out_grad.data_ptr(), out_mul.data_ptr(), sqrsum.data_ptr(), out_mul_grad.data_ptr(),
           sqrsum_grad.data_ptr(), num_tokens, num_mixes, rms_group_size, rms_eps)  # fmt: skip
    given = (key[1] is False, key[2] is False)
    for t, g in zip((out_mul_grad, sqrsum_grad), given):
        if g:
            plan.bump(t)
    plan.remember(_PLANS, key, _plans_norm.reduce_partials_bwd, kernel, out_mul.get_device(), given, rms_group_size,
                  rms_eps)  # fmt: skip
    return out_mul_grad, sqrsum_grad
