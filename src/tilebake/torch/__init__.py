"""Plain-PyTorch reference implementations: the correctness oracles; also the slow path on CPU tensors."""

from .cast import cast, cast_back

__all__ = ["cast", "cast_back"]
from .cast import unpack_from_e2m1fn_x2  # noqa: E402
from .fake_quant import per_token_cast_and_cast_back_ref  # noqa: E402
from .stochastic import stochastic_cast  # noqa: E402

__all__ += ["unpack_from_e2m1fn_x2", "per_token_cast_and_cast_back_ref", "stochastic_cast"]
