"""Op packages (tilebake.quant, .moe, .transform) whose op modules load on first use of one of
their functions: importing every op module up front cost a cold start ~15 ms."""

import importlib
import sys
import types


class LazyOpsPackage(types.ModuleType):
    """A package whose module-global `_MODULES` maps each public name to the module defining it:
    a submodule name, or a dotted module path elsewhere in tilebake."""

    def __getattr__(self, name):
        modules = self.__dict__.get("_MODULES", {})
        if name not in modules:
            raise AttributeError(f"module {self.__name__!r} has no attribute {name!r}")
        where = modules[name]
        value = getattr(importlib.import_module(where if "." in where else f"{self.__name__}.{where}"), name)
        self.__dict__[name] = value  # later lookups skip this method
        return value

    def __setattr__(self, name, value):
        # Importing a submodule binds it as an attribute of its package; most ops share their
        # module's name, so that binding would hide the function (tilebake.quant.cast_back would
        # become the module). Keep the public names for the functions.
        if not (isinstance(value, types.ModuleType) and name in self.__dict__.get("_MODULES", {})):
            super().__setattr__(name, value)

    def __dir__(self):
        return sorted({*self.__dict__, *self.__dict__.get("__all__", ())})


def make_lazy(module_name: str) -> None:
    """Turn the (already executing) package `module_name` into a LazyOpsPackage."""
    sys.modules[module_name].__class__ = LazyOpsPackage
