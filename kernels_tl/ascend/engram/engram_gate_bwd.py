"""engram_gate_bwd for Ascend 950 (build time only), read from
tilebake.engram.engram_gate_bwd.EngramGateBwdAscendVariant: tilebake.torch.engram.
engram_gate_bwd_ref's arithmetic in fp32. Per (token, head), with s = 1 / sqrt(H),
d = dot * rstd_x * rstd_k * s, G = sum_j(g_j v_j) * gate (1 - gate) * dsdd (dsdd = 0.5 /
sqrt(max(|d|, clamp)) where |d| >= clamp and d != 0, else 0; 0 for an image token), c = rstd_x
rstd_k s:
    dx = g + G (c k w - dot rstd_k s rstd_x^3 x / H),  dk = G (c x w - dot rstd_x s rstd_k^3 k / H),
    dv = sum_h gate_h g_h (image tokens: 0),  dw partial of the core += G c x k.

A block per vector core, each taking tokens core, core + num_vec_cores, ...; per token its v row
DMA'd in and a dv accumulator zeroed, then per head the g, x, k and fused-weight rows and the
core's fw-gradient partial row of that head DMA'd in; THREADS SIMT threads, each over every
THREADS-th column: (A) partial sums of g * v; (B) G, then the columns of dx (over g's row), dk
(over k's row), dv's accumulator (heads in order) and the partial; dx, dk and the partial DMA'd
out; after the heads, dv rounded and DMA'd out. grad_w_partial has a row a core (zeroed by the
caller). Built and lowered here, never run on an NPU: checked on the CPU by
tests/ascend/test_emulated_engram.py.
"""

import tilelang.ascend.language as T

from tilebake.engram.engram_gate_bwd import EngramGateBwdAscendVariant

THREADS = 64


def build(v: EngramGateBwdAscendVariant):
    n = T.dynamic("num_tokens")
    hc = T.dynamic("hc")
    hidden = T.dynamic("hidden")
    g_ts, g_hs = T.dynamic("g_token_stride"), T.dynamic("g_head_stride")
    x_ts, x_hs = T.dynamic("x_token_stride"), T.dynamic("x_head_stride")
    k_ts, k_hs = T.dynamic("k_token_stride"), T.dynamic("k_head_stride")
    dx_ts, dx_hs = T.dynamic("dx_token_stride"), T.dynamic("dx_head_stride")
    dk_ts, dk_hs = T.dynamic("dk_token_stride"), T.dynamic("dk_head_stride")
    v_ts, dv_ts = T.dynamic("v_token_stride"), T.dynamic("dv_token_stride")
    CORES = v.num_vec_cores
    H = v.max_hidden
    STEPS = H // THREADS

    @T.prim_func
    def engram_gate_bwd_kernel(
        G: T.StridedTensor((n, hc, hidden), (g_ts, g_hs, 1), "bfloat16"),
        X: T.StridedTensor((n, hc, hidden), (x_ts, x_hs, 1), "bfloat16"),
        K: T.StridedTensor((n, hc, hidden), (k_ts, k_hs, 1), "bfloat16"),
        V: T.StridedTensor((n, hidden), (v_ts, 1), "bfloat16"),
        W: T.Tensor((hc, hidden), "float32"),
        DOT: T.Tensor((n, hc), "float32"),
        GATE: T.Tensor((n, hc), "float32"),
        RSTD_X: T.Tensor((n, hc), "float32"),
        RSTD_K: T.Tensor((n, hc), "float32"),
        MASK: T.Tensor((n,), "uint8"),
        DX: T.StridedTensor((n, hc, hidden), (dx_ts, dx_hs, 1), "bfloat16"),
        DK: T.StridedTensor((n, hc, hidden), (dk_ts, dk_hs, 1), "bfloat16"),
        DV: T.StridedTensor((n, hidden), (dv_ts, 1), "bfloat16"),
        P: T.Tensor((CORES, hc, hidden), "float32"),
        clamp_value: T.float32,
        has_mask: T.int32,
    ):
        with T.Kernel(CORES) as core:
            gs = T.alloc_shared((H,), "bfloat16")  # g, then dx
            xs = T.alloc_shared((H,), "bfloat16")
            ks = T.alloc_shared((H,), "bfloat16")  # k, then dk
            vs = T.alloc_shared((H,), "bfloat16")  # v, then dv
            ws = T.alloc_shared((H,), "float32")
            pw = T.alloc_shared((H,), "float32")  # the core's partial row of the head
            dv = T.alloc_shared((H,), "float32")
            part = T.alloc_shared((THREADS,), "float32")
            for r in T.serial(T.ceildiv(n - core, CORES)):
                t = core + r * CORES
                T.copy(V[t, 0:H], vs)
                with T.SimtVF(threads=THREADS):
                    i = T.get_thread_binding()
                    for q in T.serial(STEPS):
                        dv[q * THREADS + i] = T.float32(0)
                for h in T.serial(hc):
                    T.copy(G[t, h, 0:H], gs)
                    T.copy(X[t, h, 0:H], xs)
                    T.copy(K[t, h, 0:H], ks)
                    T.copy(W[h, 0:H], ws)
                    T.copy(P[core, h, 0:H], pw)
                    with T.SimtVF(threads=THREADS):  # (A) the thread's part of sum g * v
                        i = T.get_thread_binding()
                        acc = T.alloc_var("float32")
                        acc = T.float32(0)
                        for q in T.serial(STEPS):
                            j = q * THREADS + i
                            if j < hidden:
                                acc = acc + T.cast(gs[j], "float32") * T.cast(vs[j], "float32")
                        part[i] = acc
                    with T.SimtVF(threads=THREADS):  # (B) the head's columns
                        i = T.get_thread_binding()
                        sgv = T.alloc_var("float32")
                        image = T.alloc_var("int32")
                        gate = T.alloc_var("float32")
                        gd = T.alloc_var("float32")
                        d = T.alloc_var("float32")
                        sgv = T.float32(0)
                        for p in T.serial(THREADS):
                            sgv = sgv + part[p]
                        image = 0
                        if has_mask != 0:
                            image = T.if_then_else(MASK[t] != T.uint8(0), 1, 0)
                        dot = DOT[t, h]
                        rx = RSTD_X[t, h]
                        rk = RSTD_K[t, h]
                        gate = GATE[t, h]
                        scale = T.float32(1) / T.sqrt(T.cast(hidden, "float32"))
                        d = dot * rx * rk * scale
                        gd = T.float32(0)
                        if image == 0 and T.abs(d) >= clamp_value and d != T.float32(0):
                            gd = sgv * gate * (T.float32(1) - gate) * (T.float32(0.5) / T.sqrt(T.max(T.abs(d), clamp_value)))
                        c = rx * rk * scale
                        ax = dot * rk * scale * (rx * rx * rx)
                        ak = dot * rx * scale * (rk * rk * rk)
                        gate = T.if_then_else(image != 0, T.float32(0), gate)
                        for q in T.serial(STEPS):
                            j = q * THREADS + i
                            if j < hidden:
                                g = T.cast(gs[j], "float32")
                                x = T.cast(xs[j], "float32")
                                k = T.cast(ks[j], "float32")
                                dv[j] = dv[j] + gate * g
                                pw[j] = pw[j] + gd * c * x * k
                                gs[j] = T.cast(g + gd * (c * k * ws[j] - ax * x / T.cast(hidden, "float32")), "bfloat16")
                                ks[j] = T.cast(gd * (c * x * ws[j] - ak * k / T.cast(hidden, "float32")), "bfloat16")
                    T.copy(gs[0:H], DX[t, h, 0:H])
                    T.copy(ks[0:H], DK[t, h, 0:H])
                    T.copy(pw[0:H], P[core, h, 0:H])
                with T.SimtVF(threads=THREADS):
                    i = T.get_thread_binding()
                    for q in T.serial(STEPS):
                        vs[q * THREADS + i] = T.cast(dv[q * THREADS + i], "bfloat16")
                T.copy(vs[0:H], DV[t, 0:H])

    return engram_gate_bwd_kernel
