"""norm_backward on NPU tensors: the Ascend 950 kernels where they apply (contiguous out_grad, x,
weight and residual_out_grad, hidden a multiple of 128 up to 8192), else None: the caller takes
the reference path. The kernel writes x_grad and one row of fp32 weight-gradient partial sums a
vector core; torch sums them (on the NPU, as the original's Ascend path reduces) and applies
out_scale as the reference does. Results match the reference within its tolerance (sums in
another order). Never run on an NPU here: the launches are tested against a stand-in libascendcl
(tests/ascend/).
"""

from __future__ import annotations

import torch

from tilebake._runtime import ascend
from tilebake.quant.norm_backward import NormBackwardAscendVariant
from tilebake.quant.norm_forward import MAX_HIDDEN

_KERNELS = ascend.AscendKernelTable(NormBackwardAscendVariant)
_IN_DTYPES = {torch.bfloat16: "bf16", torch.float32: "fp32"}


def norm_backward(out_grad, x, weight, rstd, residual_out_grad, out_scale):
    """(x_grad, fp32 weight gradient or None) of the checked NPU tensors, or None."""
    num_tokens, hidden = x.shape
    tensors = [t for t in (out_grad, x, weight, rstd, residual_out_grad) if t is not None]
    if hidden % 128 or hidden > MAX_HIDDEN or not all(t.is_contiguous() for t in tensors):
        return None
    index = ascend.device_index(x)
    cores = ascend.vector_cores(index)
    x_grad = torch.empty_like(x)
    partials = x.new_zeros((cores, hidden), dtype=torch.float32) if weight is not None else None
    kernel = _KERNELS[_IN_DTYPES[x.dtype], weight is not None, residual_out_grad is not None, cores]
    pointers = (out_grad.data_ptr(), x.data_ptr(), rstd.data_ptr(), x_grad.data_ptr())
    pointers += (weight.data_ptr(), partials.data_ptr()) if weight is not None else ()
    pointers += (residual_out_grad.data_ptr(),) if residual_out_grad is not None else ()
    kernel(index, *pointers, out_scale, num_tokens, hidden)
    if weight is None:
        return x_grad, None
    dw = partials.sum(0)
    return x_grad, dw * torch.full_like(dw, out_scale)
