"""FP8 quantisation: casts and dequantisation (the original's tile_kernels.quant)."""

from tilebake.quant._common import QuantTensor
from tilebake.quant.cast_back import cast_back, per_token_cast_back
from tilebake.quant.per_token_cast import per_token_cast
from tilebake.quant.swiglu_backward import swiglu_backward, swiglu_backward_and_per_token_cast
from tilebake.quant.swiglu_forward import swiglu_forward, swiglu_forward_and_per_token_cast

__all__ = ["QuantTensor", "cast_back", "per_token_cast", "per_token_cast_back"]
__all__ += [
    "swiglu_backward",
    "swiglu_backward_and_per_token_cast",
    "swiglu_forward",
    "swiglu_forward_and_per_token_cast",
]
