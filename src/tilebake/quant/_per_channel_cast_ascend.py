"""per_channel_cast on NPU tensors: the Ascend 950 kernels where they apply (the original's Ascend
case: 32-token blocks, a bf16 input or an e4m3 QuantTensor with (1, 32) SF; here also fp32 inputs,
any token count, hidden % 128 == 0; the input SF fp32 (T, H / 32) or UE8M0 two to an int16
(T, H / 64), row-major; the SF written fp32, power-of-two fp32, or UE8M0 bytes packed two row
blocks to an int16 along the tokens: (ceil(ceil(T / 32) / 2), H)), else None: the caller then
takes the reference path (torch ops on the NPU tensor; slower, same arithmetic). Never run on an
NPU here: the launch sequence is tested against a stand-in libascendcl (tests/ascend/).
"""

from __future__ import annotations

import torch

from tilebake import config
from tilebake._runtime import ascend
from tilebake.quant._common import ASCEND_SF_KINDS
from tilebake.quant.per_channel_cast import ASCEND_NUM_PER_TOKENS, PerChannelCastAscendVariant
from tilebake.utils import ceil_div

_KERNELS = ascend.AscendKernelTable(PerChannelCastAscendVariant)
_IN_DTYPES = {torch.bfloat16: "bf16", torch.float32: "fp32", torch.float8_e4m3fn: "e4m3"}
_IN_GROUP = 32


def _input_sf_kind(data, sf, num_per_channels):
    """The kernel's in_sf for x = data (plain: sf None) or (data, sf); None where it does not apply."""
    if sf is None:
        return "none"
    kind = ASCEND_SF_KINDS.get(sf.dtype)
    if num_per_channels != _IN_GROUP or kind is None or sf.device != data.device or not sf.is_contiguous():
        return None
    if tuple(sf.shape) != (data.shape[0], data.shape[1] // _IN_GROUP // kind[1]):
        return None
    return kind[0]


def per_channel_cast(data, sf_in, num_per_tokens, num_per_channels, round_sf, use_packed_ue8m0):
    """(data, sf) of per_channel_cast of NPU tensor data (T, H) (a QuantTensor's with sf_in) by the
    Ascend kernel, or None where it does not apply."""
    num_tokens, hidden = data.shape
    in_sf = _input_sf_kind(data, sf_in, num_per_channels)
    if num_per_tokens != ASCEND_NUM_PER_TOKENS or hidden % 128 or in_sf is None or data.dtype not in _IN_DTYPES:
        return None
    row_blocks = ceil_div(num_tokens, ASCEND_NUM_PER_TOKENS)
    out = data.new_empty((num_tokens, hidden), dtype=torch.float8_e4m3fn)
    if use_packed_ue8m0:  # two row blocks' UE8M0 bytes to an int16 (the original's Ascend packing)
        sf = data.new_empty((ceil_div(row_blocks, 2), hidden), dtype=torch.int16)
        mode = "ue8m0"
    else:
        sf = data.new_empty((row_blocks, hidden), dtype=torch.float32)
        mode = "round" if round_sf else "fp32"
    if num_tokens:
        index, kernel = _KERNELS.on(data, _IN_DTYPES[data.dtype], in_sf, mode)
        pointers = (data.data_ptr(), out.data_ptr(), sf.data_ptr())
        pointers += (sf_in.data_ptr(),) if sf_in is not None else ()
        clamp = config.get_amax_clamp_for_quant("e4m3", False)
        kernel(index, *pointers, clamp, num_tokens, hidden, data.stride(0), sf.shape[0])
    return out, sf
