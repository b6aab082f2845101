"""topk_gate on NPU tensors: the Ascend 950 kernel (the same indices as the reference; a row
holding a non-finite score gets -1s, as on CUDA). Never run on an NPU here: the launch is tested
against a stand-in libascendcl (tests/ascend/)."""

from __future__ import annotations

import torch

from tilebake._runtime import ascend
from tilebake.moe.topk_gate import MAX_EXPERTS, TopkGateAscendVariant

_KERNELS = ascend.AscendKernelTable(TopkGateAscendVariant)


def topk_gate_npu(scores: torch.Tensor, num_topk: int) -> torch.Tensor:
    num_tokens, num_experts = scores.shape
    out = scores.new_empty((num_tokens, num_topk), dtype=torch.int64)
    if num_tokens:
        index, kernel = _KERNELS.on(scores, MAX_EXPERTS[-1])
        kernel(index, scores.data_ptr(), out.data_ptr(), num_tokens, num_experts, num_topk, scores.stride(0))
    return out
