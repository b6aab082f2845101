"""Routing-weight normalisation, as a TileLang factory (build time only).

A thread per token: denominator = ((1e-20 + w[0]) + w[1]) + ... + w[k-1] in fp32, left to right,
then normalized[j] = w[j] / denominator (IEEE division: nvcc's default -prec-div=true; no fast
math). The same operations in the same order as tilebake.torch.normalize_weight, so the bytes
are equal. The thread's k <= 32 weights sit in registers (loads guarded by j < k).
"""

import tilelang.language as T

from tilebake.moe.normalize_weight import NormalizeWeightVariant

THREADS = 256
MAX_TOPK = 32  # as src/tilebake/moe/normalize_weight.py checks
DENOMINATOR_START = 1e-20  # as tilebake.torch.moe.DENOMINATOR_START, rounded to fp32


def build(v: NormalizeWeightVariant):
    num_tokens = T.dynamic("num_tokens")
    num_topk = T.dynamic("num_topk")
    w_stride = T.dynamic("w_stride")

    @T.prim_func
    def normalize_weight_kernel(
        W: T.StridedTensor((num_tokens, num_topk), (w_stride, 1), "float32"),
        D: T.Tensor((num_tokens,), "float32"),
        N: T.Tensor((num_tokens, num_topk), "float32"),
    ):
        with T.Kernel(T.ceildiv(num_tokens, THREADS), threads=THREADS) as b:
            tx = T.get_thread_binding(0)
            t = T.alloc_var("int32")
            t = b * THREADS + tx
            w = T.alloc_local((MAX_TOPK,), "float32")
            den = T.alloc_var("float32")
            if t < num_tokens:
                # Every load issued before the first add (a runtime-length loop would wait on each).
                for j in T.unroll(MAX_TOPK):
                    if j < num_topk:
                        w[j] = W[t, j]
                den = T.float32(DENOMINATOR_START)
                for j in T.unroll(MAX_TOPK):
                    if j < num_topk:
                        den = den + w[j]
                D[t] = den
                for j in T.unroll(MAX_TOPK):
                    if j < num_topk:
                        N[t, j] = w[j] / den

    return normalize_weight_kernel
