"""TileLang pieces shared by kernels of several ops (build time only)."""

import tilelang.language as T

REDUCE_THREADS = 256
REDUCE_WARPS = REDUCE_THREADS // 32
REDUCE_VEC = 4  # fp32 columns a lane owns: a warp covers 128 columns
REDUCE_COLS = 32 * REDUCE_VEC  # columns a CTA covers
REDUCE_UNROLL = 4  # partial rows a lane loads before adding them


@T.macro
def sum_partial_rows(P, num_partials, num_cols, col0, acc, rows, red, tx, vec):
    """acc[:] = the sum over the num_partials rows of P (a (num_partials, num_cols) fp32 tensor) of the
    `vec` columns col0 + (tx % 32) * vec ..., in a fixed order: warp w adds rows
    w, w + REDUCE_WARPS, ... in row order (REDUCE_UNROLL loads in flight), then the warps' sums
    are added in warp order (through `red`, a (REDUCE_WARPS, 32 * vec) fp32 shared buffer).
    Every thread of the CTA ends with the same acc for its lane's columns (0 past num_cols; the
    caller ensures num_cols % vec == 0). A CTA covers 32 * vec columns: a narrower vec spreads a
    short reduction over more CTAs (more SMs pulling) without changing any column's order. The size
    arguments keep the names of the kernels' dynamic sizes: TileLang names a size after the macro
    parameter it is passed to."""
    w = tx // 32
    c = col0 + (tx % 32) * vec
    for j in T.unroll(vec):
        acc[j] = T.float32(0)
    for k in T.serial(T.ceildiv(T.ceildiv(num_partials - w, REDUCE_WARPS), REDUCE_UNROLL)):
        for u in T.unroll(REDUCE_UNROLL):
            if w + (k * REDUCE_UNROLL + u) * REDUCE_WARPS < num_partials and c < num_cols:
                for j in T.vectorized(vec):
                    rows[u, j] = P[w + (k * REDUCE_UNROLL + u) * REDUCE_WARPS, c + j]
            else:
                for j in T.unroll(vec):
                    rows[u, j] = T.float32(0)
        for u in T.unroll(REDUCE_UNROLL):
            for j in T.unroll(vec):
                acc[j] = T.ieee_add(acc[j], rows[u, j])
    for j in T.vectorized(vec):
        red[w, (tx % 32) * vec + j] = acc[j]
    T.sync_threads()
    for j in T.unroll(vec):
        acc[j] = red[0, (tx % 32) * vec + j]
    for v in T.unroll(REDUCE_WARPS - 1):
        for j in T.unroll(vec):
            acc[j] = T.ieee_add(acc[j], red[v + 1, (tx % 32) * vec + j])
