"""norm_forward and norm_forward_and_per_token_cast on NPU tensors: the Ascend 950 kernels where
they apply (contiguous x, residual and weight, hidden a multiple of 128 up to 8192, the outputs
allocated here; the cast e4m3 in (1, 32) groups), else None: the caller takes the reference path.
norm_forward_and_per_token_cast is one kernel: norm_forward's arithmetic, then per_token_cast's on
its output rounded to x's dtype (the bytes of per_token_cast of norm_forward, as the op promises).
norm_forward's results match the reference within its tolerance (the row's sum of squares is
accumulated in another order). Never run on an NPU here: the launches are tested against a
stand-in libascendcl (tests/ascend/).
"""

from __future__ import annotations

import torch

from tilebake import config
from tilebake._runtime import ascend
from tilebake.quant._common import alloc_ascend_sf, ascend_sf_mode
from tilebake.quant.norm_forward import MAX_HIDDEN, NormForwardAscendVariant
from tilebake.quant.norm_forward_and_per_token_cast import NormForwardCastAscendVariant

_KERNELS = ascend.AscendKernelTable(NormForwardAscendVariant)
_CAST_KERNELS = ascend.AscendKernelTable(NormForwardCastAscendVariant)
_IN_DTYPES = {torch.bfloat16: "bf16", torch.float32: "fp32"}


def _kernels_apply(x, weight, residual) -> bool:
    """The rows the Ascend norm kernels read: contiguous, hidden a multiple of 128 up to MAX_HIDDEN."""
    hidden = x.shape[-1]
    tensors = [t for t in (x, weight, residual) if t is not None]
    return not hidden % 128 and hidden <= MAX_HIDDEN and all(t.is_contiguous() for t in tensors)


def norm_forward(x, weight, eps, residual, out_scale, with_rstd):
    """(out, rstd or None, norm_input) of the checked NPU tensor x, or None."""
    if not _kernels_apply(x, weight, residual):
        return None
    hidden = x.shape[-1]
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
    """((data, sf), out_bf16 or None, rstd or None, norm_input) of the checked NPU tensor x by the
    fused kernel, the SF per (batch) matrix row-major: fp32, power-of-two fp32 or UE8M0 bytes two
    to an int16; or None where it does not apply."""
    if not _kernels_apply(x, weight, residual):
        return None
    hidden = x.shape[-1]
    rows, groups = x.numel() // hidden, hidden // 32
    data = torch.empty_like(x, dtype=torch.float8_e4m3fn)
    sf = alloc_ascend_sf(x, rows, groups, packed)
    out_bf16 = torch.empty_like(x, dtype=torch.bfloat16) if with_out_bf16 else None
    norm_input = torch.empty_like(x) if residual is not None else x
    rstd = x.new_empty(x.shape[:-1], dtype=torch.float32) if with_rstd else None
    if rows:
        mode = ascend_sf_mode(round_sf, packed)
        index, kernel = _CAST_KERNELS.on(x, _IN_DTYPES[x.dtype], residual is not None, mode)
        absent = x.data_ptr()  # the address of an output or input the flags leave alone
        pointers = [t.data_ptr() if t is not None else absent for t in (x, data, sf, out_bf16, rstd, weight)]
        pointers += (residual.data_ptr(), norm_input.data_ptr()) if residual is not None else ()
        clamp = config.get_amax_clamp_for_quant("e4m3", False)
        flags = (weight is not None, with_rstd, with_out_bf16)
        kernel(index, *pointers, eps, out_scale, clamp, rows, hidden, *map(int, flags))
    sf = sf.view(*x.shape[:-1], sf.shape[-1])
    return (data, sf), out_bf16, rstd, norm_input
