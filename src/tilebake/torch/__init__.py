"""Plain-PyTorch reference implementations: the correctness oracles; also the slow path on CPU tensors."""

from .cast import cast, cast_back
from .cast_lossless import per_block_cast_lossless
from .norm import norm_backward_ref, norm_forward_ref
from .swiglu import get_mapping_from_psum, swiglu_backward, swiglu_forward
from .weight_sf import batched_transpose_weight_sf

__all__ = [
    "batched_transpose_weight_sf",
    "cast",
    "cast_back",
    "get_mapping_from_psum",
    "norm_backward_ref",
    "norm_forward_ref",
    "per_block_cast_lossless",
    "swiglu_backward",
    "swiglu_forward",
]
