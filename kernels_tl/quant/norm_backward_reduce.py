"""norm_backward's weight gradient: the backward kernel's per-CTA fp32 partial rows (P, H) summed
in a fixed order (kernels_tl/common.py sum_partial_rows: two runs give the same bits), then
added to OUT's values in fp32 and rounded once (accumulate != 0, in place) or rounded to
OUT's dtype, as a TileLang factory (build time only). 128 columns a CTA.
"""

import tilelang.language as T

from kernels_tl.common import REDUCE_COLS, REDUCE_THREADS, REDUCE_UNROLL, REDUCE_VEC, REDUCE_WARPS, sum_partial_rows
from kernels_tl.quant.common import TL_DTYPES
from tilebake.quant.norm_backward import NormBackwardReduceVariant

PASS_CONFIGS = {"tl.disable_safe_memory_legalize": True}  # guarded per vector below


def build(v: NormBackwardReduceVariant):
    parts = T.dynamic("num_partials")
    n = T.dynamic("num_cols")
    dtype = TL_DTYPES[v.out_dtype]

    @T.prim_func
    def norm_backward_reduce_kernel(
        P: T.Tensor((parts, n), "float32"),
        OUT: T.Tensor((n,), dtype),
        accumulate: T.int32,
    ):
        with T.Kernel(T.ceildiv(n, REDUCE_COLS), threads=REDUCE_THREADS) as b:
            tx = T.get_thread_binding(0)
            T.assume(n % 4 == 0)
            acc = T.alloc_local((REDUCE_VEC,), "float32")
            rows = T.alloc_local((REDUCE_UNROLL, REDUCE_VEC), "float32")
            red = T.alloc_shared((REDUCE_WARPS, REDUCE_COLS), "float32")
            given = T.alloc_local((REDUCE_VEC,), dtype)
            out = T.alloc_local((REDUCE_VEC,), dtype)
            sum_partial_rows(P, parts, n, b * REDUCE_COLS, acc, rows, red, tx, REDUCE_VEC)
            col = b * REDUCE_COLS + tx * REDUCE_VEC
            if tx < 32 and col < n:
                if accumulate != 0:
                    for j in T.vectorized(REDUCE_VEC):
                        given[j] = OUT[col + j]
                    for j in T.unroll(REDUCE_VEC):
                        acc[j] = T.ieee_add(T.cast(given[j], "float32"), acc[j])
                for j in T.unroll(REDUCE_VEC):
                    out[j] = T.cast(acc[j], dtype)
                for j in T.vectorized(REDUCE_VEC):
                    OUT[col + j] = out[j]

    return norm_backward_reduce_kernel
