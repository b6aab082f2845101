"""per_block_cast_lossless for Ascend 950 (build time only): packed e2m1 in (1, 32) blocks ->
e4m3 in (32, 32) blocks, exactly, the SFs fp32 or UE8M0 bytes two to an int16, read from
tilebake.quant.per_block_cast_lossless.PerBlockCastLosslessAscendVariant.

A block per vector core, each taking row blocks core, core + num_vec_cores, ...; a row block in
steps of WIDTH columns: the packed codes and their SFs DMA'd to the unified buffer, a SIMT thread
an output block (its input scales' max and validity: sf_out = max * 2^-6, inv = 64 / max, or a
NaN scale, UE8M0 0xFF, for a block that cannot be re-quantised exactly), then a SIMT thread a
byte column (its 32 rows' two codes, q = value * (sf_in * inv), e4m3, exact), the codes and SFs
DMA'd out (the copies bound the tails: any token count, hidden % 256 == 0 from the host). The
arithmetic and the validity rule are tilebake.torch.cast_lossless's, as the CUDA kernel's.

Built and lowered here, never run here: no NPU and no CANN toolkit on our machines.
"""

import tilelang.ascend.language as T

from kernels_tl.quant.common import e2m1_value, ue8m0_to_float32
from tilebake.quant.per_block_cast_lossless import PerBlockCastLosslessAscendVariant

B = 32  # input groups (1 x 32) and output blocks (32 x 32)
WIDTH = 256  # logical columns a step: 8 output blocks, 128 bytes of packed codes a row
BLOCKS = WIDTH // B
MAX_RATIO = 2048.0  # 2^11: the largest spread of input scales an output block keeps exact
MIN_MAX = 2.0**-120  # sf_out = max * 2^-6 stays a normal power of two


def build(v: PerBlockCastLosslessAscendVariant):
    n = T.dynamic("num_tokens")
    xb = T.dynamic("x_bytes")  # a row's packed bytes: hidden / 2 (X binds it first)
    x_stride = T.dynamic("x_stride")  # bytes
    in_sf_dtype = "uint8" if v.in_sf == "ue8m0" else "float32"
    sf_dtype = "uint8" if v.sf_mode == "ue8m0" else "float32"
    CORES = v.num_vec_cores

    def scale(sins, j, g):
        return ue8m0_to_float32(sins[j, g]) if v.in_sf == "ue8m0" else sins[j, g]

    @T.prim_func
    def per_block_cast_lossless_kernel(
        X: T.StridedTensor((n, xb), (x_stride, 1), "uint8"),
        SIN: T.Tensor((n, xb // (B // 2)), in_sf_dtype),
        Y: T.Tensor((n, xb * 2), "float8_e4m3fn"),
        S: T.Tensor((T.ceildiv(n, B), xb // (B // 2)), sf_dtype),
    ):
        with T.Kernel(CORES) as core:
            xs = T.alloc_shared((B, WIDTH // 2), "uint8")
            sins = T.alloc_shared((B, BLOCKS), in_sf_dtype)
            ys = T.alloc_shared((B, WIDTH), "float8_e4m3fn")
            inv = T.alloc_shared((BLOCKS,), "float32")
            ss = T.alloc_shared((BLOCKS,), sf_dtype)
            for r in T.serial(T.ceildiv(T.ceildiv(n, B) - core, CORES)):
                rb = core + r * CORES
                rows = T.min(B, n - rb * B)
                for step in T.serial(T.ceildiv(xb, WIDTH // 2)):
                    T.copy(X[rb * B : rb * B + B, step * (WIDTH // 2) : (step + 1) * (WIDTH // 2)], xs)
                    T.copy(SIN[rb * B : rb * B + B, step * BLOCKS : (step + 1) * BLOCKS], sins)
                    with T.SimtVF(threads=BLOCKS):
                        b = T.get_thread_binding()
                        hi = T.alloc_var("float32")  # max (NaN as 0)
                        lo = T.alloc_var("float32")  # min, an invalid scale as 0
                        hi = T.float32(0)
                        lo = T.float32(float("inf"))
                        for j in T.serial(rows):
                            s = scale(sins, j, b)
                            bits = T.reinterpret(s, "int32")
                            e = T.shift_right(bits, 23) & 255
                            valid = ((bits & T.int32(-2139095041)) == 0) & (e >= 1) & (e <= 254)  # 0x807FFFFF
                            nan = (bits & T.int32(0x7FFFFFFF)) > T.int32(0x7F800000)  # (s != s folds away)
                            hi = T.max(hi, T.if_then_else(nan, T.float32(0), s))
                            lo = T.min(lo, T.if_then_else(valid, s, T.float32(0)))
                        ok = (lo > 0) & (hi <= lo * T.float32(MAX_RATIO)) & (hi >= T.float32(MIN_MAX))
                        sf = hi * T.float32(2.0**-6)
                        inv[b] = T.float32(64) / hi
                        if v.sf_mode == "ue8m0":
                            byte = T.cast(T.shift_right(T.reinterpret(sf, "int32"), 23) & 255, "uint8")
                            ss[b] = T.if_then_else(ok, byte, T.uint8(255))
                        else:
                            ss[b] = T.if_then_else(ok, sf, T.float32(float("nan")))
                    with T.SimtVF(threads=WIDTH // 2):
                        c = T.get_thread_binding()  # byte column: logical columns 2c, 2c + 1
                        for j in T.serial(B):
                            w = scale(sins, j, c * 2 // B) * inv[c * 2 // B]
                            code = T.cast(xs[j, c], "int32")
                            q0 = e2m1_value(code & 15) * w
                            q1 = e2m1_value(T.shift_right(code, 4)) * w
                            ys[j, 2 * c] = T.cast(T.clamp(q0, -448.0, 448.0), "float8_e4m3fn")
                            ys[j, 2 * c + 1] = T.cast(T.clamp(q1, -448.0, 448.0), "float8_e4m3fn")
                    T.copy(ys, Y[rb * B : rb * B + B, step * WIDTH : (step + 1) * WIDTH])
                    T.copy(ss, S[rb, step * BLOCKS])

    return per_block_cast_lossless_kernel
