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
mhc_post.WIDE_ROWS), their lanes over the columns (8 a lane a step). A step's vectors come by
cp.async into the lane's own slots of its warp's shared stages, the next step's issued before
this one's are read, so DRAM works while a step is computed (H200 session 16 at 8192 x 4 x 7168:
394.7-396.5 us against 404.2-406.5 with each step's loads into registers, issued before any use;
404.2-405.9 with the stages 64 but not 128 bytes aligned).
The token's mixes are held in registers for m <= 4 (reloaded a step: 421-423 us against 412-415,
H200 session 13). d_x = sum_o post[o] d_o[o] and
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
# Whole vectors (the host checks hidden % VEC). No barriers inserted and no shared buffer reused
# for another: each lane reads only the stage slots its own cp.async wrote, after its own wait,
# and the backward's one barrier (before its warps' sums are read) is explicit.
PASS_CONFIGS = {
    "tl.disable_safe_memory_legalize": True,
    "tl.disable_thread_storage_sync": True,
    "tl.disable_shared_memory_reuse": True,
}
# The backward's steps in flight a warp: 2 (a step's loads land while the one before is computed;
# 3 measured the same at 8192 x 4 x 7168 and slower at 4096 x 4 x 1280, H200 session 16)
STAGES = 2


def copy16(dst, src):
    """One lane's 16-byte vector global -> shared by cp.async (waited for by T.ptx_wait_group)."""
    return T.call_extern("handle", "tl::cp_async_gs<16>", T.address_of(dst), T.address_of(src))


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

    NR = (MAX_M + 1) * MAX_M  # a token's sums: d_comb's m x m and d_post's m (as MAX_M + 1 rows)
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

    NV = 1 + 2 * MAX_M  # a lane's vectors a step: x, d_o[0..MAX_M), residual[0..MAX_M)

    @T.macro
    def issue(X, R, DO, t, p, share, lane, stage, warp, mhc_mult, hidden):
        """Step p's vectors of the lane, global -> its own slots of the warp's stage p % STAGES by
        cp.async (one commit group a step, empty past the row: the groups stay counted alike)."""
        c = ((p * G + share) * 32 + lane) * VEC
        s = p % STAGES
        if c < hidden:
            copy16(stage[warp, s, 0, lane * VEC], X[t, c])
            for o in T.unroll(MAX_M):
                if o < mhc_mult:
                    copy16(stage[warp, s, 1 + o, lane * VEC], DO[t, o, c])
            for i in T.unroll(MAX_M):
                if i < mhc_mult:
                    copy16(stage[warp, s, 1 + MAX_M + i, lane * VEC], R[t, i, c])
        T.ptx_commit_group()

    @T.macro
    def walk(X, R, POST, COMB, DO, DX, DR, t, share, lane, xs, rs, gs, acc, ys, part, wr, stage, warp, mhc_mult, hidden):
        """The token's columns of this warp's share: its vectors' d_x and d_residual, and the lane's
        part sums (arguments named as the kernel's: TileLang names them after these). The next
        STAGES - 1 steps' loads are in flight (cp.async into shared memory, no registers) while a
        step is computed."""
        if HOIST:
            for r in T.unroll(MAX_M + 1):
                for o in T.unroll(MAX_M):
                    if (r < mhc_mult or r == MAX_M) and o < mhc_mult:
                        wr[r, o] = POST[t, o] if r == MAX_M else COMB[t, r, o]
        for q in T.unroll(STAGES - 1):
            issue(X, R, DO, t, q, share, lane, stage, warp, mhc_mult, hidden)
        for p in T.serial(T.ceildiv(hidden, G * 32 * VEC)):
            issue(X, R, DO, t, p + STAGES - 1, share, lane, stage, warp, mhc_mult, hidden)
            T.ptx_wait_group(STAGES - 1)  # step p's group (the lane's own copies) has landed
            T.call_extern("handle", "__syncwarp")  # (orders the shared reads after the wait)
            c = ((p * G + share) * 32 + lane) * VEC
            s = p % STAGES
            if c < hidden:
                for j in T.vectorized(VEC):
                    xs[j] = stage[warp, s, 0, lane * VEC + j]
                for o in T.unroll(MAX_M):
                    if o < mhc_mult:
                        for j in T.vectorized(VEC):
                            gs[o, j] = stage[warp, s, 1 + o, lane * VEC + j]
                for i in T.unroll(MAX_M):
                    if i < mhc_mult:
                        for j in T.vectorized(VEC):
                            rs[i, j] = stage[warp, s, 1 + MAX_M + i, lane * VEC + j]
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
            if MAX_M <= 4:  # at most 128 registers: 16 warps an SM (m <= 8: its stages fit 3 CTAs)
                T.annotate_min_blocks_per_sm(4)
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
            for r in T.unroll(MAX_M + 1):
                for o in T.unroll(MAX_M):
                    part[r, o] = T.float32(0)
            wr = T.alloc_local((MAX_M + 1, MAX_M), "float32")  # [i, o]: comb[i, o]; [MAX_M, o]: post[o]
            stage = T.alloc_shared((WARPS, STAGES, NV, 32 * VEC), "bfloat16")  # each lane its own slots
            # the warps' sums (G > 1), a whole number of KiB: the stages after it stay 1 KiB aligned
            red = T.alloc_shared((-(-WARPS * NR // 256) * 256,), "float32")
            args = (X, R, POST, COMB, DO, DX, DR, t, share, lane, xs, rs, gs, acc, ys, part, wr, stage, warp, m, h)
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
                            red[warp * NR + r * MAX_M + o] = part[r, o]
            if G > 1:
                T.sync_threads()
                for e in T.unroll(-(-NR // (G * 32))):  # the token's threads take its sums in turn
                    k = e * G * 32 + share * 32 + lane
                    if t < n and k < NR:
                        total = T.alloc_var("float32")
                        total = red[(warp - share) * NR + k]
                        for w in T.unroll(G - 1):
                            total = total + red[(warp - share + w + 1) * NR + k]
                        if k // MAX_M == MAX_M and k % MAX_M < m:
                            DPOST[t, k % MAX_M] = total
                        elif k // MAX_M < m and k % MAX_M < m:
                            DCOMB[t, k // MAX_M, k % MAX_M] = total

    return mhc_post_bwd_kernel
