"""per_token_cast_and_cast_back for Ascend 950 (build time only): x quantised to e4m3 in
32-column groups and dequantised in place, y = x.dtype(fp32(q) * sf), with per_token_cast's
scale and codes (kernels_tl/ascend/quant/per_token_cast.py: fp32 c / 448 or a power of two) and
cast_back's product. Read from
tilebake.quant.per_token_cast_and_cast_back.PerTokenCastAndCastBackAscendVariant.

A block per vector core taking every num_vec_cores-th row; a row in chunks of CHUNK columns, DMA'd
in, rewritten in the unified buffer by a SIMT thread per group, DMA'd back. Built and lowered
here, never run here.
"""

import tilelang.ascend.language as T

from kernels_tl.ascend.quant.common import CHUNK, GROUPS, NPC, e4m3_code, e4m3_scales, group_amax
from kernels_tl.quant.common import TL_DTYPES
from tilebake.quant.per_token_cast_and_cast_back import PerTokenCastAndCastBackAscendVariant


def build(v: PerTokenCastAndCastBackAscendVariant):
    n = T.dynamic("num_tokens")
    h = T.dynamic("hidden")
    x_stride = T.dynamic("x_stride")
    dtype = TL_DTYPES[v.in_dtype]
    CORES = v.num_vec_cores

    @T.prim_func
    def per_token_cast_and_cast_back_kernel(X: T.StridedTensor((n, h), (x_stride, 1), dtype), amax_clamp: T.float32):
        with T.Kernel(CORES) as core:
            xs = T.alloc_shared((CHUNK,), dtype)
            for r in T.serial(T.ceildiv(n - core, CORES)):
                row = core + r * CORES
                for step in T.serial(T.ceildiv(h, CHUNK)):
                    T.copy(X[row, step * CHUNK], xs)
                    with T.SimtVF(threads=GROUPS):
                        g = T.get_thread_binding()
                        amax = group_amax(xs, g)
                        sf, inv = e4m3_scales(T.max(amax, amax_clamp), v.round_sf)
                        for j in T.serial(NPC):
                            q = e4m3_code(xs[g * NPC + j], inv)
                            xs[g * NPC + j] = T.cast(T.cast(q, "float32") * sf, dtype)
                    T.copy(xs, X[row, step * CHUNK])

    return per_token_cast_and_cast_back_kernel
