"""engram_gate_fwd for Ascend 950 (build time only), read from
tilebake.engram.engram_gate_fwd.EngramGateFwdAscendVariant: per (token, head), in fp32,

    rstd_x = rsqrt(sum x^2 / H + eps), rstd_k likewise, dot = sum x * k * w,
    d = dot * rstd_x * rstd_k * (1 / sqrt(H)), gate = 1 / (1 + exp(-s)),
    s = sign(d) * sqrt(max(|d|, clamp_value)), out = bf16(x + gate * v)

(tilebake.torch.engram's arithmetic); an image token writes x unchanged; with save the raw dot,
the gate and both rstd are written.

A block per vector core, each taking the (token, head) rows core, core + num_vec_cores, ...: the
x, k and v rows and the head's fused-weight row DMA'd to the unified buffer (the copies bound
the row at H); THREADS SIMT threads, each over every THREADS-th column: (A) partial sums of x^2,
k^2 and x * k * w; (B) every thread adds the partials in thread order (the same bits), then its
columns of out, written over x's row; thread 0 writes the saved scalars to GM; the row DMA'd
out. Built and lowered here, never run on an NPU: checked on the CPU by
tests/ascend/test_emulated_engram.py.
"""

import tilelang.ascend.language as T

from tilebake.engram.engram_gate_fwd import EngramGateFwdAscendVariant

THREADS = 64


def build(v: EngramGateFwdAscendVariant):
    n = T.dynamic("num_tokens")
    hc = T.dynamic("hc")
    hidden = T.dynamic("hidden")
    x_ts, x_hs = T.dynamic("x_token_stride"), T.dynamic("x_head_stride")
    k_ts, k_hs = T.dynamic("k_token_stride"), T.dynamic("k_head_stride")
    o_ts, o_hs = T.dynamic("out_token_stride"), T.dynamic("out_head_stride")
    v_ts = T.dynamic("v_token_stride")
    CORES = v.num_vec_cores
    H = v.max_hidden
    STEPS = H // THREADS

    @T.prim_func
    def engram_gate_fwd_kernel(
        X: T.StridedTensor((n, hc, hidden), (x_ts, x_hs, 1), "bfloat16"),
        K: T.StridedTensor((n, hc, hidden), (k_ts, k_hs, 1), "bfloat16"),
        V: T.StridedTensor((n, hidden), (v_ts, 1), "bfloat16"),
        W: T.Tensor((hc, hidden), "float32"),
        MASK: T.Tensor((n,), "uint8"),
        OUT: T.StridedTensor((n, hc, hidden), (o_ts, o_hs, 1), "bfloat16"),
        DOT: T.Tensor((n, hc), "float32"),
        GATE: T.Tensor((n, hc), "float32"),
        RSTD_X: T.Tensor((n, hc), "float32"),
        RSTD_K: T.Tensor((n, hc), "float32"),
        eps: T.float32,
        clamp_value: T.float32,
        has_mask: T.int32,
        save: T.int32,
    ):
        with T.Kernel(CORES) as core:
            xs = T.alloc_shared((H,), "bfloat16")  # x, then out
            ks = T.alloc_shared((H,), "bfloat16")
            vs = T.alloc_shared((H,), "bfloat16")
            ws = T.alloc_shared((H,), "float32")
            part = T.alloc_shared((THREADS, 4), "float32")
            for r in T.serial(T.ceildiv(n * hc - core, CORES)):
                item = core + r * CORES
                t = item // hc
                h = item % hc
                T.copy(X[t, h, 0:H], xs)
                T.copy(K[t, h, 0:H], ks)
                T.copy(V[t, 0:H], vs)
                T.copy(W[h, 0:H], ws)
                with T.SimtVF(threads=THREADS):  # (A) the thread's partial sums
                    i = T.get_thread_binding()
                    sx = T.alloc_var("float32")
                    sk = T.alloc_var("float32")
                    sd = T.alloc_var("float32")
                    sx = T.float32(0)
                    sk = T.float32(0)
                    sd = T.float32(0)
                    for q in T.serial(STEPS):
                        j = q * THREADS + i
                        if j < hidden:
                            x = T.cast(xs[j], "float32")
                            k = T.cast(ks[j], "float32")
                            sx = sx + x * x
                            sk = sk + k * k
                            sd = sd + x * k * ws[j]
                    part[i, 0] = sx
                    part[i, 1] = sk
                    part[i, 2] = sd
                with T.SimtVF(threads=THREADS):  # (B) the row's gate and out
                    i = T.get_thread_binding()
                    sx = T.alloc_var("float32")
                    sk = T.alloc_var("float32")
                    dot = T.alloc_var("float32")
                    rx = T.alloc_var("float32")
                    rk = T.alloc_var("float32")
                    d = T.alloc_var("float32")
                    s = T.alloc_var("float32")
                    gate = T.alloc_var("float32")
                    image = T.alloc_var("int32")
                    sx = T.float32(0)
                    sk = T.float32(0)
                    dot = T.float32(0)
                    for p in T.serial(THREADS):
                        sx = sx + part[p, 0]
                        sk = sk + part[p, 1]
                        dot = dot + part[p, 2]
                    rx = T.rsqrt(sx / T.cast(hidden, "float32") + eps)
                    rk = T.rsqrt(sk / T.cast(hidden, "float32") + eps)
                    d = dot * rx * rk * (T.float32(1) / T.sqrt(T.cast(hidden, "float32")))
                    s = T.sqrt(T.max(T.abs(d), clamp_value))
                    s = T.if_then_else(d > T.float32(0), s, T.if_then_else(d < T.float32(0), -s, d * s))
                    gate = T.float32(1) / (T.float32(1) + T.exp(-s))
                    image = 0
                    if has_mask != 0:
                        image = T.if_then_else(MASK[t] != T.uint8(0), 1, 0)
                    for q in T.serial(STEPS):
                        j = q * THREADS + i
                        if j < hidden and image == 0:
                            xs[j] = T.cast(T.cast(xs[j], "float32") + gate * T.cast(vs[j], "float32"), "bfloat16")
                    if save != 0 and i == 0:
                        DOT[t, h] = dot
                        GATE[t, h] = gate
                        RSTD_X[t, h] = rx
                        RSTD_K[t, h] = rk
                T.copy(xs[0:H], OUT[t, h, 0:H])

    return engram_gate_fwd_kernel
