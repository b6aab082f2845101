"""Lossless FP4 (e2m1) -> FP8 (e4m3) block re-quantisation, as a TileLang factory.

Build time only: `build(variant)` returns the PrimFunc that build_tools/aot.py lowers.

Arithmetic (src/tilebake/torch/cast_lossless.py): per output block, max and min of the input
scales over its valid elements; sf_out = max * 2^-6, inv = 64 / max, q = value * (sf_in * inv),
e4m3 (exact). A block whose input scales are not normal powers of two within a ratio of 2^11
(or whose max is below 2^-120) gets a NaN scale (UE8M0 byte 0xFF): a kernel cannot raise, and
a NaN scale poisons every dequantised value of exactly the blocks that are wrong.

Thread mapping as kernels_tl/quant/per_block_cast.py: a CTA owns bm rows x 128 columns of
the output; each thread 16 columns (8 packed input bytes) in bm / 32 rows. The input SF block
(bm_in, bk_in) is runtime (as log2 shifts; bk_in >= 16 so a thread's 16 columns share one
input scale), and so are the SF layouts.

Conversion: per row a thread has one scale (sf_in * inv). When it is finite, +-v give e4m3
bytes that differ only in the sign bit, so the 8 magnitudes are converted (the same fp32
multiply, clamp and cast as an element) into an 8-byte table and the 16 codes are looked up
with 4 byte permutes; an inf/NaN scale takes the element-wise path. Same bytes either way.
"""

import tilelang.language as T

from tilebake.quant.per_block_cast_lossless import PerBlockCastLosslessVariant

THREADS = 256
VEC = 16
THREADS_PER_ROW = 8
ROWS_PER_PASS = THREADS // THREADS_PER_ROW  # 32
COLS_PER_CTA = THREADS_PER_ROW * VEC  # 128
MAX_SCALE_RATIO = 2048.0
MIN_BLOCK_MAX = 2.0**-120

PASS_CONFIGS = {"tl.disable_safe_memory_legalize": True}


def e2m1_value(code):
    """fp32 value of a 4-bit e2m1 code (int32), built from its bits: magnitude codes 2..7 are
    2^((m >> 1) - 1) * (1 + (m & 1) / 2), code 1 is 0.5, code 0 is zero; bit 3 is the sign."""
    m = code & 7
    magnitude = T.if_then_else(
        m >= 2,
        T.shift_left((m >> 1) + 126, 23) | T.shift_left(m & 1, 22),
        T.if_then_else(m == 1, T.int32(126 << 23), T.int32(0)),
    )
    return T.reinterpret(magnitude | T.shift_left(code & 8, 28), "float32")


def e4m3_byte(q):
    """The e4m3 byte (uint32) of fp32 `q` as the reference casts it: clamp to +-448, RNE."""
    f8 = T.cast(T.clamp(q, T.float32(-448.0), T.float32(448.0)), "float8_e4m3fn")
    return T.cast(T.reinterpret(f8, "uint8"), "uint32")


def sign_bits(nib):
    """Bit 3 of each of the 4 nibbles of `nib` (uint32) moved to bit 7 of byte 0..3."""
    return (
        (T.shift_left(nib, T.uint32(4)) & T.uint32(0x80))
        | (T.shift_left(nib, T.uint32(8)) & T.uint32(0x8000))
        | (T.shift_left(nib, T.uint32(12)) & T.uint32(0x800000))
        | (T.shift_left(nib, T.uint32(16)) & T.uint32(0x80000000))
    )


def build(v: PerBlockCastLosslessVariant):
    bm, bk = v.block_m, v.block_k
    rows_per_thread = bm // ROWS_PER_PASS
    lanes = bk // VEC
    groups_per_cta = COLS_PER_CTA // bk
    assert rows_per_thread * ROWS_PER_PASS == bm and lanes * VEC == bk and THREADS_PER_ROW % lanes == 0, v

    num_tokens = T.dynamic("num_tokens")
    hidden = T.dynamic("hidden")
    x_stride = T.dynamic("x_stride")  # bytes
    y_stride = T.dynamic("y_stride")
    num_groups = T.ceildiv(hidden, bk)

    @T.prim_func
    def per_block_cast_lossless_kernel(
        # Y first: its shape binds `hidden`, which X's (hidden / 2) cannot.
        # e4m3 bytes (built as integers; the host passes the float8_e4m3fn tensor's pointer).
        Y: T.StridedTensor((num_tokens, hidden), (y_stride, 1), "uint8"),
        X: T.StridedTensor((num_tokens, hidden // 2), (x_stride, 1), "uint8"),
        # Input and output SF as bytes at runtime byte strides (extents nominal).
        SIN: T.Tensor((num_tokens * hidden,), "uint8"),
        S: T.Tensor((num_tokens * hidden,), "uint8"),
        in_sf_packed: T.int32,
        in_sf_stride_m: T.int32,
        in_sf_stride_k: T.int32,
        in_shift_m: T.int32,  # log2 of the input SF block
        in_shift_k: T.int32,
        packed_sf: T.int32,
        sf_stride_m: T.int32,
        sf_stride_k: T.int32,
    ):
        with T.Kernel(T.ceildiv(num_tokens, bm) * T.ceildiv(hidden, COLS_PER_CTA), threads=THREADS) as b:
            T.annotate_min_blocks_per_sm(4)  # at most 64 registers: 4 CTAs (1024 threads) an SM
            bx = T.alloc_var("int32")
            by = T.alloc_var("int32")
            bx = b // T.ceildiv(hidden, COLS_PER_CTA)
            by = b % T.ceildiv(hidden, COLS_PER_CTA)
            T.assume(x_stride % 16 == 0)
            T.assume(y_stride % 16 == 0)
            T.assume(hidden % 32 == 0)
            tx = T.get_thread_binding(0)
            col = by * COLS_PER_CTA + (tx % THREADS_PER_ROW) * VEC
            g_local = (tx % THREADS_PER_ROW) // lanes
            group = by * groups_per_cta + g_local
            g_in = col >> in_shift_k
            red_max = T.alloc_shared((ROWS_PER_PASS, groups_per_cta), "float32")
            red_min = T.alloc_shared((ROWS_PER_PASS, groups_per_cta), "float32")
            xs = T.alloc_local((rows_per_thread, VEC // 2), "uint8")
            sfs = T.alloc_local((rows_per_thread,), "float32")
            ys = T.alloc_local((VEC,), "uint8")
            smax = T.alloc_var("float32")
            smin = T.alloc_var("float32")
            smax = T.float32(0)
            smin = T.float32(T.infinity("float32"))
            for u in T.unroll(rows_per_thread):
                row = bx * bm + u * ROWS_PER_PASS + tx // THREADS_PER_ROW
                if row < num_tokens and col < hidden:
                    for j in T.vectorized(VEC // 2):
                        xs[u, j] = X[row, by * (COLS_PER_CTA // 2) + (tx % THREADS_PER_ROW) * (VEC // 2) + j]
                    row_in = row >> in_shift_m
                    if in_sf_packed != 0:
                        byte = T.cast(SIN[row_in * in_sf_stride_m + (g_in >> 2) * in_sf_stride_k + (g_in & 3)], "int32")
                        # UE8M0 byte b -> 2^(b - 127); byte 0 is the subnormal 2^-127 (not valid here).
                        sfs[u] = T.reinterpret(
                            T.if_then_else(byte == 0, T.int32(1 << 22), T.shift_left(byte, 23)), "float32"
                        )
                    else:
                        off = row_in * in_sf_stride_m + g_in * in_sf_stride_k
                        sfs[u] = T.reinterpret(
                            T.cast(SIN[off], "int32")
                            | T.shift_left(T.cast(SIN[off + 1], "int32"), 8)
                            | T.shift_left(T.cast(SIN[off + 2], "int32"), 16)
                            | T.shift_left(T.cast(SIN[off + 3], "int32"), 24),
                            "float32",
                        )
                    bits = T.reinterpret(sfs[u], "int32")
                    exponent = T.shift_right(bits, 23) & 255
                    normal_pow2 = (bits & T.int32(-2139095041)) == 0 and exponent >= 1 and exponent <= 254  # 0x807FFFFF
                    smax = T.max(smax, sfs[u])
                    smin = T.min(smin, T.if_then_else(normal_pow2, sfs[u], T.float32(0)))
                else:
                    for j in T.vectorized(VEC // 2):
                        xs[u, j] = T.uint8(0)
                    sfs[u] = T.float32(0)
            # Block max and min: lanes (shuffles), then the pass's rows (shared memory).
            for s in T.unroll(lanes.bit_length() - 1):
                smax = T.max(smax, T.shfl_xor(smax, lanes >> (s + 1)))
                smin = T.min(smin, T.shfl_xor(smin, lanes >> (s + 1)))
            if tx % lanes == 0:
                red_max[tx // THREADS_PER_ROW, g_local] = smax
                red_min[tx // THREADS_PER_ROW, g_local] = smin
            T.sync_threads()
            for r in T.unroll(ROWS_PER_PASS):
                smax = T.max(smax, red_max[r, g_local])
                smin = T.min(smin, red_min[r, g_local])
            ok = smin > T.float32(0) and smax <= smin * T.float32(MAX_SCALE_RATIO) and smax >= T.float32(MIN_BLOCK_MAX)
            sf_out = smax * T.float32(2.0**-6)
            inv = T.float32(64.0) / smax
            if tx < THREADS_PER_ROW and tx % lanes == 0 and col < hidden:
                if packed_sf != 0:
                    off = bx * sf_stride_m + (group // 4) * sf_stride_k + group % 4
                    S[off] = T.cast(
                        T.if_then_else(ok, T.shift_right(T.reinterpret(sf_out, "int32"), 23) & 255, 255), "uint8"
                    )
                    if group == num_groups - 1:  # zero-fill the rest of the last word
                        for k in T.serial(3 - group % 4):
                            S[off + 1 + k] = T.uint8(0)
                else:
                    off = bx * sf_stride_m + group * sf_stride_k
                    sf_bits = T.if_then_else(ok, T.reinterpret(sf_out, "int32"), T.int32(0x7FC00000))
                    for k in T.unroll(4):
                        S[off + k] = T.cast(T.shift_right(sf_bits, 8 * k) & 255, "uint8")
            for u in T.unroll(rows_per_thread):
                row = bx * bm + u * ROWS_PER_PASS + tx // THREADS_PER_ROW
                scale = sfs[u] * inv
                if T.abs(scale) < T.float32(T.infinity("float32")):
                    # A finite scale maps +-v to bytes that differ only in bit 7 (the product,
                    # clamp and RNE are sign-symmetric), so convert the 8 magnitudes once, as
                    # the elements would be, and look the 16 codes up 4 at a time: PRMT with
                    # the 3 magnitude bits of 4 nibbles as byte selectors, then flip the bytes
                    # whose code has bit 3 set.
                    tab_lo = T.alloc_var("uint32")
                    tab_hi = T.alloc_var("uint32")
                    tab_lo = T.uint32(0)
                    tab_hi = T.uint32(0)
                    for m in T.unroll(4):
                        tab_lo = tab_lo | T.shift_left(e4m3_byte(e2m1_value(T.int32(m)) * scale), T.uint32(8 * m))
                        tab_hi = tab_hi | T.shift_left(e4m3_byte(e2m1_value(T.int32(m + 4)) * scale), T.uint32(8 * m))
                    for k in T.unroll(VEC // 8):
                        # 4 packed input bytes = 8 codes = 8 output bytes (low nibble first).
                        w = (
                            T.cast(xs[u, 4 * k], "uint32")
                            | T.shift_left(T.cast(xs[u, 4 * k + 1], "uint32"), T.uint32(8))
                            | T.shift_left(T.cast(xs[u, 4 * k + 2], "uint32"), T.uint32(16))
                            | T.shift_left(T.cast(xs[u, 4 * k + 3], "uint32"), T.uint32(24))
                        )
                        for h in T.unroll(2):
                            nib = T.shift_right(w, T.uint32(16 * h)) & T.uint32(0xFFFF)  # 4 codes
                            out = T.call_extern(
                                "uint32", "__byte_perm", tab_lo, tab_hi, nib & T.uint32(0x7777)
                            ) ^ sign_bits(nib)
                            for i in T.unroll(4):
                                ys[8 * k + 4 * h + i] = T.cast(
                                    T.shift_right(out, T.uint32(8 * i)) & T.uint32(255), "uint8"
                                )
                else:
                    # inf or NaN scale (a block the SF marks NaN): the element-wise conversion.
                    for j in T.unroll(VEC // 2):
                        byte = T.cast(xs[u, j], "int32")
                        ys[2 * j] = T.cast(e4m3_byte(e2m1_value(byte & 15) * scale), "uint8")
                        ys[2 * j + 1] = T.cast(e4m3_byte(e2m1_value(T.shift_right(byte, 4)) * scale), "uint8")
                if row < num_tokens and col < hidden:
                    for j in T.vectorized(VEC):
                        Y[row, by * COLS_PER_CTA + (tx % THREADS_PER_ROW) * VEC + j] = ys[j]

    return per_block_cast_lossless_kernel
