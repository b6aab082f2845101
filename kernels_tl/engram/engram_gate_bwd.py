"""The Engram gate backward, as a TileLang factory (build time only).

Persistent, one head a CTA: num_ctas_per_head x hc CTAs, CTA b taking head h = b % hc of tokens
c, c + num_ctas_per_head, ... (c = b // hc), in order; the hc CTAs of a token run side by side.
The head's fused weight row is loaded once into shared memory, and its gradient is summed over
the CTA's tokens in registers or shared memory (dw_in_smem), each thread its own columns, and
written once to the CTA's row P[c, h] of the partials (grad_w_reduce adds the rows in order).
THREADS threads own VEC contiguous columns per pass, PASSES passes cover the variant's max_hidden.

Staged (stages S > 1): the next S - 1 tokens' rows (g_h, v, x_h, k_h and the dv slice's g of
every head) are on their way through cp.async into shared memory while a token is computed;
each thread copies, and later reads, only its own columns' slots, so the data needs no barrier.
Unstaged (S = 1): every load of a token is issued first, straight into registers. Either way a
token's saved scalars are loaded a token ahead (they are on the critical path). Per token t:

1. sum_j g_hj v_j per thread in pass order, a butterfly in each warp, the warps' partials in
   warp order (shared, by token parity: one barrier a token).
2. dv for this CTA's slice of the columns (the hc slices of a token's CTAs cover the row):
   sum over heads h' = 0 .. hc - 1, in that order, of gate[t, h'] g_h' (the other heads' g: L2
   hits, their CTAs read them at the same time); 0 for an image token.
3. d = dot rx rk scale, G = ((g.v * gate) * (1 - gate)) * dsdd (dsdd = 1 / (2 sqrt(|d|)) where
   |d| >= clamp_value and d != 0, else 0), c = rx rk scale, and per column
       dx = g + G (c k w - ax x),  dk = G (c x w - ak k),  ax = dot rk scale rx^3 / H, ak likewise,
       dw += (G c) x k.
An image token (has_mask and MASK[t]): dx = g, dk = dv = 0, nothing added to dw.
"""

import dataclasses

import tilelang.language as T

from tilebake.engram._common import MAX_HC
from tilebake.engram.engram_gate_bwd import CTAS_PER_SM

# Vectors guarded by hand; the staged rows are thread-private (each thread reads back only what it
# copied) and the reduction's shared buffer is synchronised by hand.
PASS_CONFIGS = {"tl.disable_safe_memory_legalize": True, "tl.disable_thread_storage_sync": True}
DV_HEADS = 4  # unstaged: heads whose g the dv slice loads at once (registers: DV_HEADS x VEC bf16)


@dataclasses.dataclass(frozen=True)
class LaunchConfig:
    threads: int
    vec: int  # bf16 columns a thread per pass
    ctas_per_sm: int  # resident CTAs a SM (the host launches this many x SMs: CTAS_PER_SM)
    stages: int  # token buffers in shared memory (1: none, every row loaded into registers)
    dw_in_smem: bool  # the weight gradient's running sum in shared memory rather than registers


# The H200 sweeps (bench/tune_engram_gate.py; bench/results/2026-12-02-NVIDIA-H200/session8/call3/,
# GB/s counting the 22 rows a token moves at hc 4): at 8001 x 4 x 7168, staged 256 threads x 1 CTA a
# SM 629.4 us (94.3% of copy bandwidth; 512 threads 628.9, 5120 columns 561.2 against 577.5), the
# unstaged 256 x 2 846.4; at 8001 x 4 x 4096, staged 256 x 2 387.9 us (87.4%) against 458.1 for the
# unstaged 128 x 4 and 478.3 for 512 x 1. The 16384 class has no room for two staged tokens: unstaged.
# Short rows want small CTAs, many a SM (session9/call1-2, 8001 x 4): the 512 class at 32 threads x 16
# 57.0 / 39.9 us at 512 / 256 (64 threads x 16: 72.0 / 68.6), the 1024 class 32 x 8 100.1 / 75.1 at
# 1024 / 768 (64 x 6, 3 stages: 99.3 / 93.0; 128 x 6: 112.6 at 1024), the 2048 class 64 x 4 192.3 /
# 144.8 at 2048 / 1536 (128 x 4: 198.3-219.7 / 153.5; 256 x 3, 3 stages: 222.4 / 202.7), the 4096
# class 128 x 2 386.2 / 274.2 at 4096 / 2560 (256 x 2: 395.4 / 288.3). The 16384 class: 512 threads
# 2291.5 / 1886.3 us at 16384 / 12288 (1024 threads: 2742.3 / 2349.5); with the next token's g and v
# rows in flight through cp.async into a 64 KB buffer (git 0f7b7f6) 2451.0 / 1928.0 against 2300.6 /
# 1852.7 (2026-12-03 session10/call4).
CONFIGS = {
    512: LaunchConfig(threads=32, vec=8, ctas_per_sm=CTAS_PER_SM[512], stages=2, dw_in_smem=False),
    1024: LaunchConfig(threads=32, vec=8, ctas_per_sm=CTAS_PER_SM[1024], stages=2, dw_in_smem=False),
    2048: LaunchConfig(threads=64, vec=8, ctas_per_sm=CTAS_PER_SM[2048], stages=2, dw_in_smem=False),
    4096: LaunchConfig(threads=128, vec=8, ctas_per_sm=CTAS_PER_SM[4096], stages=2, dw_in_smem=False),
    8192: LaunchConfig(threads=256, vec=8, ctas_per_sm=CTAS_PER_SM[8192], stages=2, dw_in_smem=False),
    16384: LaunchConfig(threads=512, vec=8, ctas_per_sm=CTAS_PER_SM[16384], stages=1, dw_in_smem=True),
}


def candidate_configs(max_hidden=8192):
    """The search space of `python bench/tune_engram_gate.py build|run DIR` for a class (shared
    memory a CTA: stages x (5 rows + 8 vectors) bf16 + a fp32 row)."""
    if max_hidden == 512:
        return [LaunchConfig(t, 8, c, s, False) for t, c, s in ((32, 16, 2), (32, 12, 3), (64, 16, 2), (64, 12, 3), (64, 8, 4))]
    if max_hidden == 1024:
        return [LaunchConfig(t, 8, c, s, False) for t, c, s in ((64, 6, 3), (64, 8, 2), (32, 8, 2))]
    if max_hidden == 2048:
        return [LaunchConfig(t, 8, c, s, False) for t, c, s in ((128, 4, 2), (64, 4, 2), (32, 4, 2))]
    if max_hidden == 4096:
        return [LaunchConfig(t, 8, 2, 2, False) for t in (128, 256)]
    if max_hidden == 16384:  # no room for two staged tokens
        return [LaunchConfig(t, 8, 1, 1, True) for t in (512, 1024)]
    return [LaunchConfig(256, 8, 2, 1, True)] + [LaunchConfig(t, 8, 1, 2, False) for t in (256, 512)]


def build(v, cfg: LaunchConfig | None = None):
    cfg = cfg or CONFIGS[v.max_hidden]
    THREADS, VEC, STAGES, DW_SMEM = cfg.threads, cfg.vec, cfg.stages, cfg.dw_in_smem
    STAGED = STAGES > 1
    PASS = THREADS * VEC
    PASSES = -(-v.max_hidden // PASS)
    ROW = PASSES * PASS
    WARPS = THREADS // 32
    # A slot: g_h, v, x_h, k_h (ROW each), then the dv slice's g of every head (hc x slice_vecs
    # vectors, at most ROW + MAX_HC x VEC columns).
    OFF_G, OFF_V, OFF_X, OFF_K, OFF_DV = 0, ROW, 2 * ROW, 3 * ROW, 4 * ROW
    SLOT = 5 * ROW + MAX_HC * VEC

    num_tokens = T.dynamic("num_tokens")
    hc = T.dynamic("hc")
    hidden = T.dynamic("hidden")
    num_ctas_per_head = T.dynamic("num_ctas_per_head")
    strides = {n: (T.dynamic(f"{n}_token_stride"), T.dynamic(f"{n}_head_stride")) for n in ("g", "x", "k", "dx", "dk")}
    v_ts, dv_ts = T.dynamic("v_token_stride"), T.dynamic("dv_token_stride")

    def rows(name):
        return T.StridedTensor((num_tokens, hc, hidden), (*strides[name], 1), "bfloat16")

    @T.macro
    def fetch(G, V, X, K, buf, t, h, tx, slot, slice_vecs, num_tokens, hc, hidden):
        """cp.async of token t's columns of this thread into buf[slot] (zeros past the rows)."""
        for p in T.unroll(PASSES):
            col = p * PASS + tx * VEC
            ok = t < num_tokens and col < hidden
            T.ptx_cp_async(T.access_ptr(buf[slot, OFF_G + col], "w", VEC), T.access_ptr(G[t, h, col], "r", VEC), VEC, predicate=ok)
            T.ptx_cp_async(T.access_ptr(buf[slot, OFF_V + col], "w", VEC), T.access_ptr(V[t, col], "r", VEC), VEC, predicate=ok)
            T.ptx_cp_async(T.access_ptr(buf[slot, OFF_X + col], "w", VEC), T.access_ptr(X[t, h, col], "r", VEC), VEC, predicate=ok)
            T.ptx_cp_async(T.access_ptr(buf[slot, OFF_K + col], "w", VEC), T.access_ptr(K[t, h, col], "r", VEC), VEC, predicate=ok)
        for r in T.serial(T.ceildiv(slice_vecs, THREADS)):
            e = r * THREADS + tx
            vi = h * slice_vecs + e
            if e < slice_vecs:  # a branch, not the predicate: a predicated-off copy still zero-fills
                for u in T.serial(hc):
                    T.ptx_cp_async(
                        T.access_ptr(buf[slot, OFF_DV + (u * slice_vecs + e) * VEC], "w", VEC),
                        T.access_ptr(G[t, u, vi * VEC], "r", VEC), VEC, predicate=t < num_tokens and vi * VEC < hidden,
                    )  # fmt: skip
        T.ptx_commit_group()

    @T.macro
    def load_rows(G, V, X, K, buf, t, h, tx, slot, hidden, gs, vs, xs, ks):
        """Token t's g_h and v rows (unstaged: x_h's and k_h's too) into registers (0 past hidden)."""
        for p in T.unroll(PASSES):
            col = p * PASS + tx * VEC
            if STAGED:
                for j in T.vectorized(VEC):
                    gs[p, j] = buf[slot, OFF_G + col + j]
                for j in T.vectorized(VEC):
                    vs[p, j] = buf[slot, OFF_V + col + j]
            elif col < hidden:
                for j in T.vectorized(VEC):
                    gs[p, j] = G[t, h, col + j]
                for j in T.vectorized(VEC):
                    vs[p, j] = V[t, col + j]
                for j in T.vectorized(VEC):
                    xs[p, j] = X[t, h, col + j]
                for j in T.vectorized(VEC):
                    ks[p, j] = K[t, h, col + j]
            else:
                for j in T.unroll(VEC):
                    gs[p, j] = T.bfloat16(0)
                    vs[p, j] = T.bfloat16(0)

    @T.macro
    def dv_slice(G, DV, buf, t, h, tx, slot, hc, hidden, slice_vecs, masked, gates, gd, acc, dvs):
        """dv for this CTA's slice of the columns: the heads' gate * g, in head order; 0 for an
        image token."""
        for r in T.serial(T.ceildiv(slice_vecs, THREADS)):
            e = r * THREADS + tx
            vi = h * slice_vecs + e
            if e < slice_vecs and vi * VEC < hidden:
                for j in T.unroll(VEC):
                    acc[j] = T.float32(0)
                for grp in T.unroll(MAX_HC // DV_HEADS):  # unrolled: gates[] indexed by constants
                    if grp * DV_HEADS < hc:
                        for u in T.unroll(DV_HEADS):
                            if grp * DV_HEADS + u < hc:
                                for j in T.vectorized(VEC):
                                    gd[u, j] = (buf[slot, OFF_DV + ((grp * DV_HEADS + u) * slice_vecs + e) * VEC + j]
                                                if STAGED else G[t, grp * DV_HEADS + u, vi * VEC + j])  # fmt: skip
                        for u in T.unroll(DV_HEADS):
                            if grp * DV_HEADS + u < hc:
                                for j in T.unroll(VEC):
                                    acc[j] = acc[j] + gates[grp * DV_HEADS + u] * T.cast(gd[u, j], "float32")
                for j in T.unroll(VEC):
                    dvs[j] = T.if_then_else(masked != 0, T.bfloat16(0), T.cast(acc[j], "bfloat16"))
                for j in T.vectorized(VEC):
                    DV[t, vi * VEC + j] = dvs[j]

    @T.macro
    def load_scalars(DOT, GATE, RSTD_X, RSTD_K, MASK, t, h, hc, has_mask, num_tokens, sc, gates):
        """Token t's saved scalars (sc: dot, gate, rstd_x, rstd_k, masked) and every head's gate."""
        tc = T.min(t, num_tokens - 1)
        sc[0] = DOT[tc, h]
        sc[1] = GATE[tc, h]
        sc[2] = RSTD_X[tc, h]
        sc[3] = RSTD_K[tc, h]
        sc[4] = T.if_then_else(has_mask != 0, T.if_then_else(MASK[tc] != T.uint8(0), T.float32(1), T.float32(0)), T.float32(0))
        for u in T.unroll(MAX_HC):
            gates[u] = T.if_then_else(u < hc, GATE[tc, T.min(u, hc - 1)], T.float32(0))

    @T.prim_func
    def engram_gate_bwd_kernel(
        G: rows("g"),
        X: rows("x"),
        K: rows("k"),
        V: T.StridedTensor((num_tokens, hidden), (v_ts, 1), "bfloat16"),
        W: T.Tensor((hc, hidden), "float32"),
        DOT: T.Tensor((num_tokens, hc), "float32"),
        GATE: T.Tensor((num_tokens, hc), "float32"),
        RSTD_X: T.Tensor((num_tokens, hc), "float32"),
        RSTD_K: T.Tensor((num_tokens, hc), "float32"),
        MASK: T.Tensor((num_tokens,), "uint8"),
        DX: rows("dx"),
        DK: rows("dk"),
        DV: T.StridedTensor((num_tokens, hidden), (dv_ts, 1), "bfloat16"),
        P: T.Tensor((num_ctas_per_head, hc, hidden), "float32"),
        clamp_value: T.float32,
        has_mask: T.int32,
    ):
        with T.Kernel(num_ctas_per_head * hc, threads=THREADS) as b:
            T.annotate_min_blocks_per_sm(cfg.ctas_per_sm)
            T.assume(hidden % 8 == 0)
            for n in ("g", "x", "k", "dx", "dk"):
                T.assume(strides[n][0] % 8 == 0)
                T.assume(strides[n][1] % 8 == 0)
            T.assume(v_ts % 8 == 0)
            T.assume(dv_ts % 8 == 0)
            h = T.alloc_var("int32")
            c = T.alloc_var("int32")
            t = T.alloc_var("int32")
            h = b % hc
            c = b // hc
            tx = T.get_thread_binding(0)
            ws = T.alloc_shared((ROW,), "float32")
            dws = T.alloc_shared((ROW if DW_SMEM else 1,), "float32")
            buf = T.alloc_shared((STAGES if STAGED else 1, SLOT if STAGED else 8), "bfloat16")
            dwr = T.alloc_local((1 if DW_SMEM else PASSES, VEC), "float32")
            gs = T.alloc_local((PASSES, VEC), "bfloat16")
            vs = T.alloc_local((PASSES, VEC), "bfloat16")
            xs = T.alloc_local((1 if STAGED else PASSES, VEC), "bfloat16")
            ks = T.alloc_local((1 if STAGED else PASSES, VEC), "bfloat16")
            gd = T.alloc_local((DV_HEADS, VEC), "bfloat16")
            sc = T.alloc_local((5,), "float32")
            sn = T.alloc_local((5,), "float32")
            gates = T.alloc_local((MAX_HC,), "float32")
            gates_next = T.alloc_local((MAX_HC,), "float32")
            wv = T.alloc_local((VEC,), "float32")
            acc = T.alloc_local((VEC,), "float32")
            dxs = T.alloc_local((VEC,), "bfloat16")
            dks = T.alloc_local((VEC,), "bfloat16")
            dvs = T.alloc_local((VEC,), "bfloat16")
            red = T.alloc_shared((2, WARPS), "float32")
            gsum = T.alloc_var("float32")
            gv = T.alloc_var("float32")
            grad_d = T.alloc_var("float32")
            cf = T.alloc_var("float32")
            gc = T.alloc_var("float32")
            ax = T.alloc_var("float32")
            ak = T.alloc_var("float32")
            scale = T.alloc_var("float32")
            scale = T.float32(1) / T.sqrt(T.cast(hidden, "float32"))
            # this CTA's slice of dv's columns, in whole VEC-vectors
            slice_vecs = T.alloc_var("int32")  # (a variable: its division done once)
            slice_vecs = T.ceildiv(T.ceildiv(hidden, VEC), hc)
            n_mine = T.ceildiv(num_tokens - c, num_ctas_per_head)
            if STAGED:  # tokens 0 .. S - 2 of this CTA in flight first
                for s in T.unroll(STAGES - 1):
                    fetch(G, V, X, K, buf, c + s * num_ctas_per_head, h, tx, s, slice_vecs, num_tokens, hc, hidden)
            for p in T.unroll(PASSES):
                col = p * PASS + tx * VEC
                if col < hidden:
                    for q in T.unroll(VEC // 4):
                        for j in T.vectorized(4):
                            ws[col + q * 4 + j] = W[h, col + q * 4 + j]
                for j in T.unroll(VEC):
                    if DW_SMEM:
                        dws[col + j] = T.float32(0)
                    else:
                        dwr[p, j] = T.float32(0)
            load_scalars(DOT, GATE, RSTD_X, RSTD_K, MASK, c, h, hc, has_mask, num_tokens, sn, gates_next)
            for i in T.serial(n_mine):
                t = c + i * num_ctas_per_head
                slot = i % STAGES
                for q in T.unroll(5):
                    sc[q] = sn[q]
                for u in T.unroll(MAX_HC):
                    gates[u] = gates_next[u]
                load_scalars(DOT, GATE, RSTD_X, RSTD_K, MASK, t + num_ctas_per_head, h, hc, has_mask, num_tokens, sn,
                             gates_next)  # fmt: skip
                if STAGED:  # token i + S - 1 into the slot token i - 1 left (read by its copier only)
                    fetch(G, V, X, K, buf, t + (STAGES - 1) * num_ctas_per_head, h, tx, (i + STAGES - 1) % STAGES,
                          slice_vecs, num_tokens, hc, hidden)  # fmt: skip
                    T.ptx_wait_group(STAGES - 1)  # token i has landed
                load_rows(G, V, X, K, buf, t, h, tx, slot, hidden, gs, vs, xs, ks)
                # 1. g.v
                gsum = T.float32(0)
                for p in T.unroll(PASSES):
                    for j in T.unroll(VEC):
                        gsum = gsum + T.cast(gs[p, j], "float32") * T.cast(vs[p, j], "float32")
                for s in T.unroll(5):
                    gsum = gsum + T.shfl_xor(gsum, 16 >> s)
                if tx % 32 == 0:
                    red[i % 2, tx // 32] = gsum
                dv_slice(G, DV, buf, t, h, tx, slot, hc, hidden, slice_vecs, sc[4], gates, gd, acc, dvs)  # 2.
                T.sync_threads()
                gv = red[i % 2, 0]
                for w in T.unroll(WARPS - 1):
                    gv = gv + red[i % 2, w + 1]
                # 3. dx, dk, dw
                # (variables, not expressions: an expression is inlined, and its division redone, per column)
                dot, gate, rx, rk, masked = sc[0], sc[1], sc[2], sc[3], sc[4]
                d = dot * rx * rk * scale
                ad = T.abs(d)
                dsdd = T.if_then_else(ad >= clamp_value and d != 0, T.float32(0.5) / T.sqrt(T.max(ad, clamp_value)), T.float32(0))
                grad_d = T.if_then_else(masked != 0, T.float32(0), ((gv * gate) * (T.float32(1) - gate)) * dsdd)
                cf = rx * rk * scale
                gc = grad_d * cf
                ax = ((dot * rk * scale) * (rx * rx * rx)) / T.cast(hidden, "float32")
                ak = ((dot * rx * scale) * (rk * rk * rk)) / T.cast(hidden, "float32")
                for p in T.unroll(PASSES):
                    col = p * PASS + tx * VEC
                    if col < hidden:
                        xp = 0 if STAGED else p
                        if STAGED:
                            for j in T.vectorized(VEC):
                                xs[0, j] = buf[slot, OFF_X + col + j]
                            for j in T.vectorized(VEC):
                                ks[0, j] = buf[slot, OFF_K + col + j]
                        for q in T.unroll(VEC // 4):
                            for j in T.vectorized(4):
                                wv[q * 4 + j] = ws[col + q * 4 + j]
                        for j in T.unroll(VEC):
                            gf = T.cast(gs[p, j], "float32")
                            xf = T.cast(xs[xp, j], "float32")
                            kf = T.cast(ks[xp, j], "float32")
                            dxs[j] = T.if_then_else(masked != 0, gs[p, j], T.cast(gf + grad_d * (cf * kf * wv[j] - ax * xf), "bfloat16"))
                            dks[j] = T.if_then_else(masked != 0, T.bfloat16(0), T.cast(grad_d * (cf * xf * wv[j] - ak * kf), "bfloat16"))
                            if DW_SMEM:
                                dws[col + j] = T.if_then_else(masked != 0, dws[col + j], dws[col + j] + (gc * xf) * kf)
                            else:
                                dwr[p, j] = T.if_then_else(masked != 0, dwr[p, j], dwr[p, j] + (gc * xf) * kf)
                        for j in T.vectorized(VEC):
                            DX[t, h, col + j] = dxs[j]
                        for j in T.vectorized(VEC):
                            DK[t, h, col + j] = dks[j]
            for p in T.unroll(PASSES):
                col = p * PASS + tx * VEC
                if col < hidden:
                    for q in T.unroll(VEC // 4):
                        for j in T.vectorized(4):
                            P[c, h, col + q * 4 + j] = dws[col + q * 4 + j] if DW_SMEM else dwr[p, q * 4 + j]
            if STAGED:
                T.ptx_wait_group(0)  # the fetches past the CTA's last token (zero fills) done before exit

    return engram_gate_bwd_kernel
