"""Lossless FP4 (e2m1) -> FP8 (e4m3) block re-quantisation, as a TileLang factory.

Build time only: `build(variant)` returns the PrimFunc that build_tools/aot.py lowers.

Arithmetic (src/tilebake/torch/cast_lossless.py): per output block, max and min of the input
scales over its valid elements; sf_out = max * 2^-6, inv = 64 / max, q = value * (sf_in * inv),
e4m3 (exact). A block whose input scales are not normal powers of two within a ratio of 2^11
(or whose max is below 2^-120) gets a NaN scale (UE8M0 byte 0xFF): a kernel cannot raise, and
a NaN scale poisons every dequantised value of exactly the blocks that are wrong.

Thread mapping: a CTA (128 threads) owns 128 rows x 128 columns; warp w rows 32w..32w+31; a
thread 32 columns (one 16-byte load of codes, two 16-byte stores) in 4 rows 8 apart. All loads
(4 x 16 bytes of codes and the input scales) are issued before any is used. The block max/min
only needs the scales: shuffles over the lanes of a row (bk 128) and the warp's 32 rows, then
(bm 128) the 4 warps through shared memory. The input SF block (bm_in, bk_in) is runtime (log2
shifts; bk_in 16 gives a thread two scales a row), and so are the SF layouts.

Conversion: per scale a thread has one factor (sf_in * inv). When it is finite, +-v give e4m3
bytes that differ only in the sign bit, so the 8 magnitudes are converted (the same fp32
multiply and cast as an element; the clamp to +-448 is what the saturating cast does for a
finite product) into an 8-byte table; 8 codes (one word) then cost 2 byte permutes for the
magnitudes and 2 for the sign bits. An inf/NaN factor takes the element-wise path. Same bytes.
"""

import tilelang.language as T

from tilebake.quant.per_block_cast_lossless import PerBlockCastLosslessVariant

THREADS = 128
LANES = 4  # threads of a row
WORDS = 4  # uint32 words of codes a thread loads per row (16 bytes = 32 codes)
ROWS_PER_THREAD = 4
ROWS_PER_WARP = 32
ROWS_PER_CTA = 128
WORDS_PER_CTA = LANES * WORDS  # 16 words of codes = 128 columns
MAX_SCALE_RATIO = 2048.0
MIN_BLOCK_MAX = 2.0**-120
MAGNITUDES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)

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


def e4m3_byte_finite(q):
    """e4m3_byte for a finite (non-NaN) q: the cast saturates (satfinite) to +-448 itself."""
    return T.cast(T.reinterpret(T.cast(q, "float8_e4m3fn"), "uint8"), "uint32")


def magnitude_table(scale, first):
    """The e4m3 bytes of MAGNITUDES[first:first + 4] * scale (finite), packed little-endian.
    0 * scale is a zero with the sign of scale (the compiler would fold it to +0): byte 0x00
    or 0x80, taken from the sign bit."""
    if first == 0:
        word = T.shift_right(T.reinterpret(scale, "uint32"), T.uint32(24)) & T.uint32(0x80)
    else:
        word = e4m3_byte_finite(T.float32(MAGNITUDES[first]) * scale)
    for m in range(1, 4):
        word = word | T.shift_left(e4m3_byte_finite(T.float32(MAGNITUDES[first + m]) * scale), T.uint32(8 * m))
    return word


def byte_perm(x, y, selector):
    return T.call_extern("uint32", "__byte_perm", x, y, selector)


def build(v: PerBlockCastLosslessVariant):
    bm, bk = v.block_m, v.block_k
    assert bm in (32, 128) and bk in (32, 128), v

    num_tokens = T.dynamic("num_tokens")
    x_words = T.dynamic("x_words")  # hidden / 8: words of codes a row
    x_stride = T.dynamic("x_stride")  # words
    y_stride = T.dynamic("y_stride")  # words
    hidden = x_words * 8
    num_groups = T.ceildiv(hidden, bk)
    warp_blocks = 1 if bm == 32 else 0  # a warp's 32 rows are one row block (bm 32)
    lane_groups = 1 if bk == 32 else 0  # a thread's 32 columns are one column block (bk 32)
    writer_lanes = LANES if bk == 32 else 1  # the threads that write a block's scale
    writer_warps = 4 if bm == 32 else 1

    @T.prim_func
    def per_block_cast_lossless_kernel(
        X: T.StridedTensor((num_tokens, x_words), (x_stride, 1), "uint32"),  # 8 codes a word, low nibble first
        # e4m3 bytes 4 a word (built as integers; the host passes the float8_e4m3fn tensor's pointer).
        Y: T.StridedTensor((num_tokens, x_words * 2), (y_stride, 1), "uint32"),
        # Input SF (the host passes one pointer as both): packed UE8M0 bytes, or fp32 bits; byte
        # strides (extents nominal).
        SIN: T.Tensor((num_tokens * x_words,), "uint8"),
        SIN32: T.Tensor((num_tokens * x_words,), "int32"),
        S: T.Tensor((num_tokens * x_words,), "uint8"),  # output SF as bytes at byte strides
        in_sf_packed: T.int32,
        in_sf_stride_m: T.int32,
        in_sf_stride_k: T.int32,
        in_shift_m: T.int32,  # log2 of the input SF block
        in_shift_k: T.int32,
        packed_sf: T.int32,
        sf_stride_m: T.int32,
        sf_stride_k: T.int32,
    ):
        with T.Kernel(T.ceildiv(num_tokens, ROWS_PER_CTA) * T.ceildiv(x_words, WORDS_PER_CTA), threads=THREADS) as b:
            T.annotate_min_blocks_per_sm(8)  # at most 64 registers: 1024 threads an SM
            bx = T.alloc_var("int32")
            by = T.alloc_var("int32")
            bx = b // T.ceildiv(x_words, WORDS_PER_CTA)
            by = b % T.ceildiv(x_words, WORDS_PER_CTA)
            T.assume(x_stride % 4 == 0)
            T.assume(y_stride % 4 == 0)
            tx = T.get_thread_binding(0)
            warp = tx // 32
            lane = tx % 32
            row0 = T.alloc_var("int32")
            row0 = bx * ROWS_PER_CTA + warp * ROWS_PER_WARP + lane // LANES  # + 8u
            col = T.alloc_var("int32")
            col = (by * WORDS_PER_CTA + (tx % LANES) * WORDS) * 8  # the thread's first column
            col_ok = col < hidden
            g_in0 = T.alloc_var("int32")
            g_in1 = T.alloc_var("int32")
            g_in0 = col >> in_shift_k
            g_in1 = (col + 16) >> in_shift_k  # == g_in0 unless bk_in == 16
            xs = T.alloc_local((ROWS_PER_THREAD, WORDS), "uint32")
            sfb = T.alloc_local((ROWS_PER_THREAD, 2), "int32")  # fp32 bits of the two scales a row
            red_max = T.alloc_shared((4, LANES), "float32")
            red_min = T.alloc_shared((4, LANES), "float32")
            ys = T.alloc_local((2 * WORDS,), "uint32")
            tab_lo = T.alloc_var("uint32")
            tab_hi = T.alloc_var("uint32")
            smax = T.alloc_var("float32")
            smin = T.alloc_var("float32")

            # 1. Every load, before any use.
            for u in T.unroll(ROWS_PER_THREAD):
                if row0 + 8 * u < num_tokens and col_ok:
                    for j in T.vectorized(WORDS):
                        xs[u, j] = X[row0 + 8 * u, by * WORDS_PER_CTA + (tx % LANES) * WORDS + j]
                else:
                    for j in T.vectorized(WORDS):
                        xs[u, j] = T.uint32(0)
            if in_sf_packed != 0:
                for u in T.unroll(ROWS_PER_THREAD):
                    if row0 + 8 * u < num_tokens and col_ok:
                        base = ((row0 + 8 * u) >> in_shift_m) * in_sf_stride_m
                        sfb[u, 0] = T.cast(SIN[base + (g_in0 >> 2) * in_sf_stride_k + (g_in0 & 3)], "int32")
                        sfb[u, 1] = T.cast(SIN[base + (g_in1 >> 2) * in_sf_stride_k + (g_in1 & 3)], "int32")
                    else:
                        sfb[u, 0] = 0
                        sfb[u, 1] = 0
                # UE8M0 byte b -> 2^(b - 127); byte 0 is the subnormal 2^-127 (not valid here).
                for u in T.unroll(ROWS_PER_THREAD):
                    for h in T.unroll(2):
                        sfb[u, h] = T.if_then_else(sfb[u, h] == 0, T.int32(1 << 22), T.shift_left(sfb[u, h], 23))
            else:
                for u in T.unroll(ROWS_PER_THREAD):
                    if row0 + 8 * u < num_tokens and col_ok:
                        base = ((row0 + 8 * u) >> in_shift_m) * in_sf_stride_m
                        sfb[u, 0] = SIN32[(base + g_in0 * in_sf_stride_k) >> 2]
                        sfb[u, 1] = SIN32[(base + g_in1 * in_sf_stride_k) >> 2]
                    else:
                        sfb[u, 0] = 0
                        sfb[u, 1] = 0

            # 2. Block max and min of the scales: the thread's, its row's lanes (bk 128), the
            # warp's 32 rows, the 4 warps (bm 128). Rows and columns outside the tensor count
            # as max 0 / min +inf.
            smax = T.float32(0)
            smin = T.float32(T.infinity("float32"))
            for u in T.unroll(ROWS_PER_THREAD):
                for h in T.unroll(2):
                    f = T.reinterpret(sfb[u, h], "float32")
                    exponent = T.shift_right(sfb[u, h], 23) & 255
                    normal_pow2 = (sfb[u, h] & T.int32(-2139095041)) == 0 and exponent >= 1 and exponent <= 254
                    valid = row0 + 8 * u < num_tokens and col_ok
                    smax = T.max(smax, T.if_then_else(valid, f, T.float32(0)))
                    smin = T.min(
                        smin,
                        T.if_then_else(
                            valid, T.if_then_else(normal_pow2, f, T.float32(0)), T.float32(T.infinity("float32"))
                        ),
                    )
            if bk == 128:
                for s in T.unroll(2):
                    smax = T.max(smax, T.shfl_xor(smax, 1 << s))
                    smin = T.min(smin, T.shfl_xor(smin, 1 << s))
            for s in T.unroll(3):
                smax = T.max(smax, T.shfl_xor(smax, LANES << s))
                smin = T.min(smin, T.shfl_xor(smin, LANES << s))
            if bm == 128:
                if lane < LANES:
                    red_max[warp, lane] = smax
                    red_min[warp, lane] = smin
                T.sync_threads()
                for w in T.unroll(4):
                    smax = T.max(smax, red_max[w, tx % LANES])
                    smin = T.min(smin, red_min[w, tx % LANES])
            ok = smin > T.float32(0) and smax <= smin * T.float32(MAX_SCALE_RATIO) and smax >= T.float32(MIN_BLOCK_MAX)
            sf_out = smax * T.float32(2.0**-6)
            inv = T.alloc_var("float32")
            inv = T.float32(64.0) / smax

            # 3. The output scale: one thread a block.
            block_row = bx * (ROWS_PER_CTA // bm) + warp * warp_blocks
            group = by * (128 // bk) + (tx % LANES) * lane_groups
            if lane < writer_lanes and warp < writer_warps and col_ok and block_row * bm < num_tokens:
                if packed_sf != 0:
                    off = block_row * sf_stride_m + (group // 4) * sf_stride_k + group % 4
                    S[off] = T.cast(
                        T.if_then_else(ok, T.shift_right(T.reinterpret(sf_out, "int32"), 23) & 255, 255), "uint8"
                    )
                    if group == num_groups - 1:  # zero-fill the rest of the last word
                        for k in T.serial(3 - group % 4):
                            S[off + 1 + k] = T.uint8(0)
                else:
                    off = block_row * sf_stride_m + group * sf_stride_k
                    sf_bits = T.if_then_else(ok, T.reinterpret(sf_out, "int32"), T.int32(0x7FC00000))
                    for k in T.unroll(4):
                        S[off + k] = T.cast(T.shift_right(sf_bits, 8 * k) & 255, "uint8")

            # 4. Convert and store, a row at a time.
            for u in T.unroll(ROWS_PER_THREAD):
                for h in T.unroll(2):  # columns 16h..16h+15: words 2h, 2h+1
                    scale = T.reinterpret(sfb[u, h], "float32") * inv
                    if T.abs(scale) < T.float32(T.infinity("float32")):
                        # The table of the 8 magnitudes; the second half reuses the first's
                        # unless the input scales are 16 columns wide.
                        if h == 0 or in_shift_k == 4:
                            tab_lo = magnitude_table(scale, 0)
                            tab_hi = magnitude_table(scale, 4)
                        for k in T.unroll(2):
                            w = xs[u, 2 * h + k]
                            # Magnitudes: byte permutes select table bytes by the 3 low bits of
                            # 4 nibbles each (bit 3 of a selector nibble must be clear).
                            mag = w & T.uint32(0x77777777)
                            # Sign bits: code i's sign (bit 4i+3) is bit 7 of byte i/2 of w << 4
                            # (even i) or of w (odd i); pick those bytes in order, keep bit 7.
                            w4 = T.shift_left(w, T.uint32(4))
                            ys[4 * h + 2 * k] = byte_perm(tab_lo, tab_hi, mag) ^ (
                                byte_perm(w4, w, T.uint32(0x5140)) & T.uint32(0x80808080)
                            )
                            ys[4 * h + 2 * k + 1] = byte_perm(tab_lo, tab_hi, T.shift_right(mag, T.uint32(16))) ^ (
                                byte_perm(w4, w, T.uint32(0x7362)) & T.uint32(0x80808080)
                            )
                    else:
                        # inf or NaN factor (a block the SF marks NaN): the element-wise conversion.
                        for k in T.unroll(2):
                            w = xs[u, 2 * h + k]
                            for o in T.unroll(2):
                                ys[4 * h + 2 * k + o] = T.uint32(0)
                                for i in T.unroll(4):
                                    code = T.cast(T.shift_right(w, T.uint32(16 * o + 4 * i)) & T.uint32(15), "int32")
                                    ys[4 * h + 2 * k + o] = ys[4 * h + 2 * k + o] | T.shift_left(
                                        e4m3_byte(e2m1_value(code) * scale), T.uint32(8 * i)
                                    )
                if row0 + 8 * u < num_tokens and col_ok:
                    for q in T.unroll(2):
                        for j in T.vectorized(WORDS):
                            Y[row0 + 8 * u, 2 * (by * WORDS_PER_CTA + (tx % LANES) * WORDS) + 4 * q + j] = ys[4 * q + j]

    return per_block_cast_lossless_kernel
