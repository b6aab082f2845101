"""FP8/FP4 quantisation: casts, dequantisation, and SwiGLU / RMSNorm fused with casts (the
original's tile_kernels.quant)."""

from tilebake.quant._common import QuantTensor
from tilebake.quant.batched_transpose_weight_sf import batched_transpose_weight_sf
from tilebake.quant.cast import cast
from tilebake.quant.cast_back import cast_back, per_token_cast_back
from tilebake.quant.norm_backward import norm_backward
from tilebake.quant.norm_forward import norm_forward, norm_forward_and_per_token_cast
from tilebake.quant.per_block_cast import (
    per_block_cast,
    per_block_cast_with_precomputed_sf,
    per_block_cast_with_sf_only,
)
from tilebake.quant.per_block_cast_lossless import per_block_cast_lossless
from tilebake.quant.per_channel_cast import per_channel_cast
from tilebake.quant.per_token_cast import (
    per_token_cast,
    per_token_cast_with_precomputed_sf,
    per_token_cast_with_sf_only,
)
from tilebake.quant.per_token_cast_and_cast_back import per_token_cast_and_cast_back
from tilebake.quant.swiglu_backward import swiglu_backward, swiglu_backward_and_per_token_cast
from tilebake.quant.swiglu_forward import swiglu_forward, swiglu_forward_and_per_token_cast
from tilebake.torch.cast import unpack_from_e2m1fn_x2

__all__ = [
    "QuantTensor",
    "batched_transpose_weight_sf",
    "cast",
    "cast_back",
    "norm_backward",
    "norm_forward",
    "norm_forward_and_per_token_cast",
    "per_block_cast",
    "per_block_cast_lossless",
    "per_block_cast_with_precomputed_sf",
    "per_block_cast_with_sf_only",
    "per_channel_cast",
    "per_token_cast",
    "per_token_cast_and_cast_back",
    "per_token_cast_back",
    "per_token_cast_with_precomputed_sf",
    "per_token_cast_with_sf_only",
    "swiglu_backward",
    "swiglu_backward_and_per_token_cast",
    "swiglu_forward",
    "swiglu_forward_and_per_token_cast",
    "unpack_from_e2m1fn_x2",
]
