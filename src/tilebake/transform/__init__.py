"""Transforms of activations: rotary position embedding (the original's tile_kernels.transform).

The op's module (its checks, torch.library schema and kernel table) loads on first use.
"""

from tilebake._lazy import make_lazy

# public name -> the module that defines it
_MODULES = {"apply_rotary": "apply_rotary"}


make_lazy(__name__)

__all__ = list(_MODULES)
