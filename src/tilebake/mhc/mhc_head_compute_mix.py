"""mhc_head_compute_mix_fwd / _bwd: the head's stream mix sigmoid(input_mix * scale + base) + eps,
and its backward with the scale and base gradients as per-CTA partials.

Validate, allocate, launch (kernels_tl/mhc/mhc_head_compute_mix.py: the forward a thread an
element; the backward P CTAs over token ranges, a partial row each, summed in a fixed order). m
(1 to 8) and eps at run time; token_block_size is accepted for the original's callers and not
needed (the kernels have no token blocks). CPU tensors take the references (tilebake.torch.mhc).
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import torch

from tilebake import config
from tilebake._library import register
from tilebake._runtime import plan
from tilebake._runtime.loader import KernelTable
from tilebake._variants import Variant, f32, i32, ptr
from tilebake.mhc import _plans_mix
from tilebake.mhc._common import MAX_MHC_MULT, MhcAscendVariant, check_float, check_int, check_shape, check_streams


@dataclasses.dataclass(frozen=True)
class MhcHeadComputeMixVariant(Variant):
    family = "mhc"
    op = "mhc_head_compute_mix"

    direction: str  # 'fwd' | 'bwd'

    @classmethod
    def all(cls):
        return (cls("fwd"), cls("bwd"))

    def params(self):
        if self.direction == "fwd":
            return ptr("X", "SCALE", "BASE", "OUT") + i32("num_tokens", "mhc_mult") + f32("pre_eps")
        return ptr("G", "X", "SCALE", "BASE", "XG", "SP", "BP") + i32("num_tokens", "mhc_mult", "num_partials")


@dataclasses.dataclass(frozen=True)
class MhcHeadComputeMixAscendVariant(MhcAscendVariant):
    """The Ascend 950 kernels (kernels_tl/ascend/mhc/mhc_head_compute_mix.py): m and every size at run time."""

    op = "mhc_head_compute_mix"
    params = MhcHeadComputeMixVariant.params


_KERNELS = KernelTable(MhcHeadComputeMixVariant)
_PLANS = plan.cache()  # by direction, rank, which outputs are given and the scalars


def _check(input_mix, mhc_scale, mhc_base, token_block_size):
    """(tokens, m) of checked inputs."""
    check_streams(input_mix, "input_mix", torch.float32, 1)
    m = input_mix.shape[-1]
    if not 1 <= m <= MAX_MHC_MULT:
        raise ValueError(f"input_mix's last dim (m) must be 1 to {MAX_MHC_MULT}, got {m}")
    if input_mix.numel() >= 2**31:
        raise ValueError(f"input_mix must have fewer than 2^31 elements, got {input_mix.numel()}")
    check_streams(mhc_scale, "mhc_scale", torch.float32, 1)
    check_shape(mhc_scale, "mhc_scale", (1,), input_mix, "input_mix")
    check_streams(mhc_base, "mhc_base", torch.float32, 1)
    check_shape(mhc_base, "mhc_base", (m,), input_mix, "input_mix")
    block = check_int(token_block_size, "token_block_size", 0)
    if block > 64 or block & (block - 1):
        raise ValueError(f"token_block_size must be 0 or a power of two <= 64, got {block}")
    return input_mix.numel() // m, m


def mhc_head_compute_mix_fwd(input_mix, mhc_scale, mhc_base, output_mix: Optional[torch.Tensor] = None,
                             mhc_pre_eps: float = 1e-6, token_block_size: int = 0) -> torch.Tensor:  # fmt: skip
    """sigmoid(input_mix * scale + base) + eps (fp32), written into output_mix if given (else a new
    tensor); returns it. input_mix: (..., m) fp32, 1 <= m <= 8; mhc_scale (1,), mhc_base (m,)
    fp32; output_mix as input_mix. All contiguous."""
    if not torch.compiler.is_compiling():  # dynamo can neither hash the key nor trace the native call
        try:
            call = _PLANS["fwd", input_mix.ndim, output_mix is None, mhc_pre_eps, mhc_pre_eps.__class__,
                          token_block_size, token_block_size.__class__]  # fmt: skip
        except (KeyError, AttributeError, TypeError):
            pass
        else:
            result = plan.run(call, input_mix, mhc_scale, mhc_base, output_mix)
            if result is not NotImplemented:
                return result
    num_tokens, m = _check(input_mix, mhc_scale, mhc_base, token_block_size)
    eps = check_float(mhc_pre_eps, "mhc_pre_eps")
    if torch.compiler.is_compiling():
        result = torch.ops.tilebake.mhc_head_compute_mix_fwd(input_mix, mhc_scale, mhc_base, eps)
        return result if output_mix is None else output_mix.copy_(result)
    out = output_mix
    if out is None:
        out = torch.empty_like(input_mix)
    else:
        check_streams(out, "output_mix", torch.float32, 1)
        check_shape(out, "output_mix", input_mix.shape, input_mix, "input_mix")
    if num_tokens == 0:
        return out
    if input_mix.device.type == "npu":  # the Ascend kernel
        from tilebake.mhc._mhc_ascend import launch

        launch("mhc_head_compute_mix", "fwd", input_mix, input_mix.data_ptr(), mhc_scale.data_ptr(),
               mhc_base.data_ptr(), out.data_ptr(), num_tokens, m, eps)  # fmt: skip
        plan.bump(output_mix)
        return out
    if not input_mix.is_cuda:
        from tilebake.torch.mhc import mhc_head_compute_mix_ref

        return out.copy_(mhc_head_compute_mix_ref(input_mix, mhc_scale, mhc_base, eps))
    kernel = _KERNELS["fwd",]
    kernel(input_mix.get_device(), input_mix.data_ptr(), mhc_scale.data_ptr(), mhc_base.data_ptr(), out.data_ptr(),
           num_tokens, m, eps)  # fmt: skip
    plan.bump(output_mix)
    plan.remember(_PLANS, ("fwd", input_mix.ndim, output_mix is None, mhc_pre_eps, mhc_pre_eps.__class__, token_block_size,
                           token_block_size.__class__), _plans_mix.head_fwd, kernel, input_mix.get_device(),
                  input_mix.ndim - 1, output_mix is not None, eps)  # fmt: skip
    return out


def _num_partials(scale_partial, base_partial, num_sms, like: torch.Tensor) -> int:
    for t in (scale_partial, base_partial):
        if t is not None:
            check_streams(t, "mhc_scale_grad_partial" if t is scale_partial else "mhc_base_grad_partial", torch.float32, 2)
            return t.shape[0]
    if num_sms is None:  # a row an SM or vector core; the CPU path: one row
        if like.device.type == "npu":
            from tilebake._runtime import ascend

            return ascend.vector_cores(ascend.device_index(like))
        return config.get_num_sms() if like.is_cuda else 1
    return check_int(num_sms, "num_sms", 1)


def mhc_head_compute_mix_bwd(output_mix_grad, input_mix, mhc_scale, mhc_base,
                             input_mix_grad: Optional[torch.Tensor] = None,
                             mhc_scale_grad_partial: Optional[torch.Tensor] = None,
                             mhc_base_grad_partial: Optional[torch.Tensor] = None, num_sms: Optional[int] = None,
                             token_block_size: int = 0):  # fmt: skip
    """The gradients of mhc_head_compute_mix_fwd: (input_mix_grad (..., m), mhc_scale_grad_partial
    (P, 1), mhc_base_grad_partial (P, m)), written into the given tensors (else new ones). Row b
    of the partials sums the tokens [b * ceil(T / P), ...) in a fixed order (two runs give the
    same bits); summing the P rows gives the scale and base gradients. P: the given partials'
    dim 0, else num_sms, else tilebake.config.get_num_sms() (an NPU's vector cores on an NPU, 1 on
    the CPU; any P >= 1)."""
    if not torch.compiler.is_compiling():  # dynamo can neither hash the key nor trace the native call
        try:
            call = _PLANS["bwd", input_mix.ndim, input_mix_grad is None, mhc_scale_grad_partial is None,
                          mhc_base_grad_partial is None, num_sms, num_sms.__class__, token_block_size,
                          token_block_size.__class__]  # fmt: skip
        except (KeyError, AttributeError, TypeError):
            pass
        else:
            result = plan.run(call, output_mix_grad, input_mix, mhc_scale, mhc_base, input_mix_grad,
                              mhc_scale_grad_partial, mhc_base_grad_partial)  # fmt: skip
            if result is not NotImplemented:
                return result
    num_tokens, m = _check(input_mix, mhc_scale, mhc_base, token_block_size)
    check_streams(output_mix_grad, "output_mix_grad", torch.float32, 1)
    check_shape(output_mix_grad, "output_mix_grad", input_mix.shape, input_mix, "input_mix")
    parts = _num_partials(mhc_scale_grad_partial, mhc_base_grad_partial, num_sms, input_mix)
    if parts < 1:
        raise ValueError(f"the partials must have at least one row, got {parts}")
    for t, name, shape in ((input_mix_grad, "input_mix_grad", input_mix.shape),
                           (mhc_scale_grad_partial, "mhc_scale_grad_partial", (parts, 1)),
                           (mhc_base_grad_partial, "mhc_base_grad_partial", (parts, m))):  # fmt: skip
        if t is not None:
            check_streams(t, name, torch.float32, 1)
            check_shape(t, name, shape, input_mix, "input_mix")
    if torch.compiler.is_compiling():
        got = torch.ops.tilebake.mhc_head_compute_mix_bwd(output_mix_grad, input_mix, mhc_scale, mhc_base, parts)
        given = (input_mix_grad, mhc_scale_grad_partial, mhc_base_grad_partial)
        return tuple(g if o is None else o.copy_(g) for g, o in zip(got, given))
    x_grad = input_mix.new_empty(input_mix.shape) if input_mix_grad is None else input_mix_grad
    sp = input_mix.new_empty((parts, 1)) if mhc_scale_grad_partial is None else mhc_scale_grad_partial
    bp = input_mix.new_empty((parts, m)) if mhc_base_grad_partial is None else mhc_base_grad_partial
    if num_tokens and input_mix.device.type == "npu":  # the Ascend kernel
        from tilebake.mhc._mhc_ascend import launch

        launch("mhc_head_compute_mix", "bwd", input_mix, *(t.data_ptr() for t in (output_mix_grad, input_mix, mhc_scale,
                                                                                   mhc_base, x_grad, sp, bp)),
               num_tokens, m, parts)  # fmt: skip
        plan.bump(input_mix_grad, mhc_scale_grad_partial, mhc_base_grad_partial)
        return x_grad, sp, bp
    if num_tokens == 0 or not input_mix.is_cuda:
        from tilebake.torch.mhc import mhc_head_compute_mix_bwd_ref

        want = mhc_head_compute_mix_bwd_ref(output_mix_grad, input_mix, mhc_scale, mhc_base, parts)
        return x_grad.copy_(want[0]), sp.copy_(want[1]), bp.copy_(want[2])
    kernel = _KERNELS["bwd",]
    kernel(input_mix.get_device(), *(t.data_ptr() for t in (output_mix_grad, input_mix, mhc_scale, mhc_base, x_grad, sp, bp)),
           num_tokens, m, parts)  # fmt: skip
    plan.bump(input_mix_grad, mhc_scale_grad_partial, mhc_base_grad_partial)
    plan.remember(_PLANS, ("bwd", input_mix.ndim, input_mix_grad is None, mhc_scale_grad_partial is None,
                           mhc_base_grad_partial is None, num_sms, num_sms.__class__, token_block_size,
                           token_block_size.__class__), _plans_mix.head_bwd, kernel, input_mix.get_device(),
                  input_mix.ndim - 1, (input_mix_grad is not None, mhc_scale_grad_partial is not None,
                                       mhc_base_grad_partial is not None), None if num_sms is None and
                  mhc_scale_grad_partial is None and mhc_base_grad_partial is None else parts)  # fmt: skip
    return x_grad, sp, bp


# torch.library: lets torch.compile(fullgraph=True) trace the ops; eager calls skip it.
register(
    "mhc_head_compute_mix_fwd(Tensor input_mix, Tensor mhc_scale, Tensor mhc_base, float eps) -> Tensor",
    lambda x, s, b, eps: mhc_head_compute_mix_fwd(x, s, b, None, eps),
    lambda x, s, b, eps: torch.empty_like(x),
)
register(
    "mhc_head_compute_mix_bwd(Tensor output_mix_grad, Tensor input_mix, Tensor mhc_scale, Tensor mhc_base, int parts)"
    " -> (Tensor, Tensor, Tensor)",
    lambda g, x, s, b, p: mhc_head_compute_mix_bwd(g, x, s, b, num_sms=p),
    lambda g, x, s, b, p: (torch.empty_like(x), x.new_empty((p, 1)), x.new_empty((p, x.shape[-1]))),
)
