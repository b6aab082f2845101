"""per_block_cast (+ _with_sf_only: store_data False, _with_precomputed_sf: sf_mode
'precomputed') for Ascend 950 (build time only): 32 x 32 blocks, e4m3 data or e2m1 codes packed two
to a byte (the even column in the low nibble), the SF fp32, power-of-two fp32 ('round') or UE8M0
bytes packed two to an int16 ('ue8m0'), read from
tilebake.quant.per_block_cast.PerBlockCastAscendVariant.

A block per vector core, each taking row blocks core, core + num_vec_cores, ...; a row block in
steps of WIDTH columns: the 32 x WIDTH tile DMA'd to the unified buffer, then three SIMT passes
(a thread a column: its maximum over the block's valid rows; a thread a 32 x 32 block: its amax
over its valid columns, SF and multiplier; a thread a column, or a column pair for e2m1: the codes),
the codes and SFs DMA'd out (the copies bound the tails: any token count, hidden % 128 == 0 from
the host). The arithmetic is numerics.md's, as the CUDA kernel's: c = max(amax, amax_clamp); fp32
SF c / fmt_max and multiplier fmt_max / c (two true divisions); round_sf the power of two from the
bits of c * (1 / fmt_max); e4m3(clamp(x * inv, -448, 448)) or the e2m1 code of x * inv.

Built and lowered here, never run here: no NPU and no CANN toolkit on our machines.
"""

import tilelang.ascend.language as T

from kernels_tl.quant.common import TL_DTYPES, e2m1_code, pow2_inverse, pow2_scale_exponent, pow2_sf
from tilebake.quant.per_block_cast import ASCEND_BLOCK as B
from tilebake.quant.per_block_cast import PerBlockCastAscendVariant

WIDTH = 256  # columns a step: 8 blocks (a 32 x 256 fp32 tile is 32 KiB of the unified buffer)
BLOCKS = WIDTH // B
FMT_MAX = {"e4m3": 448.0, "e2m1": 6.0}


def build(v: PerBlockCastAscendVariant):
    n = T.dynamic("num_tokens")
    h = T.dynamic("hidden")
    x_stride = T.dynamic("x_stride")
    sf_cols = T.dynamic("sf_cols")  # S's row: blocks (fp32 SF) or bytes (UE8M0, two to an int16)
    in_dtype = TL_DTYPES[v.in_dtype]
    e2m1 = v.fmt == "e2m1"
    data_dtype, data_width = ("uint8", WIDTH // 2) if e2m1 else ("float8_e4m3fn", WIDTH)
    sf_dtype = "uint8" if v.sf_mode == "ue8m0" else "float32"
    fmt_max = FMT_MAX[v.fmt]
    CORES = v.num_vec_cores

    @T.prim_func
    def per_block_cast_kernel(
        X: T.StridedTensor((n, h), (x_stride, 1), in_dtype),
        Y: T.Tensor((n, h // 2 if e2m1 else h), data_dtype),  # (unused without store_data)
        S: T.Tensor((T.ceildiv(n, B), sf_cols), sf_dtype),
        amax_clamp: T.float32,  # (unused with a precomputed SF)
    ):
        with T.Kernel(CORES) as core:
            xs = T.alloc_shared((B, WIDTH), in_dtype)
            colmax = T.alloc_shared((WIDTH,), "float32")
            inv = T.alloc_shared((BLOCKS,), "float32")
            ss = T.alloc_shared((BLOCKS,), sf_dtype)
            ys = T.alloc_shared((B, data_width), data_dtype)
            for r in T.serial(T.ceildiv(T.ceildiv(n, B) - core, CORES)):
                rb = core + r * CORES
                rows = T.min(B, n - rb * B)  # the block's valid rows (the last may be partial)
                for step in T.serial(T.ceildiv(h, WIDTH)):
                    T.copy(X[rb * B : rb * B + B, step * WIDTH : step * WIDTH + WIDTH], xs)
                    if v.sf_mode == "precomputed":
                        T.copy(S[rb, step * BLOCKS], ss)
                        with T.SimtVF(threads=BLOCKS):
                            b = T.get_thread_binding()
                            inv[b] = T.float32(1) / ss[b]  # numerics.md: the reciprocal first
                    else:
                        with T.SimtVF(threads=WIDTH):
                            c = T.get_thread_binding()
                            m = T.alloc_var("float32")
                            m = T.float32(0)
                            for j in T.serial(rows):
                                m = T.max(m, T.abs(T.cast(xs[j, c], "float32")))
                            colmax[c] = m
                        with T.SimtVF(threads=BLOCKS):
                            b = T.get_thread_binding()
                            amax = T.alloc_var("float32")
                            amax = T.float32(0)
                            for j in T.serial(B):
                                amax = T.max(amax, colmax[b * B + j])
                            cl = T.max(amax, amax_clamp)
                            if v.sf_mode == "fp32":
                                ss[b] = cl / T.float32(fmt_max)
                                inv[b] = T.float32(fmt_max) / cl
                            else:
                                e = pow2_scale_exponent(cl, fmt_max)
                                inv[b] = pow2_inverse(e)
                                if v.sf_mode == "ue8m0":  # the byte e + 127 of sf = 2^e
                                    ss[b] = T.cast(e + 127, "uint8")
                                else:
                                    ss[b] = pow2_sf(e)
                    if v.store_data:
                        with T.SimtVF(threads=data_width):
                            c = T.get_thread_binding()
                            for j in T.serial(B):
                                if e2m1:  # columns 2c (low nibble) and 2c + 1 of one block
                                    w = inv[2 * c // B]
                                    lo = e2m1_code(T.cast(xs[j, 2 * c], "float32") * w)
                                    hi = e2m1_code(T.cast(xs[j, 2 * c + 1], "float32") * w)
                                    ys[j, c] = T.cast(lo | (hi << 4), "uint8")
                                else:
                                    q = T.cast(xs[j, c], "float32") * inv[c // B]
                                    ys[j, c] = T.cast(T.clamp(q, -fmt_max, fmt_max), "float8_e4m3fn")
                        T.copy(ys, Y[rb * B : rb * B + B, step * data_width : step * data_width + data_width])
                    if v.sf_mode != "precomputed":
                        T.copy(ss, S[rb, step * BLOCKS])

    return per_block_cast_kernel
