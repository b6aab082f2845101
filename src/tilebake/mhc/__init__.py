"""Manifold hyper-connections (the original's tile_kernels.mhc): the residual stream held as m
mixed streams. Each op writes into caller-given outputs where the original does (and allocates
them where they are not given); CPU tensors take the references (tilebake.torch.mhc).

Each op's module (its checks and kernel table) loads on first use.
"""

from tilebake._lazy import make_lazy

# public name -> the module that defines it
_MODULES = {
    "expand_to_mhc_fwd": "expand_to_mhc",
    "expand_to_mhc_bwd": "expand_to_mhc",
    "mhc_post_fwd": "mhc_post",
    "mhc_post_bwd": "mhc_post",
    "mhc_pre_apply_mix_fwd": "mhc_pre_apply_mix",
    "mhc_pre_apply_mix_bwd": "mhc_pre_apply_mix",
    "mhc_sinkhorn_fwd": "mhc_sinkhorn",
    "mhc_sinkhorn_bwd": "mhc_sinkhorn",
    "mhc_pre_split_mixes_fwd": "mhc_pre_split_mixes",
    "mhc_pre_split_mixes_bwd": "mhc_pre_split_mixes",
    "mhc_head_compute_mix_fwd": "mhc_head_compute_mix",
    "mhc_head_compute_mix_bwd": "mhc_head_compute_mix",
    "mhc_fn_normw_merge_fwd": "mhc_fn_normw_merge",
    "mhc_fn_normw_merge_bwd": "mhc_fn_normw_merge",
    "mhc_pre_norm_gemm_fwd": "mhc_pre_norm_gemm",
    "mhc_pre_norm_gemm_bwd": "mhc_pre_norm_gemm",
    "mhc_reduce_partials_and_rmsnorm_fwd": "mhc_reduce_partials_and_rmsnorm",
    "mhc_reduce_partials_and_rmsnorm_bwd": "mhc_reduce_partials_and_rmsnorm",
    "mhc_pre_big_fuse_fwd": "mhc_pre_big_fuse",
    "mhc_multilayer_recompute": "mhc_multilayer_recompute",
}


make_lazy(__name__)

__all__ = list(_MODULES)
