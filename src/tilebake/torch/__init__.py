"""Plain-PyTorch reference implementations: the correctness oracles; also the slow path on CPU tensors."""

from .cast import cast, cast_back

__all__ = ["cast", "cast_back"]
from .cast_lossless import per_block_cast_lossless  # noqa: E402

__all__ += ["per_block_cast_lossless"]
from .weight_sf import batched_transpose_weight_sf  # noqa: E402

__all__ += ["batched_transpose_weight_sf"]
