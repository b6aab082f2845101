"""MoE routing: top-k expert selection, weight normalisation and the router backward (the
original's tile_kernels.moe), and the TileKernels 1.0 token-to-expert mapping ops (api.md 1.11):
get_fused_mapping, expand_to_fused, expand_to_fused_with_sf, reduce_fused.

Each op's module (its checks, torch.library schema and kernel table) loads on first use of
one of its functions, as in tilebake.quant.
"""

import importlib
import sys
import types

# public name -> the module that defines it
_MODULES = {
    "moe_topk_gate_backward": "moe_topk_gate_backward",
    "normalize_weight": "normalize_weight",
    "topk_gate": "topk_gate",
    "get_fused_mapping": "get_fused_mapping",
    "expand_to_fused": "expand_to_fused",
    "expand_to_fused_with_sf": "expand_to_fused",
    "reduce_fused": "reduce_fused",
    "moe_topk_gate": "moe_topk_gate_forward",
    "moe_topk_gate_forward": "moe_topk_gate_forward",
}


def __getattr__(name):
    if name in _MODULES:
        value = getattr(importlib.import_module(f"tilebake.moe.{_MODULES[name]}"), name)
    else:
        raise AttributeError(f"module 'tilebake.moe' has no attribute {name!r}")
    globals()[name] = value  # later lookups skip this function
    return value


class _Package(types.ModuleType):
    """Importing a submodule binds it as an attribute of its package; the ops share their
    module's name, so that binding would hide the function. Keep the public names for the
    functions."""

    def __setattr__(self, name, value):
        if not (isinstance(value, types.ModuleType) and name in _MODULES):
            super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package


def __dir__():
    return sorted([*globals(), *__all__])


__all__ = [*_MODULES]
