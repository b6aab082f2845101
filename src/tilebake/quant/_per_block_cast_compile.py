"""per_block_cast under torch.compile(fullgraph=True): its torch.library ops (functional, and
out= writing a given (data, sf)), their shape functions and the traced call. Apart from
per_block_cast.py because eager calls never come here; per_block_cast.py registers the ops on
import, handing in the function they run.
"""

from __future__ import annotations

import torch

from tilebake._library import register
from tilebake.quant._common import alloc_sf, quant_data_shape
from tilebake.utils import ceil_div


def register_ops(per_block_cast) -> None:
    """Define torch.ops.tilebake.per_block_cast and per_block_cast_out, both run by
    `per_block_cast` (passed in: it is defined in the module that imports this one)."""

    def op_impl(x, fmt, bm, bk, col_major_sf, round_sf, packed_ue8m0):
        data, sf = per_block_cast(x, fmt, (bm, bk), col_major_sf, round_sf, packed_ue8m0)
        return data, sf

    def op_out_impl(x, fmt, bm, bk, round_sf, packed_ue8m0, out_data, out_sf):
        per_block_cast(x, fmt, (bm, bk), round_sf=round_sf, use_packed_ue8m0=packed_ue8m0, out=(out_data, out_sf))

    def meta(x, fmt, bm, bk, col_major_sf, round_sf, packed_ue8m0):
        num_tokens, hidden = x.shape
        shape, dtype = quant_data_shape(fmt, num_tokens, hidden)
        sf = alloc_sf(x, ceil_div(num_tokens, bm), ceil_div(hidden, bk), packed_ue8m0, col_major_sf)
        return x.new_empty(shape, dtype=dtype), sf

    register(
        "per_block_cast(Tensor x, str fmt, int bm, int bk, bool col_major_sf, bool round_sf, bool packed_ue8m0)"
        " -> (Tensor, Tensor)",
        op_impl,
        meta,
    )
    register(
        "per_block_cast_out(Tensor x, str fmt, int bm, int bk, bool round_sf, bool packed_ue8m0,"
        " Tensor(a!) out_data, Tensor(b!) out_sf) -> ()",
        op_out_impl,
        lambda *args: None,
    )


def _compiled_path(x, fmt, bm, bk, col_major_sf, round_sf, packed_ue8m0, data, sf):
    """Traced: the functional op, or with any part of out= given, the missing part allocated (as
    eager mode lays it out) and both written by the mutating op."""
    if data is None and sf is None:
        return torch.ops.tilebake.per_block_cast(x, fmt, bm, bk, col_major_sf, round_sf, packed_ue8m0)
    num_tokens, hidden = x.shape
    if data is None:
        shape, dtype = quant_data_shape(fmt, num_tokens, hidden)
        data = x.new_empty(shape, dtype=dtype)
    if sf is None:
        sf = alloc_sf(x, ceil_div(num_tokens, bm), ceil_div(hidden, bk), packed_ue8m0, col_major_sf)
    torch.ops.tilebake.per_block_cast_out(x, fmt, bm, bk, round_sf, packed_ue8m0, data, sf)
    return data, sf
