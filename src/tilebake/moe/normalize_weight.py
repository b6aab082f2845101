"""normalize_weight: per-token routing-weight normalisation.

Validate, allocate, launch. The kernel is kernels_tl/moe/normalize_weight.py (a thread per
token); the reference (and the CPU path) is tilebake.torch.normalize_weight, whose summation
order the kernel repeats, so both give the same bytes.
"""

from __future__ import annotations

import dataclasses

import torch

from tilebake._library import register
from tilebake._runtime import plan
from tilebake._runtime.loader import KernelTable
from tilebake._variants import ASCEND_VEC_CORES, Variant, i32, ptr
from tilebake.moe.topk_gate import MAX_TOPK, check_fp32_rows


@dataclasses.dataclass(frozen=True)
class NormalizeWeightVariant(Variant):
    family = "moe"
    op = "normalize_weight"
    PARAMS = ptr("W", "D", "N") + i32("num_tokens", "num_topk", "w_stride")

    dtype: str  # 'fp32' (the only one: a field so the id names it)

    @classmethod
    def all(cls):
        return (cls("fp32"),)


@dataclasses.dataclass(frozen=True)
class NormalizeWeightAscendVariant(Variant):
    """The Ascend 950 kernel (kernels_tl/ascend/moe/normalize_weight.py): a SIMT thread per token,
    the reference's summation order (the same bytes)."""

    family = "moe"
    op = "normalize_weight"
    backend = "ascend"
    PARAMS = ptr("W", "D", "N") + i32("num_tokens", "num_topk", "w_stride")

    dtype: str  # 'fp32'
    num_vec_cores: int

    @classmethod
    def all(cls):
        return tuple(cls("fp32", cores) for cores in ASCEND_VEC_CORES)


_KERNELS = KernelTable(NormalizeWeightVariant)


def normalize_weight(topk_weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Normalise each token's routing weights by their sum.

    Args:
        topk_weights: fp32 (num_tokens, num_topk), 1 <= num_topk <= 32; last dim contiguous,
            any row stride.

    Returns:
        (denominator fp32 (num_tokens,), normalized fp32 (num_tokens, num_topk) contiguous):
        denominator = 1e-20 + w[0] + ... + w[k-1] added left to right in fp32 (the 1e-20 keeps
        a row of zeros finite, as in moe_topk_gate_forward); normalized = w / denominator.
        Bit-identical to tilebake.torch.normalize_weight, which CPU tensors run.
    """
    if not torch.compiler.is_compiling():  # dynamo can neither hash the key nor trace the native call
        try:  # the native path (moe/_plans_gate.py); NotImplemented: the Python path below
            call = _PLANS[topk_weights.dtype]
        except (KeyError, AttributeError, TypeError):
            pass
        else:
            result = plan.run(call, topk_weights)
            if result is not NotImplemented:
                return result
    num_tokens, num_topk = check_fp32_rows(topk_weights, "topk_weights", "num_topk", MAX_TOPK)
    if torch.compiler.is_compiling():
        return torch.ops.tilebake.normalize_weight(topk_weights)
    return _normalize_weight(topk_weights)


def _normalize_weight(topk_weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    if topk_weights.device.type == "npu":  # the Ascend kernel
        from tilebake.moe._normalize_weight_ascend import normalize_weight_npu

        return normalize_weight_npu(topk_weights)
    if not topk_weights.is_cuda:
        from tilebake.torch.moe import normalize_weight as reference

        denominator, normalized = reference(topk_weights)
        return denominator, normalized.contiguous()
    num_tokens, num_topk = topk_weights.shape
    denominator = topk_weights.new_empty((num_tokens,))
    normalized = topk_weights.new_empty((num_tokens, num_topk))
    if num_tokens == 0:
        return denominator, normalized
    _KERNELS[("fp32",)](
        topk_weights.get_device(),
        topk_weights.data_ptr(), denominator.data_ptr(), normalized.data_ptr(),
        num_tokens, num_topk, topk_weights.stride(0),
    )  # fmt: skip
    if topk_weights.dtype not in _PLANS:
        from tilebake.moe._plans_gate import normalize_weight_plan

        kernel = _KERNELS[("fp32",)]
        plan.remember(_PLANS, topk_weights.dtype, normalize_weight_plan, kernel, topk_weights.get_device())
    return denominator, normalized


_PLANS = plan.cache()


# --- torch.library: lets torch.compile(fullgraph=True) trace normalize_weight; eager calls skip it ---


def _meta(topk_weights):
    num_tokens, num_topk = topk_weights.shape
    return topk_weights.new_empty((num_tokens,)), topk_weights.new_empty((num_tokens, num_topk))


register(
    "normalize_weight(Tensor topk_weights) -> (Tensor, Tensor)",
    _normalize_weight,
    _meta,
)
