"""swiglu_backward (+ _and_per_token_cast) for Ascend 950 (build time only), read from
tilebake.quant.swiglu_backward.SwigluBackwardAscendVariant. The arithmetic is numerics.md's
(2.1.0's, as tilebake.torch.swiglu.swiglu_backward): l, r the halves of x in fp32 (an e4m3 x
times its (1, 32) SF), clamped when has_clamp; t = 1 + exp(-l), sig = 1 / t, act = l / t * r;
gws = (g * e) * sig with the row factor e (has_weights), else g * sig; d l = (gws * r) *
fma(l, 1 - sig, 1), 0 where l > c; d r = gws * l, 0 where |r| > c; act_out = act * e (act without
weights); the row's fp32 sum of g * act for the weight gradient; the e4m3 copy of x_grad per
(1, 32) group of the fp32 gradient as per_token_cast casts.

A block per vector core, each taking rows core, core + num_vec_cores, ...; a row in chunks of
CHUNK columns of each half: the chunks (x's, its SFs, g's) DMA'd to the unified buffer, a SIMT
thread per 32 columns (its left and right groups), one thread adding the threads' sums of g * act
in order to the row's, the outputs DMA'd out (the copies bound the tails: hidden % 64 == 0 from
the host).

Built and lowered here, never run here: no NPU and no CANN toolkit on our machines; the accuracy
of the vector cores' expf and division against CUDA's, and their fmaf (the C library's fused
multiply-add, called by name), are unverified.
"""

import tilelang.ascend.language as T

from kernels_tl.ascend.quant.common import NPC, cast_group  # NPC: the (1, 32) group
from kernels_tl.quant.common import TL_DTYPES
from tilebake.quant.swiglu_backward import SwigluBackwardAscendVariant

CHUNK = 1024  # columns of each half a step: 32 groups, one SIMT thread each
GROUPS = CHUNK // NPC


def build(v: SwigluBackwardAscendVariant):
    n = T.dynamic("num_tokens")
    h = T.dynamic("hidden")
    quantized = v.in_dtype == "e4m3"
    cast = v.sf_mode != "none"
    x_dtype = "float8_e4m3fn" if quantized else TL_DTYPES[v.in_dtype]
    g_dtype = TL_DTYPES[v.grad_dtype]
    out_dtype = TL_DTYPES[v.out_fmt]
    sf_dtype = "uint8" if v.sf_mode == "ue8m0" else "float32"
    CORES = v.num_vec_cores

    @T.prim_func
    def swiglu_backward_kernel(
        X: T.Tensor((n, h * 2), x_dtype),
        SIN: T.Tensor((n, h * 2 // NPC), "float32"),  # (an e4m3 x's)
        G: T.Tensor((n, h), g_dtype),
        DX: T.Tensor((n, h * 2), out_dtype),
        Q: T.Tensor((n, h * 2), "float8_e4m3fn"),  # (the cast's)
        S: T.Tensor((n, h * 2 // NPC), sf_dtype),  # (the cast's)
        E: T.Tensor((n,), "float32"),  # the row factors (has_weights)
        ACT: T.Tensor((n, h), g_dtype),  # act_out (with_act)
        WS: T.Tensor((n,), "float32"),  # the rows' sums of g * act (has_weights)
        has_weights: T.int32,
        has_clamp: T.int32,
        with_act: T.int32,
        clamp_value: T.float32,
        amax_clamp: T.float32,
    ):
        with T.Kernel(CORES) as core:
            ls = T.alloc_shared((CHUNK,), x_dtype)
            rs = T.alloc_shared((CHUNK,), x_dtype)
            sfl = T.alloc_shared((GROUPS,), "float32")
            sfr = T.alloc_shared((GROUPS,), "float32")
            gs = T.alloc_shared((CHUNK,), g_dtype)
            dl = T.alloc_shared((CHUNK,), out_dtype)
            dr = T.alloc_shared((CHUNK,), out_dtype)
            vl = T.alloc_shared((CHUNK,) if cast else (8,), "float32")
            vr = T.alloc_shared((CHUNK,) if cast else (8,), "float32")
            ql = T.alloc_shared((CHUNK,) if cast else (32,), "float8_e4m3fn")
            qr = T.alloc_shared((CHUNK,) if cast else (32,), "float8_e4m3fn")
            ssl = T.alloc_shared((GROUPS,), sf_dtype)
            ssr = T.alloc_shared((GROUPS,), sf_dtype)
            acts = T.alloc_shared((CHUNK,), g_dtype)
            part = T.alloc_shared((GROUPS,), "float32")
            row = T.alloc_shared((8,), "float32")  # row[0]: e
            rsum = T.alloc_shared((8,), "float32")  # rsum[0]: the row's sum of g * act (a 32-byte aligned DMA source)
            for r in T.serial(T.ceildiv(n - core, CORES)):
                t = core + r * CORES
                if has_weights != 0:
                    T.copy(E[t : t + 1], row[0:1])
                with T.SimtVF(threads=1):
                    rsum[0] = T.float32(0)
                for step in T.serial(T.ceildiv(h, CHUNK)):
                    c0 = step * CHUNK
                    T.copy(X[t, c0 : c0 + CHUNK], ls)
                    T.copy(X[t, h + c0 : h + c0 + CHUNK], rs)
                    T.copy(G[t, c0 : c0 + CHUNK], gs)
                    if quantized:
                        T.copy(SIN[t, c0 // NPC : c0 // NPC + GROUPS], sfl)
                        T.copy(SIN[t, (h + c0) // NPC : (h + c0) // NPC + GROUPS], sfr)
                    with T.SimtVF(threads=GROUPS):
                        g = T.get_thread_binding()
                        lv = T.alloc_var("float32")
                        rv = T.alloc_var("float32")
                        gws = T.alloc_var("float32")
                        wsum = T.alloc_var("float32")
                        amax_l = T.alloc_var("float32")
                        amax_r = T.alloc_var("float32")
                        wsum = T.float32(0)
                        amax_l = T.float32(0)
                        amax_r = T.float32(0)
                        for j in T.serial(NPC):
                            k = g * NPC + j
                            lv = T.cast(ls[k], "float32")
                            rv = T.cast(rs[k], "float32")
                            if quantized:
                                lv = lv * sfl[g]
                                rv = rv * sfr[g]
                            l_hi = (has_clamp != 0) & (lv > clamp_value)
                            r_out = (has_clamp != 0) & ((rv > clamp_value) | (rv < -clamp_value))
                            if has_clamp != 0:
                                lv = T.min(lv, clamp_value)
                                rv = T.min(T.max(rv, -clamp_value), clamp_value)
                            den = T.float32(1) + T.exp(-lv)
                            sig = T.float32(1) / den
                            act = lv / den * rv
                            gv = T.cast(gs[k], "float32")
                            gws = gv * sig
                            if has_weights != 0:
                                gws = gv * row[0] * sig
                            d_l = T.if_then_else(
                                l_hi,
                                T.float32(0),
                                gws * rv * T.call_extern("float32", "fmaf", lv, T.float32(1) - sig, T.float32(1)),
                            )
                            d_r = T.if_then_else(r_out, T.float32(0), gws * lv)
                            dl[k] = T.cast(d_l, out_dtype)
                            dr[k] = T.cast(d_r, out_dtype)
                            if cast:
                                vl[k] = d_l
                                vr[k] = d_r
                                amax_l = T.max(amax_l, T.abs(d_l))
                                amax_r = T.max(amax_r, T.abs(d_r))
                            acts[k] = T.cast(T.if_then_else(has_weights != 0, act * row[0], act), g_dtype)
                            if c0 + k < h:  # a column past the row's end holds stale UB
                                wsum = wsum + gv * act
                        part[g] = wsum
                        if cast:
                            cast_group(vl, ql, ssl, g, amax_l, amax_clamp, v.sf_mode)
                            cast_group(vr, qr, ssr, g, amax_r, amax_clamp, v.sf_mode)
                    with T.SimtVF(threads=1):
                        for k in T.serial(GROUPS):
                            rsum[0] = rsum[0] + part[k]
                    T.copy(dl, DX[t, c0 : c0 + CHUNK])
                    T.copy(dr, DX[t, h + c0 : h + c0 + CHUNK])
                    if cast:
                        T.copy(ql, Q[t, c0 : c0 + CHUNK])
                        T.copy(qr, Q[t, h + c0 : h + c0 + CHUNK])
                        T.copy(ssl, S[t, c0 // NPC : c0 // NPC + GROUPS])
                        T.copy(ssr, S[t, (h + c0) // NPC : (h + c0) // NPC + GROUPS])
                    if with_act != 0:
                        T.copy(acts, ACT[t, c0 : c0 + CHUNK])
                if has_weights != 0:
                    T.copy(rsum[0:1], WS[t : t + 1])

    return swiglu_backward_kernel
