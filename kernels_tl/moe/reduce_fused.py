"""reduce_fused: each token's weighted sum of its rows in the fused layout.

out[t, c] = convert((fmaf chain over j = 0..k-1 of x[p_j, c] * s_j) * sf), p_j =
token_topk_to_pos[t, j] in [0, num_expanded) (others skipped), s_j = (has_weights ? w[t, j] : 1)
* (has_x_sf ? x_sf[p_j] : 1) in fp32; the accumulator starts at 0 and every step is one
T.ieee_fmaf (a single rounding, as the original's contracted `acc += x * s`); `* sf` only with
has_sf; convert: RNE to bf16 / fp32, or the saturating e4m3 conversion. The flags are runtime
(uniform branches); absent tensors are passed as a valid dummy pointer and never read.

Thread mapping: a thread owns ELEMS consecutive columns of one row (whole 16-byte input vectors,
each guarded against the hidden size, which the host checks is a multiple of a vector); a CTA
covers ROWS_PER_CTA tokens x COLS_PER_CTA columns, the column tile varying fastest.
"""

import tilelang.language as T

from kernels_tl.quant.common import TL_DTYPES
from tilebake.moe.reduce_fused import ReduceFusedVariant

THREADS = 128
THREADS_PER_ROW = 64
ELEMS = 16
ROWS_PER_CTA = THREADS // THREADS_PER_ROW
COLS_PER_CTA = THREADS_PER_ROW * ELEMS
TOPK_BATCH = 4  # slots whose rows are loaded together (a runtime k is walked in batches of it)

PASS_CONFIGS = {"tl.disable_safe_memory_legalize": True}  # accesses are guarded per vector


def build(v: ReduceFusedVariant):
    in_dtype, out_dtype = TL_DTYPES[v.in_dtype], TL_DTYPES[v.out_dtype]
    vec = 8 if v.in_dtype == "bf16" else 4  # input elements in 16 bytes
    num_tokens = T.dynamic("num_tokens")
    num_expanded = T.dynamic("num_expanded")
    num_topk = T.dynamic("num_topk")
    hidden = T.dynamic("hidden")
    x_stride = T.dynamic("x_stride")
    y_stride = T.dynamic("y_stride")
    num_col_tiles = T.ceildiv(hidden, COLS_PER_CTA)

    @T.prim_func
    def reduce_fused_kernel(
        X: T.StridedTensor((num_expanded, hidden), (x_stride, 1), in_dtype),
        W: T.Tensor((num_tokens, num_topk), "float32"),
        P: T.Tensor((num_tokens, num_topk), "int32"),
        XSF: T.Tensor((num_expanded,), "float32"),
        SF: T.Tensor((1,), "float32"),
        Y: T.StridedTensor((num_tokens, hidden), (y_stride, 1), out_dtype),
        has_weights: T.int32,
        has_x_sf: T.int32,
        has_sf: T.int32,
    ):
        with T.Kernel(T.ceildiv(num_tokens, ROWS_PER_CTA) * num_col_tiles, threads=THREADS) as b:
            bx = T.alloc_var("int32")
            by = T.alloc_var("int32")
            bx = b // num_col_tiles
            by = b % num_col_tiles
            T.assume(x_stride % vec == 0)
            T.assume(y_stride % vec == 0)
            T.assume(hidden % vec == 0)
            tx = T.get_thread_binding(0)
            row = bx * ROWS_PER_CTA + tx // THREADS_PER_ROW
            col = by * COLS_PER_CTA + (tx % THREADS_PER_ROW) * ELEMS
            acc = T.alloc_local((ELEMS,), "float32")
            xs = T.alloc_local((TOPK_BATCH, ELEMS), in_dtype)
            ys = T.alloc_local((ELEMS,), out_dtype)
            ps = T.alloc_local((TOPK_BATCH,), "int32")
            ss = T.alloc_local((TOPK_BATCH,), "float32")
            s = T.alloc_var("float32")
            for j in T.unroll(ELEMS):
                acc[j] = T.float32(0)
            if row < num_tokens:
                # Slots TOPK_BATCH at a time: their positions, multipliers and rows are all loaded
                # before the fmaf chain consumes them in slot order.
                for kb in T.serial(T.ceildiv(num_topk, TOPK_BATCH)):
                    for q in T.unroll(TOPK_BATCH):
                        ps[q] = -1
                        if kb * TOPK_BATCH + q < num_topk:
                            ps[q] = P[row, kb * TOPK_BATCH + q]
                    for q in T.unroll(TOPK_BATCH):
                        ss[q] = T.float32(1)
                        if ps[q] >= 0 and ps[q] < num_expanded:
                            if has_weights != 0:
                                ss[q] = W[row, kb * TOPK_BATCH + q]
                            if has_x_sf != 0:
                                ss[q] = ss[q] * XSF[ps[q]]
                            for h in T.unroll(ELEMS // vec):
                                if col + h * vec < hidden:
                                    for j in T.vectorized(vec):
                                        xs[q, h * vec + j] = X[
                                            ps[q], by * COLS_PER_CTA + (tx % THREADS_PER_ROW) * ELEMS + h * vec + j
                                        ]
                                else:
                                    for j in T.vectorized(vec):
                                        xs[q, h * vec + j] = T.cast(0, in_dtype)
                    for q in T.unroll(TOPK_BATCH):
                        if ps[q] >= 0 and ps[q] < num_expanded:
                            for j in T.unroll(ELEMS):
                                acc[j] = T.ieee_fmaf(T.cast(xs[q, j], "float32"), ss[q], acc[j])
                if has_sf != 0:
                    s = SF[0]
                    for j in T.unroll(ELEMS):
                        acc[j] = acc[j] * s
                for j in T.vectorized(ELEMS):
                    ys[j] = T.cast(acc[j], out_dtype)
                for h in T.unroll(ELEMS // vec):
                    if col + h * vec < hidden:
                        for j in T.vectorized(vec):
                            Y[row, by * COLS_PER_CTA + (tx % THREADS_PER_ROW) * ELEMS + h * vec + j] = ys[h * vec + j]

    return reduce_fused_kernel
