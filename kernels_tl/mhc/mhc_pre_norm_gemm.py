"""The mHC pre-norm projection, as TileLang factories (build time only): x (T, K) bf16 times
fn (N, K) fp32 with N = m (m + 2) mixes, split over K, and its backward. Sizes at run time; the
variant fixes the most mixes a tile holds (max_mult 4: 24, 8: 80).

Forward: a CTA BM tokens x one split's K steps of BK columns, a manual ring of STAGES cp.async
buffers (T.Pipelined needs a static trip count in TileLang 0.1.15; a split's is not) copied
straight into the wgmma's swizzled layout, rows past the tokens and columns past K zero-filled.
fn is cut into bf16 hi + lo parts (hi = bf16(f), lo = bf16(f - hi): 16 bits of mantissa, finer
than the TF32 the original rounds to), stacked as one 2N-row B tile, so one m64 n(2N) wgmma a
k-step reads the x tile from shared memory once (N = 24 alone would be three n8 instructions);
a thread a row adds its square sums from the same tile. OUT[s, t, n] = acc[t, n] + acc[t, N + n].

Backward: CUDA cores (N is too narrow for tensor-core tiles to pay off here). A thread owns VEC
columns of K, holds fn's N x VEC values and the fn gradient's N x VEC sums in registers and
walks a CTA's share of the tokens TB at a time (their DOM rows staged in shared memory, their x
and x-grad vectors loaded before any is used: one DRAM latency a batch, not one a token):
    xg[t, k] = (xg[t, k] +) sum_n dom[t, n] fn[n, k] + 2 dsq[t] x[t, k]    (n in order, fp32)
    P[p, n, k] = sum over the CTA's tokens, in order, of dom[t, n] x[t, k]
P's rows are summed by norm_backward_reduce (a fixed order: two runs give the same bits).
"""

import tilelang.language as T

from tilebake.mhc.mhc_pre_norm_gemm import BK, MhcPreNormGemmVariant

THREADS = 128
# The forward's tile: m <= 4 (24 mixes): 128 tokens, 4 stages, 94 KB of shared memory, 2 CTAs an
# SM (H200, 8192 tokens: 8 splits 130 us against 170 with 3 stages and 3 CTAs an SM, the waves
# fuller; 4 and 16 splits the same); m <= 8 (80 mixes, fn tiles 3.3 times larger): 64 tokens, 3 stages.
WIDE, NARROW = (128, 4), (64, 3)  # (tokens, stages)
TB = 16  # tokens the backward takes a batch (32 measured slower: 3715 us against 2470, session 7)
PASS_CONFIGS = {"tl.disable_tma_lower": True, "tl.disable_warp_specialized": True}


def build(v: MhcPreNormGemmVariant):
    np_ = v.max_mult * (v.max_mult + 2)
    return _forward(np_) if v.direction == "fwd" else _backward(np_, 2 if v.max_mult <= 4 else 1)


def _forward(NP):
    BM, STAGES = WIDE if NP <= 24 else NARROW  # acc: BM x 2 NP fp32 over 128 threads
    XV = BM * BK // 8 // THREADS  # 16-byte vectors of the x tile a thread copies
    FV = -(-NP * BK // 4 // THREADS)  # and of the fn tile
    ROWS, LANES = max(BM // THREADS, 1), max(THREADS // BM, 1)
    num_tokens = T.dynamic("num_tokens")
    num_cols = T.dynamic("num_cols")
    num_mixes = T.dynamic("num_mixes")
    n_splits = T.dynamic("n_splits")

    @T.macro
    def fetch(X, FN, xr, fr, slot, t0, k0, valid, tx, num_tokens, num_cols, num_mixes):
        """cp.async of the step at column k0 into ring slot `slot` (zeros where not valid)."""
        for u in T.unroll(XV):
            q = u * THREADS + tx
            r, c = q // (BK // 8), (q % (BK // 8)) * 8
            T.ptx_cp_async(
                T.access_ptr(xr[slot, r, c], "w", 8), T.access_ptr(X[t0 + r, k0 + c], "r", 8), 8,
                predicate=valid and t0 + r < num_tokens and k0 + c < num_cols,
            )  # fmt: skip
        for u in T.unroll(FV):
            q = u * THREADS + tx
            r, c = q // (BK // 4), (q % (BK // 4)) * 4
            if q < NP * BK // 4:
                T.ptx_cp_async(
                    T.access_ptr(fr[slot, r, c], "w", 4), T.access_ptr(FN[r, k0 + c], "r", 4), 4,
                    predicate=valid and r < num_mixes and k0 + c < num_cols,
                )  # fmt: skip
        T.ptx_commit_group()

    @T.prim_func
    def mhc_pre_norm_gemm_fwd_kernel(
        X: T.Tensor((num_tokens, num_cols), "bfloat16"),
        FN: T.Tensor((num_mixes, num_cols), "float32"),
        OUT: T.Tensor((n_splits, num_tokens, num_mixes), "float32"),
        SQ: T.Tensor((n_splits, num_tokens), "float32"),
    ):
        with T.Kernel(T.ceildiv(num_tokens, BM), n_splits, threads=THREADS) as (bt, s):
            tx = T.get_thread_binding(0)
            T.assume(num_cols % 8 == 0)
            xr = T.alloc_shared((STAGES, BM, BK), "bfloat16")
            fr = T.alloc_shared((STAGES, NP, BK), "float32")
            b = T.alloc_shared((2 * NP, BK), "bfloat16")  # fn's hi parts, then its lo parts
            acc = T.alloc_fragment((BM, 2 * NP), "float32")
            # hi and lo products, summed per mix at the end (TileLang places it over the idle ring)
            acc_s = T.alloc_shared((BM, 2 * NP), "float32")
            sq = T.alloc_local((ROWS,), "float32")  # x's square sums: ROWS rows a thread, LANES threads a row
            sq_s = T.alloc_shared((LANES, BM), "float32")
            xl = T.alloc_local((8,), "bfloat16")
            T.clear(acc)
            for h in T.unroll(ROWS):
                sq[h] = T.float32(0)
            t0 = bt * BM
            steps = T.ceildiv(num_cols, BK)
            per = T.ceildiv(steps, n_splits)  # this split: steps [s per, (s + 1) per) of num_cols
            n_steps = T.max(T.min(steps - s * per, per), 0)
            for st in T.unroll(STAGES - 1):
                fetch(X, FN, xr, fr, st, t0, (s * per + st) * BK, st < n_steps, tx, num_tokens, num_cols, num_mixes)
            for i in T.serial(n_steps):
                T.ptx_wait_group(STAGES - 2)  # step i's group has landed
                # every thread is past step i - 1's gemm: its slot and b may be written again
                T.sync_threads()
                ahead = i + STAGES - 1
                fetch(X, FN, xr, fr, ahead % STAGES, t0, (s * per + ahead) * BK, ahead < n_steps, tx, num_tokens, num_cols, num_mixes)
                slot = i % STAGES
                for n, j in T.Parallel(NP, BK):
                    hi = T.cast(fr[slot, n, j], "bfloat16")
                    b[n, j] = hi
                    b[NP + n, j] = T.cast(fr[slot, n, j] - T.cast(hi, "float32"), "bfloat16")
                for h in T.unroll(ROWS):
                    for c in T.unroll(BK // 8 // LANES):  # 16-byte reads: the swizzle spreads a warp's rows over the banks
                        for j in T.vectorized(8):
                            xl[j] = xr[slot, h * THREADS + tx % BM, (c * LANES + tx // BM) * 8 + j]
                        for j in T.unroll(8):
                            sq[h] = sq[h] + T.cast(xl[j], "float32") * T.cast(xl[j], "float32")
                # the writers' side of the hand-over to the wgmma (async proxy): every thread's own
                # cp.async and st.shared writes fenced before the barrier, not only after it
                T.fence_proxy_async()
                T.sync_threads()
                T.gemm(xr[slot, :, :], b, acc, transpose_B=True)
            T.ptx_wait_group(0)  # the ring's last (zero-filling) copies land before acc_s reuses it
            T.sync_threads()
            T.copy(acc, acc_s)
            T.sync_threads()
            for r, n in T.Parallel(BM, NP):
                if t0 + r < num_tokens and n < num_mixes:
                    OUT[s, t0 + r, n] = acc_s[r, n] + acc_s[r, NP + n]
            if LANES > 1:  # a row's lanes' sums, added in lane order
                for h in T.unroll(ROWS):
                    sq_s[tx // BM, h * THREADS + tx % BM] = sq[h]
                T.sync_threads()
                if tx < BM:
                    for h in T.unroll(ROWS):
                        for lane in T.unroll(1, LANES):
                            sq[h] = sq[h] + sq_s[lane, h * THREADS + tx]
            if tx < BM:
                for h in T.unroll(ROWS):
                    if t0 + h * THREADS + tx < num_tokens:
                        SQ[s, t0 + h * THREADS + tx] = sq[h]

    return mhc_pre_norm_gemm_fwd_kernel


def _backward(NP, VEC):
    num_tokens = T.dynamic("num_tokens")
    num_cols = T.dynamic("num_cols")
    num_mixes = T.dynamic("num_mixes")
    parts = T.dynamic("num_parts")

    @T.prim_func
    def mhc_pre_norm_gemm_bwd_kernel(
        X: T.Tensor((num_tokens, num_cols), "bfloat16"),
        FN: T.Tensor((num_mixes, num_cols), "float32"),
        DOM: T.Tensor((num_tokens, num_mixes), "float32"),
        DSQ: T.Tensor((num_tokens,), "float32"),
        XG: T.Tensor((num_tokens, num_cols), "bfloat16"),
        P: T.Tensor((parts, num_mixes, num_cols), "float32"),
        has_x_grad: T.int32,
    ):
        with T.Kernel(T.ceildiv(num_cols, THREADS * VEC), parts, threads=THREADS) as (cb, p):
            tx = T.get_thread_binding(0)
            T.assume(num_cols % 8 == 0)
            fnr = T.alloc_local((NP, VEC), "float32")
            dfn = T.alloc_local((NP, VEC), "float32")
            xs = T.alloc_local((TB, VEC), "bfloat16")
            gs = T.alloc_local((TB, VEC), "bfloat16")
            ys = T.alloc_local((VEC,), "bfloat16")
            g = T.alloc_local((VEC,), "float32")
            doms = T.alloc_shared((TB, NP + 1), "float32")  # a token's dom row, then 2 dsq
            col = (cb * THREADS + tx) * VEC
            inside = col < num_cols
            for n in T.unroll(NP):
                for j in T.unroll(VEC):
                    fnr[n, j] = T.if_then_else(inside and n < num_mixes, FN[T.min(n, num_mixes - 1), T.min(col + j, num_cols - 1)], T.float32(0))
                    dfn[n, j] = T.float32(0)
            per = T.ceildiv(num_tokens, parts)
            lo = p * per
            count = T.max(T.min(num_tokens - lo, per), 0)
            for b in T.serial(T.ceildiv(count, TB)):
                T.sync_threads()  # the previous batch's rows are no longer read
                for q in T.serial(T.ceildiv(TB * (NP + 1), THREADS)):
                    e = q * THREADS + tx
                    r, n = e // (NP + 1), e % (NP + 1)
                    t = lo + b * TB + r
                    if e < TB * (NP + 1):
                        doms[r, n] = T.if_then_else(
                            b * TB + r < count,
                            T.if_then_else(n < NP, T.if_then_else(n < num_mixes, DOM[t, T.min(n, num_mixes - 1)], T.float32(0)), 2 * DSQ[t]),
                            T.float32(0),
                        )  # fmt: skip
                T.sync_threads()
                # the batch's x (and x grad) vectors loaded before any use: one DRAM latency a batch
                for r in T.unroll(TB):
                    if inside and b * TB + r < count:
                        for j in T.vectorized(VEC):
                            xs[r, j] = X[lo + b * TB + r, col + j]
                        if has_x_grad != 0:
                            for j in T.vectorized(VEC):
                                gs[r, j] = XG[lo + b * TB + r, col + j]
                for r in T.unroll(TB):
                    t = lo + b * TB + r
                    if inside and b * TB + r < count:
                        for j in T.unroll(VEC):
                            g[j] = T.float32(0)
                        for n in T.unroll(NP):
                            for j in T.unroll(VEC):
                                g[j] = g[j] + doms[r, n] * fnr[n, j]
                                dfn[n, j] = dfn[n, j] + doms[r, n] * T.cast(xs[r, j], "float32")
                        for j in T.unroll(VEC):
                            g[j] = g[j] + doms[r, NP] * T.cast(xs[r, j], "float32")
                            ys[j] = T.if_then_else(has_x_grad != 0, T.cast(T.cast(gs[r, j], "float32") + g[j], "bfloat16"), T.cast(g[j], "bfloat16"))
                        for j in T.vectorized(VEC):
                            XG[t, col + j] = ys[j]
            if inside:
                for n in T.unroll(NP):
                    if n < num_mixes:
                        for j in T.unroll(VEC):
                            P[p, n, col + j] = dfn[n, j]

    return mhc_pre_norm_gemm_bwd_kernel
