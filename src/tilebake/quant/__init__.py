"""FP8/FP4 quantisation: casts, dequantisation, and SwiGLU / RMSNorm fused with casts (the
original's tile_kernels.quant).

Each op's module (its checks, torch.library schema and kernel table) loads on first use of
one of its functions: importing all of them up front cost a cold start ~15 ms.
"""

import importlib
import sys
import types

from tilebake.quant._common import QuantTensor

# public name -> the module that defines it
_MODULES = {
    "batched_transpose_weight_sf": "batched_transpose_weight_sf",
    "cast": "cast",
    "cast_back": "cast_back",
    "per_token_cast_back": "cast_back",
    "norm_backward": "norm_backward",
    "norm_forward": "norm_forward",
    "norm_forward_and_per_token_cast": "norm_forward",
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
}


def __getattr__(name):
    if name == "unpack_from_e2m1fn_x2":  # pure torch: the reference is the implementation
        value = importlib.import_module("tilebake.torch.cast").unpack_from_e2m1fn_x2
    elif name in _MODULES:
        value = getattr(importlib.import_module(f"tilebake.quant.{_MODULES[name]}"), name)
    else:
        raise AttributeError(f"module 'tilebake.quant' has no attribute {name!r}")
    globals()[name] = value  # later lookups skip this function
    return value


class _Package(types.ModuleType):
    """Importing a submodule binds it as an attribute of its package; most ops share their
    module's name, so that binding would hide the function (tilebake.quant.cast_back would
    become the module). Keep the public names for the functions."""

    def __setattr__(self, name, value):
        if not (isinstance(value, types.ModuleType) and name in _MODULES):
            super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package


def __dir__():
    return sorted([*globals(), *__all__])


__all__ = ["QuantTensor", "unpack_from_e2m1fn_x2", *_MODULES]
