"""norm_forward_and_per_token_cast for Ascend 950 (build time only), one kernel, read from
tilebake.quant.norm_forward_and_per_token_cast.NormForwardCastAscendVariant: norm_forward's
RMSNorm (kernels_tl/ascend/quant/norm_forward.py's arithmetic and row passes), then its output,
rounded to x's dtype, cast per (1, 32) group to e4m3 as per_token_cast does (numerics.md) with
the SF as fp32, power-of-two fp32 or UE8M0 bytes (two to an int16 on the host side); optionally
the output's bf16 copy (with_out_bf16) and rstd (with_rstd); those and the weight's presence
(has_weight) are run-time flags.

A block per vector core, each taking rows core, core + num_vec_cores, ...: the row (and its
residual; the weight once) DMA'd to the unified buffer whole (hidden <= 8192), PARTS threads
summing squares, one thread adding the PARTS sums in order and taking rstd, then PARTS threads
each taking groups t, t + PARTS, ...: the group's outputs in x's dtype, their amax, SF and codes.
Same bytes as norm_forward's kernel followed by per_token_cast's, in one pass over the row.

Built and lowered here, never run here: no NPU and no CANN toolkit on our machines.
"""

import tilelang.ascend.language as T

from kernels_tl.ascend.quant.common import NPC, cast_group
from kernels_tl.ascend.quant.norm_common import PARTS, row_rstd
from kernels_tl.quant.common import TL_DTYPES
from tilebake.quant.norm_forward import MAX_HIDDEN
from tilebake.quant.norm_forward_and_per_token_cast import NormForwardCastAscendVariant

MAX_GROUPS = MAX_HIDDEN // NPC


def build(v: NormForwardCastAscendVariant):
    n = T.dynamic("num_rows")
    h = T.dynamic("hidden")
    dtype = TL_DTYPES[v.in_dtype]
    sf_dtype = "uint8" if v.sf_mode == "ue8m0" else "float32"
    CORES = v.num_vec_cores
    rstd_of_row = row_rstd(dtype, v.has_residual, h)

    @T.prim_func
    def norm_forward_and_per_token_cast_kernel(
        X: T.Tensor((n, h), dtype),
        D: T.Tensor((n, h), "float8_e4m3fn"),
        S: T.Tensor((n, h // NPC), sf_dtype),
        YB: T.Tensor((n, h), "bfloat16"),  # (X's address without with_out_bf16: never written then)
        RSTD: T.Tensor((n,), "float32"),  # (X's address without with_rstd: never written then)
        W: T.Tensor((h,), dtype),  # (X's address without has_weight: never read then)
        R: T.Tensor((n, h), dtype),
        RO: T.Tensor((n, h), dtype),
        eps: T.float32,
        out_scale: T.float32,
        amax_clamp: T.float32,
        has_weight: T.int32,
        with_rstd: T.int32,
        with_out_bf16: T.int32,
    ):
        with T.Kernel(CORES) as core:
            xs = T.alloc_shared((MAX_HIDDEN,), dtype)
            rs = T.alloc_shared((MAX_HIDDEN,), dtype)
            ws = T.alloc_shared((MAX_HIDDEN,), dtype)
            ys = T.alloc_shared((MAX_HIDDEN,), dtype)  # the norm's output, rounded to x's dtype
            yb = ys if v.in_dtype == "bf16" else T.alloc_shared((MAX_HIDDEN,), "bfloat16")  # its bf16 copy
            qs = T.alloc_shared((MAX_HIDDEN,), "float8_e4m3fn")
            ss = T.alloc_shared((MAX_GROUPS,), sf_dtype)
            part = T.alloc_shared((PARTS,), "float32")
            rstd = T.alloc_shared((8,), "float32")
            if has_weight != 0:
                T.copy(W[0:MAX_HIDDEN], ws)
            for r in T.serial(T.ceildiv(n - core, CORES)):
                row = core + r * CORES
                T.copy(X[row, 0:MAX_HIDDEN], xs)
                if v.has_residual:
                    T.copy(R[row, 0:MAX_HIDDEN], rs)
                rstd_of_row(xs, rs, part, rstd, eps)
                with T.SimtVF(threads=PARTS):
                    t = T.get_thread_binding()
                    for k in T.serial(T.ceildiv(h // NPC - t, PARTS)):
                        g = t + k * PARTS
                        amax = T.alloc_var("float32")
                        amax = T.float32(0)
                        for j in T.serial(NPC):
                            c = g * NPC + j
                            if has_weight != 0:
                                ys[c] = T.cast(
                                    T.cast(xs[c], "float32") * rstd[0] * (T.cast(ws[c], "float32") * out_scale), dtype
                                )
                            else:
                                ys[c] = T.cast(T.cast(xs[c], "float32") * rstd[0] * out_scale, dtype)
                            if v.in_dtype != "bf16":
                                yb[c] = T.cast(ys[c], "bfloat16")
                            amax = T.max(amax, T.abs(T.cast(ys[c], "float32")))
                        cast_group(ys, qs, ss, g, amax, amax_clamp, v.sf_mode)
                T.copy(qs, D[row, 0:MAX_HIDDEN])
                T.copy(ss, S[row, 0:MAX_GROUPS])
                if with_out_bf16 != 0:
                    T.copy(yb, YB[row, 0:MAX_HIDDEN])
                if v.has_residual:
                    T.copy(xs, RO[row, 0:MAX_HIDDEN])
                if with_rstd != 0:
                    T.copy(rstd[0:1], RSTD[row : row + 1])

    return norm_forward_and_per_token_cast_kernel
