"""FP8 quantisation: casts and dequantisation (the original's tile_kernels.quant)."""

from tilebake.quant._common import QuantTensor
from tilebake.quant.cast_back import cast_back, per_token_cast_back
from tilebake.quant.per_token_cast import per_token_cast

__all__ = ["QuantTensor", "cast_back", "per_token_cast", "per_token_cast_back"]
from tilebake.quant.per_token_cast import per_token_cast_with_precomputed_sf, per_token_cast_with_sf_only

__all__ += ["per_token_cast_with_precomputed_sf", "per_token_cast_with_sf_only"]
from tilebake.quant.per_block_cast import (  # noqa: E402
    per_block_cast,
    per_block_cast_with_precomputed_sf,
    per_block_cast_with_sf_only,
)

__all__ += ["per_block_cast", "per_block_cast_with_precomputed_sf", "per_block_cast_with_sf_only"]
from tilebake.quant.per_channel_cast import per_channel_cast  # noqa: E402

__all__ += ["per_channel_cast"]
from tilebake.quant.per_block_cast_lossless import per_block_cast_lossless  # noqa: E402

__all__ += ["per_block_cast_lossless"]
from tilebake.quant.batched_transpose_weight_sf import batched_transpose_weight_sf  # noqa: E402

__all__ += ["batched_transpose_weight_sf"]
