"""mhc_post_fwd / _bwd: a layer's output x merged back into the m residual streams,
out[..., o, :] = post[..., o] * x + sum over i of comb[..., i, o] * residual[..., i, :], and its
gradients.

Validate, allocate, launch (kernels_tl/mhc/mhc_post.py: the forward flat over 8-column vectors,
the backward a warp or a CTA a token reducing the mix gradients over the hidden dim in a fixed
order; m and every size at run time, any m from 1 to 8: the original's backward hard-codes m = 4).
CPU tensors take the references (tilebake.torch.mhc).
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
    MhcAscendVariant,
    check_aligned,
    check_mult_and_hidden,
    check_shape,
    check_streams,
)

_SIZES = i32("num_tokens", "mhc_mult", "hidden")


@dataclasses.dataclass(frozen=True)
class MhcPostVariant(Variant):
    family = "mhc"
    op = "mhc_post"

    direction: str  # 'fwd' | 'bwd'
    # m's upper bound, which sizes the kernel's register arrays: 4 (m = 1 to 4; the original's
    # only m) or 8 (m = 5 to 8)
    max_mult: int
    # the backward's warps a token (token_warps(hidden) picks): 1, or 4 (a CTA) for wide rows
    token_warps: int = 1

    @classmethod
    def all(cls):
        return tuple(cls("fwd", m) for m in MAX_MULTS) + tuple(cls("bwd", m, g) for m in MAX_MULTS for g in (1, 4))

    def params(self):
        if self.direction == "fwd":
            return ptr("X", "R", "POST", "COMB", "OUT") + _SIZES
        return ptr("X", "R", "POST", "COMB", "DO", "DX", "DR", "DPOST", "DCOMB") + _SIZES


@dataclasses.dataclass(frozen=True)
class MhcPostAscendVariant(MhcAscendVariant):
    """The Ascend 950 kernels (kernels_tl/ascend/mhc/mhc_post.py): m and every size at run time."""

    op = "mhc_post"
    params = MhcPostVariant.params


MAX_MULTS = (4, MAX_MHC_MULT)
_KERNELS = KernelTable(MhcPostVariant)


def _max_mult(mhc_mult: int) -> int:
    return next(c for c in MAX_MULTS if mhc_mult <= c)


# The backward's warps a token: 4 (a CTA) from WIDE_ROWS columns, each warp then at least five
# 256-column steps (H200 session 14: 8192 x 4 x 7168, 401.9-403.5 us against 413.6-414.3 with one
# warp a token), else 1 (4096 x 4 x 1280: 42.7-47.4 us against 61.2 with a CTA a token).
WIDE_ROWS = 5120


def token_warps(hidden: int) -> int:
    return 4 if hidden >= WIDE_ROWS else 1


_PLANS = plan.cache()  # by direction and the arguments' ranks (and which outputs are given)


def _check(x, residual, post_layer_mix, comb_res_mix):
    """(tokens, m, hidden) of checked forward inputs; post_layer_mix may be (..., m) or (..., m, 1)."""
    check_streams(x, "x", torch.bfloat16, 1)
    check_streams(residual, "residual", torch.bfloat16, 2)
    mhc_mult, hidden = residual.shape[-2:]
    check_shape(residual, "residual", (*x.shape[:-1], mhc_mult, hidden), x, "x")
    check_mult_and_hidden(mhc_mult, hidden, "residual", residual)
    lead = tuple(x.shape[:-1])
    check_streams(post_layer_mix, "post_layer_mix", torch.float32, 1)
    if tuple(post_layer_mix.shape) not in ((*lead, mhc_mult), (*lead, mhc_mult, 1)):
        raise ValueError(
            f"post_layer_mix must have shape {(*lead, mhc_mult, 1)} or {(*lead, mhc_mult)}, got {tuple(post_layer_mix.shape)}"
        )
    check_shape(post_layer_mix, "post_layer_mix", post_layer_mix.shape, x, "x")
    check_streams(comb_res_mix, "comb_res_mix", torch.float32, 2)
    check_shape(comb_res_mix, "comb_res_mix", (*lead, mhc_mult, mhc_mult), x, "x")
    return x.numel() // hidden, mhc_mult, hidden


def mhc_post_fwd(x, residual, post_layer_mix, comb_res_mix, out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """out[..., o, :] = post[..., o] * x + sum_i comb[..., i, o] * residual[..., i, :] (fp32, i in
    order, rounded to bf16 once).

    x: (..., H) bf16; residual: (..., m, H) bf16, 1 <= m <= 8; post_layer_mix: (..., m, 1) or
    (..., m) fp32; comb_res_mix: (..., m, m) fp32 (comb[i, o]: stream i's weight in output o);
    out: optional (..., m, H) bf16 (not overlapping the inputs). All contiguous; on CUDA 16-byte
    aligned, H a multiple of 8. Returns out.
    """
    if not torch.compiler.is_compiling():  # dynamo can neither hash the key nor trace the native call
        try:
            call = _PLANS["fwd", x.ndim, post_layer_mix.ndim, out is None, residual.shape[-2] <= 4]
        except (KeyError, AttributeError, TypeError, IndexError):
            pass
        else:
            result = plan.run(call, x, residual, post_layer_mix, comb_res_mix, out)
            if result is not NotImplemented:
                return result
    num_tokens, mhc_mult, hidden = _check(x, residual, post_layer_mix, comb_res_mix)
    key = ("fwd", x.ndim, post_layer_mix.ndim, out is None, mhc_mult <= 4)
    if torch.compiler.is_compiling():
        result = torch.ops.tilebake.mhc_post_fwd(x, residual, post_layer_mix, comb_res_mix)
        return result if out is None else out.copy_(result)
    if out is None:
        out = torch.empty_like(residual)
    else:
        check_streams(out, "out", torch.bfloat16, 2)
        check_shape(out, "out", residual.shape, x, "x")
    if out.numel() == 0:
        return out
    if x.device.type == "npu":  # the Ascend kernel
        from tilebake.mhc._mhc_ascend import launch

        launch("mhc_post", "fwd", x, x.data_ptr(), residual.data_ptr(), post_layer_mix.data_ptr(),
               comb_res_mix.data_ptr(), out.data_ptr(), num_tokens, mhc_mult, hidden)  # fmt: skip
        plan.bump(out)
        return out
    if not x.is_cuda:
        from tilebake.torch.mhc import mhc_post_ref

        return out.copy_(mhc_post_ref(x, residual, post_layer_mix, comb_res_mix))
    check_aligned(x=x, residual=residual, out=out)
    kernel = _KERNELS["fwd", _max_mult(mhc_mult)]
    kernel(
        x.get_device(), x.data_ptr(), residual.data_ptr(), post_layer_mix.data_ptr(), comb_res_mix.data_ptr(),
        out.data_ptr(), num_tokens, mhc_mult, hidden,
    )  # fmt: skip
    plan.bump(out)
    plan.remember(_PLANS, key, _plans.post_fwd, kernel, x.get_device(), x.ndim - 1, post_layer_mix.ndim == x.ndim,
                  not key[3])  # fmt: skip
    return out


def mhc_post_bwd(x, residual, post_layer_mix, comb_res_mix, d_o):
    """The gradients of mhc_post_fwd: (d_x (..., H) bf16, d_residual (..., m, H) bf16, d_post (as
    post_layer_mix) fp32, d_comb (..., m, m) fp32), new tensors.

    d_x = sum_o post[o] d_o[o] and d_residual[i] = sum_o comb[i, o] d_o[o] (fp32, o in order);
    d_post[o] = sum over the hidden dim of x d_o[o] and d_comb[i, o] of residual[i] d_o[o], in a
    fixed order (two runs give the same bits). d_o: (..., m, H) bf16; the rest as mhc_post_fwd.
    """
    if not torch.compiler.is_compiling():  # dynamo can neither hash the key nor trace the native call
        try:
            call = _PLANS["bwd", x.ndim, post_layer_mix.ndim, residual.shape[-2] <= 4, x.shape[-1] >= WIDE_ROWS]
        except (KeyError, AttributeError, TypeError, IndexError):
            pass
        else:
            result = plan.run(call, x, residual, post_layer_mix, comb_res_mix, d_o)
            if result is not NotImplemented:
                return result
    num_tokens, mhc_mult, hidden = _check(x, residual, post_layer_mix, comb_res_mix)
    check_streams(d_o, "d_o", torch.bfloat16, 2)
    check_shape(d_o, "d_o", residual.shape, x, "x")
    if torch.compiler.is_compiling():
        return torch.ops.tilebake.mhc_post_bwd(x, residual, post_layer_mix, comb_res_mix, d_o)
    d_x, d_residual = torch.empty_like(x), torch.empty_like(residual)
    d_post, d_comb = torch.empty_like(post_layer_mix), torch.empty_like(comb_res_mix)
    if num_tokens == 0:
        return d_x, d_residual, d_post, d_comb
    if x.device.type == "npu":  # the Ascend kernel
        from tilebake.mhc._mhc_ascend import launch

        launch("mhc_post", "bwd", x, x.data_ptr(), residual.data_ptr(), post_layer_mix.data_ptr(),
               comb_res_mix.data_ptr(), d_o.data_ptr(), d_x.data_ptr(), d_residual.data_ptr(), d_post.data_ptr(),
               d_comb.data_ptr(), num_tokens, mhc_mult, hidden)  # fmt: skip
        return d_x, d_residual, d_post, d_comb
    if not x.is_cuda:
        from tilebake.torch.mhc import mhc_post_bwd_ref

        ref = mhc_post_bwd_ref(x, residual, post_layer_mix, comb_res_mix, d_o)
        return tuple(t.copy_(r) for t, r in zip((d_x, d_residual, d_post, d_comb), ref))
    check_aligned(x=x, residual=residual, d_o=d_o)
    kernel = _KERNELS["bwd", _max_mult(mhc_mult), token_warps(hidden)]
    kernel(
        x.get_device(), x.data_ptr(), residual.data_ptr(), post_layer_mix.data_ptr(), comb_res_mix.data_ptr(),
        d_o.data_ptr(), d_x.data_ptr(), d_residual.data_ptr(), d_post.data_ptr(), d_comb.data_ptr(), num_tokens,
        mhc_mult, hidden,
    )  # fmt: skip
    rows = f"H >= {WIDE_ROWS}" if kernel.variant.token_warps > 1 else f"H < {WIDE_ROWS}"  # the kernel's hidden sizes
    plan.remember(_PLANS, ("bwd", x.ndim, post_layer_mix.ndim, mhc_mult <= 4, hidden >= WIDE_ROWS), _plans.post_bwd,
                  kernel, x.get_device(), x.ndim - 1, post_layer_mix.ndim == x.ndim, rows)  # fmt: skip
    return d_x, d_residual, d_post, d_comb




# torch.library: lets torch.compile(fullgraph=True) trace the ops; eager calls skip it.
register(
    "mhc_post_fwd(Tensor x, Tensor residual, Tensor post_layer_mix, Tensor comb_res_mix) -> Tensor",
    lambda x, r, p, c: mhc_post_fwd(x, r, p, c),
    lambda x, r, p, c: torch.empty_like(r),
)
register(
    "mhc_post_bwd(Tensor x, Tensor residual, Tensor post_layer_mix, Tensor comb_res_mix, Tensor d_o)"
    " -> (Tensor, Tensor, Tensor, Tensor)",
    lambda x, r, p, c, d_o: mhc_post_bwd(x, r, p, c, d_o),
    lambda x, r, p, c, d_o: (torch.empty_like(x), torch.empty_like(r), torch.empty_like(p), torch.empty_like(c)),
)
