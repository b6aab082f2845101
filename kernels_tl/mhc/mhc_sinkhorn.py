"""mhc_sinkhorn, as TileLang factories (build time only): a thread a matrix element, each token a
slot of max_mult^2 threads (element (i, j) at i * max_mult + j), 64 threads a CTA (4 tokens at
max_mult 4, 1 at 8); m, repeat and eps at run time. Threads past m or past the tokens compute on
zeros and store nothing, but take part in every exchange.

A sum over a row or a column gathers its m values from the threads holding them: a row lies in
one warp (shuffles), and so does a column at max_mult 4; at 8 a column spans the CTA's two warps
(a shared buffer and a barrier, the buffer alternating so that one barrier an exchange is enough).
Every thread of a row (column) sums the same values in the same order: no broadcast is needed.

Arithmetic (tilebake.torch.mhc.sinkhorn_ordered_ref's, but the exponential and the steps'
quotients): row max, e = exp(x - max), p = e / (row sum) + eps (IEEE division); then per step
x / (sum + eps) by div.approx (within 2 ulp: the IEEE division's slow-path check and branch were
most of a step's latency; H200 session 15 at 512 tokens, repeat 10: forward 2.4 us against 2.6,
backward 5.2-5.3 against 5.9), sums in index order, every sum and product rounded on its own
(T.ieee_*: no fused multiply-adds). Within the original's tolerance (rtol 1e-5, atol 1e-6) of the
float64 reference; the Sinkhorn of kernels_tl/mhc/mhc_pre_big_fuse.py shares these macros.
Backward (sinkhorn_bwd_ordered_ref's, the quotients as above): the forward recomputed from x, each thread keeping its
element of the input of each normalisation and its divisor in shared memory (SLOTS steps; past
them, i.e. repeat > 12, one input per segment of ceil((2 repeat - 1) / SLOTS) steps, the rest
recomputed from it); then in reverse g = (g - sum(g * y)) / d for y = x / d (the step's output),
and the softmax's p * (g - sum(g * p)).
"""

import types

import tilelang.language as T

from tilebake.mhc.mhc_sinkhorn import SLOTS, MhcSinkhornVariant

THREADS = 64
# Barriers by hand: the exchange buffer's are below; the saved steps are each thread's own.
PASS_CONFIGS = {"tl.disable_thread_storage_sync": True}


def build(v: MhcSinkhornVariant):
    return _kernel(v.max_mult, v.direction == "bwd")


def sinkhorn_ops(MM: int, m):
    """The forward's arithmetic as macros, a token a slot of MM * MM threads (element (i, j) at
    slot offset i * MM + j; m the run-time stream count): fold / divisor as below, softmax(x, ...)
    (x this thread's element, 0 past the matrix) and normalize(a, repeat, ...), the 2 repeat - 1
    steps after it. Shared with kernels_tl/mhc/mhc_pre_big_fuse.py, whose Sinkhorn gives this
    kernel's bits."""
    NN = MM * MM
    SPLIT = NN > 32  # a column spans warps: exchanged through xbuf, (2, the CTA's threads)

    @T.macro
    def peer(v, k, col, tx, xbuf, par):
        """The v of the token's element (k, j) (col) or (i, k), this thread's being (i, j)."""
        if col and SPLIT:
            return xbuf[par, tx - (tx % NN) // MM * MM + k * MM]
        elif col:
            return T.shfl_sync(v, tx % 32 - (tx % NN) // MM * MM + k * MM)
        else:
            return T.shfl_sync(v, tx % 32 - tx % MM + k)

    @T.macro
    def fold(v, col, op, tx, xbuf, par: T.Ref):
        """v_0 op v_1 op ... op v_(m-1) in index order over the column (col) or row of this
        thread's element; op "add", "max" or "add0" (the sum from 0.0)."""
        if col and SPLIT:
            par = 1 - par
            xbuf[par, tx] = v
            T.sync_threads()
        # every value fetched first (those past m too: still in the token's slot), so that the
        # shuffles or loads are all in flight before the sum
        w = T.alloc_local((MM,), "float32")
        for k in T.unroll(MM):
            w[k] = peer(v, k, col, tx, xbuf, par)
        acc = T.alloc_var("float32")
        acc = w[0]
        if op == "add0":
            acc = T.ieee_add(T.float32(0), acc)
        for k in T.unroll(MM - 1):
            if k + 1 < m:
                if op == "max":
                    acc = T.max(acc, w[k + 1])
                else:
                    acc = T.ieee_add(acc, w[k + 1])
        return acc

    @T.macro
    def divisor(v, s, eps, tx, xbuf, par: T.Ref):
        """The divisor of step s at this thread's element: its column (s even) or row sum + eps."""
        d = T.alloc_var("float32")
        if s % 2 == 0:
            d = fold(v, True, "add", tx, xbuf, par)
        else:
            d = fold(v, False, "add", tx, xbuf, par)
        return T.ieee_add(d, eps)

    @T.macro
    def softmax(x, eps, a: T.Ref, p: T.Ref, tx, xbuf, par: T.Ref):
        """p = this element of the rows' softmax of the token's x (0 past the matrix); a = p + eps."""
        e = T.alloc_var("float32")
        e = T.exp(T.ieee_sub(x, fold(x, False, "max", tx, xbuf, par)))
        p = T.ieee_fdiv(e, fold(e, False, "add", tx, xbuf, par))
        a = T.ieee_add(p, eps)

    @T.macro
    def normalize(a: T.Ref, repeat, eps, tx, xbuf, par: T.Ref):
        for s in T.serial(2 * repeat - 1):
            a = quotient(a, divisor(a, s, eps, tx, xbuf, par))

    return types.SimpleNamespace(fold=fold, divisor=divisor, softmax=softmax, normalize=normalize)


def quotient(a, d):
    """a / d in the normalisation steps (forward and backward): div.approx, within 2 ulp for d in
    [2^-126, 2^126] (d = a sum of probabilities + eps), no slow-path branch."""
    return T.call_extern("float32", "__fdividef", a, d)


def _kernel(MM: int, backward: bool):
    n = T.dynamic("num_tokens")
    m = T.dynamic("mhc_mult")
    NN = MM * MM
    TOKENS = THREADS // NN  # a CTA's
    SPLIT = NN > 32
    ops = sinkhorn_ops(MM, m)
    fold, divisor = ops.fold, ops.divisor

    @T.macro
    def load_softmax(X, t, i, j, eps, a: T.Ref, p: T.Ref, tx, xbuf, par: T.Ref):
        x = T.alloc_var("float32")
        x = T.float32(0)
        if t < n and i < m and j < m:
            x = X[t, i, j]
        ops.softmax(x, eps, a, p, tx, xbuf, par)

    if not backward:

        @T.prim_func
        def mhc_sinkhorn_fwd_kernel(
            X: T.Tensor((n, m, m), "float32"),
            OUT: T.Tensor((n, m, m), "float32"),
            repeat: T.int32,
            eps: T.float32,
        ):
            with T.Kernel(T.ceildiv(n, TOKENS), threads=THREADS) as b:
                tx = T.get_thread_binding(0)
                xbuf = T.alloc_shared((2, THREADS if SPLIT else 1), "float32")
                par = T.alloc_var("int32")
                a = T.alloc_var("float32")
                p = T.alloc_var("float32")
                par = 0
                t = b * TOKENS + tx // NN
                i = (tx % NN) // MM
                j = tx % MM
                load_softmax(X, t, i, j, eps, a, p, tx, xbuf, par)
                ops.normalize(a, repeat, eps, tx, xbuf, par)
                if t < n and i < m and j < m:
                    OUT[t, i, j] = a

        return mhc_sinkhorn_fwd_kernel

    @T.prim_func
    def mhc_sinkhorn_bwd_kernel(
        G: T.Tensor((n, m, m), "float32"),
        X: T.Tensor((n, m, m), "float32"),
        GI: T.Tensor((n, m, m), "float32"),
        repeat: T.int32,
        eps: T.float32,
    ):
        with T.Kernel(T.ceildiv(n, TOKENS), threads=THREADS) as b:
            tx = T.get_thread_binding(0)
            xbuf = T.alloc_shared((2, THREADS if SPLIT else 1), "float32")
            inputs = T.alloc_shared((SLOTS, THREADS), "float32")  # step k * seg's input at k
            divisors = T.alloc_shared((SLOTS, THREADS), "float32")  # and its divisor (read at seg 1)
            par = T.alloc_var("int32")
            a = T.alloc_var("float32")
            p = T.alloc_var("float32")
            d = T.alloc_var("float32")
            y = T.alloc_var("float32")
            g = T.alloc_var("float32")
            c = T.alloc_var("float32")
            par = 0
            t = b * TOKENS + tx // NN
            i = (tx % NN) // MM
            j = tx % MM
            steps = 2 * repeat - 1
            seg = T.alloc_var("int32")  # steps a stored input covers: 1 up to repeat = 12
            seg = T.ceildiv(steps, SLOTS)
            # step s = k * seg + r: counters, no division a step
            k = T.alloc_var("int32")
            r = T.alloc_var("int32")
            k = 0
            r = 0
            g = T.float32(0)
            if t < n and i < m and j < m:
                g = G[t, i, j]  # loaded first: its latency hidden by the forward
            load_softmax(X, t, i, j, eps, a, p, tx, xbuf, par)
            for s in T.serial(steps):
                d = divisor(a, s, eps, tx, xbuf, par)
                if r == 0:
                    inputs[k, tx] = a
                    divisors[k, tx] = d
                r = r + 1
                if r == seg:
                    k = k + 1
                    r = 0
                a = quotient(a, d)
            y = a  # the output of the last step
            k = (steps - 1) // seg
            r = (steps - 1) % seg
            for q in T.serial(steps):
                s = steps - 1 - q
                # (y, d) = the output and divisor of step s: stored (seg 1: k = s), or recomputed
                # from its segment's input (seg is the same in every thread: so is the branch)
                if seg == 1:
                    d = divisors[k, tx]
                    c = inputs[k, tx]  # step s's input: step s - 1's output (loaded early)
                else:
                    c = inputs[k, tx]
                    for u in T.serial(r):
                        c = quotient(c, divisor(c, s - r + u, eps, tx, xbuf, par))
                    d = divisor(c, s, eps, tx, xbuf, par)
                    y = quotient(c, d)
                if s % 2 == 0:
                    g = quotient(T.ieee_sub(g, fold(T.ieee_mul(g, y), True, "add0", tx, xbuf, par)), d)
                else:
                    g = quotient(T.ieee_sub(g, fold(T.ieee_mul(g, y), False, "add0", tx, xbuf, par)), d)
                if seg == 1:
                    y = c
                if r == 0:
                    k = k - 1
                    r = seg
                r = r - 1
            # the softmax: p * (g - sum over the row of g * p)
            g = T.ieee_mul(p, T.ieee_sub(g, fold(T.ieee_mul(g, p), False, "add0", tx, xbuf, par)))
            if t < n and i < m and j < m:
                GI[t, i, j] = g

    return mhc_sinkhorn_bwd_kernel
