"""fused_weight: weight_hidden * weight_embed (bf16, (hc, H)) -> fp32, as a TileLang factory
(build time only). Flat: each thread owns VEC consecutive elements (one 16-byte load of each
input, two 16-byte stores); the last thread's partial vector goes element by element. The
product of two bf16 values is exact in fp32, so any order gives the reference's bits.
"""

import tilelang.language as T

from tilebake.engram.fused_weight import FusedWeightVariant

THREADS = 256
VEC = 8
PASS_CONFIGS = {"tl.disable_safe_memory_legalize": True}  # guarded per vector below


def build(v: FusedWeightVariant):
    n = T.dynamic("numel")

    @T.prim_func
    def fused_weight_kernel(
        WH: T.Tensor((n,), "bfloat16"),
        WE: T.Tensor((n,), "bfloat16"),
        W: T.Tensor((n,), "float32"),
    ):
        with T.Kernel(T.ceildiv(n, THREADS * VEC), threads=THREADS) as b:
            tx = T.get_thread_binding(0)
            a = T.alloc_local((VEC,), "bfloat16")
            c = T.alloc_local((VEC,), "bfloat16")
            y = T.alloc_local((VEC,), "float32")
            base = (b * THREADS + tx) * VEC
            if base + VEC <= n:
                for j in T.vectorized(VEC):
                    a[j] = WH[base + j]
                for j in T.vectorized(VEC):
                    c[j] = WE[base + j]
                for j in T.unroll(VEC):
                    y[j] = T.cast(a[j], "float32") * T.cast(c[j], "float32")
                for h in T.unroll(VEC // 4):
                    for j in T.vectorized(4):
                        W[base + h * 4 + j] = y[h * 4 + j]
            else:
                for j in T.serial(VEC):
                    if base + j < n:
                        W[base + j] = T.cast(WH[base + j], "float32") * T.cast(WE[base + j], "float32")

    return fused_weight_kernel
