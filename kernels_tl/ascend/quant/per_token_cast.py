"""per_token_cast (and per_token_cast_with_sf_only: store_data False) for Ascend 950 (build time
only): e4m3 data, 32 columns a group, the SF as fp32,
power-of-two fp32 ('round') or UE8M0 bytes packed two to an int16 ('ue8m0'), read from
tilebake.quant.per_token_cast.PerTokenCastAscendVariant.

A block per vector core, each taking rows core, core + num_vec_cores, ... (the grid is the
variant's core count); a row in chunks of CHUNK columns: the chunk DMA'd to the unified buffer,
a SIMT thread per group (its amax, SF and 32 codes), the codes and SFs DMA'd out (the copies
bound the row's tail). The arithmetic is numerics.md's, as the CUDA kernel's
(kernels_tl/quant/per_token_cast.py): c = max(amax, amax_clamp); fp32 SF c / 448 and multiplier
448 / c (two true divisions); round_sf the power of two from the bits of c * (1 / 448);
q = e4m3(clamp(x * inv, -448, 448)).

Built and lowered here, never run here: no NPU and no CANN toolkit on our machines.
"""

import tilelang.ascend.language as T

from kernels_tl.ascend.quant.common import CHUNK, FMT_MAX, GROUPS, NPC, e4m3_code, e4m3_scales, group_amax
from kernels_tl.quant.common import TL_DTYPES, pow2_scale_exponent
from tilebake.quant.per_token_cast import PerTokenCastAscendVariant


def build(v: PerTokenCastAscendVariant):
    n = T.dynamic("num_tokens")
    h = T.dynamic("hidden")
    x_stride = T.dynamic("x_stride")
    sf_cols = T.dynamic("sf_cols")  # S's row: groups (fp32 SF) or bytes (UE8M0, two to an int16)
    in_dtype = TL_DTYPES[v.in_dtype]
    sf_dtype = "uint8" if v.sf_mode == "ue8m0" else "float32"
    CORES = v.num_vec_cores

    @T.prim_func
    def per_token_cast_kernel(
        X: T.StridedTensor((n, h), (x_stride, 1), in_dtype),
        Y: T.Tensor((n, h), "float8_e4m3fn"),  # (unused without store_data: the lowering drops it)
        S: T.Tensor((n, sf_cols), sf_dtype),
        amax_clamp: T.float32,
    ):
        with T.Kernel(CORES) as core:
            xs = T.alloc_shared((CHUNK,), in_dtype)
            ys = T.alloc_shared((CHUNK,), "float8_e4m3fn")
            ss = T.alloc_shared((GROUPS,), sf_dtype)
            for r in T.serial(T.ceildiv(n - core, CORES)):
                row = core + r * CORES
                for step in T.serial(T.ceildiv(h, CHUNK)):
                    T.copy(X[row, step * CHUNK], xs)
                    if v.sf_mode == "precomputed":
                        T.copy(S[row, step * GROUPS], ss)
                    with T.SimtVF(threads=GROUPS):
                        g = T.get_thread_binding()
                        if v.sf_mode == "precomputed":  # numerics.md: the reciprocal first
                            inv = T.float32(1) / ss[g]
                        else:
                            amax = group_amax(xs, g)
                            c = T.max(amax, amax_clamp)
                            sf, inv = e4m3_scales(c, v.sf_mode != "fp32")
                            if v.sf_mode == "ue8m0":  # the byte e + 127 of sf = 2^e
                                ss[g] = T.cast(pow2_scale_exponent(c, FMT_MAX) + 127, "uint8")
                            else:
                                ss[g] = sf
                        if v.store_data:
                            for j in T.serial(NPC):
                                ys[g * NPC + j] = e4m3_code(xs[g * NPC + j], inv)
                    if v.store_data:
                        T.copy(ys, Y[row, step * CHUNK])
                    if v.sf_mode != "precomputed":
                        T.copy(ss, S[row, step * GROUPS])

    return per_token_cast_kernel
