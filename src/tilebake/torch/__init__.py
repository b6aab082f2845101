"""Plain-PyTorch reference implementations: the correctness oracles; also the slow path on CPU tensors."""

from .cast import cast, cast_back, unpack_from_e2m1fn_x2
from . import engram, mhc
from .cast_lossless import per_block_cast_lossless
from .engram import (
    engram_gate_bwd_ref,
    engram_gate_fwd_ref,
    engram_gate_ref,
    engram_hash_ref,
    engram_sinkhorn_finalize_ref,
    engram_sinkhorn_momentum_update_ref,
    engram_sinkhorn_step_ref,
    fused_weight_ref,
    grad_w_reduce_ref,
    make_offsets,
)
from .fake_quant import per_token_cast_and_cast_back_ref
from .gate import moe_topk_gate_forward_ref
from .mapping import expand_to_fused, expand_to_fused_with_sf, get_fused_mapping, reduce_fused
from .mhc import (
    expand_to_mhc_ref,
    mhc_head_compute_mix_ref,
    mhc_post_ref,
    mhc_pre_apply_mix_ref,
    mhc_pre_norm_fn_partials_ref,
    mhc_pre_norm_fn_ref,
    mhc_pre_split_mixes_ref,
    sinkhorn_normalize_ref,
)
from .moe import mask_indices_by_tp, moe_topk_gate_backward_ref, normalize_weight
from .norm import norm_backward_ref, norm_forward_ref
from .rope import rotary_embedding_ref
from .stochastic import stochastic_cast
from .swiglu import get_mapping_from_psum, swiglu_backward, swiglu_forward
from .topk import grouped_topk, stable_topk
from .weight_sf import batched_transpose_weight_sf

# The original's names for the router references (its torch/topk.py).
moe_topk_gate_forward = moe_topk_gate_forward_ref
moe_topk_gate_backward = moe_topk_gate_backward_ref

__all__ = [
    "batched_transpose_weight_sf",
    "cast",
    "cast_back",
    "engram",
    "engram_gate_bwd_ref",
    "engram_gate_fwd_ref",
    "engram_gate_ref",
    "engram_hash_ref",
    "engram_sinkhorn_finalize_ref",
    "engram_sinkhorn_momentum_update_ref",
    "engram_sinkhorn_step_ref",
    "fused_weight_ref",
    "grad_w_reduce_ref",
    "make_offsets",
    "mhc",
    "expand_to_mhc_ref",
    "mhc_head_compute_mix_ref",
    "mhc_post_ref",
    "mhc_pre_apply_mix_ref",
    "mhc_pre_norm_fn_partials_ref",
    "mhc_pre_norm_fn_ref",
    "mhc_pre_split_mixes_ref",
    "sinkhorn_normalize_ref",
    "get_mapping_from_psum",
    "grouped_topk",
    "mask_indices_by_tp",
    "moe_topk_gate_backward",
    "moe_topk_gate_backward_ref",
    "moe_topk_gate_forward",
    "moe_topk_gate_forward_ref",
    "norm_backward_ref",
    "norm_forward_ref",
    "normalize_weight",
    "per_block_cast_lossless",
    "per_token_cast_and_cast_back_ref",
    "rotary_embedding_ref",
    "stable_topk",
    "stochastic_cast",
    "swiglu_backward",
    "swiglu_forward",
    "unpack_from_e2m1fn_x2",
    "get_fused_mapping",
    "expand_to_fused",
    "expand_to_fused_with_sf",
    "reduce_fused",
]
