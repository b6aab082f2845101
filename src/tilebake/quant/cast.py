"""cast: element-wise dtype cast of a contiguous tensor, round-to-nearest-even or stochastic.

Round-to-nearest pairs among fp32 / bf16 / e4m3 use torch's own `.to` (a kernel would bring
nothing). Stochastic rounding (SR) pairs fp32 -> bf16, fp32 -> e4m3, bf16 -> e4m3 launch
kernels_tl/quant/cast.py; the reference (and the CPU path) is tilebake.torch.stochastic_cast.
SR is deterministic: 16 random bits per element from one hash per pair of consecutive inputs (their
bits and the pair's flat index), see tilebake.torch.stochastic.
"""

from __future__ import annotations

import dataclasses

import torch

from tilebake._checks import check_device
from tilebake._library import register
from tilebake._runtime import plan
from tilebake._runtime.loader import KernelTable
from tilebake._variants import ASCEND_VEC_CORES, Variant, i32, ptr
from tilebake.quant import _cast_plans as plans
from tilebake.quant._common import check_aligned
from tilebake.utils import FORMAT_NAMES


@dataclasses.dataclass(frozen=True)
class CastVariant(Variant):
    family = "quant"
    op = "cast"
    PARAMS = ptr("X", "Y") + i32("num_groups")

    in_dtype: str  # 'fp32' | 'bf16'
    out_dtype: str  # 'bf16' | 'e4m3'

    @classmethod
    def all(cls):
        return tuple(cls(*key) for key in (("fp32", "bf16"), ("fp32", "e4m3"), ("bf16", "e4m3")))


@dataclasses.dataclass(frozen=True)
class CastAscendVariant(Variant):
    """The Ascend 950 kernel (kernels_tl/ascend/quant/cast.py): fp32 -> bf16 with stochastic
    rounding, the one pair the original's Ascend cast takes; the same random bits as CUDA's."""

    family = "quant"
    op = "cast"
    backend = "ascend"
    PARAMS = ptr("X", "Y") + i32("num_groups")

    in_dtype: str  # 'fp32'
    out_dtype: str  # 'bf16'
    num_vec_cores: int

    @classmethod
    def all(cls):
        return tuple(cls("fp32", "bf16", cores) for cores in ASCEND_VEC_CORES)


_SR_PAIRS = {("fp32", "bf16"), ("fp32", "e4m3"), ("bf16", "e4m3")}
_KERNELS = KernelTable(CastVariant)
_PLANS = plan.cache()  # the stochastic-rounding calls, by the fast path's key (x.ndim: a plan takes one rank)


def cast(x: torch.Tensor, dtype: torch.dtype, stochastic_rounding: bool = False) -> torch.Tensor:
    """Cast the contiguous tensor `x` (any shape) to `dtype`.

    Args:
        x: fp32, bf16 or float8_e4m3fn, contiguous.
        dtype: torch.float32, torch.bfloat16 or torch.float8_e4m3fn.
        stochastic_rounding: round to one of the two neighbours, up with probability equal to
            the distance from the lower one over the gap (unbiased); only fp32 -> bf16,
            fp32 -> e4m3 and bf16 -> e4m3, with x.numel() % 4 == 0. Deterministic: equal
            inputs give equal outputs. To e4m3, |x| >= 448 and inf saturate to +-448 and NaN
            stays NaN; to bf16, NaN stays NaN and values past the largest finite bf16 may round
            to inf. Without it the cast is torch's .to (to e4m3 above 448: what torch gives on
            that device: +-448 with torch 2.13 on the CPU, not 448 with torch 2.11 on the H200).
    """
    # The native path (see per_token_cast): a call whose key has been seen runs as one plan.
    if not torch.compiler.is_compiling():  # dynamo can neither hash the key nor trace the native call
        try:
            call = _PLANS[x.dtype, dtype, stochastic_rounding is True, x.ndim]
        except (KeyError, AttributeError, TypeError):
            pass
        else:
            result = plan.run(call, x)
            if result is not NotImplemented:
                return result
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    src = FORMAT_NAMES.get(x.dtype)
    if src is None:
        raise TypeError(f"x must be float32, bfloat16 or float8_e4m3fn, got {x.dtype}")
    dst = FORMAT_NAMES.get(dtype)
    if dst is None:
        raise TypeError(f"dtype must be torch.float32, torch.bfloat16 or torch.float8_e4m3fn, got {dtype!r}")
    if not isinstance(stochastic_rounding, bool):
        raise TypeError(f"stochastic_rounding must be a bool, got {stochastic_rounding!r}")
    if not x.is_contiguous():
        raise ValueError(f"x must be contiguous, got shape {tuple(x.shape)} with strides {x.stride()}")
    check_device(x, "x")
    if not stochastic_rounding:
        return x.to(dtype)
    if (src, dst) not in _SR_PAIRS:
        raise ValueError(
            f"stochastic_rounding=True supports fp32->bf16, fp32->e4m3 and bf16->e4m3 (x, dtype), got {src}->{dst}"
        )
    numel = x.numel()
    if numel % 4:
        raise ValueError(f"stochastic_rounding=True needs x.numel() % 4 == 0, got numel {numel}")
    if numel >= 2**31:
        raise ValueError(f"stochastic_rounding=True needs x.numel() < 2^31 (a 32-bit element index), got {numel}")
    if torch.compiler.is_compiling():
        return torch.ops.tilebake.stochastic_cast(x, dtype)
    if x.device.type == "npu" and (src, dst) == ("fp32", "bf16"):  # the Ascend kernel
        from tilebake.quant import _cast_ascend

        return _cast_ascend.stochastic_cast(x)
    if not x.is_cuda:  # the slow path
        from tilebake.torch import stochastic_cast

        return stochastic_cast(x, dtype)
    out = torch.empty(x.shape, dtype=dtype, device=x.device)
    if numel == 0:
        return out
    x_ptr = x.data_ptr()
    if x_ptr % 16:
        check_aligned(x_ptr, "x")
    _KERNELS[src, dst](x.get_device(), x_ptr, out.data_ptr(), numel // 4)
    if 1 <= x.ndim <= 6:  # the plans' rank limit
        plan.remember(
            _PLANS, (x.dtype, dtype, True, x.ndim), plans.stochastic_cast_plan, _KERNELS[src, dst], x.get_device(),
            x.dtype, dtype, x.ndim,
        )  # fmt: skip
    return out


# --- torch.library: lets torch.compile(fullgraph=True) trace the SR path; eager calls skip it ---

register(
    "stochastic_cast(Tensor x, ScalarType dtype) -> Tensor",
    lambda x, dtype: cast(x, dtype, True),
    lambda x, dtype: torch.empty(x.shape, dtype=dtype, device=x.device),
)
