"""RMSNorm backward, as a TileLang factory (build time only).

With r = rstd (saved by the forward), xhat = x * r, y = xhat * w * out_scale, g = out_grad:
    g'     = g * (w * out_scale)
    x_grad = r * (g' - xhat * (sum(g' * xhat) / H))   (+ residual_out_grad)
    dw     = out_scale * sum over rows of (g * xhat)
(d y_j / d x_k = r w_j s (delta_jk - xhat_j xhat_k / H), since d r / d x_k = -r^3 x_k / H.)

Persistent: `num_ctas` CTAs (a runtime dim: the shape of the partials tensor P; the host
launches CTAS_PER_SM per SM), CTA c takes rows c, c + num_ctas, ...; each thread keeps its
columns' dw in fp32 registers and writes them once to P[c, :] at the end; norm_backward_reduce (kernels_tl/quant/norm_backward_reduce.py) sums P over CTAs. No grid sync is
needed, so the plain launcher suffices. Thread mapping: THREADS threads x VEC contiguous
elements per pass, PASSES passes cover MAX_HIDDEN; a thread-vector is all valid or all
masked (the host checks hidden % 32 == 0).
"""

import tilelang.language as T

from kernels_tl.quant.common import TL_DTYPES

THREADS = 256
VEC = 8  # 16 B of bf16, 32 B of fp32
PASS = THREADS * VEC  # 2048 elements
MAX_HIDDEN = 8192
PASSES = MAX_HIDDEN // PASS
WARPS = THREADS // 32
# The host launches min(CTAS_PER_SM * num_sms, num_tokens) CTAs (the same table is in
# src/tilebake/quant/norm_backward.py). bf16: two CTAs of 256 threads in 128 registers each,
# with a row's g, x, w (and residual_out_grad) in flight: 64-96 KB per SM. fp32 rows need
# twice the registers: one CTA per SM, which may use 255.
CTAS_PER_SM = {"bf16": 2, "fp32": 1}

# Every access is guarded per thread-vector below; TileLang's per-element guards would
# split each 16-byte access into scalar ones.
PASS_CONFIGS = {"tl.disable_safe_memory_legalize": True}


def build(v):
    in_dtype = TL_DTYPES[v.in_dtype]
    align = 16 // (2 if v.in_dtype == "bf16" else 4)  # elements in 16 bytes: what the host guarantees
    has_weight, has_rog = v.has_weight, v.has_residual_grad

    num_tokens = T.dynamic("num_tokens")
    hidden = T.dynamic("hidden")
    num_ctas = T.dynamic("num_ctas")
    g_stride = T.dynamic("out_grad_stride")
    x_stride = T.dynamic("x_stride")
    rog_stride = T.dynamic("residual_out_grad_stride")
    dx_stride = T.dynamic("x_grad_stride")

    @T.prim_func
    def norm_backward_kernel(
        G: T.StridedTensor((num_tokens, hidden), (g_stride, 1), in_dtype),
        X: T.StridedTensor((num_tokens, hidden), (x_stride, 1), in_dtype),
        W: T.Tensor((hidden,), in_dtype),
        RSTD: T.Tensor((num_tokens,), "float32"),
        ROG: T.StridedTensor((num_tokens, hidden), (rog_stride, 1), in_dtype),
        DX: T.StridedTensor((num_tokens, hidden), (dx_stride, 1), in_dtype),
        P: T.Tensor((num_ctas, hidden), "float32"),
        out_scale: T.float32,
    ):
        with T.Kernel(num_ctas, threads=THREADS) as c:
            # bf16: two CTAs per SM, one's loads overlap the other's reduction barrier.
            T.annotate_min_blocks_per_sm(CTAS_PER_SM[v.in_dtype])
            # The host checks these; they make every thread-vector access whole 16-byte vectors.
            T.assume(hidden % 32 == 0)
            T.assume(g_stride % align == 0)
            T.assume(x_stride % align == 0)
            T.assume(dx_stride % align == 0)
            if has_rog:
                T.assume(rog_stride % align == 0)
            tx = T.get_thread_binding(0)
            # The row's g, x (and residual_out_grad) in registers in their own dtype (half the
            # registers of fp32 for bf16); g * w and x * rstd are recomputed in the second pass.
            # All loads of a row are issued before the first use; the math is unguarded
            # (masked slots hold 0 and add exact zeros), so the compiler cannot sink a later
            # pass's loads into a guarded block after an earlier pass's math.
            gs = T.alloc_local((PASSES, VEC), in_dtype)
            xs = T.alloc_local((PASSES, VEC), in_dtype)
            rs = T.alloc_local((PASSES, VEC), in_dtype)
            ws = T.alloc_local((PASSES, VEC), in_dtype)  # the weight, reloaded per row (L1 hits): kept
            # across rows, its fp32 products would be hoisted out of the loop and spill
            acc = T.alloc_local((PASSES, VEC), "float32")  # this CTA's sum of g * xhat
            ob = T.alloc_local((VEC,), in_dtype)
            pb = T.alloc_local((VEC,), "float32")
            # Two slots, alternating by row: one barrier per row is enough (a warp can only
            # rewrite a slot after every warp has passed the next row's barrier).
            red = T.alloc_shared((2, WARPS), "float32")
            dot = T.alloc_var("float32")
            total = T.alloc_var("float32")
            r = T.alloc_var("float32")
            t = T.alloc_var("int32")
            if has_weight:
                for p in T.unroll(PASSES):
                    for j in T.unroll(VEC):
                        acc[p, j] = T.float32(0)

            for i in T.serial(T.ceildiv(num_tokens - c, num_ctas)):
                t = c + i * num_ctas
                r = RSTD[t]
                for p in T.unroll(PASSES):
                    if p * PASS + tx * VEC < hidden:
                        for j in T.vectorized(VEC):
                            gs[p, j] = G[t, p * PASS + tx * VEC + j]
                        for j in T.vectorized(VEC):
                            xs[p, j] = X[t, p * PASS + tx * VEC + j]
                        if has_rog:
                            for j in T.vectorized(VEC):
                                rs[p, j] = ROG[t, p * PASS + tx * VEC + j]
                        if has_weight:
                            for j in T.vectorized(VEC):
                                ws[p, j] = W[p * PASS + tx * VEC + j]
                    else:
                        for j in T.unroll(VEC):
                            gs[p, j] = T.cast(0, in_dtype)
                            xs[p, j] = T.cast(0, in_dtype)
                            if has_rog:
                                rs[p, j] = T.cast(0, in_dtype)
                            if has_weight:
                                ws[p, j] = T.cast(0, in_dtype)
                dot = T.float32(0)
                for p in T.unroll(PASSES):
                    if has_weight:
                        for j in T.unroll(VEC):
                            xh = T.cast(xs[p, j], "float32") * r
                            acc[p, j] = acc[p, j] + T.cast(gs[p, j], "float32") * xh
                            dot = dot + (T.cast(gs[p, j], "float32") * (T.cast(ws[p, j], "float32") * out_scale)) * xh
                    else:
                        for j in T.unroll(VEC):
                            xh = T.cast(xs[p, j], "float32") * r
                            dot = dot + (T.cast(gs[p, j], "float32") * out_scale) * xh
                # Block sum of dot: warp butterfly, then the WARPS partials in a fixed order.
                for s in T.unroll(5):
                    dot = dot + T.shfl_xor(dot, 16 >> s)
                if tx % 32 == 0:
                    red[i % 2, tx // 32] = dot
                T.sync_threads()
                total = red[i % 2, 0]
                for k in T.unroll(WARPS - 1):
                    total = total + red[i % 2, k + 1]
                mean = total / T.cast(hidden, "float32")
                for p in T.unroll(PASSES):
                    for j in T.unroll(VEC):
                        xh = T.cast(xs[p, j], "float32") * r
                        gw = T.cast(gs[p, j], "float32") * (
                            (T.cast(ws[p, j], "float32") * out_scale) if has_weight else out_scale
                        )
                        if has_rog:
                            ob[j] = T.cast(r * (gw - xh * mean) + T.cast(rs[p, j], "float32"), in_dtype)
                        else:
                            ob[j] = T.cast(r * (gw - xh * mean), in_dtype)
                    if p * PASS + tx * VEC < hidden:
                        for j in T.vectorized(VEC):
                            DX[t, p * PASS + tx * VEC + j] = ob[j]

            if has_weight:
                for p in T.unroll(PASSES):
                    if p * PASS + tx * VEC < hidden:
                        for j in T.unroll(VEC):
                            pb[j] = acc[p, j] * out_scale
                        for j in T.vectorized(VEC):
                            P[c, p * PASS + tx * VEC + j] = pb[j]

    return norm_backward_kernel
