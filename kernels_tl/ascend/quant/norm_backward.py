"""norm_backward (RMSNorm backward) for Ascend 950 (build time only), read from
tilebake.quant.norm_backward.NormBackwardAscendVariant. The arithmetic is
tilebake.torch.norm.norm_backward_ref's: xhat = fp32(x) * rstd, gs = fp32(g) * (fp32(w) *
out_scale) (out_scale alone without weight), mean = sum(gs * xhat) / hidden,
x_grad = rstd * (gs - xhat * mean) (+ the residual's gradient), rounded to x's dtype; the weight
gradient's per-core partial sums of fp32(g) * xhat (the host sums the cores' rows and applies
out_scale).

A block per vector core, each taking rows core, core + num_vec_cores, ...: the row's gradient,
input (and residual gradient; the weight once) DMA'd to the unified buffer whole (hidden <=
8192), three SIMT passes (PARTS threads' partial sums of gs * xhat, one thread's mean, PARTS
threads' x_grad and weight partials), x_grad DMA'd out; the core's partial sums at the end.

Built and lowered here, never run here: no NPU and no CANN toolkit on our machines.
"""

import tilelang.ascend.language as T

from kernels_tl.quant.common import TL_DTYPES
from tilebake.quant.norm_backward import NormBackwardAscendVariant
from tilebake.quant.norm_forward import MAX_HIDDEN

PARTS = 64  # threads of the row's passes (and partial sums)


def build(v: NormBackwardAscendVariant):
    n = T.dynamic("num_tokens")
    h = T.dynamic("hidden")
    dtype = TL_DTYPES[v.in_dtype]
    CORES = v.num_vec_cores

    @T.macro
    def scaled_grad(gs, ws, c, out_scale):
        if v.has_weight:
            return T.cast(gs[c], "float32") * (T.cast(ws[c], "float32") * out_scale)
        return T.cast(gs[c], "float32") * out_scale

    @T.prim_func
    def norm_backward_kernel(
        G: T.Tensor((n, h), dtype),
        X: T.Tensor((n, h), dtype),
        RSTD: T.Tensor((n,), "float32"),
        DX: T.Tensor((n, h), dtype),
        W: T.Tensor((h,), dtype),
        P: T.Tensor((CORES, h), "float32"),
        ROG: T.Tensor((n, h), dtype),
        out_scale: T.float32,
    ):
        with T.Kernel(CORES) as core:
            gs = T.alloc_shared((MAX_HIDDEN,), dtype)
            xs = T.alloc_shared((MAX_HIDDEN,), dtype)
            ws = T.alloc_shared((MAX_HIDDEN,) if v.has_weight else (8,), dtype)
            rog = T.alloc_shared((MAX_HIDDEN,) if v.has_residual_grad else (8,), dtype)
            dx = T.alloc_shared((MAX_HIDDEN,), dtype)
            acc = T.alloc_shared((MAX_HIDDEN,) if v.has_weight else (8,), "float32")
            part = T.alloc_shared((PARTS,), "float32")
            rs = T.alloc_shared((8,), "float32")  # rs[0] the row's rstd, rs[1] its mean
            if v.has_weight:
                T.copy(W[0:MAX_HIDDEN], ws)
                with T.SimtVF(threads=PARTS):
                    t = T.get_thread_binding()
                    for k in T.serial(T.ceildiv(h - t, PARTS)):
                        acc[t + k * PARTS] = T.float32(0)
            for r in T.serial(T.ceildiv(n - core, CORES)):
                row = core + r * CORES
                T.copy(G[row, 0:MAX_HIDDEN], gs)
                T.copy(X[row, 0:MAX_HIDDEN], xs)
                T.copy(RSTD[row : row + 1], rs[0:1])
                if v.has_residual_grad:
                    T.copy(ROG[row, 0:MAX_HIDDEN], rog)
                with T.SimtVF(threads=PARTS):
                    t = T.get_thread_binding()
                    s = T.alloc_var("float32")
                    s = T.float32(0)
                    for k in T.serial(T.ceildiv(h - t, PARTS)):
                        c = t + k * PARTS
                        s = s + scaled_grad(gs, ws, c, out_scale) * (T.cast(xs[c], "float32") * rs[0])
                    part[t] = s
                with T.SimtVF(threads=1):
                    total = T.alloc_var("float32")
                    total = T.float32(0)
                    for k in T.serial(PARTS):
                        total = total + part[k]
                    rs[1] = total / T.cast(h, "float32")
                with T.SimtVF(threads=PARTS):
                    t = T.get_thread_binding()
                    for k in T.serial(T.ceildiv(h - t, PARTS)):
                        c = t + k * PARTS
                        xhat = T.cast(xs[c], "float32") * rs[0]
                        grad = rs[0] * (scaled_grad(gs, ws, c, out_scale) - xhat * rs[1])
                        if v.has_residual_grad:
                            grad = grad + T.cast(rog[c], "float32")
                        dx[c] = T.cast(grad, dtype)
                        if v.has_weight:
                            acc[c] = acc[c] + T.cast(gs[c], "float32") * xhat
                T.copy(dx, DX[row, 0:MAX_HIDDEN])
            if v.has_weight:
                T.copy(acc, P[core, 0:MAX_HIDDEN])

    return norm_backward_kernel
