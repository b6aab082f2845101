"""grad_w_reduce: the gate's fused-weight gradient partials (P, hc, H) summed in a fixed order,
then grad_weight_hidden += sum * weight_embed and grad_weight_embed += sum * weight_hidden (fp32,
in place), as a TileLang factory (build time only). 128 flat columns of hc x H a CTA, the
partials summed by kernels_tl/common.py's sum_partial_rows (a fixed order: two runs give
the same bits); the products and sums rounded on their own (T.ieee_*). Any partial count (the
original's 1.0 needed a multiple of 4).
"""

import tilelang.language as T

from kernels_tl.common import (
    REDUCE_COLS,
    REDUCE_THREADS,
    REDUCE_UNROLL,
    REDUCE_VEC,
    REDUCE_WARPS,
    sum_partial_rows,
)
from tilebake.engram.grad_w_reduce import GradWReduceVariant

PASS_CONFIGS = {"tl.disable_safe_memory_legalize": True}  # guarded per vector below


def build(v: GradWReduceVariant):
    parts = T.dynamic("num_partials")
    n = T.dynamic("num_cols")  # hc x H

    @T.prim_func
    def grad_w_reduce_kernel(
        P: T.Tensor((parts, n), "float32"),
        WH: T.Tensor((n,), "bfloat16"),
        WE: T.Tensor((n,), "bfloat16"),
        GWH: T.Tensor((n,), "float32"),
        GWE: T.Tensor((n,), "float32"),
    ):
        with T.Kernel(T.ceildiv(n, REDUCE_COLS), threads=REDUCE_THREADS) as b:
            tx = T.get_thread_binding(0)
            T.assume(n % 4 == 0)
            acc = T.alloc_local((REDUCE_VEC,), "float32")
            rows = T.alloc_local((REDUCE_UNROLL, REDUCE_VEC), "float32")
            red = T.alloc_shared((REDUCE_WARPS, REDUCE_COLS), "float32")
            wh = T.alloc_local((REDUCE_VEC,), "bfloat16")
            we = T.alloc_local((REDUCE_VEC,), "bfloat16")
            gh = T.alloc_local((REDUCE_VEC,), "float32")
            ge = T.alloc_local((REDUCE_VEC,), "float32")
            sum_partial_rows(P, parts, n, b * REDUCE_COLS, acc, rows, red, tx, REDUCE_VEC)
            col = b * REDUCE_COLS + tx * REDUCE_VEC
            if tx < 32 and col < n:
                for j in T.vectorized(REDUCE_VEC):
                    wh[j] = WH[col + j]
                for j in T.vectorized(REDUCE_VEC):
                    we[j] = WE[col + j]
                for j in T.vectorized(REDUCE_VEC):
                    gh[j] = GWH[col + j]
                for j in T.vectorized(REDUCE_VEC):
                    ge[j] = GWE[col + j]
                for j in T.unroll(REDUCE_VEC):
                    gh[j] = T.ieee_add(gh[j], T.ieee_mul(acc[j], T.cast(we[j], "float32")))
                    ge[j] = T.ieee_add(ge[j], T.ieee_mul(acc[j], T.cast(wh[j], "float32")))
                for j in T.vectorized(REDUCE_VEC):
                    GWH[col + j] = gh[j]
                for j in T.vectorized(REDUCE_VEC):
                    GWE[col + j] = ge[j]

    return grad_w_reduce_kernel
