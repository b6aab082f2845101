"""FP8/FP4 quantisation: casts, dequantisation, and SwiGLU / RMSNorm fused with casts (the
original's tile_kernels.quant).

Each op's module (its checks, torch.library schema and kernel table) loads on first use of
one of its functions: importing all of them up front cost a cold start ~15 ms.
"""

from tilebake._lazy import make_lazy
from tilebake.quant._common import QuantTensor

# public name -> the module that defines it
_MODULES = {
    "batched_transpose_weight_sf": "batched_transpose_weight_sf",
    "cast": "cast",
    "cast_back": "cast_back",
    "per_token_cast_back": "cast_back",
    "norm_backward": "norm_backward",
    "norm_forward": "norm_forward",
    "norm_forward_and_per_token_cast": "norm_forward_and_per_token_cast",
    "per_block_cast": "per_block_cast",
    "per_block_cast_with_precomputed_sf": "per_block_cast",
    "per_block_cast_with_sf_only": "per_block_cast",
    "per_block_cast_lossless": "per_block_cast_lossless",
    "per_channel_cast": "per_channel_cast",
    "per_token_cast": "per_token_cast",
    "per_token_cast_with_precomputed_sf": "per_token_cast",
    "per_token_cast_with_sf_only": "per_token_cast",
    "per_token_cast_and_cast_back": "per_token_cast_and_cast_back",
    "swiglu_backward": "swiglu_backward",
    "swiglu_backward_and_per_token_cast": "swiglu_backward",
    "swiglu_forward": "swiglu_forward",
    "swiglu_forward_and_per_token_cast": "swiglu_forward",
    "unpack_from_e2m1fn_x2": "unpack_from_e2m1fn_x2",
}


make_lazy(__name__)

__all__ = ["QuantTensor", *_MODULES]
