"""Every op's variant declaration, in one list: what the build lowers and the manifest holds.

Nothing here names an op: the Variant subclasses declared in the op packages' modules
(tilebake/<family>/<op>.py) register themselves (tilebake._variants.DECLARED); this module
imports those modules and sorts the declarations by family, then op, so the order (the build's
op numbering, `aot.py list`) does not depend on import order. The manifest sorts its keys anyway.
"""

import importlib
import pkgutil

from tilebake._variants import DECLARED

FAMILIES = ("engram", "mhc", "moe", "quant", "transform")


def _declared_types() -> tuple:
    for family in FAMILIES:
        package = importlib.import_module(f"tilebake.{family}")
        for module in sorted(m.name for m in pkgutil.iter_modules(package.__path__)):
            if not module.startswith("_"):  # _common and friends hold no variants
                importlib.import_module(f"tilebake.{family}.{module}")
    # Only the package's own declarations (a test may declare a Variant of its own).
    ours = [cls for cls in DECLARED if cls.__module__.startswith("tilebake.")]
    ours.sort(key=lambda cls: (cls.family, cls.op, cls.backend))
    ops = [(cls.op, cls.backend) for cls in ours]
    duplicates = sorted({op for op in ops if ops.count(op) > 1})
    if duplicates:
        raise RuntimeError(f"(op, backend) pairs declared by more than one Variant class: {duplicates}")
    return tuple(ours)


VARIANT_TYPES = _declared_types()


def all_variants(backend: str = "cuda"):
    """Every variant one backend's kernel package holds ('cuda': tilebake-cuda, 'ascend':
    tilebake-ascend)."""
    return [v for cls in VARIANT_TYPES if cls.backend == backend for v in cls.all()]
