"""mhc_sinkhorn_fwd / _bwd for Ascend 950 (build time only), read from
tilebake.mhc.mhc_sinkhorn.MhcSinkhornAscendVariant: tilebake.torch.mhc.sinkhorn_ordered_ref and
sinkhorn_bwd_ordered_ref's arithmetic (sums in index order, IEEE divisions x / (sum + eps); the
exponential the one thing not bit-exact), m, repeat and eps at run time.

A SIMT thread a token (its (m, m) matrix read from and written to GM by the thread, kept in
registers): a block per vector core, each taking steps core, core + num_vec_cores, ... of THREADS
tokens. The backward recomputes each step's input from the softmax forward (2 repeat - 1 steps,
so repeat^2 m^2 work a token) rather than keeping 2 repeat - 1 matrices. Built and lowered here,
never run on an NPU: checked on the CPU by tests/ascend/test_emulated_mhc.py.
"""

import tilelang.ascend.language as T

from tilebake.mhc._common import MAX_MHC_MULT
from tilebake.mhc.mhc_sinkhorn import MhcSinkhornAscendVariant

M = MAX_MHC_MULT
THREADS = 32


def build(v: MhcSinkhornAscendVariant):
    n = T.dynamic("num_tokens")
    m = T.dynamic("mhc_mult")
    CORES = v.num_vec_cores

    @T.macro
    def softmax_plus_eps(X, t, eps, p, cur):
        """p = the rows' softmax of token t's matrix (max subtracted, true division), cur = p + eps
        (m is the kernel's own size: a macro argument would rename it)."""
        mx = T.alloc_var("float32")
        s = T.alloc_var("float32")
        for i in T.serial(m):
            mx = X[t, i, 0]
            for j in T.serial(m - 1):
                mx = T.max(mx, X[t, i, j + 1])
            for j in T.serial(m):
                p[i * M + j] = T.exp(X[t, i, j] - mx)
            s = p[i * M]
            for j in T.serial(m - 1):
                s = s + p[i * M + j + 1]
            for j in T.serial(m):
                p[i * M + j] = p[i * M + j] / s
                cur[i * M + j] = p[i * M + j] + eps

    @T.macro
    def normalize(cur, step, eps, d: T.Ref):
        """One Sinkhorn step: columns (step even) or rows (step odd) divided by their sum + eps."""
        for a in T.serial(m):
            d = cur[T.if_then_else(step % 2 == 0, a, a * M)]
            for b in T.serial(m - 1):
                d = d + cur[T.if_then_else(step % 2 == 0, (b + 1) * M + a, a * M + b + 1)]
            d = d + eps
            for b in T.serial(m):
                cur[T.if_then_else(step % 2 == 0, b * M + a, a * M + b)] = cur[T.if_then_else(step % 2 == 0, b * M + a, a * M + b)] / d

    if v.direction == "fwd":

        @T.prim_func
        def mhc_sinkhorn_fwd_kernel(
            X: T.Tensor((n, m, m), "float32"),
            OUT: T.Tensor((n, m, m), "float32"),
            repeat: T.int32,
            eps: T.float32,
        ):
            with T.Kernel(CORES) as core:
                for r in T.serial(T.ceildiv(T.ceildiv(n, THREADS) - core, CORES)):
                    with T.SimtVF(threads=THREADS):
                        t = (core + r * CORES) * THREADS + T.get_thread_binding()
                        p = T.alloc_local((M * M,), "float32")
                        cur = T.alloc_local((M * M,), "float32")
                        d = T.alloc_var("float32")
                        if t < n:
                            softmax_plus_eps(X, t, eps, p, cur)
                            for s in T.serial(2 * repeat - 1):
                                normalize(cur, s, eps, d)
                            for i in T.serial(m):
                                for j in T.serial(m):
                                    OUT[t, i, j] = cur[i * M + j]

        return mhc_sinkhorn_fwd_kernel

    @T.prim_func
    def mhc_sinkhorn_bwd_kernel(
        G: T.Tensor((n, m, m), "float32"),
        X: T.Tensor((n, m, m), "float32"),
        GI: T.Tensor((n, m, m), "float32"),
        repeat: T.int32,
        eps: T.float32,
    ):
        with T.Kernel(CORES) as core:
            for r in T.serial(T.ceildiv(T.ceildiv(n, THREADS) - core, CORES)):
                with T.SimtVF(threads=THREADS):
                    t = (core + r * CORES) * THREADS + T.get_thread_binding()
                    p = T.alloc_local((M * M,), "float32")
                    cur = T.alloc_local((M * M,), "float32")
                    g = T.alloc_local((M * M,), "float32")
                    d = T.alloc_var("float32")
                    acc = T.alloc_var("float32")
                    if t < n:
                        for i in T.serial(m):
                            for j in T.serial(m):
                                g[i * M + j] = G[t, i, j]
                        for back in T.serial(2 * repeat - 1):
                            step = 2 * repeat - 2 - back
                            softmax_plus_eps(X, t, eps, p, cur)  # the step's input, recomputed
                            for s in T.serial(step):
                                normalize(cur, s, eps, d)
                            for a in T.serial(m):  # g = (g - sum(g * x_in / d)) / d along the step's axis
                                d = cur[T.if_then_else(step % 2 == 0, a, a * M)]
                                for b in T.serial(m - 1):
                                    d = d + cur[T.if_then_else(step % 2 == 0, (b + 1) * M + a, a * M + b + 1)]
                                d = d + eps
                                acc = T.float32(0)
                                for b in T.serial(m):
                                    k = T.if_then_else(step % 2 == 0, b * M + a, a * M + b)
                                    acc = acc + g[k] * (cur[k] / d)
                                for b in T.serial(m):
                                    k = T.if_then_else(step % 2 == 0, b * M + a, a * M + b)
                                    g[k] = (g[k] - acc) / d
                        for i in T.serial(m):  # the softmax (p from the last recompute): p * (g - sum_row g p)
                            acc = T.float32(0)
                            for j in T.serial(m):
                                acc = acc + g[i * M + j] * p[i * M + j]
                            for j in T.serial(m):
                                GI[t, i, j] = p[i * M + j] * (g[i * M + j] - acc)

    return mhc_sinkhorn_bwd_kernel
