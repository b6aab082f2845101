"""FP8 quantisation: casts and dequantisation (the original's tile_kernels.quant)."""

from tilebake.quant._common import QuantTensor
from tilebake.quant.cast_back import cast_back, per_token_cast_back
from tilebake.quant.norm_backward import norm_backward
from tilebake.quant.norm_forward import norm_forward, norm_forward_and_per_token_cast
from tilebake.quant.per_token_cast import per_token_cast

__all__ = [
    "QuantTensor",
    "cast_back",
    "per_token_cast",
    "per_token_cast_back",
    "norm_forward",
    "norm_forward_and_per_token_cast",
    "norm_backward",
]
