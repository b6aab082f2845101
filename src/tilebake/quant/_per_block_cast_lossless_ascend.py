"""per_block_cast_lossless on NPU tensors: the Ascend 950 kernels where they apply (the original's
Ascend case: (1, 32) e2m1 blocks to (32, 32) e4m3 blocks, hidden % 256 == 0; here any token count;
the SFs row-major, fp32 or UE8M0 bytes two to an int16), else None: the caller goes on (the CUDA
layouts' checks, then the reference). A block that cannot be re-quantised exactly gets a NaN
scale (UE8M0 byte 0xFF), as on CUDA; check=True looks for one (a host sync) and raises. Never run
on an NPU here: the launch sequence is tested against a stand-in libascendcl (tests/ascend/).
"""

from __future__ import annotations

import torch

from tilebake._runtime import ascend
from tilebake.quant._common import ASCEND_SF_KINDS, alloc_ascend_sf
from tilebake.quant.per_block_cast_lossless import PerBlockCastLosslessAscendVariant
from tilebake.utils import ceil_div

_KERNELS = ascend.AscendKernelTable(PerBlockCastLosslessAscendVariant)
_GROUP = 32


def per_block_cast_lossless(data, sf_in, x_block, out_block, col_major_sf, use_packed_ue8m0, check):
    num_tokens, hidden = data.shape[0], 2 * data.shape[1]
    kind = ASCEND_SF_KINDS.get(sf_in.dtype)
    if (
        tuple(x_block) != (1, _GROUP)
        or tuple(out_block) != (_GROUP, _GROUP)
        or hidden % 256
        or col_major_sf
        or kind is None
        or data.stride(1) != 1
        or sf_in.device != data.device
        or not sf_in.is_contiguous()
        or tuple(sf_in.shape) != (num_tokens, hidden // _GROUP // kind[1])
    ):
        return None
    y = data.new_empty((num_tokens, hidden), dtype=torch.float8_e4m3fn)
    row_blocks, blocks = ceil_div(num_tokens, _GROUP), hidden // _GROUP
    sf = alloc_ascend_sf(data, row_blocks, blocks, use_packed_ue8m0)
    if num_tokens:
        index, kernel = _KERNELS.on(data, kind[0], "ue8m0" if use_packed_ue8m0 else "fp32")
        pointers = (data.data_ptr(), sf_in.data_ptr(), y.data_ptr(), sf.data_ptr())
        kernel(index, *pointers, num_tokens, data.shape[1], data.stride(0))  # x_bytes: hidden / 2
    if check:
        bad = (sf.view(torch.uint8) == 0xFF) if use_packed_ue8m0 else torch.isnan(sf)
        if bool(bad.any()):
            raise ValueError(
                "per_block_cast_lossless: some output blocks cannot be re-quantised exactly (their input scales "
                "are not normal powers of two within a ratio of 2^11); their scales are NaN"
            )
    return y, sf
