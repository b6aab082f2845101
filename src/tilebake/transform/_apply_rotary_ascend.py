"""apply_rotary on NPU tensors: the Ascend 950 kernels where they apply (contiguous query and key,
at most MAX_ASCEND_ROW elements a token's heads). Each token's cache row (positions or its index,
plus seqlen_offset) is gathered by torch on the NPU, with a flag for rows inside the cache (a
token outside stays as it was); the kernel rotates in place with the reference's fp32 arithmetic
(out1 = fma(x1, cos, -(x2 sin)), out2 = fma(x2, cos, x1 sin)). Never run on an NPU here: the
launch is tested against a stand-in libascendcl (tests/ascend/).
"""

from __future__ import annotations

import math

import torch

from tilebake._runtime import ascend
from tilebake.transform.apply_rotary import MAX_ASCEND_ROW, ApplyRotaryAscendVariant
from tilebake.utils import FLOAT_FORMATS

_KERNELS = ascend.AscendKernelTable(ApplyRotaryAscendVariant)


def apply_rotary_npu(query, cos_sin_cache, key, positions, interleaved, conjugate, seqlen_offset) -> bool:
    """Rotate the checked NPU tensors in place; False where the kernels do not apply."""
    rot, lead = query.shape[-1], tuple(query.shape[:-2])
    q_heads, k_heads = query.shape[-2], (key.shape[-2] if key is not None else 0)
    if (
        not query.is_contiguous()
        or (key is not None and not key.is_contiguous())
        or max(q_heads, k_heads) * rot > MAX_ASCEND_ROW
        or cos_sin_cache.shape[0] == 0
    ):
        return False
    tokens = math.prod(lead)
    if tokens == 0:
        return True
    gathered, flags = gather_rows(cos_sin_cache, positions, query, seqlen_offset)
    index, kernel = _KERNELS.on(query, FLOAT_FORMATS[query.dtype], rot)
    k_ptr = key.data_ptr() if key is not None else query.data_ptr()
    kernel(index, query.data_ptr(), k_ptr, gathered.data_ptr(), flags.data_ptr(), tokens, q_heads, k_heads,
           int(interleaved), int(conjugate))  # fmt: skip
    torch.autograd.graph.increment_version(query if key is None else (query, key))
    return True


def gather_rows(cos_sin_cache, positions, query, seqlen_offset):
    """(each token's cache row fp32 (tokens, rot), int32 flags: 1 where that row is inside the
    cache) for query's tokens, the rows as the reference takes them: positions (or the token's
    index within its sequence) + seqlen_offset; a row outside gathers row 0 (flag 0: not used)."""
    lead = tuple(query.shape[:-2])
    if positions is None:  # arange, built on query's device
        positions = query.new_ones(lead[-1], dtype=torch.int64).cumsum(0).sub_(1).expand(lead)
    rows = positions.long() + seqlen_offset
    inside = (rows >= 0) & (rows < cos_sin_cache.shape[0])
    gathered = cos_sin_cache[torch.where(inside, rows, torch.zeros_like(rows))]
    return gathered.reshape(-1, cos_sin_cache.shape[1]).contiguous(), inside.reshape(-1).to(torch.int32)
