"""torch.library registration of the ops: lets torch.compile(fullgraph=True) trace a public
function as one opaque node. Eager calls skip it (they call the implementation directly)."""

from __future__ import annotations

import torch

# One fragment of the "tilebake" namespace for every op, kept alive here: a Library that is
# garbage collected takes its registrations with it.
_LIB = torch.library.Library("tilebake", "FRAGMENT")


def register(schema: str, impl, meta) -> None:
    """Define torch.ops.tilebake.<name> from `schema` ("name(args) -> returns"), run by `impl`
    on CPU and CUDA tensors. `meta` is the shape function (what torch.compile's fake tensors
    run), registered as a Meta kernel: that costs nothing at import, where register_fake spends
    ~2 ms an op reading source."""
    name = schema.split("(", 1)[0]
    _LIB.define(schema)
    for key in ("CPU", "CUDA"):
        _LIB.impl(name, impl, key)
    _LIB.impl(name, meta, "Meta")
