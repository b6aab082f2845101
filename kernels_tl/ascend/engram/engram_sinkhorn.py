"""The engram Sinkhorn optimizer's momentum, step, step_reduce and finalize stages for Ascend 950
(build time only), read from tilebake.engram.engram_sinkhorn.EngramSinkhornAscendVariant, with
tilebake.torch.engram's arithmetic:
  momentum: scaled = g (1 - beta1); m = scaled + mb beta1 (stored back in mb's dtype); out = m
    beta1 + scaled (nesterov) or m; each product and sum rounded on its own (separate statements);
  step_reduce: out = the (P, D) partial rows summed in sum_partials' order (accumulator g adds rows
    g, g + 8, ...; then the accumulators in order);
  finalize: out = alpha * (rs / (row_norm + eps)) * M * cs (left to right), row_norm the L2 norm of
    the row of diag(rs) M diag(cs) (its sum of squares in another order than torch's).
A block per vector core, each taking CHUNK-element chunks (momentum, step_reduce) or rows
(finalize: its chunks twice, the norm's partials a thread, added in thread order; step: a whole
row of at most MAX_COLS columns in the unified buffer, with col_scale and the core's column
accumulators) core, core + num_vec_cores, ...; THREADS SIMT threads, each over every THREADS-th
element of a chunk or row. Built and lowered here, never run on an NPU: checked on the CPU by
tests/ascend/test_emulated_engram.py.
"""

import tilelang.ascend.language as T

from kernels_tl.ascend.engram.common import CHUNK, STEPS, THREADS, add_accumulators, partial_rows_summer
from kernels_tl.quant.common import TL_DTYPES
from tilebake.engram.engram_sinkhorn import MAX_COLS, EngramSinkhornAscendVariant
from tilebake.torch.engram import PARTIAL_GROUPS


def build(v: EngramSinkhornAscendVariant):
    return {"momentum": _momentum, "step": _step, "step_reduce": _step_reduce, "finalize": _finalize}[v.stage](v)


def _momentum(v):
    numel = T.dynamic("numel")
    g_dtype, m_dtype = TL_DTYPES[v.grad_dtype], TL_DTYPES[v.momentum_dtype]
    CORES = v.num_vec_cores

    @T.prim_func
    def engram_sinkhorn_momentum_kernel(
        G: T.Tensor((numel,), g_dtype),
        MB: T.Tensor((numel,), m_dtype),
        OUT: T.Tensor((numel,), "float32"),
        beta1: T.float32,
        one_minus_beta1: T.float32,
        nesterov: T.int32,
    ):
        with T.Kernel(CORES) as core:
            gs = T.alloc_shared((CHUNK,), g_dtype)
            ms = T.alloc_shared((CHUNK,), m_dtype)
            os = T.alloc_shared((CHUNK,), "float32")
            for s in T.serial(T.ceildiv(T.ceildiv(numel, CHUNK) - core, CORES)):
                c0 = (core + s * CORES) * CHUNK
                T.copy(G[c0 : c0 + CHUNK], gs)
                T.copy(MB[c0 : c0 + CHUNK], ms)
                with T.SimtVF(threads=THREADS):
                    t = T.get_thread_binding()
                    scaled = T.alloc_var("float32")
                    prod = T.alloc_var("float32")
                    m = T.alloc_var("float32")
                    for q in T.serial(STEPS):
                        j = q * THREADS + t
                        scaled = T.cast(gs[j], "float32") * one_minus_beta1
                        prod = T.cast(ms[j], "float32") * beta1
                        m = scaled + prod
                        ms[j] = T.cast(m, m_dtype)
                        prod = m * beta1
                        os[j] = T.if_then_else(nesterov != 0, prod + scaled, m)
                T.copy(ms, MB[c0 : c0 + CHUNK])
                T.copy(os, OUT[c0 : c0 + CHUNK])

    return engram_sinkhorn_momentum_kernel


def _step(v):
    rows = T.dynamic("num_rows")
    cols = T.dynamic("num_cols")
    num_ctas = T.dynamic("num_ctas")
    CORES = v.num_vec_cores
    ROW_STEPS = MAX_COLS // THREADS

    @T.prim_func
    def engram_sinkhorn_step_kernel(
        M: T.Tensor((rows, cols), "float32"),
        RS: T.Tensor((rows,), "float32"),
        CS: T.Tensor((cols,), "float32"),
        NORM: T.Tensor((rows,), "float32"),
        P: T.Tensor((num_ctas, cols), "float32"),
        eps: T.float32,
    ):
        with T.Kernel(CORES) as core:
            ms = T.alloc_shared((MAX_COLS,), "float32")
            cs = T.alloc_shared((MAX_COLS,), "float32")
            acc = T.alloc_shared((MAX_COLS,), "float32")  # the core's column sums of squares
            part = T.alloc_shared((THREADS,), "float32")
            old = T.alloc_shared((THREADS,), "float32")  # [0]: the row's scale before the step
            if core < num_ctas:  # a core past the partial rows has no row of the matrix either
                T.copy(CS[0:MAX_COLS], cs)
                with T.SimtVF(threads=THREADS):
                    t = T.get_thread_binding()
                    for q in T.serial(ROW_STEPS):
                        acc[q * THREADS + t] = T.float32(0)
                for r in T.serial(T.ceildiv(rows - core, CORES)):
                    row = core + r * CORES
                    T.copy(M[row, 0:MAX_COLS], ms)
                    with T.SimtVF(threads=THREADS):  # the thread's partial sum of squares
                        t = T.get_thread_binding()
                        rs = T.alloc_var("float32")
                        x = T.alloc_var("float32")
                        s = T.alloc_var("float32")
                        rs = RS[row]
                        s = T.float32(0)
                        for q in T.serial(ROW_STEPS):
                            j = q * THREADS + t
                            if j < cols:  # the buffer's stale tail is not summed
                                x = rs * ms[j] * cs[j]
                                s = s + x * x
                        part[t] = s
                        if t == 0:
                            old[0] = rs
                    with T.SimtVF(threads=THREADS):  # the norm, the new scale, the column sums
                        t = T.get_thread_binding()
                        sq = T.alloc_var("float32")
                        norm = T.alloc_var("float32")
                        scale = T.alloc_var("float32")
                        x = T.alloc_var("float32")
                        sq = T.float32(0)
                        for p in T.serial(THREADS):
                            sq = sq + part[p]
                        norm = T.sqrt(sq)
                        scale = old[0] / (norm + eps)
                        for q in T.serial(ROW_STEPS):
                            j = q * THREADS + t
                            if j < cols:
                                x = scale * ms[j] * cs[j]
                                acc[j] = acc[j] + x * x
                        if t == 0:
                            NORM[row] = norm
                            RS[row] = scale
                T.copy(acc[0:MAX_COLS], P[core, 0:MAX_COLS])

    return engram_sinkhorn_step_kernel


def _step_reduce(v):
    parts = T.dynamic("num_partials")
    cols = T.dynamic("num_cols")
    CORES = v.num_vec_cores
    sum_rows = partial_rows_summer(parts)

    @T.prim_func
    def engram_sinkhorn_step_reduce_kernel(P: T.Tensor((parts, cols), "float32"), OUT: T.Tensor((cols,), "float32")):
        with T.Kernel(CORES) as core:
            acc = T.alloc_shared((PARTIAL_GROUPS, CHUNK), "float32")
            ps = T.alloc_shared((CHUNK,), "float32")
            os = T.alloc_shared((CHUNK,), "float32")
            for s in T.serial(T.ceildiv(T.ceildiv(cols, CHUNK) - core, CORES)):
                c0 = (core + s * CORES) * CHUNK
                sum_rows(P, ps, acc, c0)
                with T.SimtVF(threads=THREADS):
                    t = T.get_thread_binding()
                    total = T.alloc_var("float32")
                    for q in T.serial(STEPS):
                        j = q * THREADS + t
                        add_accumulators(acc, j, total)
                        os[j] = total
                T.copy(os, OUT[c0 : c0 + CHUNK])

    return engram_sinkhorn_step_reduce_kernel


def _finalize(v):
    rows = T.dynamic("num_rows")
    cols = T.dynamic("num_cols")
    CORES = v.num_vec_cores

    @T.prim_func
    def engram_sinkhorn_finalize_kernel(
        M: T.Tensor((rows, cols), "float32"),
        RS: T.Tensor((rows,), "float32"),
        CS: T.Tensor((cols,), "float32"),
        OUT: T.Tensor((rows, cols), "float32"),
        eps: T.float32,
        alpha: T.float32,
    ):
        with T.Kernel(CORES) as core:
            ms = T.alloc_shared((CHUNK,), "float32")
            cs = T.alloc_shared((CHUNK,), "float32")
            os = T.alloc_shared((CHUNK,), "float32")
            part = T.alloc_shared((THREADS,), "float32")
            for r in T.serial(T.ceildiv(rows - core, CORES)):
                row = core + r * CORES
                with T.SimtVF(threads=THREADS):
                    part[T.get_thread_binding()] = T.float32(0)
                for c in T.serial(T.ceildiv(cols, CHUNK)):  # the row's sum of squares
                    T.copy(M[row, c * CHUNK : c * CHUNK + CHUNK], ms)
                    T.copy(CS[c * CHUNK : c * CHUNK + CHUNK], cs)
                    with T.SimtVF(threads=THREADS):
                        t = T.get_thread_binding()
                        x = T.alloc_var("float32")
                        for q in T.serial(STEPS):
                            j = q * THREADS + t
                            if c * CHUNK + j < cols:  # the chunk's stale tail is not summed
                                x = RS[row] * ms[j] * cs[j]
                                part[t] = part[t] + x * x
                for c in T.serial(T.ceildiv(cols, CHUNK)):
                    T.copy(M[row, c * CHUNK : c * CHUNK + CHUNK], ms)
                    T.copy(CS[c * CHUNK : c * CHUNK + CHUNK], cs)
                    with T.SimtVF(threads=THREADS):
                        t = T.get_thread_binding()
                        sq = T.alloc_var("float32")
                        scale = T.alloc_var("float32")
                        sq = T.float32(0)
                        for p in T.serial(THREADS):
                            sq = sq + part[p]
                        scale = RS[row] / (T.sqrt(sq) + eps)
                        for q in T.serial(STEPS):
                            j = q * THREADS + t
                            os[j] = alpha * scale * ms[j] * cs[j]
                    T.copy(os, OUT[row, c * CHUNK : c * CHUNK + CHUNK])

    return engram_sinkhorn_finalize_kernel
