"""swiglu_backward and swiglu_backward_and_per_token_cast on NPU tensors: the Ascend 950 kernels.
The row factors e = where(valid row, w * s, 0) are computed by torch on the NPU exactly as the
reference computes them (tilebake.torch.swiglu), so the kernels need no psum search; the kernels
write x_grad (and its e4m3 copy in (1, 32) groups: fp32, power-of-two fp32 or UE8M0 two to an
int16), act_out when asked, and each row's fp32 sum of g * act, which torch scales by s and
masks to the valid rows (the reference sums in fp64: a tolerance, as on CUDA). Never run on an
NPU here: the launches are tested against a stand-in libascendcl (tests/ascend/).
"""

from __future__ import annotations

import math

import torch

from tilebake import config
from tilebake._runtime import ascend
from tilebake.quant._common import FLOAT_DTYPES, alloc_ascend_sf
from tilebake.quant.swiglu_backward import SwigluBackwardAscendVariant
from tilebake.torch.swiglu import _valid_rows

_KERNELS = ascend.AscendKernelTable(SwigluBackwardAscendVariant)
_DTYPES = {torch.bfloat16: "bf16", torch.float32: "fp32", torch.float8_e4m3fn: "e4m3"}
_GROUP = 32


def swiglu_backward(x, x_sf, g, fmt, psum, topk_weights, scale, clamp, do_recompute, sf_mode="none"):
    """(x_grad, (x_grad_fp8, sf) or None, weight_grad or None, act_out or None) of checked NPU
    tensors: x (E, 2H) (e4m3 with x_sf fp32 (E, 2H / 32) for the cast), g (E, H)."""
    num_tokens, hidden = x.shape[0], x.shape[1] // 2
    cast = sf_mode != "none"
    x_grad = g.new_empty((num_tokens, 2 * hidden), dtype=FLOAT_DTYPES[fmt])
    act = g.new_empty((num_tokens, hidden)) if do_recompute else None
    quantized = None
    if cast:
        sf = alloc_ascend_sf(g, num_tokens, 2 * hidden // _GROUP, sf_mode == "ue8m0")
        quantized = (g.new_empty((num_tokens, 2 * hidden), dtype=torch.float8_e4m3fn), sf)
    e = row_sums = valid = None
    if topk_weights is not None:  # tilebake.torch.swiglu's e = w * s (s rounded to fp32), 0 on padding rows
        e = topk_weights if scale is None else topk_weights * torch.full_like(topk_weights, scale)
        if psum is not None:
            valid = _valid_rows(num_tokens, psum, config.get_token_alignment(), g.device)
            e = torch.where(valid, e, torch.zeros_like(e))
        e = e.contiguous()
        row_sums = g.new_empty((num_tokens,), dtype=torch.float32)
    if num_tokens:
        index, kernel = _KERNELS.on(g, _DTYPES[x.dtype], _DTYPES[g.dtype], fmt, sf_mode)
        unused = x.data_ptr()  # (never read or written: the flags say so)
        pointers = [x.data_ptr(), g.data_ptr(), x_grad.data_ptr()]
        pointers += [t.data_ptr() if t is not None else unused for t in (e, act, row_sums)]
        if cast:
            x_sf = x_sf.contiguous()  # (held until the launch)
            pointers += [x_sf.data_ptr(), quantized[0].data_ptr(), quantized[1].data_ptr()]
        flags = (num_tokens, hidden, int(e is not None), int(clamp is not None), int(act is not None))
        scalars = (math.inf if clamp is None else clamp,)
        scalars += (config.get_amax_clamp_for_quant("e4m3", False),) if cast else ()
        kernel(index, *pointers, *flags, *scalars)
    weight_grad = None
    if topk_weights is not None:
        weight_grad = row_sums if scale is None else row_sums * torch.full_like(row_sums, scale)
        if valid is not None:
            weight_grad = torch.where(valid, weight_grad, torch.zeros_like(weight_grad))
    return x_grad, quantized, weight_grad, act
