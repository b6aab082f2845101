"""FP8 quantisation: casts and dequantisation (the original's tile_kernels.quant)."""

from tilebake.quant._common import QuantTensor
from tilebake.quant.cast_back import cast_back, per_token_cast_back
from tilebake.quant.per_token_cast import per_token_cast

__all__ = ["QuantTensor", "cast_back", "per_token_cast", "per_token_cast_back"]

from tilebake.quant.cast import cast  # noqa: E402
from tilebake.quant.per_token_cast_and_cast_back import per_token_cast_and_cast_back  # noqa: E402
from tilebake.torch.cast import unpack_from_e2m1fn_x2  # noqa: E402

__all__ += ["cast", "per_token_cast_and_cast_back", "unpack_from_e2m1fn_x2"]
