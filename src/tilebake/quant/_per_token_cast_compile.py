"""per_token_cast under torch.compile(fullgraph=True): its torch.library ops (functional, and
out= writing a given (data, sf)), their shape functions and the traced call. Apart from
per_token_cast.py because eager calls never come here; per_token_cast.py registers the ops on
import, handing in the function they run.
"""

from __future__ import annotations

import torch

from tilebake._library import register
from tilebake.quant._common import alloc_sf
from tilebake.utils import ceil_div


def register_ops(per_token_cast) -> None:
    """Define torch.ops.tilebake.per_token_cast and per_token_cast_out (e4m3 only), both run by
    `per_token_cast` (passed in: it is defined in the module that imports this one)."""

    def op_impl(x, num_per_channels, col_major_sf, round_sf, packed_ue8m0):
        data, sf = per_token_cast(
            x,
            "e4m3",
            num_per_channels,
            use_tma_aligned_col_major_sf=col_major_sf,
            round_sf=round_sf,
            use_packed_ue8m0=packed_ue8m0,
        )
        return data, sf

    def op_out_impl(x, num_per_channels, round_sf, packed_ue8m0, out_data, out_sf):
        per_token_cast(
            x, "e4m3", num_per_channels, round_sf=round_sf, use_packed_ue8m0=packed_ue8m0, out=(out_data, out_sf)
        )

    register(
        "per_token_cast(Tensor x, int num_per_channels, bool col_major_sf, bool round_sf, bool packed_ue8m0)"
        " -> (Tensor, Tensor)",
        op_impl,
        _meta,
    )
    register(
        "per_token_cast_out(Tensor x, int num_per_channels, bool round_sf, bool packed_ue8m0,"
        " Tensor(a!) out_data, Tensor(b!) out_sf) -> ()",
        op_out_impl,
        _meta_out,
    )


# Shape functions as Meta kernels (what torch.compile's fake tensors run): registering
# them costs nothing at import, where register_fake spends ~2 ms each reading source.
def _meta(x, num_per_channels, col_major_sf, round_sf, packed_ue8m0):
    num_tokens, hidden = x.shape
    data = x.new_empty((num_tokens, hidden), dtype=torch.float8_e4m3fn)
    return data, alloc_sf(x, num_tokens, ceil_div(hidden, num_per_channels), packed_ue8m0, col_major_sf)


def _meta_out(x, num_per_channels, round_sf, packed_ue8m0, out_data, out_sf):
    return None


def _compiled_path(x, num_per_channels, col_major_sf, round_sf, packed_ue8m0, data, sf):
    """Traced: the functional op, or with any part of out= given, the missing part allocated (as
    eager mode lays it out) and both written by the mutating op."""
    if data is None and sf is None:
        return torch.ops.tilebake.per_token_cast(x, num_per_channels, col_major_sf, round_sf, packed_ue8m0)
    num_tokens, hidden = x.shape
    if data is None:
        data = x.new_empty((num_tokens, hidden), dtype=torch.float8_e4m3fn)
    if sf is None:
        sf = alloc_sf(x, num_tokens, ceil_div(hidden, num_per_channels), packed_ue8m0, col_major_sf)
    torch.ops.tilebake.per_token_cast_out(x, num_per_channels, round_sf, packed_ue8m0, data, sf)
    return data, sf
