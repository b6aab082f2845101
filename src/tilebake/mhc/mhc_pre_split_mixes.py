"""mhc_pre_split_mixes_fwd / _bwd: a token's m (m + 2) mixes (the pre-norm projection's output)
split into the layer's pre mix, post mix and m x m comb matrix, and the backward.

Validate, allocate, launch (kernels_tl/mhc/mhc_pre_split_mixes.py: the forward a thread an
element; the backward per-CTA partials of the scale and base gradients over a token range, then a
second launch reducing them in a fixed order). m (1 to 8), post_mult and eps at run time. CPU
tensors take the references (tilebake.torch.mhc).
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
from tilebake.mhc._common import MAX_MHC_MULT, MhcAscendVariant, check_float, check_shape, check_streams, ndim_or_none

# m (m + 2) -> m
MULT_OF = {m * (m + 2): m for m in range(1, MAX_MHC_MULT + 1)}


@dataclasses.dataclass(frozen=True)
class MhcPreSplitMixesVariant(Variant):
    family = "mhc"
    op = "mhc_pre_split_mixes"

    direction: str  # 'fwd' | 'bwd' (the per-CTA partials) | 'bwd_reduce' (their sum)

    @classmethod
    def all(cls):
        return (cls("fwd"), cls("bwd"), cls("bwd_reduce"))

    def params(self):
        if self.direction == "fwd":
            return ptr("MIX", "SCALE", "BASE", "PRE", "POST", "COMB") + i32("num_tokens", "mhc_mult", "mix_cols") + f32(
                "post_mult", "pre_eps"
            )
        if self.direction == "bwd":
            return ptr("PREG", "POSTG", "COMBG", "MIX", "SCALE", "BASE", "MIXG", "PART") + i32(
                "num_tokens", "mhc_mult", "mix_cols", "num_partials", "num_cols"
            ) + f32("post_mult")  # fmt: skip
        return ptr("PART", "SG", "BG") + i32("num_partials", "num_cols", "mix_cols")


@dataclasses.dataclass(frozen=True)
class MhcPreSplitMixesAscendVariant(MhcAscendVariant):
    """The Ascend 950 kernels (kernels_tl/ascend/mhc/mhc_pre_split_mixes.py): the CUDA kernels' three,
    m and every size at run time."""

    op = "mhc_pre_split_mixes"
    DIRECTIONS = ("fwd", "bwd", "bwd_reduce")
    params = MhcPreSplitMixesVariant.params


_KERNELS = KernelTable(MhcPreSplitMixesVariant)
_PLANS = plan.cache()  # by direction, the ranks (and which outputs are given), m3 and the scalars


def partial_cols(mhc_mult: int) -> int:
    """Columns of a partial row: the 3 scale sums, the m (m + 2) base sums, zeros to a multiple of 4."""
    return (mhc_mult * (mhc_mult + 2) + 3 + 3) // 4 * 4


def _check_mixes(input_mixes, mhc_scale, mhc_base):
    """(tokens, m) of checked inputs."""
    check_streams(input_mixes, "input_mixes", torch.float32, 1)
    m3 = input_mixes.shape[-1]
    if m3 not in MULT_OF:
        raise ValueError(f"input_mixes' last dim must be m (m + 2) for m = 1 to {MAX_MHC_MULT} "
                         f"({sorted(MULT_OF)}), got {m3}")  # fmt: skip
    if input_mixes.numel() >= 2**31:
        raise ValueError(f"input_mixes must have fewer than 2^31 elements, got {input_mixes.numel()}")
    check_streams(mhc_scale, "mhc_scale", torch.float32, 1)
    check_shape(mhc_scale, "mhc_scale", (3,), input_mixes, "input_mixes")
    check_streams(mhc_base, "mhc_base", torch.float32, 1)
    check_shape(mhc_base, "mhc_base", (m3,), input_mixes, "input_mixes")
    return input_mixes.numel() // m3, MULT_OF[m3]


def _check_mix(t, name, lead, m, ref, square: bool):
    """A given (..., m, 1) / (..., m) vector or (..., m, m) / (..., m * m) matrix."""
    check_streams(t, name, torch.float32, 1)
    shapes = ((*lead, m, m), (*lead, m * m)) if square else ((*lead, m, 1), (*lead, m))
    if tuple(t.shape) not in shapes:
        raise ValueError(f"{name} must have shape {shapes[0]} or {shapes[1]}, got {tuple(t.shape)}")
    check_shape(t, name, t.shape, ref, "input_mixes")


def mhc_pre_split_mixes_fwd(input_mixes, mhc_scale, mhc_base, pre_layer_mix: Optional[torch.Tensor] = None,
                            post_layer_mix: Optional[torch.Tensor] = None, comb_res_mix: Optional[torch.Tensor] = None,
                            mhc_post_mult_value: float = 1.0, mhc_pre_eps: float = 1e-6):  # fmt: skip
    """y = input_mixes * scale[segment] + base (segments: m pre, m post, m * m comb entries);
    pre = sigmoid(y[:m]) + eps, post = sigmoid(y[m:2m]) * post_mult, comb = y[2m:] (the
    product and sum rounded on their own: mhc_pre_split_mixes_ref's bits). Returns (pre, post,
    comb), written into the given tensors (else new ones of the reference's shapes).

    input_mixes: (..., m (m + 2)) fp32, 1 <= m <= 8; mhc_scale (3,), mhc_base (m (m + 2),) fp32;
    pre / post: (..., m, 1) or (..., m); comb: (..., m, m) or (..., m * m). All contiguous.
    """
    if not torch.compiler.is_compiling():  # dynamo can neither hash the key nor trace the native call
        try:
            call = _PLANS["fwd", input_mixes.ndim, input_mixes.shape[-1], ndim_or_none(pre_layer_mix),
                          ndim_or_none(post_layer_mix), ndim_or_none(comb_res_mix), mhc_post_mult_value,
                          mhc_post_mult_value.__class__, mhc_pre_eps, mhc_pre_eps.__class__]  # fmt: skip
        except (KeyError, AttributeError, TypeError, IndexError):
            pass
        else:
            result = plan.run(call, input_mixes, mhc_scale, mhc_base, pre_layer_mix, post_layer_mix, comb_res_mix)
            if result is not NotImplemented:
                return result
    num_tokens, m = _check_mixes(input_mixes, mhc_scale, mhc_base)
    post_mult, eps = check_float(mhc_post_mult_value, "mhc_post_mult_value"), check_float(mhc_pre_eps, "mhc_pre_eps")
    if torch.compiler.is_compiling():
        got = torch.ops.tilebake.mhc_pre_split_mixes_fwd(input_mixes, mhc_scale, mhc_base, post_mult, eps)
        given = (pre_layer_mix, post_layer_mix, comb_res_mix)
        return tuple(g if o is None else o.copy_(g.reshape(o.shape)) for g, o in zip(got, given))
    lead = tuple(input_mixes.shape[:-1])
    key = ("fwd", input_mixes.ndim, input_mixes.shape[-1], ndim_or_none(pre_layer_mix), ndim_or_none(post_layer_mix),
           ndim_or_none(comb_res_mix), mhc_post_mult_value, mhc_post_mult_value.__class__, mhc_pre_eps,
           mhc_pre_eps.__class__)  # fmt: skip
    outs = []
    for t, name, square in ((pre_layer_mix, "pre_layer_mix", False), (post_layer_mix, "post_layer_mix", False),
                            (comb_res_mix, "comb_res_mix", True)):  # fmt: skip
        if t is None:
            t = input_mixes.new_empty((*lead, m, m if square else 1))
        else:
            _check_mix(t, name, lead, m, input_mixes, square)
        outs.append(t)
    pre, post, comb = outs
    if num_tokens == 0:
        return pre, post, comb
    if input_mixes.device.type == "npu":  # the Ascend kernel
        from tilebake.mhc._mhc_ascend import launch

        launch("mhc_pre_split_mixes", "fwd", input_mixes, input_mixes.data_ptr(), mhc_scale.data_ptr(),
               mhc_base.data_ptr(), pre.data_ptr(), post.data_ptr(), comb.data_ptr(), num_tokens, m, m * (m + 2),
               post_mult, eps)  # fmt: skip
        plan.bump(pre_layer_mix, post_layer_mix, comb_res_mix)
        return pre, post, comb
    if not input_mixes.is_cuda:
        from tilebake.torch.mhc import mhc_pre_split_mixes_ref

        want = mhc_pre_split_mixes_ref(input_mixes, mhc_scale, mhc_base, m, post_mult, eps)
        return tuple(o.copy_(w.reshape(o.shape)) for o, w in zip(outs, want))
    kernel = _KERNELS["fwd",]
    kernel(input_mixes.get_device(), input_mixes.data_ptr(), mhc_scale.data_ptr(), mhc_base.data_ptr(),
           pre.data_ptr(), post.data_ptr(), comb.data_ptr(), num_tokens, m, m * (m + 2), post_mult, eps)  # fmt: skip
    plan.bump(pre_layer_mix, post_layer_mix, comb_res_mix)
    plan.remember(_PLANS, key, _plans_mix.split_fwd, kernel, input_mixes.get_device(), input_mixes.ndim - 1, m,
                  key[3:6], post_mult, eps)  # fmt: skip
    return pre, post, comb


def num_partials(num_tokens: int) -> int:
    """The backward's partial rows: a CTA an SM (set_num_sms respected), at most one a token."""
    return max(1, min(config.get_num_sms(), num_tokens))


def mhc_pre_split_mixes_bwd(pre_layer_mix_grad, post_layer_mix_grad, comb_res_mix_grad, input_mixes, post_layer_mix,
                            mhc_scale, mhc_base, input_mixes_grad: Optional[torch.Tensor] = None,
                            mhc_scale_grad: Optional[torch.Tensor] = None, mhc_base_grad: Optional[torch.Tensor] = None,
                            mhc_post_mult_value: float = 1.0):  # fmt: skip
    """The gradients of mhc_pre_split_mixes_fwd: (input_mixes_grad (..., m (m + 2)), mhc_scale_grad
    (3,), mhc_base_grad (m (m + 2),)), written (not accumulated) into the given tensors, else new.
    The sigmoids are recomputed from input_mixes (post_layer_mix is checked, not read); the scale
    and base gradients are summed over the tokens in a fixed order (per-CTA partials, then their
    sum: two runs give the same bits). Gradient shapes as the forward's outputs."""
    if not torch.compiler.is_compiling():  # dynamo can neither hash the key nor trace the native call
        try:
            call = _PLANS["bwd", input_mixes.ndim, input_mixes.shape[-1], pre_layer_mix_grad.ndim,
                          post_layer_mix_grad.ndim, comb_res_mix_grad.ndim, post_layer_mix.ndim,
                          ndim_or_none(input_mixes_grad), ndim_or_none(mhc_scale_grad), ndim_or_none(mhc_base_grad),
                          mhc_post_mult_value, mhc_post_mult_value.__class__]  # fmt: skip
        except (KeyError, AttributeError, TypeError, IndexError):
            pass
        else:
            result = plan.run(call, pre_layer_mix_grad, post_layer_mix_grad, comb_res_mix_grad, input_mixes,
                              post_layer_mix, mhc_scale, mhc_base, input_mixes_grad, mhc_scale_grad, mhc_base_grad)  # fmt: skip
            if result is not NotImplemented:
                return result
    num_tokens, m = _check_mixes(input_mixes, mhc_scale, mhc_base)
    lead, m3 = tuple(input_mixes.shape[:-1]), input_mixes.shape[-1]
    for t, name, square in ((pre_layer_mix_grad, "pre_layer_mix_grad", False),
                            (post_layer_mix_grad, "post_layer_mix_grad", False),
                            (comb_res_mix_grad, "comb_res_mix_grad", True), (post_layer_mix, "post_layer_mix", False)):  # fmt: skip
        _check_mix(t, name, lead, m, input_mixes, square)
    post_mult = check_float(mhc_post_mult_value, "mhc_post_mult_value")
    for t, name, shape in ((input_mixes_grad, "input_mixes_grad", input_mixes.shape), (mhc_scale_grad, "mhc_scale_grad", (3,)),
                           (mhc_base_grad, "mhc_base_grad", (m3,))):  # fmt: skip
        if t is not None:
            check_streams(t, name, torch.float32, 1)
            check_shape(t, name, shape, input_mixes, "input_mixes")
    grads = (pre_layer_mix_grad, post_layer_mix_grad, comb_res_mix_grad)
    if torch.compiler.is_compiling():
        got = torch.ops.tilebake.mhc_pre_split_mixes_bwd(*grads, input_mixes, post_layer_mix, mhc_scale, mhc_base, post_mult)
        given = (input_mixes_grad, mhc_scale_grad, mhc_base_grad)
        return tuple(g if o is None else o.copy_(g) for g, o in zip(got, given))
    key = ("bwd", input_mixes.ndim, m3, *(t.ndim for t in (*grads, post_layer_mix)), ndim_or_none(input_mixes_grad),
           ndim_or_none(mhc_scale_grad), ndim_or_none(mhc_base_grad), mhc_post_mult_value,
           mhc_post_mult_value.__class__)  # fmt: skip
    mix_grad = torch.empty_like(input_mixes) if input_mixes_grad is None else input_mixes_grad
    scale_grad = torch.empty_like(mhc_scale) if mhc_scale_grad is None else mhc_scale_grad
    base_grad = torch.empty_like(mhc_base) if mhc_base_grad is None else mhc_base_grad
    if num_tokens and input_mixes.device.type == "npu":  # the Ascend kernels: a partial row a vector core
        from tilebake._runtime import ascend
        from tilebake.mhc._mhc_ascend import launch

        parts, cols = min(ascend.vector_cores(ascend.device_index(input_mixes)), num_tokens), partial_cols(m)
        partial = input_mixes.new_empty((parts, cols))
        launch("mhc_pre_split_mixes", "bwd", input_mixes, *(t.data_ptr() for t in (*grads, input_mixes, mhc_scale,
                                                                                     mhc_base, mix_grad, partial)),
               num_tokens, m, m3, parts, cols, post_mult)  # fmt: skip
        launch("mhc_pre_split_mixes", "bwd_reduce", input_mixes, partial.data_ptr(), scale_grad.data_ptr(),
               base_grad.data_ptr(), parts, cols, m3)  # fmt: skip
        plan.bump(input_mixes_grad, mhc_scale_grad, mhc_base_grad)
        return mix_grad, scale_grad, base_grad
    if num_tokens == 0 or not input_mixes.is_cuda:
        from tilebake.torch.mhc import mhc_pre_split_mixes_bwd_ref

        want = mhc_pre_split_mixes_bwd_ref(*grads, input_mixes, mhc_scale, mhc_base, post_mult)
        return mix_grad.copy_(want[0]), scale_grad.copy_(want[1]), base_grad.copy_(want[2])
    parts, cols = num_partials(num_tokens), partial_cols(m)
    partial = input_mixes.new_empty((parts, cols))
    device = input_mixes.get_device()
    first, second = _KERNELS["bwd",], _KERNELS["bwd_reduce",]
    first(device, *(t.data_ptr() for t in (*grads, input_mixes, mhc_scale, mhc_base, mix_grad, partial)), num_tokens, m,
          m3, parts, cols, post_mult)  # fmt: skip
    second(device, partial.data_ptr(), scale_grad.data_ptr(), base_grad.data_ptr(), parts, cols, m3)
    plan.bump(input_mixes_grad, mhc_scale_grad, mhc_base_grad)
    plan.remember(_PLANS, key, _plans_mix.split_bwd, first, second, device, input_mixes.ndim - 1, m, key[3:10],
                  post_mult, config.get_num_sms())  # fmt: skip
    return mix_grad, scale_grad, base_grad


def _fwd_meta(x, scale, base, post_mult, eps):
    m = MULT_OF[x.shape[-1]]
    return x.new_empty((*x.shape[:-1], m, 1)), x.new_empty((*x.shape[:-1], m, 1)), x.new_empty((*x.shape[:-1], m, m))


# torch.library: lets torch.compile(fullgraph=True) trace the ops; eager calls skip it.
register(
    "mhc_pre_split_mixes_fwd(Tensor input_mixes, Tensor mhc_scale, Tensor mhc_base, float post_mult, float eps)"
    " -> (Tensor, Tensor, Tensor)",
    lambda x, s, b, pm, eps: mhc_pre_split_mixes_fwd(x, s, b, None, None, None, pm, eps),
    _fwd_meta,
)
register(
    "mhc_pre_split_mixes_bwd(Tensor pre_grad, Tensor post_grad, Tensor comb_grad, Tensor input_mixes, "
    "Tensor post_layer_mix, Tensor mhc_scale, Tensor mhc_base, float post_mult) -> (Tensor, Tensor, Tensor)",
    lambda pg, qg, cg, x, post, s, b, pm: mhc_pre_split_mixes_bwd(pg, qg, cg, x, post, s, b, None, None, None, pm),
    lambda pg, qg, cg, x, post, s, b, pm: (torch.empty_like(x), torch.empty_like(s), torch.empty_like(b)),
)
