"""swiglu_forward (+ _and_per_token_cast) for Ascend 950 (build time only), read from
tilebake.quant.swiglu_forward.SwigluForwardAscendVariant. The arithmetic is numerics.md's (2.1.0's,
as the CUDA kernel's): l, r the halves of x widened to fp32, clamped when has_clamp
(l = min(l, c), r = min(max(r, -c), c)); t = 1 + exp(-l); act = l / t * r (a true division, then
the multiplication); with weights act * e, e = w * s once a row (s = 1 without a routed scaling
factor); then rounded to bf16 / fp32, or cast per (1, 32) group to e4m3 as per_token_cast does.

A block per vector core, each taking rows core, core + num_vec_cores, ...; a row in chunks of
CHUNK output columns: both halves' chunks (and the row's weight) DMA'd to the unified buffer, a
SIMT thread per 32 columns (their act values, and for the cast their group's amax, SF and codes),
the outputs DMA'd out (the copies bound the row's tail: hidden % 64 == 0 from the host).

Built and lowered here, never run here: no NPU and no CANN toolkit on our machines; the accuracy
of the vector cores' expf and division against CUDA's is unverified.
"""

import tilelang.ascend.language as T

from kernels_tl.ascend.quant.common import NPC, cast_group  # NPC: the (1, 32) group
from kernels_tl.quant.common import TL_DTYPES
from tilebake.quant.swiglu_forward import SwigluForwardAscendVariant

CHUNK = 1024  # output columns a step: 32 groups, one SIMT thread each
GROUPS = CHUNK // NPC


def build(v: SwigluForwardAscendVariant):
    n = T.dynamic("num_tokens")
    h = T.dynamic("hidden")
    x_stride = T.dynamic("x_stride")
    in_dtype = TL_DTYPES[v.in_dtype]
    cast = v.out_fmt == "e4m3"
    out_dtype = "float8_e4m3fn" if cast else TL_DTYPES[v.out_fmt]
    sf_dtype = "uint8" if v.sf_mode == "ue8m0" else "float32"
    CORES = v.num_vec_cores

    @T.prim_func
    def swiglu_forward_kernel(
        X: T.StridedTensor((n, h * 2), (x_stride, 1), in_dtype),
        Y: T.Tensor((n, h), out_dtype),
        W: T.Tensor((n,), "float32"),  # (X's address when has_weights is 0: never read then)
        S: T.Tensor((n, h // NPC), sf_dtype),  # (the cast's; unused otherwise)
        has_weights: T.int32,
        has_clamp: T.int32,
        scale: T.float32,
        clamp_value: T.float32,
        amax_clamp: T.float32,
    ):
        with T.Kernel(CORES) as core:
            ls = T.alloc_shared((CHUNK,), in_dtype)
            rs = T.alloc_shared((CHUNK,), in_dtype)
            wb = T.alloc_shared((8,), "float32")  # the row's weight in wb[0]
            vals = T.alloc_shared((CHUNK,), "float32")
            ys = T.alloc_shared((CHUNK,), out_dtype)
            ss = T.alloc_shared((GROUPS,), sf_dtype)
            for r in T.serial(T.ceildiv(n - core, CORES)):
                row = core + r * CORES
                if has_weights != 0:
                    T.copy(W[row : row + 1], wb[0:1])
                for step in T.serial(T.ceildiv(h, CHUNK)):
                    c0 = step * CHUNK
                    T.copy(X[row, c0 : c0 + CHUNK], ls)
                    T.copy(X[row, h + c0 : h + c0 + CHUNK], rs)
                    with T.SimtVF(threads=GROUPS):
                        g = T.get_thread_binding()
                        e = T.alloc_var("float32")
                        e = T.float32(1)
                        if has_weights != 0:
                            e = wb[0] * scale
                        amax = T.alloc_var("float32")
                        amax = T.float32(0)
                        lv = T.alloc_var("float32")
                        rv = T.alloc_var("float32")
                        act = T.alloc_var("float32")
                        for j in T.serial(NPC):
                            lv = T.cast(ls[g * NPC + j], "float32")
                            rv = T.cast(rs[g * NPC + j], "float32")
                            if has_clamp != 0:
                                lv = T.min(lv, clamp_value)
                                rv = T.min(T.max(rv, -clamp_value), clamp_value)
                            act = lv / (T.float32(1) + T.exp(-lv)) * rv
                            if has_weights != 0:
                                act = act * e
                            if cast:
                                vals[g * NPC + j] = act
                                amax = T.max(amax, T.abs(act))
                            else:
                                ys[g * NPC + j] = T.cast(act, out_dtype)
                        if cast:
                            cast_group(vals, ys, ss, g, amax, amax_clamp, v.sf_mode)
                    T.copy(ys, Y[row, c0 : c0 + CHUNK])
                    if cast:
                        T.copy(ss, S[row, step * GROUPS : step * GROUPS + GROUPS])

    return swiglu_forward_kernel
