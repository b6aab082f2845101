"""The Engram gate forward, as a TileLang factory (build time only).

Persistent, one head a CTA: num_ctas_per_head x hc CTAs, CTA b taking head h = b % hc of tokens
c, c + num_ctas_per_head, ... (c = b // hc), so the hc CTAs of a token run side by side (v: one
HBM read, the rest L2 hits). The head's fused weight row is loaded once into shared memory (each
thread its own columns: no barrier), not once a token. THREADS threads, each owning VEC
contiguous elements per pass; PASSES passes cover the variant's max_hidden (512 to
16384: the registers a row takes). Per token, the x and k rows (and v's, with v_ahead) are
loaded whole, every pass's loads before the first use, and x stays in registers for the output.
Per thread, in fp32 and pass order: sum x^2, sum k^2 and sum (x * k) * w; a butterfly in each
warp, then the warps' partials in warp order (through shared memory, by token parity: one
barrier a token), so every thread holds the same three sums. Then

    rstd_x = rsqrt(sum x^2 / H + eps), rstd_k likewise, d = dot * rstd_x * rstd_k * scale,
    gate = 1 / (1 + exp(-s)), s = sign(d) * sqrt(max(|d|, clamp_value)) (NaN d stays NaN),
    out = bf16(x + gate * v)   (the product and the sum rounded apart, as the reference's torch ops)

with scale = 1 / sqrt(H); an image token (has_mask and MASK[t]) writes x unchanged. With save,
thread 0 writes the raw dot, the gate and both rstd. H % 8 == 0 (host check): each
thread-vector is whole or out of range.
"""

import dataclasses

import tilelang.language as T

from tilebake.engram.engram_gate_fwd import CTAS_PER_SM


PASS_CONFIGS = {"tl.disable_safe_memory_legalize": True}  # guarded per vector below


@dataclasses.dataclass(frozen=True)
class LaunchConfig:
    threads: int
    vec: int  # bf16 elements a thread per pass (8: one 16-byte vector)
    ctas_per_sm: int  # resident CTAs a SM (the host launches this many x SMs: CTAS_PER_SM)
    v_ahead: bool  # load v with x and k (before the reduction) rather than after it


# Per variant (its max_hidden): PASSES = max_hidden / (threads x vec) register slots of each row.
# The H200 sweep (bench/tune_engram_gate.py; bench/results/2026-12-02-NVIDIA-H200/session4/), 8001
# tokens x hc 4: 256 threads, 3 CTAs a SM, v loaded with x and k: 386.6 us at hidden 7168 (90.4% of
# copy bandwidth; 4 CTAs: 385.0), 261.2 at 5120 (4 CTAs: 272.6); v after the reduction 432-456, 128
# threads x 6-8 CTAs 456-922. Short rows want small CTAs, many a SM (session9/call1-2, 8001 x 4): the
# 512 class at 32 threads x 32 CTAs 32.0 / 21.2 us at 512 / 256 (64 threads: 33.6 / 32.5), the 1024
# class 32 x 24 56.3 / 44.6 at 1024 / 768 (128 x 12: 61.5 / 57.7), the 2048 class 128 x 8 106.5 at
# 2048 (256 x 6: 124.7), 86.6 at 1536.
CONFIGS = {
    512: LaunchConfig(threads=32, vec=8, ctas_per_sm=CTAS_PER_SM[512], v_ahead=True),
    1024: LaunchConfig(threads=32, vec=8, ctas_per_sm=CTAS_PER_SM[1024], v_ahead=True),
    2048: LaunchConfig(threads=128, vec=8, ctas_per_sm=CTAS_PER_SM[2048], v_ahead=True),
    4096: LaunchConfig(threads=128, vec=8, ctas_per_sm=CTAS_PER_SM[4096], v_ahead=True),
    8192: LaunchConfig(threads=256, vec=8, ctas_per_sm=CTAS_PER_SM[8192], v_ahead=True),
    16384: LaunchConfig(threads=512, vec=8, ctas_per_sm=CTAS_PER_SM[16384], v_ahead=True),
}


def candidate_configs(max_hidden=8192):
    """The search space of `python bench/tune_engram_gate.py build|run DIR` for a class."""
    if max_hidden == 512:
        return [LaunchConfig(t, 8, m, True) for t, m in ((32, 16), (32, 24), (32, 32), (64, 16), (64, 24), (64, 32))]
    if max_hidden == 1024:
        return [LaunchConfig(t, 8, m, True) for t, m in ((128, 12), (64, 16), (64, 24), (32, 24), (32, 32))]
    if max_hidden == 2048:
        return [LaunchConfig(t, 8, m, True) for t, m in ((128, 8), (64, 12), (64, 16))]
    if max_hidden == 4096:
        return [LaunchConfig(t, 8, m, True) for t, m in ((128, 6), (128, 8), (64, 8), (64, 12))]
    if max_hidden != 8192:
        return []
    return [
        LaunchConfig(t, 8, m, a)
        for t, m in ((128, 6), (128, 8), (256, 3), (256, 4), (512, 2))
        for a in (False, True)
    ]


def build(v, cfg: LaunchConfig | None = None):
    cfg = cfg or CONFIGS[v.max_hidden]
    THREADS, VEC, V_AHEAD = cfg.threads, cfg.vec, cfg.v_ahead
    PASS = THREADS * VEC
    PASSES = -(-v.max_hidden // PASS)
    WARPS = THREADS // 32

    num_tokens = T.dynamic("num_tokens")
    hc = T.dynamic("hc")
    hidden = T.dynamic("hidden")
    x_ts, x_hs = T.dynamic("x_token_stride"), T.dynamic("x_head_stride")
    k_ts, k_hs = T.dynamic("k_token_stride"), T.dynamic("k_head_stride")
    o_ts, o_hs = T.dynamic("out_token_stride"), T.dynamic("out_head_stride")
    v_ts = T.dynamic("v_token_stride")

    @T.prim_func
    def engram_gate_fwd_kernel(
        X: T.StridedTensor((num_tokens, hc, hidden), (x_ts, x_hs, 1), "bfloat16"),
        K: T.StridedTensor((num_tokens, hc, hidden), (k_ts, k_hs, 1), "bfloat16"),
        V: T.StridedTensor((num_tokens, hidden), (v_ts, 1), "bfloat16"),
        W: T.Tensor((hc, hidden), "float32"),
        MASK: T.Tensor((num_tokens,), "uint8"),
        OUT: T.StridedTensor((num_tokens, hc, hidden), (o_ts, o_hs, 1), "bfloat16"),
        DOT: T.Tensor((num_tokens, hc), "float32"),
        GATE: T.Tensor((num_tokens, hc), "float32"),
        RSTD_X: T.Tensor((num_tokens, hc), "float32"),
        RSTD_K: T.Tensor((num_tokens, hc), "float32"),
        eps: T.float32,
        clamp_value: T.float32,
        has_mask: T.int32,
        save: T.int32,
        num_ctas_per_head: T.int32,
    ):
        with T.Kernel(num_ctas_per_head * hc, threads=THREADS) as b:
            T.annotate_min_blocks_per_sm(cfg.ctas_per_sm)
            h = T.alloc_var("int32")
            c = T.alloc_var("int32")
            t = T.alloc_var("int32")
            h = b % hc
            c = b // hc
            # The host checks these: every thread-vector access is a whole 16-byte vector.
            T.assume(hidden % 8 == 0)
            T.assume(x_ts % 8 == 0)
            T.assume(x_hs % 8 == 0)
            T.assume(k_ts % 8 == 0)
            T.assume(k_hs % 8 == 0)
            T.assume(o_ts % 8 == 0)
            T.assume(o_hs % 8 == 0)
            T.assume(v_ts % 8 == 0)
            tx = T.get_thread_binding(0)
            ws = T.alloc_shared((PASSES * PASS,), "float32")
            xs = T.alloc_local((PASSES, VEC), "bfloat16")
            ks = T.alloc_local((PASSES, VEC), "bfloat16")
            wv = T.alloc_local((VEC,), "float32")
            vs = T.alloc_local((PASSES if V_AHEAD else 1, VEC), "bfloat16")
            ys = T.alloc_local((VEC,), "bfloat16")
            red = T.alloc_shared((2, 3, WARPS), "float32")
            sx = T.alloc_var("float32")
            sk = T.alloc_var("float32")
            sd = T.alloc_var("float32")
            rstd_x = T.alloc_var("float32")
            rstd_k = T.alloc_var("float32")
            gate = T.alloc_var("float32")
            passthrough = T.alloc_var("int32")
            scale = T.float32(1) / T.sqrt(T.cast(hidden, "float32"))
            for p in T.unroll(PASSES):  # the head's weight: this thread's columns, once
                if p * PASS + tx * VEC < hidden:
                    for q in T.unroll(VEC // 4):
                        for j in T.vectorized(4):
                            ws[p * PASS + tx * VEC + q * 4 + j] = W[h, p * PASS + tx * VEC + q * 4 + j]
            for i in T.serial(T.ceildiv(num_tokens - c, num_ctas_per_head)):
                t = c + i * num_ctas_per_head
                sx = T.float32(0)
                sk = T.float32(0)
                sd = T.float32(0)
                for p in T.unroll(PASSES):
                    if p * PASS + tx * VEC < hidden:
                        for j in T.vectorized(VEC):
                            xs[p, j] = X[t, h, p * PASS + tx * VEC + j]
                        for j in T.vectorized(VEC):
                            ks[p, j] = K[t, h, p * PASS + tx * VEC + j]
                        if V_AHEAD:
                            for j in T.vectorized(VEC):
                                vs[p, j] = V[t, p * PASS + tx * VEC + j]
                    else:
                        for j in T.unroll(VEC):
                            xs[p, j] = T.bfloat16(0)
                            ks[p, j] = T.bfloat16(0)
                for p in T.unroll(PASSES):
                    if p * PASS < hidden:
                        if p * PASS + tx * VEC < hidden:
                            for q in T.unroll(VEC // 4):
                                for j in T.vectorized(4):
                                    wv[q * 4 + j] = ws[p * PASS + tx * VEC + q * 4 + j]
                        else:
                            for j in T.unroll(VEC):
                                wv[j] = T.float32(0)
                        for j in T.unroll(VEC):
                            xf = T.cast(xs[p, j], "float32")
                            kf = T.cast(ks[p, j], "float32")
                            sx = sx + xf * xf
                            sk = sk + kf * kf
                            sd = sd + (xf * kf) * wv[j]
                for s in T.unroll(5):
                    sx = sx + T.shfl_xor(sx, 16 >> s)
                    sk = sk + T.shfl_xor(sk, 16 >> s)
                    sd = sd + T.shfl_xor(sd, 16 >> s)
                if tx % 32 == 0:
                    red[i % 2, 0, tx // 32] = sx
                    red[i % 2, 1, tx // 32] = sk
                    red[i % 2, 2, tx // 32] = sd
                T.sync_threads()
                sx = red[i % 2, 0, 0]
                sk = red[i % 2, 1, 0]
                sd = red[i % 2, 2, 0]
                for w in T.unroll(WARPS - 1):
                    sx = sx + red[i % 2, 0, w + 1]
                    sk = sk + red[i % 2, 1, w + 1]
                    sd = sd + red[i % 2, 2, w + 1]
                rstd_x = T.rsqrt(sx / T.cast(hidden, "float32") + eps)
                rstd_k = T.rsqrt(sk / T.cast(hidden, "float32") + eps)
                d = sd * rstd_x * rstd_k * scale
                root = T.sqrt(T.max(T.abs(d), clamp_value))
                signed = T.if_then_else(d > 0, root, T.if_then_else(d < 0, -root, d))  # d: 0 (gate 1/2) or NaN
                gate = T.float32(1) / (T.float32(1) + T.exp(-signed))
                if save != 0 and tx == 0:
                    DOT[t, h] = sd
                    GATE[t, h] = gate
                    RSTD_X[t, h] = rstd_x
                    RSTD_K[t, h] = rstd_k
                passthrough = T.if_then_else(has_mask != 0, T.if_then_else(MASK[t] != T.uint8(0), 1, 0), 0)
                for p in T.unroll(PASSES):
                    if p * PASS + tx * VEC < hidden:
                        if not V_AHEAD:
                            for j in T.vectorized(VEC):
                                vs[0, j] = V[t, p * PASS + tx * VEC + j]
                        for j in T.unroll(VEC):
                            vf = T.cast(vs[p if V_AHEAD else 0, j], "float32")
                            ys[j] = T.if_then_else(
                                passthrough != 0,
                                xs[p, j],
                                T.cast(T.ieee_add(T.cast(xs[p, j], "float32"), T.ieee_mul(gate, vf)), "bfloat16"),
                            )
                        for j in T.vectorized(VEC):
                            OUT[t, h, p * PASS + tx * VEC + j] = ys[j]

    return engram_gate_fwd_kernel
