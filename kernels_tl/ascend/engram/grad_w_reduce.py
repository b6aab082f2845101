"""grad_w_reduce for Ascend 950 (build time only), read from
tilebake.engram.grad_w_reduce.GradWReduceAscendVariant: S = the (P, hc * H) fp32 partials summed
in tilebake.torch.engram.sum_partials' order (accumulator g adds rows g, g + 8, ...; then the
accumulators in order), grad_weight_hidden += S * weight_embed, grad_weight_embed += S *
weight_hidden (each product and sum rounded on its own: separate statements), in place.

A block per vector core, each taking chunks core, core + num_vec_cores, ... of CHUNK flat columns:
the partial rows DMA'd in one after another and added by THREADS SIMT threads (each over every
THREADS-th column) into the 8 accumulators, then the weights and gradient chunks DMA'd in,
updated and DMA'd out. Built and lowered here, never run on an NPU: checked on the CPU by
tests/ascend/test_emulated_engram.py.
"""

import tilelang.ascend.language as T

from kernels_tl.ascend.engram.common import CHUNK, STEPS, THREADS, add_accumulators, partial_rows_summer
from tilebake.engram.grad_w_reduce import GradWReduceAscendVariant
from tilebake.torch.engram import PARTIAL_GROUPS


def build(v: GradWReduceAscendVariant):
    parts = T.dynamic("num_partials")
    cols = T.dynamic("num_cols")
    CORES = v.num_vec_cores
    sum_rows = partial_rows_summer(parts)

    @T.prim_func
    def grad_w_reduce_kernel(
        P: T.Tensor((parts, cols), "float32"),
        WH: T.Tensor((cols,), "bfloat16"),
        WE: T.Tensor((cols,), "bfloat16"),
        GWH: T.Tensor((cols,), "float32"),
        GWE: T.Tensor((cols,), "float32"),
    ):
        with T.Kernel(CORES) as core:
            acc = T.alloc_shared((PARTIAL_GROUPS, CHUNK), "float32")
            ps = T.alloc_shared((CHUNK,), "float32")
            whs = T.alloc_shared((CHUNK,), "bfloat16")
            wes = T.alloc_shared((CHUNK,), "bfloat16")
            ghs = T.alloc_shared((CHUNK,), "float32")
            ges = T.alloc_shared((CHUNK,), "float32")
            for s in T.serial(T.ceildiv(T.ceildiv(cols, CHUNK) - core, CORES)):
                c0 = (core + s * CORES) * CHUNK
                sum_rows(P, ps, acc, c0)
                T.copy(WH[c0 : c0 + CHUNK], whs)
                T.copy(WE[c0 : c0 + CHUNK], wes)
                T.copy(GWH[c0 : c0 + CHUNK], ghs)
                T.copy(GWE[c0 : c0 + CHUNK], ges)
                with T.SimtVF(threads=THREADS):
                    t = T.get_thread_binding()
                    total = T.alloc_var("float32")
                    prod = T.alloc_var("float32")
                    for q in T.serial(STEPS):
                        j = q * THREADS + t
                        add_accumulators(acc, j, total)
                        prod = total * T.cast(wes[j], "float32")
                        ghs[j] = ghs[j] + prod
                        prod = total * T.cast(whs[j], "float32")
                        ges[j] = ges[j] + prod
                T.copy(ghs, GWH[c0 : c0 + CHUNK])
                T.copy(ges, GWE[c0 : c0 + CHUNK])

    return grad_w_reduce_kernel
