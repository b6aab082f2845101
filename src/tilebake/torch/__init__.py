"""Plain-PyTorch reference implementations: the correctness oracles; also the slow path on CPU tensors."""

from .cast import cast, cast_back
from .norm import norm_backward_ref, norm_forward_ref

__all__ = ["cast", "cast_back", "norm_backward_ref", "norm_forward_ref"]
