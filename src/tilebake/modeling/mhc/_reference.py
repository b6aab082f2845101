"""The reference math of the mhc layer, for fp32 and fp64 inputs (what gradcheck runs).

Where tilebake.torch.mhc's references keep their inputs' dtype (sinkhorn, split mixes, head mix,
expand) they are used as they are. mhc_post_ref, mhc_pre_apply_mix_ref and mhc_pre_norm_fn_ref
compute in fp32 (`.float()`, the kernels' arithmetic), which would round fp64 inputs and break a
finite-difference gradcheck; their forms here compute in fp64 for fp64 inputs and fp32 otherwise.
"""

from __future__ import annotations

import torch

from tilebake.torch import mhc as ref


def _acc(t: torch.Tensor) -> torch.dtype:
    return torch.float64 if t.dtype == torch.float64 else torch.float32


def expand(hidden, mhc_mult: int):
    return ref.expand_to_mhc_ref(hidden, mhc_mult)


def post(x, residual, post_layer_mix, comb_res_mix):
    """out[..., o, :] = post[..., o] x + sum_i comb[..., i, o] residual[..., i, :]."""
    a = _acc(residual)
    p = post_layer_mix.reshape(*residual.shape[:-1], 1).to(a)
    mixed = torch.einsum("...io,...ic->...oc", comb_res_mix.to(a), residual.to(a))
    return (p * x.to(a).unsqueeze(-2) + mixed).to(residual.dtype)


def pre_apply_mix(x, mix):
    """sum_i mix[..., i] x[..., i, :]; mix (..., m) or (..., m, 1)."""
    a = _acc(x)
    return (mix.reshape(*x.shape[:-1], 1).to(a) * x.to(a)).sum(-2).to(x.dtype)


def pre_norm_fn(residual, fn, norm_eps: float):
    """(flatten(residual) @ fn^T) * rsqrt(mean(flatten(residual)^2) + eps), fn already merged
    with the norm weight: (..., m, H) -> (..., m3)."""
    a = _acc(residual)
    x = residual.flatten(-2).to(a)
    return (x @ fn.to(a).t()) * (x.square().mean(-1, keepdim=True) + norm_eps).rsqrt()


split_mixes = ref.mhc_pre_split_mixes_ref
sinkhorn = ref.sinkhorn_normalize_ref
head_compute_mix = ref.mhc_head_compute_mix_ref


def mhc_pre(residual, fn, scale, base, mhc_mult, post_mult_value, pre_eps, sinkhorn_eps, sinkhorn_repeat, norm_eps):
    """(layer_input, post (..., m, 1), comb (..., m, m)) of one mhc_pre, composed as the spec writes it."""
    mixes = pre_norm_fn(residual, fn, norm_eps)
    pre, post_mix, comb = split_mixes(mixes, scale, base, mhc_mult, post_mult_value, pre_eps)
    return pre_apply_mix(residual, pre), post_mix, sinkhorn(comb, sinkhorn_repeat, sinkhorn_eps)


def mhc_head(residual, fn_padded, scale, base, pre_eps, norm_eps):
    """The head's layer input: the first m mixes of the (zero-padded) projection, through
    sigmoid(mix scale + base) + eps, applied to the streams."""
    m = residual.shape[-2]
    mixes = pre_norm_fn(residual, fn_padded, norm_eps)[..., :m]
    return pre_apply_mix(residual, head_compute_mix(mixes, scale, base, pre_eps))
