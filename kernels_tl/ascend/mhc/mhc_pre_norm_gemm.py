"""mhc_pre_norm_gemm_fwd / _bwd for Ascend 950 (build time only), read from
tilebake.mhc.mhc_pre_norm_gemm.MhcPreNormGemmAscendVariant (up to MAX_MIXES mixes and every size
at run time). x is the residual as (T, K) bf16, fn (N, K) fp32; the CPU reference's arithmetic
(x in fp32, fn in fp32, no TF32 / bf16 split), each product and sum rounded on its own in a fixed
order of our own (torch's matmul sums in an order of its own: within tolerance, not the same bits).

fwd: split s covers the columns [s c, min((s + 1) c, K)), c = ceil(K / (64 n_splits)) * 64
(tilebake.mhc.mhc_pre_norm_gemm.split_columns). A block per vector core, each taking the
(split, TB-token block) items core, core + num_vec_cores, ...: per CH-column chunk of the split,
fn's N rows and the block's x rows DMA'd in, SIMT thread n < N summing x[t, j] * fn[n, j] over
the chunk's columns in order, from 0, and adding that to the token's running sum (in the unified
buffer), the last thread x[t, j]^2 likewise (two levels: the error of CH-term and c / CH-term
sums); the sums written to GM by the threads at the item's end (a split past K: zeros).
bwd: a block per vector core, each taking the CH-column chunks core, core + num_vec_cores, ...,
a SIMT thread a column: fn's N rows of the chunk DMA'd in once; then the tokens in order, TB at a
time (x, out_mul_grad and, when given, residual_grad rows DMA'd in): g = sum over n in order of
dom[t, n] * fn[n, j], then + (2 dsq[t]) * x[t, j], then residual_grad + g when given, rounded to
bf16 once (DMA'd out); fn_grad[n, j] = the TB-token blocks' sums of dom[t, n] * x[t, j] (tokens
in order, from 0) added in block order, kept in the unified buffer and DMA'd out after the last
token (no partial rows).
Built and lowered here, never run on an NPU: checked on the CPU by tests/ascend/test_emulated_mhc.py.
"""

import tilelang.ascend.language as T

from kernels_tl.ascend.mhc.common import THREADS
from tilebake.mhc.mhc_pre_norm_gemm import BK, MAX_MIXES, MhcPreNormGemmAscendVariant

CH = THREADS  # columns a chunk: fn's rows of it are MAX_MIXES x CH x 4 = 40 KiB of UB
TB = 64  # fwd: tokens an item (their running sums: TB x THREADS x 4 = 32 KiB)
TB_BWD = 16  # bwd: tokens a step


def build(v: MhcPreNormGemmAscendVariant):
    n = T.dynamic("num_tokens")
    k = T.dynamic("num_cols")
    mixes = T.dynamic("num_mixes")
    CORES = v.num_vec_cores
    return _forward(n, k, mixes, CORES) if v.direction == "fwd" else _backward(n, k, mixes, CORES)


def _forward(n, k, mixes, CORES):
    splits = T.dynamic("n_splits")

    @T.prim_func
    def mhc_pre_norm_gemm_fwd_kernel(
        X: T.Tensor((n, k), "bfloat16"),
        FN: T.Tensor((mixes, k), "float32"),
        OUT: T.Tensor((splits, n, mixes), "float32"),
        SQ: T.Tensor((splits, n), "float32"),
    ):
        with T.Kernel(CORES) as core:
            fs = T.alloc_shared((MAX_MIXES, CH), "float32")
            xs = T.alloc_shared((TB, CH), "bfloat16")
            acc = T.alloc_shared((TB, THREADS), "float32")  # [token, mix]; column THREADS - 1: the square sum
            blocks = T.ceildiv(n, TB)
            width = T.ceildiv(k, BK * splits) * BK
            for r in T.serial(T.ceildiv(splits * blocks - core, CORES)):
                item = core + r * CORES
                s = item // blocks
                t0 = item % blocks * TB
                rows = T.min(TB, n - t0)
                lo = s * width
                hi = T.min(lo + width, k)
                with T.SimtVF(threads=THREADS):
                    tx = T.get_thread_binding()
                    for i in T.serial(TB):
                        acc[i, tx] = T.float32(0)
                for c in T.serial(T.ceildiv(T.max(hi - lo, 0), CH)):
                    c0 = lo + c * CH
                    for m in T.serial(mixes):
                        T.copy(FN[m, c0 : c0 + CH], fs[m, 0:CH])
                    for i in T.serial(rows):
                        T.copy(X[t0 + i, c0 : c0 + CH], xs[i, 0:CH])
                    with T.SimtVF(threads=THREADS):  # thread tx < N: mix tx; the others x^2 (the last one's kept)
                        tx = T.get_thread_binding()
                        xv = T.alloc_var("float32")
                        prod = T.alloc_var("float32")
                        a = T.alloc_var("float32")
                        for i in T.serial(rows):
                            a = T.float32(0)
                            for j in T.serial(T.min(CH, hi - c0)):
                                xv = T.cast(xs[i, j], "float32")
                                prod = xv * T.if_then_else(tx < mixes, fs[T.min(tx, MAX_MIXES - 1), j], xv)
                                a = a + prod
                            acc[i, tx] = acc[i, tx] + a
                with T.SimtVF(threads=THREADS):
                    tx = T.get_thread_binding()
                    for i in T.serial(rows):
                        if tx < mixes:
                            OUT[s, t0 + i, tx] = acc[i, tx]
                        elif tx == THREADS - 1:
                            SQ[s, t0 + i] = acc[i, tx]

    return mhc_pre_norm_gemm_fwd_kernel


def _backward(n, k, mixes, CORES):
    @T.prim_func
    def mhc_pre_norm_gemm_bwd_kernel(
        X: T.Tensor((n, k), "bfloat16"),
        FN: T.Tensor((mixes, k), "float32"),
        DOM: T.Tensor((n, mixes), "float32"),
        DSQ: T.Tensor((n,), "float32"),
        XG: T.Tensor((n, k), "bfloat16"),
        FG: T.Tensor((mixes, k), "float32"),
        has_x_grad: T.int32,
    ):
        with T.Kernel(CORES) as core:
            fs = T.alloc_shared((MAX_MIXES, CH), "float32")
            acc = T.alloc_shared((MAX_MIXES, CH), "float32")  # fn_grad's chunk
            xs = T.alloc_shared((TB_BWD, CH), "bfloat16")
            gs = T.alloc_shared((TB_BWD, CH), "bfloat16")
            ds = T.alloc_shared((TB_BWD, MAX_MIXES), "float32")
            for r in T.serial(T.ceildiv(T.ceildiv(k, CH) - core, CORES)):
                c0 = (core + r * CORES) * CH
                for m in T.serial(mixes):
                    T.copy(FN[m, c0 : c0 + CH], fs[m, 0:CH])
                with T.SimtVF(threads=THREADS):
                    j = T.get_thread_binding()
                    for m in T.serial(MAX_MIXES):
                        acc[m, j] = T.float32(0)
                for b in T.serial(T.ceildiv(n, TB_BWD)):
                    t0 = b * TB_BWD
                    rows = T.min(TB_BWD, n - t0)
                    for i in T.serial(rows):
                        T.copy(X[t0 + i, c0 : c0 + CH], xs[i, 0:CH])
                        T.copy(DOM[t0 + i, 0:mixes], ds[i, 0:mixes])
                        if has_x_grad != 0:
                            T.copy(XG[t0 + i, c0 : c0 + CH], gs[i, 0:CH])
                    # thread j: column c0 + j (past K: the chunk's stale tail, not stored)
                    with T.SimtVF(threads=THREADS):
                        j = T.get_thread_binding()
                        g = T.alloc_var("float32")
                        prod = T.alloc_var("float32")
                        a = T.alloc_var("float32")
                        for i in T.serial(rows):
                            g = ds[i, 0] * fs[0, j]
                            for m in T.serial(mixes - 1):
                                prod = ds[i, m + 1] * fs[m + 1, j]
                                g = g + prod
                            prod = DSQ[t0 + i] * T.float32(2)
                            prod = prod * T.cast(xs[i, j], "float32")
                            g = g + prod
                            if has_x_grad != 0:
                                g = T.cast(gs[i, j], "float32") + g
                            gs[i, j] = T.cast(g, "bfloat16")
                        for m in T.serial(mixes):
                            a = T.float32(0)
                            for i in T.serial(rows):
                                prod = ds[i, m] * T.cast(xs[i, j], "float32")
                                a = a + prod
                            acc[m, j] = acc[m, j] + a
                    for i in T.serial(rows):
                        T.copy(gs[i, 0:CH], XG[t0 + i, c0 : c0 + CH])
                for m in T.serial(mixes):
                    T.copy(acc[m, 0:CH], FG[m, c0 : c0 + CH])

    return mhc_pre_norm_gemm_bwd_kernel
