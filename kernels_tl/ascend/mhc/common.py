"""What the Ascend mhc kernels share (build time only): the column chunk a step works on, and the
backwards' walk of a partial row's tokens (mhc_head_compute_mix's and mhc_pre_split_mixes')."""

import tilelang.ascend.language as T

CHUNK = 1024  # columns of a token a step (the copies bound the last chunk at H)
THREADS = 128  # SIMT threads, each over every THREADS-th column of a chunk
STEPS = CHUNK // THREADS


def partial_row_summer(threads, gradient, segment=lambda i: 0):
    """A macro (b, per, X, XG, SCALE, BASE, sums, *operands): a SIMT function of `threads` threads,
    thread i a column of X (T, C) (threads >= C), over partial row b's tokens t = b per ..
    min(T, (b + 1) per) in token order: y = X[t, i] * SCALE[segment(i)] + BASE[i], the op's macro
    gradient(t, i, y, gy, s, tmp, *operands) sets gy, the gradient of y, from y (s, tmp: scratch
    scalars), XG[t, i] = gy * SCALE[segment(i)], and sums[0, i] = the sum of gy, sums[1, i] = the sum of
    gy * X[t, i] (0 for i >= C). threads, gradient and segment (a column's SCALE index, a PrimExpr
    of i) closed over."""

    @T.macro
    def sum_row(b, per, X, XG, SCALE, BASE, sums, *operands):
        with T.SimtVF(threads=threads):
            i = T.get_thread_binding()
            y = T.alloc_var("float32")
            s = T.alloc_var("float32")
            gy = T.alloc_var("float32")
            prod = T.alloc_var("float32")
            sums[0, i] = T.float32(0)
            sums[1, i] = T.float32(0)
            if i < X.shape[1]:
                for k in T.serial(per):
                    t = b * per + k
                    if t < X.shape[0]:
                        y = X[t, i] * SCALE[segment(i)] + BASE[i]
                        gradient(t, i, y, gy, s, prod, *operands)
                        XG[t, i] = gy * SCALE[segment(i)]
                        sums[0, i] = sums[0, i] + gy
                        prod = gy * X[t, i]
                        sums[1, i] = sums[1, i] + prod

    return sum_row
