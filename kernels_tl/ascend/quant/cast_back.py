"""cast_back for Ascend 950 (build time only): e4m3 data in (1, 32) blocks -> bf16 / fp32,
y = fp32(data) * sf rounded once to the output (numerics.md's dequantisation), the SF fp32 or
UE8M0 bytes (2^(b - 127), two to an int16), read from
tilebake.quant.cast_back.CastBackAscendVariant.

A block per vector core, each taking rows core, core + num_vec_cores, ...; a row in chunks of
CHUNK columns: the chunk and its SFs DMA'd to the unified buffer, a SIMT thread per group, the
values DMA'd out (the copies bound the row's tail). Built and lowered here, never run here.
"""

import tilelang.ascend.language as T

from kernels_tl.ascend.quant.common import CHUNK, GROUPS, NPC
from kernels_tl.quant.common import TL_DTYPES, ue8m0_to_float32
from tilebake.quant.cast_back import CastBackAscendVariant


def build(v: CastBackAscendVariant):
    n = T.dynamic("num_tokens")
    h = T.dynamic("hidden")
    x_stride = T.dynamic("x_stride")
    sf_cols = T.dynamic("sf_cols")  # S's row: groups (fp32) or bytes (UE8M0, one a group)
    out_dtype = TL_DTYPES[v.out_dtype]
    sf_dtype = "uint8" if v.sf_kind == "ue8m0" else "float32"
    CORES = v.num_vec_cores

    @T.prim_func
    def cast_back_kernel(
        X: T.StridedTensor((n, h), (x_stride, 1), "float8_e4m3fn"),
        S: T.Tensor((n, sf_cols), sf_dtype),
        Y: T.Tensor((n, h), out_dtype),
    ):
        with T.Kernel(CORES) as core:
            xs = T.alloc_shared((CHUNK,), "float8_e4m3fn")
            ss = T.alloc_shared((GROUPS,), sf_dtype)
            ys = T.alloc_shared((CHUNK,), out_dtype)
            for r in T.serial(T.ceildiv(n - core, CORES)):
                row = core + r * CORES
                for step in T.serial(T.ceildiv(h, CHUNK)):
                    T.copy(X[row, step * CHUNK], xs)
                    T.copy(S[row, step * GROUPS], ss)
                    with T.SimtVF(threads=GROUPS):
                        g = T.get_thread_binding()
                        sf = ue8m0_to_float32(ss[g]) if v.sf_kind == "ue8m0" else ss[g]
                        for j in T.serial(NPC):
                            ys[g * NPC + j] = T.cast(T.cast(xs[g * NPC + j], "float32") * sf, out_dtype)
                    T.copy(ys, Y[row, step * CHUNK])

    return cast_back_kernel
