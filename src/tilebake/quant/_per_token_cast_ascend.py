"""per_token_cast on NPU tensors: the Ascend 950 kernels where they apply (the original's Ascend
cases: e4m3, 32 columns a group, hidden % 128 == 0, a plain bf16 / fp32 input, row-major SF as
fp32, power-of-two fp32 or UE8M0 bytes packed two to an int16), else None: the caller then takes
the reference path (torch ops on the NPU tensor; slower, same arithmetic). Never run on an NPU
here: the launch sequence is tested against a stand-in libascendcl.
"""

from __future__ import annotations

import torch

from tilebake import config
from tilebake._runtime import ascend
from tilebake.quant._common import alloc_ascend_sf, ascend_sf_mode
from tilebake.quant.per_token_cast import ASCEND_NUM_PER_CHANNELS, PerTokenCastAscendVariant

_KERNELS = ascend.AscendKernelTable(PerTokenCastAscendVariant)
_IN_DTYPES = {torch.bfloat16: "bf16", torch.float32: "fp32"}


def per_token_cast(x, num_per_channels, round_sf, use_packed_ue8m0, col_major_sf, store_data=True):
    """(data, sf) of an e4m3 per-token cast of NPU tensor x (T, H) by the Ascend kernel, new
    tensors (the caller copies them into given outputs), or None where it does not apply; data
    None without store_data (per_token_cast_with_sf_only)."""
    num_tokens, hidden = x.shape
    if num_per_channels != ASCEND_NUM_PER_CHANNELS or hidden % 128 or x.dtype not in _IN_DTYPES or col_major_sf:
        return None
    groups = hidden // num_per_channels
    data = x.new_empty((num_tokens, hidden), dtype=torch.float8_e4m3fn) if store_data else None
    sf = alloc_ascend_sf(x, num_tokens, groups, use_packed_ue8m0)
    mode = ascend_sf_mode(round_sf, use_packed_ue8m0)
    if num_tokens:
        index, kernel = _KERNELS.on(x, _IN_DTYPES[x.dtype], mode, store_data)
        pointers = (x.data_ptr(), data.data_ptr(), sf.data_ptr()) if store_data else (x.data_ptr(), sf.data_ptr())
        clamp = config.get_amax_clamp_for_quant("e4m3", False)
        kernel(index, *pointers, clamp, num_tokens, hidden, x.stride(0), groups)  # S's row: groups or bytes
    return data, sf


def with_precomputed_sf(x, num_per_channels, sf):
    """per_token_cast_with_precomputed_sf's data (e4m3) of NPU tensor x by the Ascend kernel, sf fp32
    (T, H / 32) contiguous on x's device; None where it does not apply."""
    num_tokens, hidden = x.shape
    if (
        num_per_channels != ASCEND_NUM_PER_CHANNELS
        or hidden % 128
        or x.dtype not in _IN_DTYPES
        or sf.dtype != torch.float32
        or sf.device != x.device
        or not sf.is_contiguous()
    ):
        return None
    data = x.new_empty((num_tokens, hidden), dtype=torch.float8_e4m3fn)
    if num_tokens:
        index, kernel = _KERNELS.on(x, _IN_DTYPES[x.dtype], "precomputed", True)
        groups = hidden // num_per_channels
        kernel(index, x.data_ptr(), data.data_ptr(), sf.data_ptr(), num_tokens, hidden, x.stride(0), groups)
    return data
