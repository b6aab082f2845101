"""mhc_fn_normw_merge, as TileLang factories (build time only); every size at run time.

A thread owns 4 columns of fn (N, K) and walks its rows:
forward   OUT[n, k] = FN[n, k] * W[k];
backward  FG[n, k] = OG[n, k] * W[k] and WG[k] = sum over n in order of OG[n, k] * FN[n, k].
"""

import tilelang.language as T

from tilebake.mhc.mhc_fn_normw_merge import MhcFnNormwMergeVariant

THREADS = 128
VEC = 4
PASS_CONFIGS = {"tl.disable_safe_memory_legalize": True}  # whole vectors: the host checks K % 4


def build(v: MhcFnNormwMergeVariant):
    return _forward() if v.direction == "fwd" else _backward()


def _forward():
    num_mixes = T.dynamic("num_mixes")
    num_cols = T.dynamic("num_cols")

    @T.prim_func
    def mhc_fn_normw_merge_fwd_kernel(
        FN: T.Tensor((num_mixes, num_cols), "float32"),
        W: T.Tensor((num_cols,), "float32"),
        OUT: T.Tensor((num_mixes, num_cols), "float32"),
    ):
        with T.Kernel(T.ceildiv(num_cols, THREADS * VEC), threads=THREADS) as b:
            T.assume(num_cols % VEC == 0)
            k = (b * THREADS + T.get_thread_binding(0)) * VEC
            ws = T.alloc_local((VEC,), "float32")
            fs = T.alloc_local((VEC,), "float32")
            if k < num_cols:
                for j in T.vectorized(VEC):
                    ws[j] = W[k + j]
                for n in T.serial(num_mixes):
                    for j in T.vectorized(VEC):
                        fs[j] = FN[n, k + j]
                    for j in T.unroll(VEC):
                        fs[j] = T.ieee_mul(fs[j], ws[j])
                    for j in T.vectorized(VEC):
                        OUT[n, k + j] = fs[j]

    return mhc_fn_normw_merge_fwd_kernel


def _backward():
    num_mixes = T.dynamic("num_mixes")
    num_cols = T.dynamic("num_cols")

    @T.prim_func
    def mhc_fn_normw_merge_bwd_kernel(
        FN: T.Tensor((num_mixes, num_cols), "float32"),
        W: T.Tensor((num_cols,), "float32"),
        OG: T.Tensor((num_mixes, num_cols), "float32"),
        FG: T.Tensor((num_mixes, num_cols), "float32"),
        WG: T.Tensor((num_cols,), "float32"),
    ):
        with T.Kernel(T.ceildiv(num_cols, THREADS * VEC), threads=THREADS) as b:
            T.assume(num_cols % VEC == 0)
            k = (b * THREADS + T.get_thread_binding(0)) * VEC
            ws = T.alloc_local((VEC,), "float32")
            fs = T.alloc_local((VEC,), "float32")
            gs = T.alloc_local((VEC,), "float32")
            acc = T.alloc_local((VEC,), "float32")
            if k < num_cols:
                for j in T.vectorized(VEC):
                    ws[j] = W[k + j]
                for j in T.unroll(VEC):
                    acc[j] = T.float32(0)
                for n in T.serial(num_mixes):
                    for j in T.vectorized(VEC):
                        fs[j] = FN[n, k + j]
                    for j in T.vectorized(VEC):
                        gs[j] = OG[n, k + j]
                    for j in T.unroll(VEC):
                        acc[j] = T.ieee_add(acc[j], T.ieee_mul(gs[j], fs[j]))
                        gs[j] = T.ieee_mul(gs[j], ws[j])
                    for j in T.vectorized(VEC):
                        FG[n, k + j] = gs[j]
                for j in T.vectorized(VEC):
                    WG[k + j] = acc[j]

    return mhc_fn_normw_merge_bwd_kernel
