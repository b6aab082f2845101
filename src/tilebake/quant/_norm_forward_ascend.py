"""norm_forward and norm_forward_and_per_token_cast on NPU tensors: the Ascend 950 kernels where
they apply (contiguous x, residual and weight, hidden a multiple of 128 up to 8192, the outputs
allocated here; the cast e4m3 in (1, 32) groups), else None: the caller takes the reference path.
The cast is per_token_cast's Ascend kernel run on norm_forward's output (two launches, no fused
kernel yet): by definition the bytes of per_token_cast of norm_forward, as the op promises.
norm_forward's results match the reference within its tolerance (the row's sum of squares is
accumulated in another order). Never run on an NPU here: the launches are tested against a
stand-in libascendcl (tests/ascend/).
"""

from __future__ import annotations

import torch

from tilebake._runtime import ascend
from tilebake.quant import _per_token_cast_ascend
from tilebake.quant.norm_forward import MAX_HIDDEN, NormForwardAscendVariant

_KERNELS = ascend.AscendKernelTable(NormForwardAscendVariant)
_IN_DTYPES = {torch.bfloat16: "bf16", torch.float32: "fp32"}


def norm_forward(x, weight, eps, residual, out_scale, with_rstd):
    """(out, rstd or None, norm_input) of the checked NPU tensor x, or None."""
    hidden = x.shape[-1]
    tensors = [t for t in (x, weight, residual) if t is not None]
    if hidden % 128 or hidden > MAX_HIDDEN or not all(t.is_contiguous() for t in tensors):
        return None
    out = torch.empty_like(x)
    norm_input = torch.empty_like(x) if residual is not None else x
    rstd = x.new_empty(x.shape[:-1], dtype=torch.float32) if with_rstd else None
    rows = x.numel() // hidden
    if rows:
        index, kernel = _KERNELS.on(x, _IN_DTYPES[x.dtype], weight is not None, residual is not None)
        pointers = (x.data_ptr(), out.data_ptr(), (rstd if with_rstd else x).data_ptr())
        pointers += (weight.data_ptr(),) if weight is not None else ()
        pointers += (residual.data_ptr(), norm_input.data_ptr()) if residual is not None else ()
        kernel(index, *pointers, eps, out_scale, rows, hidden, int(with_rstd))
    return out, rstd, norm_input


def norm_forward_and_per_token_cast(x, weight, eps, residual, out_scale, round_sf, packed, with_out_bf16, with_rstd):
    """((data, sf), out_bf16 or None, rstd or None, norm_input) of the checked NPU tensor x, the SF
    per (batch) matrix row-major: fp32, power-of-two fp32 or UE8M0 two to an int16; or None."""
    result = norm_forward(x, weight, eps, residual, out_scale, with_rstd)
    if result is None:
        return None
    y, rstd, norm_input = result
    hidden = x.shape[-1]
    data, sf = _per_token_cast_ascend.per_token_cast(y.view(-1, hidden), 32, round_sf, packed, False, None, None)
    data, sf = data.view(x.shape), sf.view(*x.shape[:-1], sf.shape[-1])
    out_bf16 = (y if y.dtype == torch.bfloat16 else y.to(torch.bfloat16)) if with_out_bf16 else None
    return (data, sf), out_bf16, rstd, norm_input
