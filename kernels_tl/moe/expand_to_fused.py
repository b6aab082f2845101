"""expand_to_fused (and _with_sf): scatter token rows into the expert-major fused layout.

Rows are moved as raw bytes (int32 words, 16-byte vectors), so one binary serves every data
dtype; the host guarantees row bytes, row strides and pointers are multiples of 16 bytes.

Thread mapping: a CTA covers ROWS_PER_CTA tokens x COLS_PER_CTA words; each thread owns
WORDS_PER_THREAD consecutive words of ROWS_PER_THREAD rows. It loads token r's words once and
stores them at every position token_topk_to_pos[r, j] in [0, num_expanded), TOPK_BATCH positions
loaded at a time. Padding rows (pos_to_expert < 0) are zeroed by the same CTAs, which walk the
positions in chunks of ROWS_PER_CTA, grid_rows chunks apart (grid_rows >= ceil(T / ROWS_PER_CTA),
chosen by the host so a CTA checks a few chunks: no CTA exists only to find no padding). The
column tile varies fastest in the 1-D grid of grid_rows x ceil(row_words / COLS_PER_CTA) CTAs.
with_sf: the CTAs of column tile 0 also move the SF rows (4-byte words: fp32 or packed UE8M0,
any strides in words, so row- and column-major SF share the binary) the same way.
"""

import tilelang.language as T

from tilebake.moe.expand_to_fused import ROWS_PER_CTA as HOST_ROWS_PER_CTA
from tilebake.moe.expand_to_fused import ExpandToFusedVariant

THREADS = 128
THREADS_PER_ROW = 32
ROWS_PER_THREAD = 2
WORDS_PER_THREAD = 8  # two 16-byte vectors
ROWS_PER_PASS = THREADS // THREADS_PER_ROW
ROWS_PER_CTA = ROWS_PER_PASS * ROWS_PER_THREAD
assert ROWS_PER_CTA == HOST_ROWS_PER_CTA  # the host sizes grid_rows with it
COLS_PER_CTA = THREADS_PER_ROW * WORDS_PER_THREAD
TOPK_BATCH = 4  # positions loaded together (a runtime k is walked in batches of it)

PASS_CONFIGS = {"tl.disable_safe_memory_legalize": True}  # accesses are guarded per vector


def build(v: ExpandToFusedVariant):
    num_tokens = T.dynamic("num_tokens")
    num_expanded = T.dynamic("num_expanded")
    num_topk = T.dynamic("num_topk")
    row_words = T.dynamic("row_words")
    x_stride = T.dynamic("x_stride")
    y_stride = T.dynamic("y_stride")
    sf_cols = T.dynamic("sf_cols")
    xs_stride_t = T.dynamic("xs_stride_t")
    xs_stride_c = T.dynamic("xs_stride_c")
    ys_stride_t = T.dynamic("ys_stride_t")
    ys_stride_c = T.dynamic("ys_stride_c")
    num_col_tiles = T.ceildiv(row_words, COLS_PER_CTA)
    vec = 4

    @T.macro
    def body(X, Y, P, E, b, grid_rows):
        bx = T.alloc_var("int32")
        by = T.alloc_var("int32")
        bx = b // num_col_tiles
        by = b % num_col_tiles
        T.assume(x_stride % 4 == 0)
        T.assume(y_stride % 4 == 0)
        T.assume(row_words % 4 == 0)
        tx = T.get_thread_binding(0)
        col = by * COLS_PER_CTA + (tx % THREADS_PER_ROW) * WORDS_PER_THREAD
        xs = T.alloc_local((ROWS_PER_THREAD, WORDS_PER_THREAD), "int32")
        ps = T.alloc_local((TOPK_BATCH,), "int32")
        for u in T.unroll(ROWS_PER_THREAD):
            row = bx * ROWS_PER_CTA + u * ROWS_PER_PASS + tx // THREADS_PER_ROW
            for h in T.unroll(WORDS_PER_THREAD // vec):
                if row < num_tokens and col + h * vec < row_words:
                    for j in T.vectorized(vec):
                        xs[u, h * vec + j] = X[
                            row, by * COLS_PER_CTA + (tx % THREADS_PER_ROW) * WORDS_PER_THREAD + h * vec + j
                        ]
        for u in T.unroll(ROWS_PER_THREAD):
            row = bx * ROWS_PER_CTA + u * ROWS_PER_PASS + tx // THREADS_PER_ROW
            if row < num_tokens:
                # Positions TOPK_BATCH at a time, all loaded before the stores that use them.
                for kb in T.serial(T.ceildiv(num_topk, TOPK_BATCH)):
                    for q in T.unroll(TOPK_BATCH):
                        ps[q] = -1
                        if kb * TOPK_BATCH + q < num_topk:
                            ps[q] = P[row, kb * TOPK_BATCH + q]
                    for q in T.unroll(TOPK_BATCH):
                        if ps[q] >= 0 and ps[q] < num_expanded:
                            for h in T.unroll(WORDS_PER_THREAD // vec):
                                if col + h * vec < row_words:
                                    for j in T.vectorized(vec):
                                        Y[
                                            ps[q],
                                            by * COLS_PER_CTA + (tx % THREADS_PER_ROW) * WORDS_PER_THREAD + h * vec + j,
                                        ] = xs[u, h * vec + j]
        # Padding rows: position chunks of ROWS_PER_CTA, grid_rows CTAs apart.
        for m in T.serial(T.ceildiv(num_expanded, grid_rows * ROWS_PER_CTA)):
            for u in T.unroll(ROWS_PER_THREAD):
                row = (m * grid_rows + bx) * ROWS_PER_CTA + u * ROWS_PER_PASS + tx // THREADS_PER_ROW
                if row < num_expanded:
                    if E[row] < 0:
                        for h in T.unroll(WORDS_PER_THREAD // vec):
                            if col + h * vec < row_words:
                                for j in T.vectorized(vec):
                                    Y[
                                        row,
                                        by * COLS_PER_CTA + (tx % THREADS_PER_ROW) * WORDS_PER_THREAD + h * vec + j,
                                    ] = T.int32(0)

    if not v.with_sf:

        @T.prim_func
        def expand_to_fused_kernel(
            X: T.StridedTensor((num_tokens, row_words), (x_stride, 1), "int32"),
            Y: T.StridedTensor((num_expanded, row_words), (y_stride, 1), "int32"),
            P: T.Tensor((num_tokens, num_topk), "int32"),
            E: T.Tensor((num_expanded,), "int32"),
            grid_rows: T.int32,
        ):
            with T.Kernel(grid_rows * num_col_tiles, threads=THREADS) as b:
                body(X, Y, P, E, b, grid_rows)

        return expand_to_fused_kernel

    @T.prim_func
    def expand_to_fused_with_sf_kernel(
        X: T.StridedTensor((num_tokens, row_words), (x_stride, 1), "int32"),
        Y: T.StridedTensor((num_expanded, row_words), (y_stride, 1), "int32"),
        P: T.Tensor((num_tokens, num_topk), "int32"),
        E: T.Tensor((num_expanded,), "int32"),
        XS: T.StridedTensor((num_tokens, sf_cols), (xs_stride_t, xs_stride_c), "int32"),
        YS: T.StridedTensor((num_expanded, sf_cols), (ys_stride_t, ys_stride_c), "int32"),
        grid_rows: T.int32,
    ):
        with T.Kernel(grid_rows * num_col_tiles, threads=THREADS) as b:
            bx = T.alloc_var("int32")
            bx = b // num_col_tiles
            tx = T.get_thread_binding(0)
            lane = tx % THREADS_PER_ROW
            word = T.alloc_var("int32")
            pos = T.alloc_var("int32")
            if b % num_col_tiles == 0:
                for u in T.unroll(ROWS_PER_THREAD):
                    row = bx * ROWS_PER_CTA + u * ROWS_PER_PASS + tx // THREADS_PER_ROW
                    if row < num_tokens:
                        for c in T.serial(lane, sf_cols, THREADS_PER_ROW):
                            word = XS[row, c]
                            for k in T.serial(num_topk):
                                pos = P[row, k]
                                if pos >= 0 and pos < num_expanded:
                                    YS[pos, c] = word
                for m in T.serial(T.ceildiv(num_expanded, grid_rows * ROWS_PER_CTA)):
                    for u in T.unroll(ROWS_PER_THREAD):
                        row = (m * grid_rows + bx) * ROWS_PER_CTA + u * ROWS_PER_PASS + tx // THREADS_PER_ROW
                        if row < num_expanded:
                            if E[row] < 0:
                                for c in T.serial(lane, sf_cols, THREADS_PER_ROW):
                                    YS[row, c] = T.int32(0)
            body(X, Y, P, E, b, grid_rows)

    return expand_to_fused_with_sf_kernel
