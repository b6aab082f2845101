"""per_block_cast (+ _with_sf_only, _with_precomputed_sf) on NPU tensors: the Ascend 950 kernels
where they apply (the original's Ascend case: 32 x 32 blocks; here also any token count, hidden %
128 == 0, e4m3 or e2m1, a plain bf16 / fp32 input, row-major SF as fp32, power-of-two fp32 or UE8M0
bytes packed two to an int16), else None: the caller then takes the reference path (torch ops on
the NPU tensor; slower, same arithmetic). Never run on an NPU here: the launch sequence is tested
against a stand-in libascendcl (tests/ascend/test_quant_ops.py).
"""

from __future__ import annotations

import torch

from tilebake import config
from tilebake._runtime import ascend
from tilebake.quant._common import alloc_ascend_sf, ascend_sf_mode
from tilebake.quant.per_block_cast import ASCEND_BLOCK, PerBlockCastAscendVariant
from tilebake.utils import ceil_div

_KERNELS = ascend.AscendKernelTable(PerBlockCastAscendVariant)
_IN_DTYPES = {torch.bfloat16: "bf16", torch.float32: "fp32"}


def _applies(x, block) -> bool:
    return (
        tuple(block) == (ASCEND_BLOCK, ASCEND_BLOCK)
        and x.dtype in _IN_DTYPES
        and x.shape[1] % 128 == 0
        and x.stride(1) == 1
    )


def _data(x, fmt):
    num_tokens, hidden = x.shape
    if fmt == "e2m1":
        return x.new_empty((num_tokens, hidden // 2), dtype=torch.int8)
    return x.new_empty((num_tokens, hidden), dtype=torch.float8_e4m3fn)


def per_block_cast(x, fmt, block, col_major_sf, round_sf, use_packed_ue8m0, store_data=True):
    """(data, sf) of per_block_cast of NPU tensor x (T, H) by the Ascend kernel, or None where it
    does not apply (the column-major SF too); data None without store_data (_with_sf_only)."""
    if col_major_sf or not _applies(x, block):
        return None
    num_tokens, hidden = x.shape
    row_blocks, blocks = ceil_div(num_tokens, ASCEND_BLOCK), hidden // ASCEND_BLOCK
    data = _data(x, fmt) if store_data else None
    sf = alloc_ascend_sf(x, row_blocks, blocks, use_packed_ue8m0)
    mode = ascend_sf_mode(round_sf, use_packed_ue8m0)
    if num_tokens:
        index, kernel = _KERNELS.on(x, _IN_DTYPES[x.dtype], fmt, mode, store_data)
        pointers = (x.data_ptr(), data.data_ptr(), sf.data_ptr()) if store_data else (x.data_ptr(), sf.data_ptr())
        clamp = config.get_amax_clamp_for_quant(fmt, False)
        kernel(index, *pointers, clamp, num_tokens, hidden, x.stride(0), blocks)  # S's row: blocks or bytes
    return data, sf


def with_precomputed_sf(x, fmt, block, sf):
    """per_block_cast_with_precomputed_sf's data of NPU tensor x by the Ascend kernel, sf fp32
    (ceil(T / 32), H / 32) contiguous on x's device; None where it does not apply."""
    if not _applies(x, block) or sf.dtype != torch.float32 or sf.device != x.device or not sf.is_contiguous():
        return None
    num_tokens, hidden = x.shape
    data = _data(x, fmt)
    if num_tokens:
        index, kernel = _KERNELS.on(x, _IN_DTYPES[x.dtype], fmt, "precomputed", True)
        blocks = hidden // ASCEND_BLOCK
        kernel(index, x.data_ptr(), data.data_ptr(), sf.data_ptr(), num_tokens, hidden, x.stride(0), blocks)
    return data
