"""Compile-time variant keys: the one declaration shared by the build, the runtime and the tests.

Each op declares a frozen dataclass whose fields are its compile-time key and whose
`all()` enumerates exactly what the kernel package contains. The build lowers `all()`, the
runtime looks a call's key up in the manifest by `id`, and a test checks that the
built manifest holds exactly `all()`. Runtime sizes, strides and scalars are never
fields here: they are kernel arguments.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar


@dataclasses.dataclass(frozen=True)
class Variant:
    family: ClassVar[str]  # kernels_tl/<family>/<op>.py holds the TileLang factory
    op: ClassVar[str]

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
