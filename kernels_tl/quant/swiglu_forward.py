"""Fused SwiGLU forward for MoE experts, optionally with a per-token FP8 e4m3 cast, as a TileLang factory.

Build time only: `build(variant)` returns the PrimFunc that build_tools/aot.py lowers. The
arithmetic is TileKernels 2.1.0's, written out in src/tilebake/torch/swiglu.py (the bit-exact
reference): t = 1 + exp(-l) with the accurate expf, out = (l / t) * r, times e = w * s (once per
row) with topk weights. Every multiply and add is an explicit __fmul_rn/__fadd_rn, so nvcc cannot
contract them into FMAs. The division l / t is correctly rounded without CUDA's slow-path check
and call when every |l| of a thread's 16 columns is < 64 (kernels_tl/quant/common.py div_rn_into;
the rare other chunks take __fdiv_rn). The cast follows kernels_tl/quant/per_token_cast.py
(../shared/spec/numerics.md); its satfinite cvt does the clamp to +-448.

Per element (bf16 -> e4m3, no clamp) the hot path is about 30 SASS instructions (expf 8, the
division 6, 2 multiplies, conversions, amax, cvt), within the ~35 that 4.3 TB/s allows. Clamp
and topk weights are uniform branches, not per-element selects.

Mapping: one CTA of 64 threads per row; every row is computed, padding rows of the psum layout
too (2.1.0 does). Thread tx owns 16 consecutive output columns j = 16 * (i * 64 + tx) in pass i,
reading x_left[j:j+16] and x_right[j:j+16]; pass i + 1's vectors are loaded before pass i
computes, so a thread always has a load in flight while it works through the serial expf/division
chains. `npc / 16` consecutive lanes share an SF group and reduce its amax with warp shuffles
(64 * 16 columns per pass is a multiple of every group width). Clamp statistics are reduced per
row and written to a (num_tokens, 4) int32 buffer that the host sums (no atomics); only there does
the psum layout matter: a binary search of psum (`search_steps` = num_experts.bit_length() steps,
once per CTA) finds whether the row is an expert's, and padding rows write zero counts.
"""

import tilelang.language as T

from kernels_tl.quant.common import (
    FAST_DIV_MAX_ABS_X,
    TL_DTYPES,
    GroupScale,
    div_rn_into,
    group_scale_into,
    per_token_sf_buffer,
    psum_row_valid,
    reciprocal_into,
)
from tilebake.quant.swiglu_forward import SwigluForwardVariant

THREADS = 64
VEC = 16  # output columns per thread per pass
# CTAs per SM asked of ptxas (__launch_bounds__(64, n)): more resident warps hide the loads.
# bf16 x: 10 (96 registers on sm_90a, no spills); fp32 x keeps the default 1 (about 120
# registers: 8 CTAs per SM anyway).
MIN_CTAS_PER_SM = {"bf16": 10, "fp32": 1}
PASS_CONFIGS = {"tl.disable_safe_memory_legalize": True}  # every access is guarded per vector below
FLT_MAX = 3.4028234663852886e38


def build(v: SwigluForwardVariant):
    in_dtype = TL_DTYPES[v.in_dtype]
    out_dtype = TL_DTYPES[v.out_fmt]
    quantize = v.out_fmt == "e4m3"
    npc = max(v.num_per_channels, VEC)  # the plain variants have no SF (and no S parameter)
    lanes = npc // VEC if quantize else 1
    fmt_max = 448.0
    scale_spec = GroupScale(lanes, fmt_max, v.round_sf, v.packed_ue8m0)
    cols_per_pass = THREADS * VEC

    num_tokens = T.dynamic("num_tokens")
    hidden = T.dynamic("hidden")  # H: x is (num_tokens, 2H)
    x_stride = T.dynamic("x_stride")
    y_stride = T.dynamic("y_stride")
    num_experts = T.dynamic("num_experts")
    # fp32 SF [token, group] or packed UE8M0 bytes [token, word, byte]; runtime strides.
    sf_shape, sf_strides, sf_dtype = per_token_sf_buffer(num_tokens, hidden, npc, v.packed_ue8m0)
    num_groups = T.ceildiv(hidden, npc)

    @T.prim_func
    def swiglu_forward_kernel(
        X: T.StridedTensor((num_tokens, 2 * hidden), (x_stride, 1), in_dtype),
        Y: T.StridedTensor((num_tokens, hidden), (y_stride, 1), out_dtype),
        S: T.StridedTensor(sf_shape, sf_strides, sf_dtype),  # unused (and not a kernel parameter) unless quantize
        W: T.Tensor((num_tokens,), "float32"),
        P: T.Tensor((num_experts,), "int32"),
        C: T.Tensor((num_tokens, 4), "int32"),
        use_psum: T.int32,
        search_steps: T.int32,
        alignment: T.int32,
        has_weights: T.int32,
        count_clamps: T.int32,
        scale: T.float32,
        clamp_value: T.float32,
        amax_clamp: T.float32,
    ):
        with T.Kernel(num_tokens, threads=THREADS) as row:
            T.annotate_min_blocks_per_sm(MIN_CTAS_PER_SM[v.in_dtype])
            T.assume(x_stride % (16 // (2 if v.in_dtype == "bf16" else 4)) == 0)
            T.assume(y_stride % 16 == 0)
            T.assume(hidden % 64 == 0)
            tx = T.get_thread_binding(0)
            valid = T.alloc_local((1,), "int32")  # is this row an expert's slot? (clamp counts only)
            e = T.alloc_var("float32")  # the row's factor w * s (s = 1.0 when not given: the same result)
            e = T.float32(1)
            if has_weights != 0:
                e = T.ieee_mul(W[row], scale)
            ls = T.alloc_local((VEC,), in_dtype)
            rs = T.alloc_local((VEC,), in_dtype)
            nls = T.alloc_local((VEC,), in_dtype)  # the next pass's vectors, loaded before this pass computes
            nrs = T.alloc_local((VEC,), in_dtype)
            ys = T.alloc_local((VEC,), "float32")
            xl = T.alloc_local((VEC,), "float32")  # x_left, x_right as fp32 (clamped when asked)
            xr = T.alloc_local((VEC,), "float32")
            den = T.alloc_local((VEC,), "float32")  # 1 + exp(-x_left)
            rcp = T.alloc_local((VEC,), "float32")  # ~1 / den
            silu = T.alloc_local((VEC,), "float32")
            big = T.alloc_local((1,), "float32")
            outs = T.alloc_local((VEC,), out_dtype)
            inv = T.alloc_local((1,), "float32")  # a quantised group's scale multiplier
            counts = T.alloc_local((3,), "int32")
            red = T.alloc_shared((THREADS // 32, 3), "int32")
            for k in T.unroll(3):
                counts[k] = 0
            # Pass 0's vectors (zeros for columns past the row, as every pass).
            if tx * VEC < hidden:
                for j in T.vectorized(VEC):
                    nls[j] = X[row, tx * VEC + j]
                for j in T.vectorized(VEC):
                    nrs[j] = X[row, hidden + tx * VEC + j]
            else:
                for j in T.vectorized(VEC):
                    nls[j] = T.cast(0, in_dtype)
                for j in T.vectorized(VEC):
                    nrs[j] = T.cast(0, in_dtype)
            for i in T.serial(T.ceildiv(hidden, cols_per_pass)):
                col = (i * THREADS + tx) * VEC
                for j in T.vectorized(VEC):
                    ls[j] = nls[j]
                for j in T.vectorized(VEC):
                    rs[j] = nrs[j]
                # Prefetch pass i + 1 so its loads are in flight while pass i computes.
                if ((i + 1) * THREADS + tx) * VEC < hidden:
                    for j in T.vectorized(VEC):
                        nls[j] = X[row, ((i + 1) * THREADS + tx) * VEC + j]
                    for j in T.vectorized(VEC):
                        nrs[j] = X[row, hidden + ((i + 1) * THREADS + tx) * VEC + j]
                else:
                    for j in T.vectorized(VEC):
                        nls[j] = T.cast(0, in_dtype)
                    for j in T.vectorized(VEC):
                        nrs[j] = T.cast(0, in_dtype)
                for j in T.unroll(VEC):
                    xl[j] = T.cast(ls[j], "float32")
                    xr[j] = T.cast(rs[j], "float32")
                if clamp_value <= FLT_MAX:  # uniform: without a clamp (inf) no element is clamped
                    for j in T.unroll(VEC):
                        counts[0] += T.if_then_else(xl[j] > clamp_value, 1, 0)
                        counts[1] += T.if_then_else(xr[j] > clamp_value, 1, 0)
                        counts[2] += T.if_then_else(xr[j] < -clamp_value, 1, 0)
                        xl[j] = T.if_then_else(xl[j] > clamp_value, clamp_value, xl[j])
                        xr[j] = T.if_then_else(xr[j] > clamp_value, clamp_value, xr[j])
                        xr[j] = T.if_then_else(xr[j] < -clamp_value, -clamp_value, xr[j])
                big[0] = T.float32(0)  # max |l| (NaN ignored: it propagates through either path)
                for j in T.unroll(VEC):
                    den[j] = T.ieee_add(T.float32(1), T.exp(-xl[j]))  # t; T.exp is expf
                    big[0] = T.max(big[0], T.abs(xl[j]))
                if big[0] < T.float32(FAST_DIV_MAX_ABS_X):
                    reciprocal_into(rcp, den, VEC)
                    div_rn_into(silu, xl, den, rcp, VEC)
                else:  # rare (|l| >= 64, inf): the division with CUDA's slow path
                    for j in T.unroll(VEC):
                        silu[j] = T.ieee_fdiv(xl[j], den[j])
                for j in T.unroll(VEC):
                    ys[j] = T.ieee_mul(silu[j], xr[j])
                if has_weights != 0:
                    for j in T.unroll(VEC):
                        ys[j] = T.ieee_mul(ys[j], e)
                if quantize:
                    owner = col < hidden and (tx % lanes) == 0
                    group_scale_into(inv, ys, scale_spec, amax_clamp, S, row, col // npc, num_groups, owner)
                    for j in T.vectorized(VEC):
                        outs[j] = T.cast(ys[j] * inv[0], out_dtype)  # the satfinite cvt clamps to +-448 (NaN stays NaN)
                else:
                    for j in T.vectorized(VEC):
                        outs[j] = T.cast(ys[j], out_dtype)
                if col < hidden:
                    for j in T.vectorized(VEC):
                        Y[row, (i * THREADS + tx) * VEC + j] = outs[j]
            if count_clamps != 0:
                # Warp sums, then the CTA's; written by thread 0, zeros for padding rows.
                psum_row_valid(valid, P, row, use_psum, num_experts, search_steps, alignment)
                for k in T.unroll(3):
                    for s in T.unroll(5):
                        counts[k] += T.shfl_xor(counts[k], 16 >> s)
                if tx % 32 == 0:
                    for k in T.unroll(3):
                        red[tx // 32, k] = counts[k]
                T.sync_threads()
                if tx == 0:
                    for k in T.unroll(3):
                        C[row, k] = valid[0] * (red[0, k] + red[1, k])
                    C[row, 3] = valid[0] * hidden

    return swiglu_forward_kernel
