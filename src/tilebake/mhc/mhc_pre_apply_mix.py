"""mhc_pre_apply_mix_fwd / _bwd: a layer's input as the mix of the m residual streams,
o = sum_i mix[i] * x[i], and its gradients.

Validate, allocate, launch (kernels_tl/mhc/mhc_pre_apply_mix.py: the forward flat over 8-column
vectors, the backward a CTA per token reducing mix_grad over the hidden dim in a fixed order;
m (1 to 8) and every size at run time). The backward's CTA, for m <= 4, has as many threads as
a token's 8-column vectors, in multiples of 128 up to 1024 (a token's loads in flight at once:
H200 session 18, 8192 x 4 x 7168: 896 threads 353.4 us, 448 355.0, 128 361.5-364.2), 128 threads
for m > 4 (its register arrays hold 8 streams). CPU tensors take the references (tilebake.torch.mhc).
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
from tilebake.mhc._common import (
    MAX_MHC_MULT,
    VEC,
    MhcAscendVariant,
    check_aligned,
    check_mult_and_hidden,
    check_shape,
    check_streams,
)

_SIZES = i32("num_tokens", "mhc_mult", "hidden")
BWD_THREADS = tuple(range(128, 1025, 128))  # the backward's CTA sizes for m <= BWD_MULT
BWD_MULT = 4
# The forward for m <= FWD_MULT: 256 threads stepping over a token pair's columns with 4-stream
# registers (H200 session 20, CUPTI at 8192 x 4 x 7168: 4278 GB/s against 4220 for the 128-thread
# column blocks with 8-stream registers that m = 5 to 8 take)
FWD_MULT = 4


def forward_key(mhc_mult: int) -> tuple:
    """The forward's variant for m streams."""
    return ("fwd", 256, FWD_MULT, True) if mhc_mult <= FWD_MULT else ("fwd", 128, MAX_MHC_MULT, False)


def backward_key(mhc_mult: int, hidden: int) -> tuple:
    """The backward's variant for m streams of `hidden` columns: a thread a vector of the token's
    (m <= BWD_MULT), up to 1024 threads; 128 threads with 8-stream registers beyond."""
    if mhc_mult > BWD_MULT:
        return ("bwd", 128, MAX_MHC_MULT)
    return ("bwd", min(1024, -(-hidden // (VEC * 128)) * 128), BWD_MULT)


@dataclasses.dataclass(frozen=True)
class MhcPreApplyMixVariant(Variant):
    family = "mhc"
    op = "mhc_pre_apply_mix"

    direction: str  # 'fwd' | 'bwd'
    threads: int = 128  # a CTA's
    max_mult: int = MAX_MHC_MULT  # the streams its register arrays hold
    column_loop: bool = False  # the forward: a CTA steps over its tokens' columns (else a column block a CTA)

    @classmethod
    def all(cls):
        bwd = tuple(cls("bwd", t, BWD_MULT) for t in BWD_THREADS)
        return (cls(*forward_key(MAX_MHC_MULT)), cls(*forward_key(1)), cls("bwd"), *bwd)

    def params(self):
        if self.direction == "fwd":
            return ptr("X", "MIX", "O") + _SIZES
        return ptr("OG", "X", "MIX", "XG", "MG") + _SIZES + i32("has_x_grad")


@dataclasses.dataclass(frozen=True)
class MhcPreApplyMixAscendVariant(MhcAscendVariant):
    """The Ascend 950 kernels (kernels_tl/ascend/mhc/mhc_pre_apply_mix.py): m and every size at run time."""

    op = "mhc_pre_apply_mix"
    params = MhcPreApplyMixVariant.params


_KERNELS = KernelTable(MhcPreApplyMixVariant)


_PLANS = plan.cache()  # by direction and the arguments' ranks (and which outputs are given)


def _check(x, mix):
    """(tokens, m, hidden) of checked inputs; mix may be (..., m) or (..., m, 1)."""
    check_streams(x, "x", torch.bfloat16, 2)
    mhc_mult, hidden = x.shape[-2:]
    check_mult_and_hidden(mhc_mult, hidden, "x", x)
    check_streams(mix, "mix", torch.float32, 1)
    lead = tuple(x.shape[:-2])
    if tuple(mix.shape) not in ((*lead, mhc_mult), (*lead, mhc_mult, 1)):
        raise ValueError(f"mix must have shape {(*lead, mhc_mult)} or {(*lead, mhc_mult, 1)}, got {tuple(mix.shape)}")
    check_shape(mix, "mix", mix.shape, x, "x")
    return x.numel() // (mhc_mult * hidden), mhc_mult, hidden


def mhc_pre_apply_mix_fwd(x: torch.Tensor, mix: torch.Tensor, o: Optional[torch.Tensor] = None) -> torch.Tensor:
    """o = sum_i mix[..., i] * x[..., i, :] (fp32, i in order, rounded to bf16 once), written into
    o if given (else a new tensor); returns it.

    x: (..., m, H) bf16, 1 <= m <= 8; mix: (..., m) or (..., m, 1) fp32; o: (..., H) bf16. All
    contiguous; on CUDA 16-byte aligned, H a multiple of 8.
    """
    if not torch.compiler.is_compiling():  # dynamo can neither hash the key nor trace the native call
        try:
            call = _PLANS["fwd", x.ndim, mix.ndim, o is None, x.shape[-2] <= FWD_MULT]
        except (KeyError, AttributeError, TypeError):
            pass
        else:
            result = plan.run(call, x, mix, o)
            if result is not NotImplemented:
                return result
    num_tokens, mhc_mult, hidden = _check(x, mix)
    shape = (*x.shape[:-2], hidden)
    key = ("fwd", x.ndim, mix.ndim, o is None, mhc_mult <= FWD_MULT)
    if torch.compiler.is_compiling():
        result = torch.ops.tilebake.mhc_pre_apply_mix_fwd(x, mix)
        return result if o is None else o.copy_(result)
    if o is None:
        o = x.new_empty(shape)
    else:
        check_streams(o, "o", torch.bfloat16, 1)
        check_shape(o, "o", shape, x, "x")
    if o.numel() == 0:
        return o
    if x.device.type == "npu":  # the Ascend kernel
        from tilebake.mhc._mhc_ascend import launch

        launch("mhc_pre_apply_mix", "fwd", x, x.data_ptr(), mix.data_ptr(), o.data_ptr(), num_tokens, mhc_mult,
               hidden)  # fmt: skip
        plan.bump(o)
        return o
    if not x.is_cuda:
        from tilebake.torch.mhc import mhc_pre_apply_mix_ref

        return o.copy_(mhc_pre_apply_mix_ref(x, mix))
    check_aligned(x=x, o=o)
    kernel = _KERNELS[forward_key(mhc_mult)]
    kernel(x.get_device(), x.data_ptr(), mix.data_ptr(), o.data_ptr(), num_tokens, mhc_mult, hidden)
    plan.bump(o)
    plan.remember(_PLANS, key, _plans.pre_apply_mix_fwd, kernel, x.get_device(), x.ndim - 2,
                  mix.ndim == x.ndim - 1, not key[3])  # fmt: skip
    return o


def mhc_pre_apply_mix_bwd(o_grad, x, mix, x_grad: Optional[torch.Tensor] = None) -> torch.Tensor:
    """The gradients of mhc_pre_apply_mix_fwd: x_grad[..., i, :] += mix[..., i] * o_grad in place
    (fp32, rounded to bf16 once; without x_grad only mix_grad is computed), and returned, a new
    mix_grad (shaped as mix) with mix_grad[..., i] = the sum over the hidden dim of
    o_grad * x[..., i, :] in a fixed order (two runs give the same bits).

    o_grad: (..., H) bf16; x_grad: (..., m, H) bf16 or None; x, mix as mhc_pre_apply_mix_fwd.
    Returns mix_grad (the original's return value); x_grad is updated in place.
    """
    if not torch.compiler.is_compiling():  # dynamo can neither hash the key nor trace the native call
        try:
            call = _PLANS["bwd", x.ndim, mix.ndim, x_grad is None, x.shape[-2] <= BWD_MULT, x.shape[-1]]
        except (KeyError, AttributeError, TypeError):
            pass
        else:
            result = plan.run(call, o_grad, x, mix, x_grad)
            if result is not NotImplemented:
                return result
    num_tokens, mhc_mult, hidden = _check(x, mix)
    check_streams(o_grad, "o_grad", torch.bfloat16, 1)
    check_shape(o_grad, "o_grad", (*x.shape[:-2], hidden), x, "x")
    if x_grad is not None:
        check_streams(x_grad, "x_grad", torch.bfloat16, 2)
        check_shape(x_grad, "x_grad", x.shape, x, "x")
    if torch.compiler.is_compiling():
        return torch.ops.tilebake.mhc_pre_apply_mix_bwd(o_grad, x, mix, x_grad)
    mix_grad = torch.empty_like(mix)
    if num_tokens == 0:
        return mix_grad
    if x.device.type == "npu":  # the Ascend kernel (an absent x_grad: x's address, never read or written)
        from tilebake.mhc._mhc_ascend import launch

        launch("mhc_pre_apply_mix", "bwd", x, o_grad.data_ptr(), x.data_ptr(), mix.data_ptr(),
               (x if x_grad is None else x_grad).data_ptr(), mix_grad.data_ptr(), num_tokens, mhc_mult, hidden,
               int(x_grad is not None))  # fmt: skip
        if x_grad is not None:
            plan.bump(x_grad)
        return mix_grad
    if not x.is_cuda:
        from tilebake.torch.mhc import mhc_pre_apply_mix_bwd_ref

        new_x_grad, ref = mhc_pre_apply_mix_bwd_ref(o_grad, x, mix, x_grad)
        if x_grad is not None:
            x_grad.copy_(new_x_grad)
        return mix_grad.copy_(ref)
    check_aligned(o_grad=o_grad, x=x, **({"x_grad": x_grad} if x_grad is not None else {}))
    kernel = _KERNELS[backward_key(mhc_mult, hidden)]
    kernel(
        x.get_device(), o_grad.data_ptr(), x.data_ptr(), mix.data_ptr(), 0 if x_grad is None else x_grad.data_ptr(),
        mix_grad.data_ptr(), num_tokens, mhc_mult, hidden, int(x_grad is not None),
    )  # fmt: skip
    if x_grad is not None:
        plan.bump(x_grad)
    # keyed by m <= BWD_MULT and the hidden size (the variant); the plan checks both
    key = ("bwd", x.ndim, mix.ndim, x_grad is None, mhc_mult <= BWD_MULT, hidden)
    plan.remember(_PLANS, key, _plans.pre_apply_mix_bwd, kernel, x.get_device(), x.ndim - 2, mix.ndim == x.ndim - 1,
                  x_grad is not None, hidden)  # fmt: skip
    return mix_grad


# torch.library: lets torch.compile(fullgraph=True) trace the ops; eager calls skip it.
register(
    "mhc_pre_apply_mix_fwd(Tensor x, Tensor mix) -> Tensor",
    lambda x, mix: mhc_pre_apply_mix_fwd(x, mix),
    lambda x, mix: x.new_empty((*x.shape[:-2], x.shape[-1])),
)
register(
    "mhc_pre_apply_mix_bwd(Tensor o_grad, Tensor x, Tensor mix, Tensor(a!)? x_grad) -> Tensor",
    lambda og, x, mix, xg: mhc_pre_apply_mix_bwd(og, x, mix, xg),
    lambda og, x, mix, xg: torch.empty_like(mix),
)
