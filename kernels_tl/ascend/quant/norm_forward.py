"""norm_forward (RMSNorm, optional residual add) for Ascend 950 (build time only), read from
tilebake.quant.norm_forward.NormForwardAscendVariant. The arithmetic is
tilebake.torch.norm.norm_forward_ref's: norm_input = x + residual rounded to x's dtype (x without
residual), v = fp32(norm_input), rstd = rsqrt(sum(v * v) / hidden + eps),
out = (v * rstd) * (w * out_scale) rounded to x's dtype.

A block per vector core, each taking rows core, core + num_vec_cores, ...: the row (and its
residual; the weight once) DMA'd to the unified buffer whole (hidden <= 8192), then three SIMT
passes: PARTS threads each summing the squares of every PARTS-th column (writing norm_input over
x's copy), one thread adding the PARTS sums in order and taking rstd, PARTS threads writing the
outputs; out, norm_input and rstd DMA'd out.

Built and lowered here, never run here: no NPU and no CANN toolkit on our machines.
"""

import tilelang.ascend.language as T

from kernels_tl.ascend.quant.norm_common import PARTS, row_rstd
from kernels_tl.quant.common import TL_DTYPES
from tilebake.quant.norm_forward import MAX_HIDDEN, NormForwardAscendVariant



def build(v: NormForwardAscendVariant):
    n = T.dynamic("num_rows")
    h = T.dynamic("hidden")
    dtype = TL_DTYPES[v.in_dtype]
    CORES = v.num_vec_cores
    rstd_of_row = row_rstd(dtype, v.has_residual, h)

    @T.prim_func
    def norm_forward_kernel(
        X: T.Tensor((n, h), dtype),
        Y: T.Tensor((n, h), dtype),
        RSTD: T.Tensor((n,), "float32"),  # (X's address without with_rstd: never written then)
        W: T.Tensor((h,), dtype),
        R: T.Tensor((n, h), dtype),
        RO: T.Tensor((n, h), dtype),
        eps: T.float32,
        out_scale: T.float32,
        with_rstd: T.int32,
    ):
        with T.Kernel(CORES) as core:
            xs = T.alloc_shared((MAX_HIDDEN,), dtype)
            rs = T.alloc_shared((MAX_HIDDEN,), dtype)
            ws = T.alloc_shared((MAX_HIDDEN,), dtype)
            ys = T.alloc_shared((MAX_HIDDEN,), dtype)
            part = T.alloc_shared((PARTS,), "float32")
            rstd = T.alloc_shared((8,), "float32")
            if v.has_weight:
                T.copy(W[0:MAX_HIDDEN], ws)
            for r in T.serial(T.ceildiv(n - core, CORES)):
                row = core + r * CORES
                T.copy(X[row, 0:MAX_HIDDEN], xs)
                if v.has_residual:
                    T.copy(R[row, 0:MAX_HIDDEN], rs)
                rstd_of_row(xs, rs, part, rstd, eps)
                with T.SimtVF(threads=PARTS):
                    t = T.get_thread_binding()
                    for k in T.serial(T.ceildiv(h - t, PARTS)):
                        c = t + k * PARTS
                        if v.has_weight:
                            ys[c] = T.cast(
                                T.cast(xs[c], "float32") * rstd[0] * (T.cast(ws[c], "float32") * out_scale), dtype
                            )
                        else:
                            ys[c] = T.cast(T.cast(xs[c], "float32") * rstd[0] * out_scale, dtype)
                T.copy(ys, Y[row, 0:MAX_HIDDEN])
                if v.has_residual:
                    T.copy(xs, RO[row, 0:MAX_HIDDEN])
                if with_rstd != 0:
                    T.copy(rstd[0:1], RSTD[row : row + 1])

    return norm_forward_kernel
