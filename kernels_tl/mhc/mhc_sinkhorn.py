"""mhc_sinkhorn, as TileLang factories (build time only): a thread a token (64 a CTA), its
(m, m) matrix in registers (arrays of max_mult^2, the entries past m skipped); m, repeat and eps
at run time.

Arithmetic (tilebake.torch.mhc.sinkhorn_ordered_ref's, bit for bit but the exponential): row max,
e = exp(x - max), p = e / (row sum) + eps; then per step x / (sum + eps), sums in index order,
every sum, product and quotient rounded on its own (T.ieee_*: no fused multiply-adds).
Backward (sinkhorn_bwd_ordered_ref): the forward recomputed from x, keeping the input of each
normalisation in a per-thread local array of SLOTS matrices (local memory: 2 * repeat - 1 of
them; past SLOTS, one checkpoint per segment of ceil((2 repeat - 1) / SLOTS) steps, the rest
recomputed from it); then in reverse g = (g - sum(g * y)) / d for y = x / d, and the softmax's
p * (g - sum(g * p)).
"""

import tilelang.language as T

from tilebake.mhc.mhc_sinkhorn import SLOTS, MhcSinkhornVariant

THREADS = 64


def build(v: MhcSinkhornVariant):
    return _kernel(v.max_mult, v.direction == "bwd")


def _kernel(MM: int, backward: bool):
    n = T.dynamic("num_tokens")
    m = T.dynamic("mhc_mult")
    NN = MM * MM

    @T.macro
    def softmax(X, t, eps, a, p, d):
        """p = the rows' softmax of X[t]; a = p + eps."""
        for i in T.unroll(MM):
            if i < m:
                for j in T.unroll(MM):
                    if j < m:
                        a[i * MM + j] = X[t, i, j]
                d[i] = a[i * MM]
                for j in T.unroll(MM - 1):
                    if j + 1 < m:
                        d[i] = T.max(d[i], a[i * MM + j + 1])
                for j in T.unroll(MM):
                    if j < m:
                        a[i * MM + j] = T.exp(T.ieee_sub(a[i * MM + j], d[i]))
                d[i] = a[i * MM]
                for j in T.unroll(MM - 1):
                    if j + 1 < m:
                        d[i] = T.ieee_add(d[i], a[i * MM + j + 1])
                for j in T.unroll(MM):
                    if j < m:
                        p[i * MM + j] = T.ieee_fdiv(a[i * MM + j], d[i])
                        a[i * MM + j] = T.ieee_add(p[i * MM + j], eps)

    @T.macro
    def sums(a, s, eps, d):
        """d = the column (s even) or row (s odd) sums of a, + eps, in index order."""
        for k in T.unroll(MM):
            if k < m:
                if s % 2 == 0:
                    d[k] = a[k]
                    for i in T.unroll(MM - 1):
                        if i + 1 < m:
                            d[k] = T.ieee_add(d[k], a[(i + 1) * MM + k])
                else:
                    d[k] = a[k * MM]
                    for j in T.unroll(MM - 1):
                        if j + 1 < m:
                            d[k] = T.ieee_add(d[k], a[k * MM + j + 1])
                d[k] = T.ieee_add(d[k], eps)

    @T.macro
    def normalise(a, s, eps, d):
        """Normalisation step s of a (in place): columns for even s, rows for odd."""
        sums(a, s, eps, d)
        # two loops, not one indexing d by the parity: a runtime index would put d in local memory
        if s % 2 == 0:
            for i in T.unroll(MM):
                for j in T.unroll(MM):
                    if i < m and j < m:
                        a[i * MM + j] = T.ieee_fdiv(a[i * MM + j], d[j])
        else:
            for i in T.unroll(MM):
                for j in T.unroll(MM):
                    if i < m and j < m:
                        a[i * MM + j] = T.ieee_fdiv(a[i * MM + j], d[i])

    if not backward:

        @T.prim_func
        def mhc_sinkhorn_fwd_kernel(
            X: T.Tensor((n, m, m), "float32"),
            OUT: T.Tensor((n, m, m), "float32"),
            repeat: T.int32,
            eps: T.float32,
        ):
            with T.Kernel(T.ceildiv(n, THREADS), threads=THREADS) as b:
                tx = T.get_thread_binding(0)
                a = T.alloc_local((NN,), "float32")
                p = T.alloc_local((NN,), "float32")
                d = T.alloc_local((MM,), "float32")
                t = b * THREADS + tx
                if t < n:
                    softmax(X, t, eps, a, p, d)
                    for s in T.serial(2 * repeat - 1):
                        normalise(a, s, eps, d)
                    for i in T.unroll(MM):
                        for j in T.unroll(MM):
                            if i < m and j < m:
                                OUT[t, i, j] = a[i * MM + j]

        return mhc_sinkhorn_fwd_kernel

    @T.prim_func
    def mhc_sinkhorn_bwd_kernel(
        G: T.Tensor((n, m, m), "float32"),
        X: T.Tensor((n, m, m), "float32"),
        GI: T.Tensor((n, m, m), "float32"),
        repeat: T.int32,
        eps: T.float32,
    ):
        with T.Kernel(T.ceildiv(n, THREADS), threads=THREADS) as b:
            tx = T.get_thread_binding(0)
            a = T.alloc_local((NN,), "float32")
            p = T.alloc_local((NN,), "float32")
            g = T.alloc_local((NN,), "float32")
            d = T.alloc_local((MM,), "float32")
            r = T.alloc_local((MM,), "float32")
            saved = T.alloc_local((SLOTS * NN,), "float32")
            t = b * THREADS + tx
            steps = 2 * repeat - 1
            seg = T.ceildiv(steps, SLOTS)  # steps a checkpoint covers: 1 up to repeat = 12
            if t < n:
                softmax(X, t, eps, a, p, d)
                for s in T.serial(steps):
                    if s % seg == 0:
                        for e in T.unroll(NN):
                            saved[(s // seg) * NN + e] = a[e]
                    normalise(a, s, eps, d)
                for i in T.unroll(MM):
                    for j in T.unroll(MM):
                        g[i * MM + j] = T.float32(0)
                        if i < m and j < m:
                            g[i * MM + j] = G[t, i, j]
                for q in T.serial(steps):
                    s = steps - 1 - q
                    # a = the input of step s: its segment's checkpoint, advanced to s
                    for e in T.unroll(NN):
                        a[e] = saved[(s // seg) * NN + e]
                    for u in T.serial(s % seg):
                        normalise(a, s - s % seg + u, eps, d)
                    sums(a, s, eps, d)
                    # r = sum over the step's axis of g * y, y = a / d
                    for k in T.unroll(MM):
                        r[k] = T.float32(0)
                    for i in T.unroll(MM):
                        for j in T.unroll(MM):
                            if i < m and j < m:
                                if s % 2 == 0:
                                    r[j] = T.ieee_add(r[j], T.ieee_mul(g[i * MM + j], T.ieee_fdiv(a[i * MM + j], d[j])))
                                else:
                                    r[i] = T.ieee_add(r[i], T.ieee_mul(g[i * MM + j], T.ieee_fdiv(a[i * MM + j], d[i])))
                    if s % 2 == 0:
                        for i in T.unroll(MM):
                            for j in T.unroll(MM):
                                if i < m and j < m:
                                    g[i * MM + j] = T.ieee_fdiv(T.ieee_sub(g[i * MM + j], r[j]), d[j])
                    else:
                        for i in T.unroll(MM):
                            for j in T.unroll(MM):
                                if i < m and j < m:
                                    g[i * MM + j] = T.ieee_fdiv(T.ieee_sub(g[i * MM + j], r[i]), d[i])
                # the softmax: p * (g - sum over the row of g * p)
                for i in T.unroll(MM):
                    if i < m:
                        r[i] = T.float32(0)
                        for j in T.unroll(MM):
                            if j < m:
                                r[i] = T.ieee_add(r[i], T.ieee_mul(g[i * MM + j], p[i * MM + j]))
                        for j in T.unroll(MM):
                            if j < m:
                                GI[t, i, j] = T.ieee_mul(p[i * MM + j], T.ieee_sub(g[i * MM + j], r[i]))

    return mhc_sinkhorn_bwd_kernel
