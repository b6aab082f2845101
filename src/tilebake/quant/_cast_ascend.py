"""cast with stochastic rounding on NPU tensors: fp32 -> bf16 by the Ascend 950 kernel (the
original's one Ascend pair; the other pairs take the reference on the NPU tensor), the same
random bits and bytes as the CUDA kernel and the CPU reference. Never run on an NPU here: the
launch is tested against a stand-in libascendcl (tests/ascend/).
"""

from __future__ import annotations

import torch

from tilebake._runtime import ascend
from tilebake.quant.cast import CastAscendVariant

_KERNELS = ascend.AscendKernelTable(CastAscendVariant)


def stochastic_cast(x: torch.Tensor) -> torch.Tensor:
    """bf16 of the contiguous fp32 NPU tensor x (numel % 4 == 0, < 2^31: checked by the caller)."""
    out = x.new_empty(x.shape, dtype=torch.bfloat16)
    if x.numel():
        index, kernel = _KERNELS.on(x, "fp32", "bf16")
        kernel(index, x.data_ptr(), out.data_ptr(), x.numel() // 4)
    return out
