"""normalize_weight on NPU tensors: the Ascend 950 kernel (a SIMT thread per token, the
reference's summation order: the same bytes). Never run on an NPU here: the launch is tested
against a stand-in libascendcl (tests/ascend/)."""

from __future__ import annotations

import torch

from tilebake._runtime import ascend
from tilebake.moe.normalize_weight import NormalizeWeightAscendVariant

_KERNELS = ascend.AscendKernelTable(NormalizeWeightAscendVariant)


def normalize_weight_npu(topk_weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    num_tokens, num_topk = topk_weights.shape
    denominator = topk_weights.new_empty((num_tokens,))
    normalized = topk_weights.new_empty((num_tokens, num_topk))
    if num_tokens:
        index, kernel = _KERNELS.on(topk_weights, "fp32")
        pointers = (topk_weights.data_ptr(), denominator.data_ptr(), normalized.data_ptr())
        kernel(index, *pointers, num_tokens, num_topk, topk_weights.stride(0))
    return denominator, normalized
