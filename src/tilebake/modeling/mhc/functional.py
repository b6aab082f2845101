"""The mhc layer's functional API (the original's tile_kernels.modeling.mhc.functional):
expand_from_embedding, mhc_pre, mhc_head, mhc_post. See tilebake.modeling.mhc."""

from __future__ import annotations

import torch

from tilebake.modeling.mhc import ops
from tilebake.modeling.mhc._common import check_mult, mix_count
from tilebake.modeling.mhc._norm_fn import MhcFnNormwMergeFn, ZeroPadRowsFn, merged_fn
from tilebake.modeling.mhc._pre import MhcHeadFn, MhcPreFn
from tilebake.modeling.mhc._streams import expand_to_mhc, mhc_post


def expand_from_embedding(x: torch.Tensor, mhc_mult: int = 4) -> torch.Tensor:
    """(..., H) -> (..., mhc_mult, H): the residual streams of a model's first block, each a copy of x."""
    return expand_to_mhc(x, mhc_mult)


def mhc_pre(residual, fn, scale, base, *, norm_weight=None, norm_eps: float = 1e-6, mhc_mult: int = 4,
            post_mult_value: float = 1.0, pre_eps: float = 1e-6, sinkhorn_eps: float = 1e-6,
            sinkhorn_repeat: int = 10, n_splits: int = 16):  # fmt: skip
    """A layer's input from the residual streams, and the mixes that merge its output back.

    residual (..., m, H) bf16; fn (m3, m H) fp32, m3 = m (m + 2); scale (3,), base (m3,), norm_weight
    (m H,) or None, fp32. Returns (layer_input (..., H) bf16, (post_mix (..., m, 1), comb_mix
    (..., m, m)) fp32), for mhc_post. With grad enabled: mixes = mhc_pre_norm_fn(residual, fn,
    norm_weight, norm_eps), (pre, post, comb) = mhc_pre_split_mixes(mixes, ...), comb =
    sinkhorn_normalize(comb, sinkhorn_repeat, sinkhorn_eps), layer_input = mhc_pre_apply_mix(residual,
    pre), run as one autograd Function (tilebake.modeling.mhc._pre: one residual-gradient buffer);
    fn' = fn * norm_weight is its own node. With grad disabled a bf16 residual takes the fused
    inference kernel, ops.mhc_pre_big_fuse, where present (the same results).
    """
    check_mult(residual, mhc_mult)
    if not torch.is_grad_enabled() and residual.dtype == torch.bfloat16:
        fused = getattr(ops, "mhc_pre_big_fuse", None)
        if fused is not None:
            fn = fn if norm_weight is None else MhcFnNormwMergeFn.apply(fn, norm_weight)
            post, comb, layer_input = fused(residual, fn, scale, base, rms_eps=norm_eps, mhc_pre_eps=pre_eps,
                                            mhc_sinkhorn_eps=sinkhorn_eps, mhc_post_mult_value=post_mult_value,
                                            sinkhorn_repeat=sinkhorn_repeat, n_splits=n_splits)  # fmt: skip
            lead, m = residual.shape[:-2], mhc_mult
            return layer_input.view(*lead, residual.shape[-1]), (post.view(*lead, m, 1), comb.view(*lead, m, m))
    layer_input, post, comb = MhcPreFn.apply(residual, merged_fn(fn, norm_weight), scale, base, mhc_mult,
                                             post_mult_value, pre_eps, sinkhorn_eps, sinkhorn_repeat, norm_eps,
                                             n_splits)  # fmt: skip
    return layer_input, (post, comb)


def mhc_head(residual, fn, scale, base, *, norm_weight=None, norm_eps: float = 1e-6, mhc_mult: int = 4,
             pre_eps: float = 1e-6, n_splits: int = 16) -> torch.Tensor:  # fmt: skip
    """The LM-head variant of mhc_pre: residual (..., m, H) bf16 -> (..., H) bf16.

    fn (m, m H) fp32 is zero-padded to (m3, m H) to reuse the pre-norm projection (an (m3, m H)
    fn is taken as it is); the first m mixes go through sigmoid(mix * scale + base) + pre_eps
    (scale a scalar or (1,), base (m,)), then mix the streams. One autograd Function, as mhc_pre.
    """
    check_mult(residual, mhc_mult)
    m3 = mix_count(mhc_mult)
    if fn.dim() != 2 or fn.shape[0] not in (mhc_mult, m3):
        raise ValueError(f"mhc_head's fn must have {mhc_mult} (or {m3}) rows, got shape {tuple(fn.shape)}")
    padded = fn if fn.shape[0] == m3 else ZeroPadRowsFn.apply(fn, m3)
    return MhcHeadFn.apply(residual, merged_fn(padded, norm_weight), scale, base, pre_eps, norm_eps, n_splits)


__all__ = ["expand_from_embedding", "mhc_pre", "mhc_head", "mhc_post"]
