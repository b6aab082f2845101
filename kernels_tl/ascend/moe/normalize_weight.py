"""normalize_weight for Ascend 950 (build time only), read from
tilebake.moe.normalize_weight.NormalizeWeightAscendVariant: denominator = 1e-20 + w[0] + ... +
w[k-1] added left to right in fp32, normalized = w / denominator (true divisions), as
tilebake.torch.normalize_weight computes them.

A block per vector core, each taking steps core, core + num_vec_cores, ... of ROWS tokens: their
weights DMA'd to the unified buffer (the copy bounds the rows and the k columns), a SIMT thread
a token, the results DMA'd out. Built and lowered here, never run here: no NPU and no CANN
toolkit on our machines.
"""

import tilelang.ascend.language as T

from tilebake.moe.normalize_weight import NormalizeWeightAscendVariant
from tilebake.moe.topk_gate import MAX_TOPK
from tilebake.torch.moe import DENOMINATOR_START

ROWS = 64  # tokens a step, a SIMT thread each


def build(v: NormalizeWeightAscendVariant):
    n = T.dynamic("num_tokens")
    k = T.dynamic("num_topk")
    w_stride = T.dynamic("w_stride")
    CORES = v.num_vec_cores

    @T.prim_func
    def normalize_weight_kernel(
        W: T.StridedTensor((n, k), (w_stride, 1), "float32"),
        D: T.Tensor((n,), "float32"),
        N: T.Tensor((n, k), "float32"),
    ):
        with T.Kernel(CORES) as core:
            ws = T.alloc_shared((ROWS, MAX_TOPK), "float32")
            ds = T.alloc_shared((ROWS,), "float32")
            ns = T.alloc_shared((ROWS, MAX_TOPK), "float32")
            for r in T.serial(T.ceildiv(T.ceildiv(n, ROWS) - core, CORES)):
                r0 = (core + r * CORES) * ROWS
                T.copy(W[r0 : r0 + ROWS, 0:MAX_TOPK], ws)
                with T.SimtVF(threads=ROWS):
                    t = T.get_thread_binding()
                    d = T.alloc_var("float32")
                    d = T.float32(DENOMINATOR_START)
                    for j in T.serial(k):
                        d = d + ws[t, j]
                    ds[t] = d
                    for j in T.serial(k):
                        ns[t, j] = ws[t, j] / d
                T.copy(ds, D[r0 : r0 + ROWS])
                T.copy(ns, N[r0 : r0 + ROWS, 0:MAX_TOPK])

    return normalize_weight_kernel
