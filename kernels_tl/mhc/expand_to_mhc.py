"""expand_to_mhc: the forward broadcasts each 8-column vector of x to the m streams; the
backward sums the m streams' vectors in fp32, in stream order (the first one loaded as is, so a
single stream's -0.0 stays -0.0), rounded to bf16 once. The forward: a thread VPT vectors of the
flattened (tokens x hidden / 8) vectors, loaded before any store; the backward: a thread a vector
(its m streams' loads all issued before the first add: 142.1 us at 8192 x 4 x 7168 against 156.9
for a loop over the run-time m, 2026-12-03 session10/call2), a CTA a token's THREADS vectors (grid:
tokens x column blocks; the flattened two-vector form measured 6% slower there,
bench/results/2026-12-02-NVIDIA-H200/session7/). As TileLang factories (build time only).
"""

import tilelang.language as T

from tilebake.mhc._common import MAX_MHC_MULT, VEC
from tilebake.mhc.expand_to_mhc import ExpandToMhcVariant

THREADS = 128
VPT = 2  # vectors a thread, of the flattened (tokens x hidden / 8) vectors: no thread idles on short rows
PASS_CONFIGS = {"tl.disable_safe_memory_legalize": True}  # whole vectors: the host checks hidden % VEC


def build(v: ExpandToMhcVariant):
    n = T.dynamic("num_tokens")
    m = T.dynamic("mhc_mult")
    h = T.dynamic("hidden")
    hv = h // VEC

    if v.direction == "fwd":

        @T.prim_func
        def expand_to_mhc_fwd_kernel(X: T.Tensor((n, h), "bfloat16"), O: T.Tensor((n, m, h), "bfloat16")):
            with T.Kernel(T.ceildiv(n * hv, THREADS * VPT), threads=THREADS) as b:
                tx = T.get_thread_binding(0)
                T.assume(h % VEC == 0)
                xs = T.alloc_local((VPT, VEC), "bfloat16")
                for u in T.unroll(VPT):
                    e = (b * VPT + u) * THREADS + tx
                    if e < n * hv:
                        for j in T.vectorized(VEC):
                            xs[u, j] = X[e // hv, e % hv * VEC + j]
                for u in T.unroll(VPT):
                    e = (b * VPT + u) * THREADS + tx
                    if e < n * hv:
                        for i in T.serial(m):
                            for j in T.vectorized(VEC):
                                O[e // hv, i, e % hv * VEC + j] = xs[u, j]

        return expand_to_mhc_fwd_kernel

    @T.prim_func
    def expand_to_mhc_bwd_kernel(OG: T.Tensor((n, m, h), "bfloat16"), XG: T.Tensor((n, h), "bfloat16")):
        with T.Kernel(n, T.ceildiv(h, THREADS * VEC), threads=THREADS) as (t, b):
            tx = T.get_thread_binding(0)
            T.assume(h % VEC == 0)
            gs = T.alloc_local((MAX_MHC_MULT, VEC), "bfloat16")
            acc = T.alloc_local((VEC,), "float32")
            ys = T.alloc_local((VEC,), "bfloat16")
            # the thread's vector, a variable: vec * VEC + j then stays one 32-bit term of the
            # addresses (from (b * THREADS + tx) * VEC, TileLang widens each term to 64 bits and nvcc
            # splits the 16-byte store into four 4-byte ones)
            vec = T.alloc_var("int32")
            vec = b * THREADS + tx
            if vec * VEC < h:
                # every stream's vector in flight before the first add (a loop over the run-time m
                # issued one load per add)
                for i in T.unroll(MAX_MHC_MULT):
                    if i < m:
                        for j in T.vectorized(VEC):
                            gs[i, j] = OG[t, i, vec * VEC + j]
                for j in T.unroll(VEC):
                    acc[j] = T.cast(gs[0, j], "float32")
                for i in T.unroll(MAX_MHC_MULT - 1):
                    if i + 1 < m:
                        for j in T.unroll(VEC):
                            acc[j] = T.ieee_add(acc[j], T.cast(gs[i + 1, j], "float32"))
                for j in T.unroll(VEC):
                    ys[j] = T.cast(acc[j], "bfloat16")
                for j in T.vectorized(VEC):
                    XG[t, vec * VEC + j] = ys[j]

    return expand_to_mhc_bwd_kernel
