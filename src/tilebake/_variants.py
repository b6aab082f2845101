"""Compile-time variant keys: the one declaration shared by the build, the runtime and the tests.

Each op declares a frozen dataclass whose fields are its compile-time key and whose
`all()` enumerates exactly what the kernel package contains. The build lowers `all()`, the
runtime looks a call's key up in the manifest by `id`, and a test checks that the
built manifest holds exactly `all()`. Runtime sizes, strides and scalars are never
fields here: they are kernel arguments.

Each variant also declares its kernel's parameters (`PARAMS`, or `params()` where they depend
on the fields): names and dtypes in the order the op passes them. The build fails when the
lowered kernel's parameters differ from them (build_tools/aot.py check_params); the runtime
reads them for the launch order (loader.Kernel) and the tests for what a kernel takes.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar, NamedTuple

# Lowered-IR parameter dtypes (a pointer is a "handle") -> the native launcher's signature letters.
PARAM_DTYPES = {"handle": "p", "int32": "i", "int64": "l", "float32": "f"}


class Param(NamedTuple):
    name: str
    dtype: str  # a key of PARAM_DTYPES, as the lowered IR spells it


def ptr(*names: str) -> tuple[Param, ...]:
    """Device pointers (a tensor's data_ptr(), or 0 where the kernel does not read it)."""
    return tuple(Param(n, "handle") for n in names)


def i32(*names: str) -> tuple[Param, ...]:
    return tuple(Param(n, "int32") for n in names)


def i64(*names: str) -> tuple[Param, ...]:
    return tuple(Param(n, "int64") for n in names)


def f32(*names: str) -> tuple[Param, ...]:
    return tuple(Param(n, "float32") for n in names)

# Every Variant subclass that declares an op, in definition order (tilebake._registry imports
# the op packages and sorts them): declaring a Variant is all it takes for the build to see it.
# The vector-core counts the Ascend kernels are built for: each bakes its count into its grid and
# its loop strides (one block a vector core), so a device with another count has no binary.
# Ascend950PR_9589: 64 (2 vector cores an AI core).
ASCEND_VEC_CORES = (64,)

DECLARED: list[type[Variant]] = []


@dataclasses.dataclass(frozen=True)
class Variant:
    family: ClassVar[str]  # kernels_tl/<family>/<op>.py holds the TileLang factory
    op: ClassVar[str]
    # 'cuda' (tilebake-cuda), or 'ascend' (tilebake-ascend: its factory in
    # kernels_tl/ascend/<family>/<op>.py, lowered for Ascend 950 by build_tools/aot_ascend.py).
    # An op declares at most one Variant class per backend.
    backend: ClassVar[str] = "cuda"
    # PARAMS = (Param, ...), or params() overridden. Not annotated: an annotated class attribute
    # is in __dataclass_fields__, which the manifest's "key" lists.

    def params(self) -> tuple[Param, ...]:
        """The kernel's parameters in the order the op passes them (the lowering may order
        them otherwise: the loader maps by name)."""
        try:
            return type(self).PARAMS
        except AttributeError:
            raise NotImplementedError(f"{type(self).__name__} must declare PARAMS or params()") from None

    @property
    def arg_names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.params())

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if "op" in cls.__dict__:
            DECLARED.append(cls)

    @classmethod
    def kernel_module(cls) -> str:
        """The module of the op's TileLang factory for this backend (build time only)."""
        prefix = "kernels_tl" if cls.backend == "cuda" else f"kernels_tl.{cls.backend}"
        return f"{prefix}.{cls.family}.{cls.op}"

    @property
    def id(self) -> str:
        """File stem, manifest key and error text: a pure function of the fields."""
        parts = [self.op]
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            parts.append(f"{field.name}-{int(value) if isinstance(value, bool) else value}")
        return ".".join(parts)

    @classmethod
    def all(cls) -> tuple[Variant, ...]:
        raise NotImplementedError(f"{cls.__name__} must enumerate its built variants")

    @classmethod
    def closest(cls, wanted: Variant, limit: int = 4, built=None) -> list[str]:
        """Variants differing from `wanted` in the fewest fields, for error messages: among the
        declared ones (cls.all()), or only those whose ids are in `built` (what a kernel package holds)."""
        names = [f.name for f in dataclasses.fields(cls)]

        def distance(v: Variant) -> int:
            return sum(getattr(v, n) != getattr(wanted, n) for n in names)

        candidates = [v for v in cls.all() if built is None or v.id in built]
        return [v.id for v in sorted(candidates, key=distance)[:limit]]
