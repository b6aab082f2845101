"""per_channel_cast for Ascend 950 (build time only): each column quantised to e4m3 in blocks of 32
tokens, the input bf16 / fp32, or e4m3 with (1, 32) SF (fp32, or UE8M0 bytes two to an int16)
dequantised first; the SF fp32, power-of-two fp32 ('round') or UE8M0 bytes packed two row blocks
to an int16 along the tokens ('ue8m0': S is (ceil(ceil(T / 32) / 2), H) int16, the even row
block in the low byte, a missing odd one 0), read from
tilebake.quant.per_channel_cast.PerChannelCastAscendVariant.

A block per vector core, each taking row steps core, core + num_vec_cores, ... of ROWS tokens (32,
or 64 for the packed SF: the two row blocks of one int16 row); a step in WIDTH columns: the tile
(and a quantized input's SFs) DMA'd to the unified buffer, a SIMT thread a column (its row
blocks' amax over their valid rows, SF, multiplier and 32 codes each), the codes and SFs DMA'd
out (the copies bound the tails: any token count, hidden % 128 == 0 from the host). The
arithmetic is numerics.md's, as the CUDA kernel's: v = fp32(x) (times the input SF);
c = max(amax, amax_clamp); fp32 SF c / 448 and multiplier 448 / c; round_sf the power of two from
the bits of c * (1 / 448); e4m3(clamp(v * inv, -448, 448)).

Built and lowered here, never run here: no NPU and no CANN toolkit on our machines.
"""

import tilelang.ascend.language as T

from kernels_tl.ascend.quant.common import FMT_MAX, e4m3_code, e4m3_scales
from kernels_tl.quant.common import TL_DTYPES, pow2_scale_exponent, ue8m0_to_float32
from tilebake.quant.per_channel_cast import ASCEND_NUM_PER_TOKENS as NPT
from tilebake.quant.per_channel_cast import PerChannelCastAscendVariant

WIDTH = 256  # columns a step (a 64 x 256 fp32 tile is 64 KiB of the unified buffer)
IN_GROUP = 32  # a quantized input's SF block width (1 x 32)


def build(v: PerChannelCastAscendVariant):
    n = T.dynamic("num_tokens")
    h = T.dynamic("hidden")
    x_stride = T.dynamic("x_stride")
    sf_rows = T.dynamic("sf_rows")
    quantized = v.in_sf != "none"
    in_dtype = "float8_e4m3fn" if quantized else TL_DTYPES[v.in_dtype]
    in_sf_dtype = "uint8" if v.in_sf == "ue8m0" else "float32"
    packed = v.sf_mode == "ue8m0"
    PACK = 2 if packed else 1  # row blocks a step: an int16 holds two row blocks' bytes
    ROWS = NPT * PACK
    sf_dtype, sf_width = ("uint8", 2 * WIDTH) if packed else ("float32", WIDTH)
    CORES = v.num_vec_cores

    @T.macro
    def value(xs, sins, j, c):
        """fp32 of element (j, c) of the tile, dequantised by its input SF for a quantized input."""
        x = T.cast(xs[j, c], "float32")
        if v.in_sf == "fp32":
            return x * sins[j, c // IN_GROUP]
        if v.in_sf == "ue8m0":
            return x * ue8m0_to_float32(sins[j, c // IN_GROUP])
        return x

    @T.prim_func
    def per_channel_cast_kernel(
        X: T.StridedTensor((n, h), (x_stride, 1), in_dtype),
        SIN: T.Tensor((n, h // IN_GROUP), in_sf_dtype),  # (unused for a bf16 / fp32 input)
        Y: T.Tensor((n, h), "float8_e4m3fn"),
        S: T.Tensor((sf_rows, h * PACK), sf_dtype),  # as bytes when packed: (word row, column, byte)
        amax_clamp: T.float32,
    ):
        with T.Kernel(CORES) as core:
            xs = T.alloc_shared((ROWS, WIDTH), in_dtype)
            sins = T.alloc_shared((ROWS, WIDTH // IN_GROUP), in_sf_dtype)
            ys = T.alloc_shared((ROWS, WIDTH), "float8_e4m3fn")
            ss = T.alloc_shared((sf_width,), sf_dtype)
            for r in T.serial(T.ceildiv(T.ceildiv(n, ROWS) - core, CORES)):
                rs = core + r * CORES
                for step in T.serial(T.ceildiv(h, WIDTH)):
                    c0 = step * WIDTH
                    T.copy(X[rs * ROWS : rs * ROWS + ROWS, c0 : c0 + WIDTH], xs)
                    if quantized:
                        g0 = c0 // IN_GROUP
                        T.copy(SIN[rs * ROWS : rs * ROWS + ROWS, g0 : g0 + WIDTH // IN_GROUP], sins)
                    with T.SimtVF(threads=WIDTH):
                        c = T.get_thread_binding()
                        for k in T.unroll(PACK):
                            rows = T.max(T.min(NPT, n - rs * ROWS - k * NPT), 0)  # the block's valid rows
                            amax = T.alloc_var("float32")
                            amax = T.float32(0)
                            for j in T.serial(rows):
                                amax = T.max(amax, T.abs(value(xs, sins, k * NPT + j, c)))
                            cl = T.max(amax, amax_clamp)
                            sf, inv = e4m3_scales(cl, v.sf_mode != "fp32")
                            if packed:  # byte k of the int16 at column c; a missing row block's is 0
                                byte = T.cast(pow2_scale_exponent(cl, FMT_MAX) + 127, "uint8")
                                ss[c * 2 + k] = T.if_then_else(rows > 0, byte, T.uint8(0))
                            else:
                                ss[c] = sf
                            for j in T.serial(NPT):
                                ys[k * NPT + j, c] = e4m3_code(value(xs, sins, k * NPT + j, c), inv)
                    T.copy(ys, Y[rs * ROWS : rs * ROWS + ROWS, c0 : c0 + WIDTH])
                    T.copy(ss, S[rs, c0 * PACK])

    return per_channel_cast_kernel
