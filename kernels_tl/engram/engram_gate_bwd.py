"""The Engram gate backward, as a TileLang factory (build time only).

Persistent, one head a CTA: num_ctas_per_head x hc CTAs, CTA b taking head h = b % hc of tokens
c, c + num_ctas_per_head, ... (c = b // hc), in order; the hc CTAs of a token run side by side.
The head's fused weight row is loaded once into shared memory, and its gradient is summed over
the CTA's tokens in registers or shared memory (dw_in_smem), each thread its own columns, and
written once to the CTA's row P[c, h] of the partials (grad_w_reduce adds the rows in order).
THREADS threads own VEC contiguous columns per pass, PASSES passes cover the variant's max_hidden.
Per token t, every load issued first (the saved scalars, the rows, the dv slice's g), so their
latencies overlap:

1. g_h's and v's rows (and x_h's, k_h's with xk_ahead); per thread sum_j g_hj v_j in pass order,
   a butterfly in each warp, the warps' partials in warp order (shared, by token parity).
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

from tilebake.engram.engram_gate_bwd import CTAS_PER_SM

PASS_CONFIGS = {"tl.disable_safe_memory_legalize": True}  # guarded per vector below
DV_HEADS = 4  # heads whose g the dv slice loads at once (registers: DV_HEADS x VEC bf16)


@dataclasses.dataclass(frozen=True)
class LaunchConfig:
    threads: int
    vec: int  # bf16 columns a thread per pass
    ctas_per_sm: int  # resident CTAs a SM (the host launches this many x SMs: CTAS_PER_SM)
    xk_ahead: bool  # load x and k with g and v (before the reduction) rather than after it
    dw_in_smem: bool  # the weight gradient's running sum in shared memory rather than registers


# The H200 sweeps (bench/tune_engram_gate.py; bench/results/2026-12-02-NVIDIA-H200/session4/):
# at 8001 x 4 x 7168, 256 threads, 2 CTAs a SM, x and k loaded up front, dw in shared memory:
# 833-941 us over two runs (run-to-run spread ~10%), against 1006-1106 for 512 x 1 and 1300-3000
# for 3 CTAs a SM (spills). The other classes take the same registers a thread.
CONFIGS = {
    4096: LaunchConfig(threads=128, vec=8, ctas_per_sm=CTAS_PER_SM[4096], xk_ahead=True, dw_in_smem=True),
    8192: LaunchConfig(threads=256, vec=8, ctas_per_sm=CTAS_PER_SM[8192], xk_ahead=True, dw_in_smem=True),
    16384: LaunchConfig(threads=512, vec=8, ctas_per_sm=CTAS_PER_SM[16384], xk_ahead=True, dw_in_smem=True),
}


def candidate_configs():
    """The search space of `python bench/tune_engram_gate.py build|run DIR` (the 8192 variant)."""
    return [LaunchConfig(t, 8, m, a, s) for t, m in ((256, 2), (512, 1)) for a in (False, True) for s in (False, True)]


def build(v, cfg: LaunchConfig | None = None):
    cfg = cfg or CONFIGS[v.max_hidden]
    THREADS, VEC, XK_AHEAD, DW_SMEM = cfg.threads, cfg.vec, cfg.xk_ahead, cfg.dw_in_smem
    PASS = THREADS * VEC
    PASSES = -(-v.max_hidden // PASS)
    WARPS = THREADS // 32

    num_tokens = T.dynamic("num_tokens")
    hc = T.dynamic("hc")
    hidden = T.dynamic("hidden")
    num_ctas_per_head = T.dynamic("num_ctas_per_head")
    strides = {n: (T.dynamic(f"{n}_token_stride"), T.dynamic(f"{n}_head_stride")) for n in ("g", "x", "k", "dx", "dk")}
    v_ts, dv_ts = T.dynamic("v_token_stride"), T.dynamic("dv_token_stride")

    def rows(name):
        return T.StridedTensor((num_tokens, hc, hidden), (*strides[name], 1), "bfloat16")

    g_ts, g_hs = strides["g"]
    x_ts, x_hs = strides["x"]
    k_ts, k_hs = strides["k"]
    dx_ts, dx_hs = strides["dx"]
    dk_ts, dk_hs = strides["dk"]

    @T.macro
    def load_rows(G, V, X, K, t, h, tx, hidden, gs, vs, xs, ks):
        """Token t's g_h and v rows (and x_h, k_h with XK_AHEAD) into registers (0 past hidden)."""
        for p in T.unroll(PASSES):
            if p * PASS + tx * VEC < hidden:
                for j in T.vectorized(VEC):
                    gs[p, j] = G[t, h, p * PASS + tx * VEC + j]
                for j in T.vectorized(VEC):
                    vs[p, j] = V[t, p * PASS + tx * VEC + j]
                if XK_AHEAD:
                    for j in T.vectorized(VEC):
                        xs[p, j] = X[t, h, p * PASS + tx * VEC + j]
                    for j in T.vectorized(VEC):
                        ks[p, j] = K[t, h, p * PASS + tx * VEC + j]
            else:
                for j in T.unroll(VEC):
                    gs[p, j] = T.bfloat16(0)
                    vs[p, j] = T.bfloat16(0)

    @T.macro
    def dv_slice(G, GATE, DV, t, h, tx, hc, hidden, slice_vecs, masked, gd, gt, dwv, dvs):
        """dv for this CTA's slice of the columns: the heads' gate * g, in head order (DV_HEADS
        heads' loads in flight at once); 0 for an image token."""
        for r in T.serial(T.ceildiv(slice_vecs, THREADS)):
            vi = h * slice_vecs + r * THREADS + tx
            if r * THREADS + tx < slice_vecs and vi * VEC < hidden:
                for j in T.unroll(VEC):
                    dwv[j] = T.float32(0)
                for grp in T.serial(T.ceildiv(hc, DV_HEADS)):
                    for u in T.unroll(DV_HEADS):
                        if grp * DV_HEADS + u < hc:
                            gt[u] = GATE[t, grp * DV_HEADS + u]
                            for j in T.vectorized(VEC):
                                gd[u, j] = G[t, grp * DV_HEADS + u, vi * VEC + j]
                    for u in T.unroll(DV_HEADS):
                        if grp * DV_HEADS + u < hc:
                            for j in T.unroll(VEC):
                                dwv[j] = dwv[j] + gt[u] * T.cast(gd[u, j], "float32")
                for j in T.unroll(VEC):
                    dvs[j] = T.if_then_else(masked != 0, T.bfloat16(0), T.cast(dwv[j], "bfloat16"))
                for j in T.vectorized(VEC):
                    DV[t, vi * VEC + j] = dvs[j]

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
            T.assume(g_ts % 8 == 0)
            T.assume(g_hs % 8 == 0)
            T.assume(x_ts % 8 == 0)
            T.assume(x_hs % 8 == 0)
            T.assume(k_ts % 8 == 0)
            T.assume(k_hs % 8 == 0)
            T.assume(dx_ts % 8 == 0)
            T.assume(dx_hs % 8 == 0)
            T.assume(dk_ts % 8 == 0)
            T.assume(dk_hs % 8 == 0)
            T.assume(v_ts % 8 == 0)
            T.assume(dv_ts % 8 == 0)
            h = T.alloc_var("int32")
            c = T.alloc_var("int32")
            t = T.alloc_var("int32")
            h = b % hc
            c = b // hc
            tx = T.get_thread_binding(0)
            ws = T.alloc_shared((PASSES * PASS,), "float32")
            dws = T.alloc_shared((PASSES * PASS if DW_SMEM else 1,), "float32")
            dwr = T.alloc_local((1 if DW_SMEM else PASSES, VEC), "float32")
            gs = T.alloc_local((PASSES, VEC), "bfloat16")
            vs = T.alloc_local((PASSES, VEC), "bfloat16")
            xs = T.alloc_local((PASSES if XK_AHEAD else 1, VEC), "bfloat16")
            ks = T.alloc_local((PASSES if XK_AHEAD else 1, VEC), "bfloat16")
            gd = T.alloc_local((DV_HEADS, VEC), "bfloat16")
            gt = T.alloc_local((DV_HEADS,), "float32")
            wv = T.alloc_local((VEC,), "float32")
            dwv = T.alloc_local((VEC,), "float32")
            dxs = T.alloc_local((VEC,), "bfloat16")
            dks = T.alloc_local((VEC,), "bfloat16")
            dvs = T.alloc_local((VEC,), "bfloat16")
            red = T.alloc_shared((2, WARPS), "float32")
            acc = T.alloc_var("float32")
            gv = T.alloc_var("float32")
            grad_d = T.alloc_var("float32")
            masked = T.alloc_var("int32")
            scale = T.float32(1) / T.sqrt(T.cast(hidden, "float32"))
            # this CTA's slice of dv's columns, in whole VEC-vectors
            slice_vecs = T.ceildiv(T.ceildiv(hidden, VEC), hc)
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
            for i in T.serial(T.ceildiv(num_tokens - c, num_ctas_per_head)):
                t = c + i * num_ctas_per_head
                # Every load of the token first (scalars, rows, the dv slice's g), so their
                # latencies overlap.
                masked = T.if_then_else(has_mask != 0, T.if_then_else(MASK[t] != T.uint8(0), 1, 0), 0)
                dot = DOT[t, h]
                gate = GATE[t, h]
                rx = RSTD_X[t, h]
                rk = RSTD_K[t, h]
                load_rows(G, V, X, K, t, h, tx, hidden, gs, vs, xs, ks)
                dv_slice(G, GATE, DV, t, h, tx, hc, hidden, slice_vecs, masked, gd, gt, dwv, dvs)  # 2.
                # 1. g.v
                acc = T.float32(0)
                for p in T.unroll(PASSES):
                    for j in T.unroll(VEC):
                        acc = acc + T.cast(gs[p, j], "float32") * T.cast(vs[p, j], "float32")
                for s in T.unroll(5):
                    acc = acc + T.shfl_xor(acc, 16 >> s)
                if tx % 32 == 0:
                    red[i % 2, tx // 32] = acc
                T.sync_threads()
                gv = red[i % 2, 0]
                for w in T.unroll(WARPS - 1):
                    gv = gv + red[i % 2, w + 1]
                # 3. dx, dk, dw
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
                        if not XK_AHEAD:
                            for j in T.vectorized(VEC):
                                xs[0, j] = X[t, h, col + j]
                            for j in T.vectorized(VEC):
                                ks[0, j] = K[t, h, col + j]
                        for q in T.unroll(VEC // 4):
                            for j in T.vectorized(4):
                                wv[q * 4 + j] = ws[col + q * 4 + j]
                        for j in T.unroll(VEC):
                            gf = T.cast(gs[p, j], "float32")
                            xf = T.cast(xs[p if XK_AHEAD else 0, j], "float32")
                            kf = T.cast(ks[p if XK_AHEAD else 0, j], "float32")
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
                    if DW_SMEM:
                        for q in T.unroll(VEC // 4):
                            for j in T.vectorized(4):
                                P[c, h, col + q * 4 + j] = dws[col + q * 4 + j]
                    else:
                        for q in T.unroll(VEC // 4):
                            for j in T.vectorized(4):
                                P[c, h, col + q * 4 + j] = dwr[p, q * 4 + j]

    return engram_gate_bwd_kernel
