"""Transforms of activations: rotary position embedding (the original's tile_kernels.transform).

The op's module (its checks, torch.library schema and kernel table) loads on first use.
"""

import importlib
import sys
import types

# public name -> the module that defines it
_MODULES = {"apply_rotary": "apply_rotary"}


def __getattr__(name):
    if name in _MODULES:
        value = getattr(importlib.import_module(f"tilebake.transform.{_MODULES[name]}"), name)
    else:
        raise AttributeError(f"module 'tilebake.transform' has no attribute {name!r}")
    globals()[name] = value  # later lookups skip this function
    return value


class _Package(types.ModuleType):
    """Importing a submodule binds it as an attribute of its package; the op shares its
    module's name, so that binding would hide the function. Keep the public name for it."""

    def __setattr__(self, name, value):
        if not (isinstance(value, types.ModuleType) and name in _MODULES):
            super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package


def __dir__():
    return sorted([*globals(), *__all__])


__all__ = list(_MODULES)
