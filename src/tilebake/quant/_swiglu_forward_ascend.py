"""swiglu_forward and swiglu_forward_and_per_token_cast on NPU tensors: the Ascend 950 kernels
(out = l / (1 + exp(-l)) * r [* (w * s)], then bf16 / fp32 or a (1, 32) e4m3 cast whose SF is
fp32, power-of-two fp32 or UE8M0 bytes two to an int16: (E, H / 64)). Calls with clamp statistics
(clamped_count) take the reference path. Never run on an NPU here: the launches are tested
against a stand-in libascendcl (tests/ascend/).
"""

from __future__ import annotations

import math

import torch

from tilebake import config
from tilebake._runtime import ascend
from tilebake.quant._common import FLOAT_DTYPES, alloc_ascend_sf
from tilebake.quant.swiglu_forward import SwigluForwardAscendVariant

_KERNELS = ascend.AscendKernelTable(SwigluForwardAscendVariant)
_IN_DTYPES = {torch.bfloat16: "bf16", torch.float32: "fp32"}
_GROUP = 32


def swiglu_forward(x, fmt, topk_weights, scale, clamp, sf_mode="none"):
    """(y, sf): y (E, H) in fmt ('bf16' | 'fp32' | 'e4m3'), sf the e4m3 cast's (None otherwise)."""
    num_tokens, hidden = x.shape[0], x.shape[1] // 2
    cast = fmt == "e4m3"
    y = x.new_empty((num_tokens, hidden), dtype=torch.float8_e4m3fn if cast else FLOAT_DTYPES[fmt])
    sf = None
    if cast:  # hidden % 64 == 0 (checked): whole groups, an even count of them
        sf = alloc_ascend_sf(x, num_tokens, hidden // _GROUP, sf_mode == "ue8m0")
    if num_tokens:
        index, kernel = _KERNELS.on(x, _IN_DTYPES[x.dtype], fmt, sf_mode)
        w = topk_weights if topk_weights is not None else x
        pointers = (x.data_ptr(), y.data_ptr(), w.data_ptr()) + ((sf.data_ptr(),) if cast else ())
        flags = (num_tokens, hidden, x.stride(0), int(topk_weights is not None), int(clamp is not None))
        scalars = (1.0 if scale is None else scale, math.inf if clamp is None else clamp)
        scalars += (config.get_amax_clamp_for_quant("e4m3", False),) if cast else ()
        kernel(index, *pointers, *flags, *scalars)
    return y, sf
