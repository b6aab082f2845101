"""The mhc autograd ops (the original's tile_kernels.modeling.mhc.ops): each op an autograd
Function over tilebake.mhc's entry points, called through a plain function (so keywords work:
`sinkhorn_normalize(comb, repeat=20, eps=1e-6)`), with the plain forward and backward kernels of
mhc_post beside them (for recomputation).

    expand_to_mhc(hidden, mhc_mult, out=None)
    mhc_head_compute_mix(input_mix, mhc_scale, mhc_base, mhc_pre_eps)
    mhc_pre_norm_fn(residual, mhc_fn, mhc_norm_weight, mhc_norm_eps, fuse_grad_acc=True, n_splits=16)
    mhc_pre_split_mixes(input_mixes, mhc_scale, mhc_base, mhc_mult, mhc_post_mult_value, mhc_pre_eps)
    sinkhorn_normalize(x, repeat=10, eps=1e-6)
    mhc_pre_apply_mix(x, mix, out=None)
    mhc_post(x, residual, post_layer_mix, comb_res_mix, out=None), mhc_post_fwd, mhc_post_bwd

m (mhc_mult) is 1 to 8 (the original: 4). bf16 streams and fp32 mixes take the kernels (their
references on CPU tensors); fp32/fp64 streams and fp64 mixes the reference math, which is what
torch.autograd.gradcheck runs. Parameters (fn, norm weight, scale, base) with a `main_grad`
attribute (Megatron) get their gradient added into it in place, and None is returned for them.
"""

from tilebake.mhc import mhc_post_bwd, mhc_post_fwd
from tilebake.modeling.mhc._mixes import (
    MhcHeadComputeMixFn,
    MhcPreSplitMixesFn,
    SinkhornNormalizeFn,
    mhc_head_compute_mix,
    mhc_pre_split_mixes,
    sinkhorn_normalize,
)
from tilebake.modeling.mhc._norm_fn import MhcFnNormwMergeFn, MhcPreNormFn, ZeroPadRowsFn, mhc_pre_norm_fn
from tilebake.modeling.mhc._pre import MhcHeadFn, MhcPreFn
from tilebake.modeling.mhc._streams import (
    ExpandToMhcFn,
    MhcPostFn,
    MhcPreApplyMixFn,
    expand_to_mhc,
    mhc_post,
    mhc_pre_apply_mix,
)

from tilebake.mhc import mhc_multilayer_recompute  # noqa: E402  (no autograd: a recompute for the backward)


def mhc_pre_big_fuse(residual, fn, mhc_scale, mhc_base, rms_eps: float = 1e-6, mhc_pre_eps: float = 1e-6,
                     mhc_sinkhorn_eps: float = 1e-6, mhc_post_mult_value: float = 1.0, sinkhorn_repeat: int = 10,
                     n_splits: int = 16):  # fmt: skip
    """The whole of an inference mhc_pre (no autograd): the projection's split partials
    (tilebake.mhc.mhc_pre_norm_gemm_fwd), then tilebake.mhc.mhc_pre_big_fuse_fwd. Returns
    (post_mix (..., m, 1), comb_mix (..., m, m), layer_input (..., H)): the grad path's bytes."""
    import tilebake.mhc as kernels

    out_mul, sqrsum = kernels.mhc_pre_norm_gemm_fwd(residual, fn, n_splits)
    return kernels.mhc_pre_big_fuse_fwd(out_mul, sqrsum, mhc_scale, mhc_base, residual, rms_eps=rms_eps,
                                        mhc_pre_eps=mhc_pre_eps, mhc_sinkhorn_eps=mhc_sinkhorn_eps,
                                        mhc_post_mult_value=mhc_post_mult_value, sinkhorn_repeat=sinkhorn_repeat,
                                        n_splits=n_splits)  # fmt: skip


__all__ = [
    "mhc_pre_big_fuse",
    "mhc_multilayer_recompute",
    "expand_to_mhc",
    "mhc_head_compute_mix",
    "mhc_pre_norm_fn",
    "mhc_pre_split_mixes",
    "sinkhorn_normalize",
    "mhc_pre_apply_mix",
    "mhc_post",
    "mhc_post_fwd",
    "mhc_post_bwd",
    "ExpandToMhcFn",
    "MhcHeadComputeMixFn",
    "MhcFnNormwMergeFn",
    "MhcPreNormFn",
    "MhcPreSplitMixesFn",
    "SinkhornNormalizeFn",
    "MhcPreApplyMixFn",
    "MhcPostFn",
    "MhcPreFn",
    "MhcHeadFn",
    "ZeroPadRowsFn",
]
