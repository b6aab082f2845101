"""mhc_sinkhorn_fwd / _bwd: each token's (m, m) comb matrix made near doubly stochastic (a row
softmax plus eps, then alternating column and row normalisations), and its backward.

Validate, allocate, launch (kernels_tl/mhc/mhc_sinkhorn.py: a thread a matrix element, the row
and column sums exchanged through shuffles or shared memory; the backward recomputes the
iterates from x, as the original stores nothing). m (1 to 8), repeat (>= 1) and eps at run time. CPU tensors take the references of the kernels'
arithmetic (tilebake.torch.mhc.sinkhorn_ordered_ref / sinkhorn_bwd_ordered_ref); the CUDA kernels
divide in the normalisation steps by div.approx (2 ulp), within the original's tolerance of them.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import torch

from tilebake._library import register
from tilebake._runtime import plan
from tilebake._runtime.loader import KernelTable
from tilebake._variants import Variant, f32, i32, ptr
from tilebake.mhc import _plans_mix
from tilebake.mhc._common import MAX_MHC_MULT, MhcAscendVariant, check_float, check_int, check_shape, check_streams

# The backward keeps the inputs of up to SLOTS normalisations per thread (shared memory):
# 2 * repeat - 1 of them, so repeat <= 12 needs no recomputation; beyond, segments of
# ceil((2 repeat - 1) / SLOTS) steps are recomputed from a stored checkpoint.
SLOTS = 24
MAX_MULTS = (4, MAX_MHC_MULT)  # m's bound, which sizes a token's slot of threads (16 or 64)


@dataclasses.dataclass(frozen=True)
class MhcSinkhornVariant(Variant):
    family = "mhc"
    op = "mhc_sinkhorn"

    direction: str  # 'fwd' | 'bwd'
    max_mult: int  # 4 (m = 1 to 4, the original's only m) or 8 (m = 5 to 8)

    @classmethod
    def all(cls):
        return tuple(cls(d, m) for d in ("fwd", "bwd") for m in MAX_MULTS)

    def params(self):
        tensors = ptr("X", "OUT") if self.direction == "fwd" else ptr("G", "X", "GI")
        return tensors + i32("num_tokens", "mhc_mult", "repeat") + f32("eps")


@dataclasses.dataclass(frozen=True)
class MhcSinkhornAscendVariant(MhcAscendVariant):
    """The Ascend 950 kernels (kernels_tl/ascend/mhc/mhc_sinkhorn.py): a SIMT thread a token."""

    op = "mhc_sinkhorn"
    params = MhcSinkhornVariant.params


_KERNELS = KernelTable(MhcSinkhornVariant)
_PLANS = plan.cache()  # by direction, rank, which outputs are given, m's class, repeat and eps


def _max_mult(mhc_mult: int) -> int:
    return next(c for c in MAX_MULTS if mhc_mult <= c)


def _check(x, name: str, repeat, eps):
    """(tokens, m, repeat, eps) of a checked (..., m, m) fp32 matrix and scalars."""
    check_streams(x, name, torch.float32, 2)
    mhc_mult = x.shape[-1]
    if x.shape[-2] != mhc_mult or not 1 <= mhc_mult <= MAX_MHC_MULT:
        raise ValueError(f"{name} must be (..., m, m) with 1 <= m <= {MAX_MHC_MULT}, got shape {tuple(x.shape)}")
    if x.numel() >= 2**31:
        raise ValueError(f"{name} must have fewer than 2^31 elements, got {x.numel()}")
    repeat = check_int(repeat, "repeat", 1)
    return x.numel() // (mhc_mult * mhc_mult), mhc_mult, repeat, check_float(eps, "eps")


def _key(direction, x, out, repeat, eps):
    return (direction, x.ndim, out is None, x.shape[-1] <= 4, repeat, repeat.__class__, eps, eps.__class__)


def mhc_sinkhorn_fwd(comb_res_mix: torch.Tensor, comb_res_mix_out: Optional[torch.Tensor] = None, repeat: int = 10,
                     eps: float = 1e-6) -> torch.Tensor:  # fmt: skip
    """sinkhorn_normalize_ref's map of each (m, m) matrix, written into comb_res_mix_out if given
    (else a new tensor); returns it: p = softmax of each row (max subtracted) + eps, then `repeat`
    column normalisations x / (sum + eps), each but the first after a row normalisation.

    comb_res_mix: (..., m, m) fp32, 1 <= m <= 8, contiguous; comb_res_mix_out the same (not
    overlapping it); repeat >= 1; eps a float.
    """
    if not torch.compiler.is_compiling():  # dynamo can neither hash the key nor trace the native call
        try:
            call = _PLANS[_key("fwd", comb_res_mix, comb_res_mix_out, repeat, eps)]
        except (KeyError, AttributeError, TypeError, IndexError):
            pass
        else:
            result = plan.run(call, comb_res_mix, comb_res_mix_out)
            if result is not NotImplemented:
                return result
    x = comb_res_mix
    num_tokens, mhc_mult, repeat_, eps_ = _check(x, "comb_res_mix", repeat, eps)
    if torch.compiler.is_compiling():
        result = torch.ops.tilebake.mhc_sinkhorn_fwd(x, repeat_, eps_)
        return result if comb_res_mix_out is None else comb_res_mix_out.copy_(result)
    out = comb_res_mix_out
    if out is None:
        out = torch.empty_like(x)
    else:
        check_streams(out, "comb_res_mix_out", torch.float32, 2)
        check_shape(out, "comb_res_mix_out", x.shape, x, "comb_res_mix")
    if num_tokens == 0:
        return out
    if x.device.type == "npu":  # the Ascend kernel
        from tilebake.mhc._mhc_ascend import launch

        launch("mhc_sinkhorn", "fwd", x, x.data_ptr(), out.data_ptr(), num_tokens, mhc_mult, repeat_, eps_)
        plan.bump(comb_res_mix_out)
        return out
    if not x.is_cuda:
        from tilebake.torch.mhc import sinkhorn_ordered_ref

        return out.copy_(sinkhorn_ordered_ref(x, repeat_, eps_))
    kernel = _KERNELS["fwd", _max_mult(mhc_mult)]
    kernel(x.get_device(), x.data_ptr(), out.data_ptr(), num_tokens, mhc_mult, repeat_, eps_)
    plan.bump(comb_res_mix_out)
    plan.remember(_PLANS, _key("fwd", x, comb_res_mix_out, repeat, eps), _plans_mix.sinkhorn, kernel,
                  x.get_device(), x.ndim - 2, comb_res_mix_out is not None, repeat_, eps_)  # fmt: skip
    return out


def mhc_sinkhorn_bwd(grad_output: torch.Tensor, x: torch.Tensor, grad_input: Optional[torch.Tensor] = None,
                     repeat: int = 10, eps: float = 1e-6) -> torch.Tensor:  # fmt: skip
    """The gradient of mhc_sinkhorn_fwd(x, repeat=repeat, eps=eps) for grad_output, recomputed from
    x, written into grad_input if given (else a new tensor); returns it. All (..., m, m) fp32,
    contiguous, as mhc_sinkhorn_fwd."""
    if not torch.compiler.is_compiling():  # dynamo can neither hash the key nor trace the native call
        try:
            call = _PLANS[_key("bwd", x, grad_input, repeat, eps)]
        except (KeyError, AttributeError, TypeError, IndexError):
            pass
        else:
            result = plan.run(call, grad_output, x, grad_input)
            if result is not NotImplemented:
                return result
    num_tokens, mhc_mult, repeat_, eps_ = _check(x, "x", repeat, eps)
    check_streams(grad_output, "grad_output", torch.float32, 2)
    check_shape(grad_output, "grad_output", x.shape, x, "x")
    if torch.compiler.is_compiling():
        result = torch.ops.tilebake.mhc_sinkhorn_bwd(grad_output, x, repeat_, eps_)
        return result if grad_input is None else grad_input.copy_(result)
    out = grad_input
    if out is None:
        out = torch.empty_like(x)
    else:
        check_streams(out, "grad_input", torch.float32, 2)
        check_shape(out, "grad_input", x.shape, x, "x")
    if num_tokens == 0:
        return out
    if x.device.type == "npu":  # the Ascend kernel
        from tilebake.mhc._mhc_ascend import launch

        launch("mhc_sinkhorn", "bwd", x, grad_output.data_ptr(), x.data_ptr(), out.data_ptr(), num_tokens, mhc_mult,
               repeat_, eps_)  # fmt: skip
        plan.bump(grad_input)
        return out
    if not x.is_cuda:
        from tilebake.torch.mhc import sinkhorn_bwd_ordered_ref

        return out.copy_(sinkhorn_bwd_ordered_ref(grad_output, x, repeat_, eps_))
    kernel = _KERNELS["bwd", _max_mult(mhc_mult)]
    kernel(x.get_device(), grad_output.data_ptr(), x.data_ptr(), out.data_ptr(), num_tokens, mhc_mult, repeat_, eps_)
    plan.bump(grad_input)
    plan.remember(_PLANS, _key("bwd", x, grad_input, repeat, eps), _plans_mix.sinkhorn_bwd, kernel, x.get_device(),
                  x.ndim - 2, grad_input is not None, repeat_, eps_)  # fmt: skip
    return out


# torch.library: lets torch.compile(fullgraph=True) trace the ops; eager calls skip it.
register(
    "mhc_sinkhorn_fwd(Tensor comb_res_mix, int repeat, float eps) -> Tensor",
    lambda x, repeat, eps: mhc_sinkhorn_fwd(x, None, repeat, eps),
    lambda x, repeat, eps: torch.empty_like(x),
)
register(
    "mhc_sinkhorn_bwd(Tensor grad_output, Tensor x, int repeat, float eps) -> Tensor",
    lambda g, x, repeat, eps: mhc_sinkhorn_bwd(g, x, None, repeat, eps),
    lambda g, x, repeat, eps: torch.empty_like(x),
)
