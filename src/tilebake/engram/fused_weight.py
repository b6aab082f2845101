"""fused_weight: the gate's fused RMSNorm weight, weight_hidden * weight_embed in fp32.

Validate, allocate, launch (kernels_tl/engram/fused_weight.py); CPU tensors take the reference
(tilebake.torch.engram.fused_weight_ref), with the same bits (a product of two bf16 is exact).
"""

from __future__ import annotations

import dataclasses

import torch

from tilebake._library import register
from tilebake._runtime import plan
from tilebake._runtime.loader import KernelTable
from tilebake._variants import ASCEND_VEC_CORES, Variant, i32, ptr
from tilebake.engram._common import check_weight_pair, dense


@dataclasses.dataclass(frozen=True)
class FusedWeightVariant(Variant):
    family = "engram"
    op = "fused_weight"
    PARAMS = ptr("WH", "WE", "W") + i32("numel")

    in_dtype: str  # 'bf16'

    @classmethod
    def all(cls):
        return (cls("bf16"),)


@dataclasses.dataclass(frozen=True)
class FusedWeightAscendVariant(Variant):
    """The Ascend 950 kernel (kernels_tl/ascend/engram/fused_weight.py)."""

    family = "engram"
    op = "fused_weight"
    backend = "ascend"
    PARAMS = FusedWeightVariant.PARAMS

    num_vec_cores: int

    @classmethod
    def all(cls):
        return tuple(cls(cores) for cores in ASCEND_VEC_CORES)


_KERNELS = KernelTable(FusedWeightVariant)
_PLANS = plan.cache()


def fused_weight(weight_hidden: torch.Tensor, weight_embed: torch.Tensor) -> torch.Tensor:
    """weight_hidden * weight_embed: two (hc, H) bf16 tensors -> (hc, H) fp32 (contiguous)."""
    if not torch.compiler.is_compiling():  # dynamo can neither hash the key nor trace the native call
        try:
            call = _PLANS[weight_hidden.dtype, weight_embed.dtype]
        except (KeyError, AttributeError, TypeError):
            pass
        else:
            result = plan.run(call, weight_hidden, weight_embed)
            if result is not NotImplemented:
                return result
    check_weight_pair(weight_hidden, weight_embed)
    if torch.compiler.is_compiling():
        return torch.ops.tilebake.fused_weight(weight_hidden, weight_embed)
    if weight_hidden.device.type == "npu":  # the Ascend kernel
        from tilebake.engram._engram_ascend import fused_weight_npu

        return fused_weight_npu(weight_hidden, weight_embed)
    if not weight_hidden.is_cuda:
        from tilebake.torch.engram import fused_weight_ref

        return fused_weight_ref(weight_hidden, weight_embed)
    weight_hidden, weight_embed = dense(weight_hidden), dense(weight_embed)
    out = torch.empty(weight_hidden.shape, dtype=torch.float32, device=weight_hidden.device)
    _KERNELS["bf16",](weight_hidden.get_device(), weight_hidden.data_ptr(), weight_embed.data_ptr(), out.data_ptr(),
                      out.numel())  # fmt: skip
    plan.remember(_PLANS, (weight_hidden.dtype, weight_embed.dtype), _plan, _KERNELS["bf16",],
                  weight_hidden.get_device())  # fmt: skip
    return out


def _plan(kernel, device):
    """run(weight_hidden, weight_embed): both (hc, H) bf16, contiguous, 16-byte aligned."""
    b = plan.Builder()
    wh = b.tensor(0, torch.bfloat16, ("hc", "H"), strides=("H", 1))
    we = b.tensor(1, torch.bfloat16, ("hc", "H"), strides=("H", 1))
    b.check("hc >= 1 and H >= 1 and hc * H < 2147483648")
    out = b.alloc(torch.float32, ("hc", "H"))
    b.launch(kernel, device, WH=wh, WE=we, W=out, numel="hc * H")
    b.returns(out)
    return b.build()


register(
    "fused_weight(Tensor weight_hidden, Tensor weight_embed) -> Tensor",
    lambda wh, we: fused_weight(wh, we),
    lambda wh, we: torch.empty(wh.shape, dtype=torch.float32, device=wh.device),
)
