"""Plain-PyTorch reference implementations: the correctness oracles; also the slow path on CPU tensors."""

from .cast import cast, cast_back
from .swiglu import get_mapping_from_psum, swiglu_backward, swiglu_forward

__all__ = ["cast", "cast_back"]
__all__ += ["get_mapping_from_psum", "swiglu_backward", "swiglu_forward"]
