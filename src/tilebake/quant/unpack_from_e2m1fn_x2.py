"""unpack_from_e2m1fn_x2: packed FP4 e2m1 bytes [..., K] -> values [..., 2K].

fp32 and bf16 outputs of a contiguous, 16-byte aligned CUDA tensor launch
kernels_tl/quant/unpack_from_e2m1fn_x2.py (one launch: the original's pure-torch decode takes a
dozen); every other call (CPU tensors, other float dtypes, strided or misaligned inputs) takes
the reference, tilebake.torch.unpack_from_e2m1fn_x2, which gives the same values.
"""

from __future__ import annotations

import dataclasses

import torch

from tilebake._checks import check_device
from tilebake._library import register
from tilebake._runtime import plan
from tilebake._runtime.loader import KernelTable
from tilebake._variants import Variant, i32, ptr
from tilebake.torch.cast import unpack_from_e2m1fn_x2 as reference


@dataclasses.dataclass(frozen=True)
class UnpackE2m1Variant(Variant):
    family = "quant"
    op = "unpack_from_e2m1fn_x2"
    PARAMS = ptr("X", "Y") + i32("num_bytes")

    out_dtype: str  # 'fp32' | 'bf16'

    @classmethod
    def all(cls):
        return (cls("fp32"), cls("bf16"))


_OUT_DTYPES = {torch.float32: "fp32", torch.bfloat16: "bf16"}
MAX_BYTES = 2**30  # the kernel's int32 output index: 2 x bytes < 2^31
_KERNELS = KernelTable(UnpackE2m1Variant)
_PLANS = plan.cache()  # by (x.dtype, out_dtype, x.ndim): a plan takes one rank


def unpack_from_e2m1fn_x2(x: torch.Tensor, out_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Decode packed e2m1 ``[..., K]`` int8/uint8 -> ``[..., 2K]`` values of ``out_dtype`` (any
    floating dtype; fp32 and bf16 by one kernel on CUDA). The low nibble of each byte is the even
    element, the high nibble the odd one."""
    if not torch.compiler.is_compiling():  # dynamo can neither hash the key nor trace the native call
        try:
            call = _PLANS[x.dtype, out_dtype, x.ndim]
        except (KeyError, AttributeError, TypeError):
            pass
        else:
            result = plan.run(call, x)
            if result is not NotImplemented:
                return result
    if not isinstance(x, torch.Tensor) or x.dtype not in (torch.int8, torch.uint8) or x.dim() == 0:
        return reference(x, out_dtype)  # raises the argument's error
    if not isinstance(out_dtype, torch.dtype) or not out_dtype.is_floating_point:
        return reference(x, out_dtype)
    check_device(x, "x")
    if torch.compiler.is_compiling():
        return torch.ops.tilebake.unpack_from_e2m1fn_x2(x, out_dtype)
    name = _OUT_DTYPES.get(out_dtype)
    numel = x.numel()
    if not x.is_cuda or name is None or not x.is_contiguous() or x.data_ptr() % 16 or numel >= MAX_BYTES:
        return reference(x, out_dtype)
    out = torch.empty((*x.shape[:-1], 2 * x.shape[-1]), dtype=out_dtype, device=x.device)
    if numel == 0:
        return out
    _KERNELS[name,](x.get_device(), x.data_ptr(), out.data_ptr(), numel)
    if x.ndim <= 6:  # the plans' rank limit
        plan.remember(_PLANS, (x.dtype, out_dtype, x.ndim), _plan, _KERNELS[name,], x.get_device(), x.dtype,
                      out_dtype, x.ndim)  # fmt: skip
    return out


def _plan(kernel, device, dtype, out_dtype, ndim):
    """run(x): x contiguous (the standard strides) of rank ndim, 16-byte aligned, 1 <= numel < MAX_BYTES."""
    b = plan.Builder()
    sizes = [f"n{d}" for d in range(ndim)]
    strides = [" * ".join(sizes[d + 1 :]) or 1 for d in range(ndim)]
    x = b.tensor(0, dtype, sizes, strides=strides, align=16)
    b.let("N", " * ".join(sizes))
    b.check(f"N >= 1 and N < {MAX_BYTES}")
    y = b.alloc(out_dtype, [*sizes[:-1], f"2 * {sizes[-1]}"])
    b.launch(kernel, device, X=x, Y=y, num_bytes="N")
    b.returns(y)
    return b.build()


# --- torch.library: lets torch.compile(fullgraph=True) trace the call as one op ---

register(
    "unpack_from_e2m1fn_x2(Tensor x, ScalarType out_dtype) -> Tensor",
    lambda x, out_dtype: unpack_from_e2m1fn_x2(x, out_dtype),
    lambda x, out_dtype: torch.empty((*x.shape[:-1], 2 * x.shape[-1]), dtype=out_dtype, device=x.device),
)
