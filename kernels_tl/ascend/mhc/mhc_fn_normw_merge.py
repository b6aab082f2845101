"""mhc_fn_normw_merge_fwd / _bwd for Ascend 950 (build time only), read from
tilebake.mhc.mhc_fn_normw_merge.MhcFnNormwMergeAscendVariant (every size at run time).

fwd: out_fn[n, :] = fn[n, :] * normw. bwd: fn_grad[n, :] = out_fn_grad[n, :] * normw and
normw_grad = the sum over the rows n in order, from 0, of out_fn_grad[n, :] * fn[n, :] (fp32,
each product and sum rounded on its own: the CPU path's bits).
A block per vector core, each taking the CHUNK-column chunks core, core + num_vec_cores, ...: the
chunk of normw DMA'd in once, then row by row (bwd: the weight gradient's running sums kept in the
unified buffer, DMA'd out after the last row). Built and lowered here, never run on an NPU:
checked on the CPU by tests/ascend/test_emulated_mhc.py.
"""

import tilelang.ascend.language as T

from kernels_tl.ascend.mhc.common import CHUNK, STEPS, THREADS
from tilebake.mhc.mhc_fn_normw_merge import MhcFnNormwMergeAscendVariant


def build(v: MhcFnNormwMergeAscendVariant):
    n = T.dynamic("num_mixes")
    k = T.dynamic("num_cols")
    CORES = v.num_vec_cores
    return _forward(n, k, CORES) if v.direction == "fwd" else _backward(n, k, CORES)


def _forward(n, k, CORES):
    @T.prim_func
    def mhc_fn_normw_merge_fwd_kernel(
        FN: T.Tensor((n, k), "float32"),
        W: T.Tensor((k,), "float32"),
        OUT: T.Tensor((n, k), "float32"),
    ):
        with T.Kernel(CORES) as core:
            ws = T.alloc_shared((CHUNK,), "float32")
            fs = T.alloc_shared((CHUNK,), "float32")
            for r in T.serial(T.ceildiv(T.ceildiv(k, CHUNK) - core, CORES)):
                c0 = (core + r * CORES) * CHUNK
                T.copy(W[c0 : c0 + CHUNK], ws)
                for row in T.serial(n):
                    T.copy(FN[row, c0 : c0 + CHUNK], fs)
                    with T.SimtVF(threads=THREADS):
                        tx = T.get_thread_binding()
                        for q in T.serial(STEPS):
                            j = q * THREADS + tx
                            fs[j] = fs[j] * ws[j]
                    T.copy(fs, OUT[row, c0 : c0 + CHUNK])

    return mhc_fn_normw_merge_fwd_kernel


def _backward(n, k, CORES):
    @T.prim_func
    def mhc_fn_normw_merge_bwd_kernel(
        FN: T.Tensor((n, k), "float32"),
        W: T.Tensor((k,), "float32"),
        OG: T.Tensor((n, k), "float32"),
        FG: T.Tensor((n, k), "float32"),
        WG: T.Tensor((k,), "float32"),
    ):
        with T.Kernel(CORES) as core:
            ws = T.alloc_shared((CHUNK,), "float32")
            fs = T.alloc_shared((CHUNK,), "float32")
            gs = T.alloc_shared((CHUNK,), "float32")
            acc = T.alloc_shared((CHUNK,), "float32")
            for r in T.serial(T.ceildiv(T.ceildiv(k, CHUNK) - core, CORES)):
                c0 = (core + r * CORES) * CHUNK
                T.copy(W[c0 : c0 + CHUNK], ws)
                with T.SimtVF(threads=THREADS):
                    tx = T.get_thread_binding()
                    for q in T.serial(STEPS):
                        acc[q * THREADS + tx] = T.float32(0)
                for row in T.serial(n):
                    T.copy(FN[row, c0 : c0 + CHUNK], fs)
                    T.copy(OG[row, c0 : c0 + CHUNK], gs)
                    with T.SimtVF(threads=THREADS):
                        tx = T.get_thread_binding()
                        prod = T.alloc_var("float32")
                        for q in T.serial(STEPS):
                            j = q * THREADS + tx
                            prod = gs[j] * fs[j]
                            acc[j] = acc[j] + prod
                            gs[j] = gs[j] * ws[j]
                    T.copy(gs, FG[row, c0 : c0 + CHUNK])
                T.copy(acc, WG[c0 : c0 + CHUNK])

    return mhc_fn_normw_merge_bwd_kernel
