"""batched_transpose_weight_sf on NPU tensors: the Ascend 950 kernels where they apply (the
original's Ascend case: block size 32, UE8M0 bytes packed two to an int16; here the scales
contiguous, outs not given), else None: the caller takes the reference path. Layouts (int16, two
scales a word, the even one in the low byte, a missing odd one 0): sf0 (G?, n, ceil(kb / 2)),
the transposed view of a (G?, ceil(kb / 2), n) buffer; sf1 the (G?, ceil(nb / 2), k) buffer, or
its transposed (G?, k, ceil(nb / 2)) view without transpose_sf1. Each kernel writes one flag a
vector core (1: it met a scale that is not a positive normal power of two, its bytes 0xFF); they
are read back (one device-to-host copy) and a bad scale raises check_power_of_two_scales's
ValueError. Never run on an NPU here: the launches are tested against a stand-in libascendcl
(tests/ascend/).
"""

from __future__ import annotations

import torch

from tilebake._runtime import ascend
from tilebake.quant.batched_transpose_weight_sf import BatchedTransposeWeightSfAscendVariant
from tilebake.torch.weight_sf import check_power_of_two_scales
from tilebake.utils import ceil_div

_KERNELS = ascend.AscendKernelTable(BatchedTransposeWeightSfAscendVariant)
_BLOCK = 32


def batched_transpose_weight_sf(sf, block_size, transpose_sf1s):
    """[(sf0, sf1)] for the NPU scale tensors sf (checked fp32, 2-D or 3-D), or None."""
    if block_size != _BLOCK or not all(s.is_contiguous() and s.device == sf[0].device for s in sf):
        return None
    index = ascend.device_index(sf[0])
    cores = ascend.vector_cores(index)
    bad = sf[0].new_zeros((2 * len(sf), cores), dtype=torch.int32)  # a row a launch, a flag a core
    results = []
    for i, (s, transpose) in enumerate(zip(sf, transpose_sf1s)):
        groups = s.shape[0] if s.dim() == 3 else 1
        nb, kb = s.shape[-2:]
        lead = s.shape[:-2]
        sf0 = s.new_empty((*lead, ceil_div(kb, 2), nb * _BLOCK), dtype=torch.int16)
        sf1 = s.new_empty((*lead, ceil_div(nb, 2), kb * _BLOCK), dtype=torch.int16)
        if s.numel():
            for j, (along, out) in enumerate((("k", sf0), ("n", sf1))):
                flags = bad[2 * i + j]
                _KERNELS[along, cores](index, s.data_ptr(), out.data_ptr(), flags.data_ptr(), groups, nb, kb)
        results.append((sf0.transpose(-1, -2), sf1 if transpose else sf1.transpose(-1, -2)))
    if bool(bad.any()):
        for i, s in enumerate(sf):
            check_power_of_two_scales(s, f"sf[{i}]")
    return results
