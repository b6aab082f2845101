"""mhc_post, as TileLang factories (build time only); m (up to the variant's max_mult, whose
register arrays it sizes) and every size at run time.

Forward: a thread an 8-column vector of a token, flat over the tokens' vectors (every CTA full
whatever the hidden size: 254.0-255.6 us against 262.7-263.2 for a grid of tokens x column blocks
at 8192 x 4 x 7168, 146.3 against 152.7-153.0 at 8192 x 4 x 4096; H200 session 15), the m residual
vectors in registers; out[o] = post[o] * x, then + comb[i, o] * residual[i] for i in order (fp32,
each term added by a fused multiply-add: 265-267 us against 277.5-277.7 with every product
rounded at 8192 x 4 x 7168, H200 session 11), rounded to bf16 once:
tilebake.torch.mhc.mhc_post_ref's arithmetic.
Backward: G warps a token (the variant's token_warps: 1, or 4 = the CTA, for hidden sizes from
mhc_post.WIDE_ROWS), their lanes over the columns (8 a lane a step), each step's loads issued
before any use, the token's mixes held in registers for m <= 4 (reloaded a step: 421-423 us
against 412-415 at 8192 x 4 x 7168, H200 session 13). d_x = sum_o post[o] d_o[o] and
d_residual[i] = sum_o comb[i, o] d_o[o] likewise per vector; each lane sums x . d_o[o] and
residual[i] . d_o[o] over its columns, a butterfly in each warp (and for G > 1 the token's warps'
sums in order through shared memory) gives d_post[o] and d_comb[i, o] (a fixed order for a
variant: two runs give the same bits). H200 session 14 at 8192 x 4 x 7168: a CTA a token 401.9-403.5
us against 413.6-414.3 for a warp a token (whose last tokens' 28-step runs were a tail); one kernel
with a run-time warp count 468-470 us (its guards split per statement).
"""

import tilelang.language as T

from tilebake.mhc._common import VEC
from tilebake.mhc.mhc_post import MhcPostVariant

THREADS = 128
WARPS = THREADS // 32
PASS_CONFIGS = {"tl.disable_safe_memory_legalize": True}  # whole vectors: the host checks hidden % VEC


def build(v: MhcPostVariant):
    return _forward(v.max_mult) if v.direction == "fwd" else _backward(v.max_mult, v.token_warps)


def _forward(MAX_M):
    n = T.dynamic("num_tokens")
    m = T.dynamic("mhc_mult")
    h = T.dynamic("hidden")

    @T.prim_func
    def mhc_post_fwd_kernel(
        X: T.Tensor((n, h), "bfloat16"),
        R: T.Tensor((n, m, h), "bfloat16"),
        POST: T.Tensor((n, m), "float32"),
        COMB: T.Tensor((n, m, m), "float32"),
        OUT: T.Tensor((n, m, h), "bfloat16"),
    ):
        with T.Kernel(T.ceildiv(n * (h // VEC), THREADS), threads=THREADS) as b:
            tx = T.get_thread_binding(0)
            T.assume(h % VEC == 0)
            xs = T.alloc_local((VEC,), "bfloat16")
            rs = T.alloc_local((MAX_M, VEC), "bfloat16")
            acc = T.alloc_local((VEC,), "float32")
            ys = T.alloc_local((VEC,), "bfloat16")
            e = T.alloc_var("int32")
            t = T.alloc_var("int32")
            vec = T.alloc_var("int32")
            e = b * THREADS + tx  # flat over the tokens' vectors: every CTA full whatever the hidden size
            t = T.truncdiv(e, h // VEC)
            vec = e - t * (h // VEC)
            if t < n:
                for j in T.vectorized(VEC):
                    xs[j] = X[t, vec * VEC + j]
                for i in T.unroll(MAX_M):
                    if i < m:
                        for j in T.vectorized(VEC):
                            rs[i, j] = R[t, i, vec * VEC + j]
                for o in T.serial(m):
                    post = POST[t, o]
                    for j in T.unroll(VEC):
                        acc[j] = T.ieee_mul(post, T.cast(xs[j], "float32"))
                    for i in T.unroll(MAX_M):
                        if i < m:
                            comb = COMB[t, i, o]
                            for j in T.unroll(VEC):
                                acc[j] = T.ieee_fmaf(comb, T.cast(rs[i, j], "float32"), acc[j])
                    for j in T.unroll(VEC):
                        ys[j] = T.cast(acc[j], "bfloat16")
                    for j in T.vectorized(VEC):
                        OUT[t, o, vec * VEC + j] = ys[j]

    return mhc_post_fwd_kernel


def _backward(MAX_M, G):
    n = T.dynamic("num_tokens")
    m = T.dynamic("mhc_mult")
    h = T.dynamic("hidden")

    HOIST = MAX_M <= 4  # the token's mixes in registers (m <= 4: 20 of them) rather than reloaded a step

    @T.macro
    def mix_sum(W, wr, t, r, gs, acc, mhc_mult):  # (named as the kernel's size: TileLang names it after this)
        """acc = sum over o in order of W[t, r, o] * gs[o] (W: POST with r = None, or COMB; wr: the
        token's mixes in registers, row r or MAX_M for POST, when HOIST)."""
        for o in T.unroll(MAX_M):
            if o == 0 or o < mhc_mult:
                if HOIST:
                    w = wr[MAX_M if r is None else r, o]
                else:
                    w = W[t, o] if r is None else W[t, r, o]
                if o == 0:
                    for j in T.unroll(VEC):
                        acc[j] = T.ieee_mul(w, T.cast(gs[0, j], "float32"))
                else:
                    for j in T.unroll(VEC):
                        acc[j] = T.ieee_add(acc[j], T.ieee_mul(w, T.cast(gs[o, j], "float32")))

    @T.macro
    def walk(X, R, POST, COMB, DO, DX, DR, t, share, lane, xs, rs, gs, acc, ys, part, wr, mhc_mult, hidden):
        """The token's columns of this warp's share: its vectors' d_x and d_residual, and the lane's
        part sums (arguments named as the kernel's: TileLang names them after these)."""
        if HOIST:
            for r in T.unroll(MAX_M + 1):
                for o in T.unroll(MAX_M):
                    if (r < mhc_mult or r == MAX_M) and o < mhc_mult:
                        wr[r, o] = POST[t, o] if r == MAX_M else COMB[t, r, o]
        for p in T.serial(T.ceildiv(hidden, G * 32 * VEC)):
            c = ((p * G + share) * 32 + lane) * VEC
            if c < hidden:
                for j in T.vectorized(VEC):
                    xs[j] = X[t, c + j]
                for o in T.unroll(MAX_M):
                    if o < mhc_mult:
                        for j in T.vectorized(VEC):
                            gs[o, j] = DO[t, o, c + j]
                for i in T.unroll(MAX_M):  # every load of the step before any use: one DRAM latency a step
                    if i < mhc_mult:
                        for j in T.vectorized(VEC):
                            rs[i, j] = R[t, i, c + j]
                mix_sum(POST, wr, t, None, gs, acc, mhc_mult)
                for j in T.unroll(VEC):
                    ys[j] = T.cast(acc[j], "bfloat16")
                for j in T.vectorized(VEC):
                    DX[t, c + j] = ys[j]
                for o in T.unroll(MAX_M):
                    if o < mhc_mult:
                        for j in T.unroll(VEC):
                            part[MAX_M, o] = part[MAX_M, o] + T.cast(xs[j], "float32") * T.cast(gs[o, j], "float32")
                for i in T.unroll(MAX_M):
                    if i < mhc_mult:
                        mix_sum(COMB, wr, t, i, gs, acc, mhc_mult)
                        for j in T.unroll(VEC):
                            ys[j] = T.cast(acc[j], "bfloat16")
                        for j in T.vectorized(VEC):
                            DR[t, i, c + j] = ys[j]
                        for o in T.unroll(MAX_M):
                            if o < mhc_mult:
                                for j in T.unroll(VEC):
                                    part[i, o] = part[i, o] + T.cast(rs[i, j], "float32") * T.cast(gs[o, j], "float32")

    @T.prim_func
    def mhc_post_bwd_kernel(
        X: T.Tensor((n, h), "bfloat16"),
        R: T.Tensor((n, m, h), "bfloat16"),
        POST: T.Tensor((n, m), "float32"),
        COMB: T.Tensor((n, m, m), "float32"),
        DO: T.Tensor((n, m, h), "bfloat16"),
        DX: T.Tensor((n, h), "bfloat16"),
        DR: T.Tensor((n, m, h), "bfloat16"),
        DPOST: T.Tensor((n, m), "float32"),
        DCOMB: T.Tensor((n, m, m), "float32"),
    ):
        with T.Kernel(T.ceildiv(n * G, WARPS), threads=THREADS) as b:
            tx = T.get_thread_binding(0)
            T.assume(h % VEC == 0)
            lane = tx % 32
            warp = tx // 32
            # the warp's token and its share of the token's columns (G divides WARPS)
            t = b * (WARPS // G) + warp // G
            share = warp % G
            xs = T.alloc_local((VEC,), "bfloat16")
            rs = T.alloc_local((MAX_M, VEC), "bfloat16")
            gs = T.alloc_local((MAX_M, VEC), "bfloat16")
            acc = T.alloc_local((VEC,), "float32")
            ys = T.alloc_local((VEC,), "bfloat16")
            # part[i, o]: residual[i] . d_o[o] (i < MAX_M), part[MAX_M, o]: x . d_o[o]
            part = T.alloc_local((MAX_M + 1, MAX_M), "float32")
            red = T.alloc_shared((WARPS, (MAX_M + 1) * MAX_M), "float32")  # the warps' sums (G > 1)
            for r in T.unroll(MAX_M + 1):
                for o in T.unroll(MAX_M):
                    part[r, o] = T.float32(0)
            wr = T.alloc_local((MAX_M + 1, MAX_M), "float32")  # [i, o]: comb[i, o]; [MAX_M, o]: post[o]
            args = (X, R, POST, COMB, DO, DX, DR, t, share, lane, xs, rs, gs, acc, ys, part, wr, m, h)
            if G == 1:
                if t < n:  # (the last CTA's warps past the tokens)
                    walk(*args)
            else:
                walk(*args)  # a CTA a token
            # the token's sums: a butterfly in each warp, then its warps' sums in share order (a
            # fixed order: two runs give the same bits); a warp a token stores its own (no barrier,
            # so a token's reduction never stalls another's loads)
            for r in T.unroll(MAX_M + 1):
                for o in T.unroll(MAX_M):
                    if (r < m or r == MAX_M) and o < m:
                        for s in T.unroll(5):
                            part[r, o] = part[r, o] + T.shfl_xor(part[r, o], 16 >> s)
                        if G == 1:
                            if lane == 0 and t < n:
                                if r == MAX_M:
                                    DPOST[t, o] = part[r, o]
                                else:
                                    DCOMB[t, r, o] = part[r, o]
                        elif lane == 0:
                            red[warp, r * MAX_M + o] = part[r, o]
            if G > 1:
                T.sync_threads()
                NR = (MAX_M + 1) * MAX_M
                for e in T.unroll(-(-NR // (G * 32))):  # the token's threads take its sums in turn
                    k = e * G * 32 + share * 32 + lane
                    if t < n and k < NR:
                        total = T.alloc_var("float32")
                        total = red[warp - share, k]
                        for w in T.unroll(G - 1):
                            total = total + red[warp - share + w + 1, k]
                        if k // MAX_M == MAX_M and k % MAX_M < m:
                            DPOST[t, k % MAX_M] = total
                        elif k // MAX_M < m and k % MAX_M < m:
                            DCOMB[t, k // MAX_M, k % MAX_M] = total

    return mhc_post_bwd_kernel
