"""Fused SwiGLU backward for MoE experts, optionally with a per-token FP8 e4m3 cast of the
input gradient, as a TileLang factory.

Build time only: `build(variant)` returns the PrimFunc that build_tools/aot.py lowers. The
arithmetic is TileKernels 2.1.0's, written out in src/tilebake/torch/swiglu.py (the bit-exact
reference): t = 1 + exp(-l) (expf), sig = 1 / t, gws = g * sig (or (g * e) * sig with weights,
e = w * s, 0 on padding rows), d l = (gws * r) * fma(l, 1 - sig, 1), d r = gws * l, act =
(l / t) * r. Explicit __fmul_rn/__fadd_rn/__fsub_rn/__fmaf_rn, so nvcc contracts nothing else.
The divisions sig = 1 / t and l / t share one reciprocal and are correctly rounded without CUDA's
slow-path check and call when every |l| of a SUB-column chunk is < 64 (kernels_tl/quant/common.py),
else __fdiv_rn; l / t is computed only when act is needed (topk weights or do_recompute). Clamp,
topk weights and do_recompute are uniform branches; the satfinite e4m3 cvt clamps to +-448.

Mapping: one CTA of 64 threads per row; every row is computed (the psum layout, searched only
with topk weights, only zeroes e). Paired loop (H % npc == 0: the halves' SF groups line up; always
for the plain variants and npc 32): in pass i thread tx owns left columns c = 16 * (i * 64 + tx) < H
and right columns H + c: one load of x_left, x_right, act_x_grad[c:c+16] (and input SFs), one exp
and sig per pair, writes of d x_left, d x_right (their e4m3 casts) and act_out; pass i + 1's
vectors are loaded before pass i computes; the math runs in chunks of SUB columns (registers).
The split loop (H % 128 == 64 with npc 128) is the original mapping: in pass i thread tx owns 16
columns c = 16 * (i * 64 + tx) of the 2H row, a left column giving d x_left[c], a right one
d x_right[c - H], both reading x_left, x_right and act_x_grad at the same relative column. Either
way `npc / 16` consecutive lanes share an output SF group and reduce its amax with xor shuffles,
and weight_grad sums g * act per thread over its left columns in column order, then across the
warp by xor shuffles (16, 8, 4, 2, 1), then warp 0 + warp 1.
"""

import tilelang.language as T

from kernels_tl.quant.common import (
    FAST_DIV_MAX_ABS_X,
    TL_DTYPES,
    GroupScale,
    div_rn_into,
    group_scale_into,
    inv_rn_into,
    per_token_sf_buffer,
    psum_row_valid,
    reciprocal_into,
)
from tilebake.quant.swiglu_backward import SwigluBackwardVariant

THREADS = 64
VEC = 16
SUB = 4  # the paired loop computes a pass's VEC columns in chunks of SUB (register pressure)
# CTAs per SM asked of ptxas (__launch_bounds__(64, n)), by (x dtype, act_x_grad dtype): more
# resident warps hide the loads. bf16/e4m3 x with bf16 grads: 10 (96 registers on sm_90a, at
# most 16 bytes spilled); fp32 grads need 8 (128 registers, no spills); fp32 x keeps 1.
MIN_CTAS_PER_SM = {("bf16", "bf16"): 10, ("e4m3", "bf16"): 10, ("e4m3", "fp32"): 8, ("fp32", "fp32"): 1}
PASS_CONFIGS = {"tl.disable_safe_memory_legalize": True}  # every access is guarded per vector below
FLT_MAX = 3.4028234663852886e38
_ALIGN = {"bf16": 8, "fp32": 4, "e4m3": 16}  # elements in 16 bytes


def build(v: SwigluBackwardVariant):
    in_dtype = TL_DTYPES[v.in_dtype]
    grad_dtype = TL_DTYPES[v.grad_dtype]
    out_dtype = TL_DTYPES[v.out_fmt]
    quantized_in = v.in_dtype == "e4m3"
    quantize = v.num_per_channels > 0
    npc = max(v.num_per_channels, 16)
    lanes = npc // VEC if quantize else 1
    fmt_max = 448.0
    scale_spec = GroupScale(lanes, fmt_max, v.round_sf, v.packed_ue8m0)
    cols_per_pass = THREADS * VEC

    num_tokens = T.dynamic("num_tokens")
    hidden = T.dynamic("hidden")  # H: x is (num_tokens, 2H)
    x_stride = T.dynamic("x_stride")
    g_stride = T.dynamic("g_stride")
    num_experts = T.dynamic("num_experts")
    xs_stride_t = T.dynamic("xs_stride_t")
    xs_stride_g = T.dynamic("xs_stride_g")
    # fp32 SF [token, group] or packed UE8M0 bytes [token, word, byte]; runtime strides.
    sf_shape, sf_strides, sf_dtype = per_token_sf_buffer(num_tokens, 2 * hidden, npc, v.packed_ue8m0)
    num_groups = T.ceildiv(2 * hidden, npc)

    def make_pair_math(xl, xr, gf, lc, rc, den, rcp, silu, sig, gws, big, ds, drs, acts, wg, e, has_weights, clamp):
        """The paired loop's element math for the SUB columns h * SUB + j of a pass (SUB-wide
        temporaries keep the live registers few): x_left, x_right, act_x_grad as fp32 in xl, xr,
        gf -> d x_left in ds, d x_right in drs, act_out in acts (if do_recompute), g * act added
        to wg[0] in column order (if with_weights). need_act (a Python bool: weights or
        do_recompute) computes act = (l / t) * r. The formulas and their order are
        src/tilebake/torch/swiglu.py's."""

        @T.macro
        def pair_math(clamped, h, with_weights, need_act, do_recompute):
            for j in T.unroll(SUB):
                if clamped:
                    lc[j] = T.if_then_else(xl[h * SUB + j] > clamp, clamp, xl[h * SUB + j])
                    rc[j] = T.if_then_else(
                        xr[h * SUB + j] > clamp,
                        clamp,
                        T.if_then_else(xr[h * SUB + j] < -clamp, -clamp, xr[h * SUB + j]),
                    )
                else:
                    lc[j] = xl[h * SUB + j]
                    rc[j] = xr[h * SUB + j]
            big[0] = T.float32(0)  # max |l| (NaN ignored: it propagates through either path)
            for j in T.unroll(SUB):
                den[j] = T.ieee_add(T.float32(1), T.exp(-lc[j]))  # t; T.exp is expf
                big[0] = T.max(big[0], T.abs(lc[j]))
            if big[0] < T.float32(FAST_DIV_MAX_ABS_X):
                reciprocal_into(rcp, den, SUB)
                inv_rn_into(sig, den, rcp, SUB)
                if need_act:
                    div_rn_into(silu, lc, den, rcp, SUB)
            else:  # rare (|l| >= 64, inf): the divisions with CUDA's slow path
                for j in T.unroll(SUB):
                    sig[j] = T.ieee_fdiv(T.float32(1), den[j])
                    silu[j] = T.ieee_fdiv(lc[j], den[j])
            if need_act and has_weights != 0:  # (need_act is False only without weights)
                for j in T.unroll(SUB):
                    gws[j] = T.ieee_mul(T.ieee_mul(gf[h * SUB + j], e), sig[j])
            else:
                for j in T.unroll(SUB):
                    gws[j] = T.ieee_mul(gf[h * SUB + j], sig[j])
            for j in T.unroll(SUB):
                fma = T.ieee_fmaf(lc[j], T.ieee_sub(T.float32(1), sig[j]), T.float32(1))
                dl = T.ieee_mul(T.ieee_mul(gws[j], rc[j]), fma)
                dr = T.ieee_mul(gws[j], lc[j])
                if clamped:
                    ds[h * SUB + j] = T.if_then_else(xl[h * SUB + j] > clamp, T.float32(0), dl)
                    drs[h * SUB + j] = T.if_then_else(
                        T.Or(xr[h * SUB + j] > clamp, xr[h * SUB + j] < -clamp), T.float32(0), dr
                    )
                else:
                    ds[h * SUB + j] = dl
                    drs[h * SUB + j] = dr
            if need_act:
                for j in T.unroll(SUB):
                    acts[h * SUB + j] = T.ieee_mul(silu[j], rc[j])
            if with_weights:  # uniform
                for j in T.unroll(SUB):
                    wg[0] = T.ieee_add(wg[0], T.ieee_mul(gf[h * SUB + j], acts[h * SUB + j]))
                if do_recompute != 0:
                    for j in T.unroll(SUB):
                        acts[h * SUB + j] = T.ieee_mul(acts[h * SUB + j], e)

        return pair_math

    def make_load_pass(nls, nrs, ngs, nsf):
        """The paired loop's loads of the pass whose left column is c: x_left[c:c+16],
        x_right[c:c+16], act_x_grad[c:c+16] and the input SFs into nls, nrs, ngs, nsf (zeros and
        unit SFs past the row)."""

        @T.macro
        def load_pass(X, XS, G, row, c):
            if c < hidden:
                for j in T.vectorized(VEC):
                    nls[j] = X[row, c + j]
                for j in T.vectorized(VEC):
                    nrs[j] = X[row, hidden + c + j]
                for j in T.vectorized(VEC):
                    ngs[j] = G[row, c + j]
                if quantized_in:
                    nsf[0] = XS[row, c // npc]
                    nsf[1] = XS[row, (hidden + c) // npc]
            else:
                for j in T.vectorized(VEC):
                    nls[j] = T.cast(0, in_dtype)
                for j in T.vectorized(VEC):
                    nrs[j] = T.cast(0, in_dtype)
                for j in T.vectorized(VEC):
                    ngs[j] = T.cast(0, grad_dtype)
                nsf[0] = T.float32(1)
                nsf[1] = T.float32(1)

        return load_pass

    @T.prim_func
    def swiglu_backward_kernel(
        X: T.StridedTensor((num_tokens, 2 * hidden), (x_stride, 1), in_dtype),
        XS: T.StridedTensor((num_tokens, num_groups), (xs_stride_t, xs_stride_g), "float32"),  # e4m3 x only
        G: T.StridedTensor((num_tokens, hidden), (g_stride, 1), grad_dtype),
        DX: T.Tensor((num_tokens, 2 * hidden), out_dtype),
        Q: T.Tensor((num_tokens, 2 * hidden), "float8_e4m3fn"),  # quantize only
        S: T.StridedTensor(sf_shape, sf_strides, sf_dtype),  # quantize only
        A: T.Tensor((num_tokens, hidden), grad_dtype),
        WG: T.Tensor((num_tokens,), "float32"),
        W: T.Tensor((num_tokens,), "float32"),
        P: T.Tensor((num_experts,), "int32"),
        use_psum: T.int32,
        search_steps: T.int32,
        alignment: T.int32,
        has_weights: T.int32,
        do_recompute: T.int32,
        scale: T.float32,
        clamp_value: T.float32,
        amax_clamp: T.float32,  # quantize only
    ):
        with T.Kernel(num_tokens, threads=THREADS) as row:
            T.annotate_min_blocks_per_sm(MIN_CTAS_PER_SM[v.in_dtype, v.grad_dtype])
            T.assume(x_stride % _ALIGN[v.in_dtype] == 0)
            T.assume(g_stride % _ALIGN[v.grad_dtype] == 0)
            T.assume(hidden % 64 == 0)
            tx = T.get_thread_binding(0)
            valid = T.alloc_local((1,), "int32")  # is this row an expert's slot? uniform per CTA
            e = T.alloc_var("float32")  # the row's factor w * s (s = 1.0 when not given), 0 on padding rows
            e = T.float32(1)
            valid[0] = 1
            if has_weights != 0:
                psum_row_valid(valid, P, row, use_psum, num_experts, search_steps, alignment)
                e = T.if_then_else(valid[0] != 0, T.ieee_mul(W[row], scale), T.float32(0))
            ls = T.alloc_local((VEC,), in_dtype)
            rs = T.alloc_local((VEC,), in_dtype)
            gs = T.alloc_local((VEC,), grad_dtype)
            sf_l = T.alloc_var("float32")
            sf_r = T.alloc_var("float32")
            ds = T.alloc_local((VEC,), "float32")
            acts = T.alloc_local((VEC,), "float32")
            dxs = T.alloc_local((VEC,), out_dtype)
            qs = T.alloc_local((VEC,), "float8_e4m3fn")
            inv = T.alloc_local((1,), "float32")  # a quantised group's scale multiplier
            acts_out = T.alloc_local((VEC,), grad_dtype)
            wg = T.alloc_var("float32")
            red = T.alloc_shared((THREADS // 32,), "float32")
            wg = T.float32(0)
            nls = T.alloc_local((VEC,), in_dtype)  # paired loop: the next pass's vectors and SFs, prefetched
            nrs = T.alloc_local((VEC,), in_dtype)
            ngs = T.alloc_local((VEC,), grad_dtype)
            nsf = T.alloc_local((2,), "float32")
            drs = T.alloc_local((VEC,), "float32")
            dxrs = T.alloc_local((VEC,), out_dtype)
            xl = T.alloc_local((VEC,), "float32")  # paired loop: x_left, x_right, act_x_grad as fp32
            xr = T.alloc_local((VEC,), "float32")
            gf = T.alloc_local((VEC,), "float32")
            lc = T.alloc_local((SUB,), "float32")  # x_left', x_right' (clamped when asked) of SUB columns
            rc = T.alloc_local((SUB,), "float32")
            den = T.alloc_local((SUB,), "float32")  # t = 1 + exp(-l)
            rcp = T.alloc_local((SUB,), "float32")  # ~1 / den
            silu = T.alloc_local((SUB,), "float32")  # l / t
            sig = T.alloc_local((SUB,), "float32")
            gws = T.alloc_local((SUB,), "float32")  # (g * e) * sig, or g * sig
            big = T.alloc_local((1,), "float32")
            wgs = T.alloc_local((1,), "float32")  # paired loop's weight_grad partial sum
            wgs[0] = T.float32(0)
            load_pass = make_load_pass(nls, nrs, ngs, nsf)
            need_act = T.alloc_var("bool")
            need_act = has_weights != 0 or do_recompute != 0
            pair_math = make_pair_math(
                *(xl, xr, gf, lc, rc, den, rcp, silu, sig, gws, big, ds, drs, acts, wgs),
                *(e, has_weights, clamp_value),
            )
            # Paired loop (whenever the right half's SF groups line up with the left half's, H % npc == 0):
            # pass i's thread tx owns left columns c = 16 * (i * 64 + tx) < H and right columns H + c: one
            # load of x_left, x_right, act_x_grad and one exp and sig per pair, with the next pass's vectors
            # in flight while this one computes. The split loop is the H % 128 == 64 fallback.
            if hidden % npc == 0:
                load_pass(X, XS, G, row, tx * VEC)
                for i in T.serial(T.ceildiv(hidden, cols_per_pass)):
                    col = (i * THREADS + tx) * VEC  # a left column
                    for j in T.vectorized(VEC):
                        ls[j] = nls[j]
                    for j in T.vectorized(VEC):
                        rs[j] = nrs[j]
                    for j in T.vectorized(VEC):
                        gs[j] = ngs[j]
                    sf_l = nsf[0]
                    sf_r = nsf[1]
                    load_pass(X, XS, G, row, ((i + 1) * THREADS + tx) * VEC)  # in flight while pass i computes
                    for j in T.unroll(VEC):
                        xl[j] = T.cast(ls[j], "float32")
                        xr[j] = T.cast(rs[j], "float32")
                        if quantized_in:
                            xl[j] = T.ieee_mul(xl[j], sf_l)
                            xr[j] = T.ieee_mul(xr[j], sf_r)
                        gf[j] = T.cast(gs[j], "float32")
                    # Uniform: clamp or not (inf: no element is clamped); act only when used.
                    for h in T.unroll(VEC // SUB):
                        if need_act:
                            if clamp_value <= FLT_MAX:
                                pair_math(True, h, has_weights != 0 and col < hidden, True, do_recompute)
                            else:
                                pair_math(False, h, has_weights != 0 and col < hidden, True, do_recompute)
                        elif clamp_value <= FLT_MAX:
                            pair_math(True, h, False, False, 0)
                        else:
                            pair_math(False, h, False, False, 0)
                    for j in T.vectorized(VEC):
                        dxs[j] = T.cast(ds[j], out_dtype)
                    for j in T.vectorized(VEC):
                        dxrs[j] = T.cast(drs[j], out_dtype)
                    if col < hidden:
                        for j in T.vectorized(VEC):
                            DX[row, (i * THREADS + tx) * VEC + j] = dxs[j]
                        for j in T.vectorized(VEC):
                            DX[row, hidden + (i * THREADS + tx) * VEC + j] = dxrs[j]
                    if do_recompute != 0 and col < hidden:
                        for j in T.vectorized(VEC):
                            acts_out[j] = T.cast(acts[j], grad_dtype)
                        for j in T.vectorized(VEC):
                            A[row, (i * THREADS + tx) * VEC + j] = acts_out[j]
                    if quantize:
                        owner = col < hidden and (tx % lanes) == 0
                        group_scale_into(inv, ds, scale_spec, amax_clamp, S, row, col // npc, num_groups, owner)
                        for j in T.vectorized(VEC):
                            qs[j] = T.cast(ds[j] * inv[0], "float8_e4m3fn")
                        if col < hidden:
                            for j in T.vectorized(VEC):
                                Q[row, (i * THREADS + tx) * VEC + j] = qs[j]
                        group_scale_into(
                            inv, drs, scale_spec, amax_clamp, S, row, (hidden + col) // npc, num_groups, owner
                        )
                        for j in T.vectorized(VEC):
                            qs[j] = T.cast(drs[j] * inv[0], "float8_e4m3fn")
                        if col < hidden:
                            for j in T.vectorized(VEC):
                                Q[row, hidden + (i * THREADS + tx) * VEC + j] = qs[j]
                wg = wgs[0]
            else:
                for i in T.serial(T.ceildiv(2 * hidden, cols_per_pass)):
                    col = (i * THREADS + tx) * VEC  # in the 2H-wide row
                    left = col < hidden
                    sf_l = T.float32(1)
                    sf_r = T.float32(1)
                    if col < hidden:
                        for j in T.vectorized(VEC):
                            ls[j] = X[row, (i * THREADS + tx) * VEC + j]
                        for j in T.vectorized(VEC):
                            rs[j] = X[row, hidden + (i * THREADS + tx) * VEC + j]
                        for j in T.vectorized(VEC):
                            gs[j] = G[row, (i * THREADS + tx) * VEC + j]
                        if quantized_in:
                            sf_l = XS[row, col // npc]
                            sf_r = XS[row, (hidden + col) // npc]
                    elif col < 2 * hidden:
                        for j in T.vectorized(VEC):
                            ls[j] = X[row, (i * THREADS + tx) * VEC - hidden + j]
                        for j in T.vectorized(VEC):
                            rs[j] = X[row, (i * THREADS + tx) * VEC + j]
                        for j in T.vectorized(VEC):
                            gs[j] = G[row, (i * THREADS + tx) * VEC - hidden + j]
                        if quantized_in:
                            sf_l = XS[row, (col - hidden) // npc]
                            sf_r = XS[row, col // npc]
                    else:
                        for j in T.vectorized(VEC):
                            ls[j] = T.cast(0, in_dtype)
                        for j in T.vectorized(VEC):
                            rs[j] = T.cast(0, in_dtype)
                        for j in T.vectorized(VEC):
                            gs[j] = T.cast(0, grad_dtype)
                    for j in T.unroll(VEC):
                        # Intermediates in registers, each computed once (if_then_else expressions
                        # would be expanded and recomputed per use).
                        x_l = T.ieee_mul(T.cast(ls[j], "float32"), sf_l) if quantized_in else T.cast(ls[j], "float32")
                        x_r = T.ieee_mul(T.cast(rs[j], "float32"), sf_r) if quantized_in else T.cast(rs[j], "float32")
                        g = T.cast(gs[j], "float32")
                        lc = T.alloc_var("float32")
                        rc = T.alloc_var("float32")
                        den = T.alloc_var("float32")
                        sig = T.alloc_var("float32")
                        gw = T.alloc_var("float32")
                        lc = T.if_then_else(x_l > clamp_value, clamp_value, x_l)
                        rc = T.if_then_else(
                            x_r > clamp_value, clamp_value, T.if_then_else(x_r < -clamp_value, -clamp_value, x_r)
                        )
                        den = T.ieee_add(T.float32(1), T.exp(-lc))  # t
                        sig = T.ieee_fdiv(T.float32(1), den)
                        gw = T.ieee_mul(T.if_then_else(has_weights != 0, T.ieee_mul(g, e), g), sig)
                        if left:
                            t = T.alloc_var("float32")
                            t = T.ieee_mul(T.ieee_fdiv(lc, den), rc)  # act
                            dl = T.ieee_mul(
                                T.ieee_mul(gw, rc), T.ieee_fmaf(lc, T.ieee_sub(T.float32(1), sig), T.float32(1))
                            )
                            ds[j] = T.if_then_else(x_l > clamp_value, T.float32(0), dl)
                            acts[j] = T.if_then_else(has_weights != 0, T.ieee_mul(t, e), t)
                            wg = T.ieee_add(wg, T.ieee_mul(g, t))
                        else:
                            dr = T.ieee_mul(gw, lc)
                            ds[j] = T.if_then_else(T.Or(x_r > clamp_value, x_r < -clamp_value), T.float32(0), dr)
                    for j in T.vectorized(VEC):
                        dxs[j] = T.cast(ds[j], out_dtype)
                    if col < 2 * hidden:
                        for j in T.vectorized(VEC):
                            DX[row, (i * THREADS + tx) * VEC + j] = dxs[j]
                    if do_recompute != 0 and col < hidden:
                        for j in T.vectorized(VEC):
                            acts_out[j] = T.cast(acts[j], grad_dtype)
                        for j in T.vectorized(VEC):
                            A[row, (i * THREADS + tx) * VEC + j] = acts_out[j]
                    if quantize:
                        owner = col < 2 * hidden and (tx % lanes) == 0
                        group_scale_into(inv, ds, scale_spec, amax_clamp, S, row, col // npc, num_groups, owner)
                        for j in T.vectorized(VEC):
                            qs[j] = T.cast(ds[j] * inv[0], "float8_e4m3fn")
                        if col < 2 * hidden:
                            for j in T.vectorized(VEC):
                                Q[row, (i * THREADS + tx) * VEC + j] = qs[j]
            if has_weights != 0:
                for s in T.unroll(5):
                    wg = T.ieee_add(wg, T.shfl_xor(wg, 16 >> s))
                if tx % 32 == 0:
                    red[tx // 32] = wg
                T.sync_threads()
                if tx == 0:
                    WG[row] = T.if_then_else(valid[0] != 0, T.ieee_mul(T.ieee_add(red[0], red[1]), scale), T.float32(0))

    return swiglu_backward_kernel
