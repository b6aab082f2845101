"""cast_back and per_token_cast_and_cast_back on NPU tensors: the Ascend 950 kernels where
they apply, else None / False: the caller goes on (the CUDA layouts' checks, then the
reference). cast_back: e4m3 data, block (1, 32), hidden % 128 == 0, SF row-major, fp32
(T, H / 32) or UE8M0 packed two to an int16 (T, H / 64), as per_token_cast's NPU path writes
them. The round trip: e4m3, 32-column groups, no e4m3 SF, hidden % 128 == 0. Never run on an NPU
here (tests/ascend/test_quant_ops.py).
"""

from __future__ import annotations

import torch

from tilebake._runtime import ascend
from tilebake.quant._common import ASCEND_SF_KINDS, FLOAT_DTYPES
from tilebake.quant.cast_back import CastBackAscendVariant
from tilebake.quant.per_token_cast import ASCEND_NUM_PER_CHANNELS
from tilebake.quant.per_token_cast_and_cast_back import PerTokenCastAndCastBackAscendVariant

_KERNELS = ascend.AscendKernelTable(CastBackAscendVariant)
_ROUND_TRIP = ascend.AscendKernelTable(PerTokenCastAndCastBackAscendVariant)
_IN_DTYPES = {torch.bfloat16: "bf16", torch.float32: "fp32"}


def cast_back(data, sf, fmt, block_m, block_k):
    num_tokens, hidden = data.shape
    kind = ASCEND_SF_KINDS.get(getattr(sf, "dtype", None))
    if (
        data.dtype != torch.float8_e4m3fn
        or (block_m, block_k) != (1, ASCEND_NUM_PER_CHANNELS)
        or hidden % 128
        or kind is None
        or sf.device != data.device
        or tuple(sf.shape) != (num_tokens, hidden // ASCEND_NUM_PER_CHANNELS // kind[1])
        or not sf.is_contiguous()
    ):
        return None
    out = data.new_empty((num_tokens, hidden), dtype=FLOAT_DTYPES[fmt])
    if num_tokens:
        index, kernel = _KERNELS.on(data, fmt, kind[0])
        sf_cols = hidden // ASCEND_NUM_PER_CHANNELS  # S's row in its kernel dtype: fp32 groups or UE8M0 bytes
        kernel(index, data.data_ptr(), sf.data_ptr(), out.data_ptr(), num_tokens, hidden, data.stride(0), sf_cols)
    return out


def fake_quant(x, fmt, num_per_channels, round_sf, use_e4m3_sf, amax_clamp) -> bool:
    """per_token_cast_and_cast_back of NPU tensor x (T, H) in place; False where it does not apply."""
    num_tokens, hidden = x.shape
    if fmt != "e4m3" or num_per_channels != ASCEND_NUM_PER_CHANNELS or use_e4m3_sf or hidden % 128:
        return False
    if x.dtype not in _IN_DTYPES:
        return False
    torch.autograd.graph.increment_version(x)  # the kernel writes x behind autograd's back
    if num_tokens:
        index, kernel = _ROUND_TRIP.on(x, _IN_DTYPES[x.dtype], bool(round_sf))
        kernel(index, x.data_ptr(), amax_clamp, num_tokens, hidden, x.stride(0))
    return True
