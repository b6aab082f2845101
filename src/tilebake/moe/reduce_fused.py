"""reduce_fused (TileKernels 1.0, api.md 1.11): each token's weighted sum of its rows in the
fused layout, optionally scaled and cast to FP8 e4m3.

Validate, allocate, launch. Kernel: kernels_tl/moe/reduce_fused.py; reference and CPU path:
tilebake.torch.mapping.reduce_fused (bit for bit the same arithmetic).
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import torch

from tilebake._runtime import plan
from tilebake._runtime.loader import KernelTable
from tilebake._variants import Variant, i32, ptr
from tilebake.moe._common import check_reduce_args
from tilebake.utils import FORMAT_NAMES


@dataclasses.dataclass(frozen=True)
class ReduceFusedVariant(Variant):
    family = "moe"
    op = "reduce_fused"
    PARAMS = (
        ptr("X", "W", "P", "XSF", "SF", "Y")
        + i32(
            "has_weights", "has_x_sf", "has_sf", "num_tokens", "num_expanded", "num_topk", "hidden", "x_stride",
            "y_stride"
        )
    )  # fmt: skip

    in_dtype: str  # 'bf16' | 'fp32' (the fused rows)
    out_dtype: str  # in_dtype, or 'e4m3' (fp8_format='e4m3')

    @classmethod
    def all(cls):
        return tuple(cls(i, o) for i in ("bf16", "fp32") for o in (i, "e4m3"))


_KERNELS = KernelTable(ReduceFusedVariant)


def reduce_fused(
    x,
    topk_weights: Optional[torch.Tensor],
    token_topk_to_pos: torch.Tensor,
    fp8_format: str = "",
    sf: Optional[torch.Tensor] = None,
    out: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """out[t] = sum over slots j with p = token_topk_to_pos[t, j] >= 0 of x[p] * w[t, j] (* x_sf[p]).

    Args:
        x: bf16 or fp32 (N, H) fused rows (H a multiple of 8 for bf16, 4 for fp32; last dim
            contiguous, row stride a multiple of 16 bytes), or a QuantTensor (data, x_sf) with x_sf
            fp32 (N,), one multiplier per row.
        topk_weights: fp32 (T, k), contiguous, or None (every weight 1).
        token_topk_to_pos: int32 (T, k), contiguous (get_fused_mapping's); a slot whose position is
            -1 (or outside [0, N)) adds nothing.
        fp8_format: '' (output in x's dtype) or 'e4m3'.
        sf: with fp8_format='e4m3' only: fp32 tensor of one element multiplying the sum before the
            cast (e.g. the inverse of a per-tensor scale).
        out: optional preallocated (T, H) output of the output dtype (row stride a multiple of 16
            bytes for bf16/fp32, 8 for e4m3 from bf16, 4 for e4m3 from fp32).

    Returns:
        (T, H). Arithmetic, in fp32 and bit for bit the reference's: acc = 0, then for j = 0..k-1
        acc = fmaf(x[p], s_j, acc) with s_j = w[t, j] * x_sf[p] (one rounding each); acc * sf[0];
        then RNE to bf16 / fp32, or to e4m3 saturating at +-448 (NaN -> 0x7F). A token with no
        valid slot gives zeros. NaN inputs give NaN, but a bf16 NaN's payload may differ from the
        reference's (0x7FFF on the GPU, 0x7FC0 from torch). CPU tensors take the reference path.
    """
    # The native path (moe/_plans_mapping.py); NotImplemented: the Python path below. A
    # QuantTensor's key holds its length (a plan reads two items, the Python path wants two).
    if not torch.compiler.is_compiling():  # dynamo can neither hash the key nor trace the native call
        try:
            data_key = x.dtype if x.__class__ is not tuple else (len(x), x[0].dtype)
            call = _PLANS[data_key, fp8_format, topk_weights is None, sf is None, out is None]
        except (KeyError, AttributeError, TypeError):
            pass
        else:
            result = plan.run(call, x, topk_weights, token_topk_to_pos, sf, out)
            if result is not NotImplemented:
                return result
    data, x_sf, num_topk, out_dtype = check_reduce_args(x, topk_weights, token_topk_to_pos, fp8_format, sf)
    num_tokens, hidden = token_topk_to_pos.shape[0], data.shape[1]
    vec = 16 // data.element_size()
    if hidden % vec:
        raise ValueError(f"x.shape[1] (hidden) must be a multiple of {vec} for {data.dtype}, got {hidden}")
    if hidden > 1 and data.stride(1) != 1:
        raise ValueError(f"x must be contiguous in its last dim, got strides {data.stride()}")
    if data.shape[0] > 1 and data.stride(0) % vec:
        raise ValueError(f"x's row stride must be a multiple of 16 bytes, got strides {data.stride()}")
    if out is not None:
        if not isinstance(out, torch.Tensor) or out.dtype != out_dtype or out.shape != (num_tokens, hidden):
            raise ValueError(
                f"out must be a {out_dtype} tensor of shape {(num_tokens, hidden)}, got "
                f"{getattr(out, 'dtype', type(out).__name__)} {tuple(getattr(out, 'shape', ()))}"
            )
        if out.device != data.device:
            raise ValueError(f"out must be on x's device {data.device}, got {out.device}")
        if hidden > 1 and out.stride(1) != 1:
            raise ValueError(f"out must be contiguous in its last dim, got strides {out.stride()}")
        if num_tokens > 1 and out.stride(0) % vec:
            raise ValueError(f"out's row stride must be a multiple of {vec} elements, got strides {out.stride()}")

    if not data.is_cuda:
        from tilebake.torch.mapping import reduce_fused as reference

        result = reference(x, topk_weights, token_topk_to_pos, fp8_format, sf)
        return result if out is None else out.copy_(result)

    given_out = out is not None
    if out is None:
        out = data.new_empty((num_tokens, hidden), dtype=out_dtype)
    if num_tokens == 0 or hidden == 0:
        return out
    if data.data_ptr() % 16:
        raise ValueError(f"x must start at a 16-byte aligned address, got {data.data_ptr():#x}")
    if out.data_ptr() % (vec * out.element_size()):
        raise ValueError(
            f"out must start at a {vec * out.element_size()}-byte aligned address, got {out.data_ptr():#x}"
        )
    dummy = token_topk_to_pos.data_ptr()  # never read when its flag is 0
    _KERNELS[FORMAT_NAMES[data.dtype], FORMAT_NAMES[out_dtype]](
        data.get_device(),
        data.data_ptr(),
        topk_weights.data_ptr() if topk_weights is not None else dummy,
        token_topk_to_pos.data_ptr(),
        x_sf.data_ptr() if x_sf is not None else dummy,
        sf.data_ptr() if sf is not None else dummy,
        out.data_ptr(),
        int(topk_weights is not None), int(x_sf is not None), int(sf is not None),
        num_tokens, data.shape[0], num_topk, hidden, data.stride(0), out.stride(0),
    )  # fmt: skip
    if given_out:  # a write into a given tensor counts, as for torch's out= ops
        torch.autograd.graph.increment_version(out)
    data_key = data.dtype if x_sf is None else (2, data.dtype)
    plan_key = (data_key, fp8_format, topk_weights is None, sf is None, not given_out)  # the lookup's `out is None`
    if plan_key not in _PLANS:
        from tilebake.moe._plans_mapping import reduce_plan

        plan.remember(
            _PLANS, plan_key,
            reduce_plan, _KERNELS[FORMAT_NAMES[data.dtype], FORMAT_NAMES[out_dtype]], data.get_device(), data.dtype,
            out_dtype, topk_weights is not None, x_sf is not None, sf is not None, given_out,
        )  # fmt: skip
    return out


_PLANS = plan.cache()
