"""Lossless FP4 (e2m1) -> FP8 (e4m3) block re-quantisation, as a TileLang factory.

Build time only: `build(variant)` returns the PrimFunc that build_tools/aot.py lowers.

One kernel for every block pair: the output SF block (bm, bk) (powers of two, 1 <= bm <= 128,
16 <= bk <= 128) and the input SF block (bm_in, bk_in) are runtime log2 shifts, and so are the
SF layouts.

Arithmetic (src/tilebake/torch/cast_lossless.py): every input scale of an output block must be a
normal power of two 2^(e - 127) (e its fp32 exponent field, 1..254), with max e = M and min e = m
over the block's valid elements, M - m <= 11 and M >= 7. Then sf_out = 2^(M - 133) (max * 2^-6),
inv = 64 / max = 2^(133 - M) (both exact, built from bits), q = value * (sf_in * inv), e4m3
(exact). Only exponents are reduced: a scale contributes the 16-bit pair (e, 255 - e), or
(0, 255) when it is not a normal power of two, and `__vmaxu2` (max of each 16-bit half) reduces
M and m at once. A block that fails gets a NaN scale (UE8M0 byte 0xFF): a kernel cannot raise,
and a NaN scale poisons every dequantised value of exactly the blocks that are wrong.

Thread mapping: a CTA (128 threads) owns 128 rows x 128 columns; warp w rows 32w..32w+31; a
thread 32 columns (one 16-byte load of codes, two 16-byte stores) in 4 rows 8 apart (u = 0..3).
Its 8 slots (row u, column half h of 16) each hold the reduction of their own output block.
The reduction runs only the levels the block spans (every branch is uniform: block sizes are
kernel arguments): in the thread (the two halves when bk >= 32; rows u^1 when bm >= 16, u^2
when bm >= 32), the lanes of a row (xor 1, 2: bk 64, 128), the row lanes of a warp (xor 4, 8,
16: bm 2, 4, 8), the warps through shared memory (bm 64, 128). Only one slot per block and
thread shuffles; a second in-thread pass (max is idempotent) hands the result to the others.
The thread holding a block's first element writes its scale.

Conversion: per slot a thread has one factor (sf_in * inv). When it is finite, +-v give e4m3
bytes that differ only in the sign bit, so the 8 magnitudes are converted (the same fp32
multiply and cast as an element; the clamp to +-448 is what the saturating cast does for a
finite product) into an 8-byte table; 8 codes (one word) then cost 2 byte permutes for the
magnitudes and 2 for the sign bits. An inf/NaN factor (an input scale of 255 or NaN) takes the
element-wise path. Same bytes.
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
MAX_EXPONENT_SPREAD = 11  # input scales within 2^11 of each other
MIN_MAX_EXPONENT = 7  # max >= 2^-120, so that sf_out = max * 2^-6 is a normal power of two
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


def vmax2(x, y):
    """Unsigned max of each 16-bit half: (max e, max (255 - e)) = (M, 255 - m) of two pairs."""
    return T.call_extern("uint32", "__vmaxu2", x, y)


@T.macro
def merge_in_thread(ex, out_shift_m, out_shift_k):
    """Reduce the slots of a thread that lie in one output block, every such slot ending with
    the result: the two column halves (bk >= 32), rows u and u^1 (bm >= 16), u and u^2 (bm >= 32).
    Its arguments carry the kernel parameters' names: a macro argument renames the parameter."""
    if out_shift_k >= 5:
        for u in T.unroll(ROWS_PER_THREAD):
            ex[u, 0] = vmax2(ex[u, 0], ex[u, 1])
            ex[u, 1] = ex[u, 0]
    if out_shift_m >= 4:
        for p in T.unroll(2):
            for h in T.unroll(2):
                ex[2 * p, h] = vmax2(ex[2 * p, h], ex[2 * p + 1, h])
                ex[2 * p + 1, h] = ex[2 * p, h]
    if out_shift_m >= 5:
        for p in T.unroll(2):
            for h in T.unroll(2):
                ex[p, h] = vmax2(ex[p, h], ex[p + 2, h])
                ex[p + 2, h] = ex[p, h]


def build(v: PerBlockCastLosslessVariant):
    assert v.out_fmt == "e4m3", v

    num_tokens = T.dynamic("num_tokens")
    x_words = T.dynamic("x_words")  # hidden / 8: words of codes a row
    x_stride = T.dynamic("x_stride")  # words
    y_stride = T.dynamic("y_stride")  # words
    hidden = x_words * 8

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
        out_shift_m: T.int32,  # log2 of the output SF block: 0..7 and 4..7
        out_shift_k: T.int32,
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
            # Per slot: the exponent pair (M, 255 - m), later the bits of inv.
            ex = T.alloc_local((ROWS_PER_THREAD, 2), "uint32")
            red = T.alloc_shared((4, LANES, 2), "uint32")
            ys = T.alloc_local((2 * WORDS,), "uint32")
            tab_lo = T.alloc_var("uint32")
            tab_hi = T.alloc_var("uint32")

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

            # 2. Each slot's exponent pair; rows and columns outside the tensor are (0, 0).
            for u in T.unroll(ROWS_PER_THREAD):
                for h in T.unroll(2):
                    exponent = T.shift_right(sfb[u, h], 23) & 255
                    normal_pow2 = (sfb[u, h] & T.int32(-2139095041)) == 0 and exponent >= 1 and exponent <= 254
                    e = T.cast(T.if_then_else(normal_pow2, exponent, 0), "uint32")
                    ex[u, h] = T.if_then_else(
                        row0 + 8 * u < num_tokens and col_ok, T.shift_left(e, T.uint32(16)) | (255 - e), T.uint32(0)
                    )

            # 3. Reduce over each output block: in the thread, across lanes (one slot per block),
            # across warps, then back to every slot of the thread.
            merge_in_thread(ex, out_shift_m, out_shift_k)
            for s in T.unroll(5):  # lane xor 1, 2 (columns), 4, 8, 16 (rows)
                if (s < 2 and out_shift_k >= 6 + s) or (s >= 2 and out_shift_m >= s - 1):
                    for u in T.unroll(ROWS_PER_THREAD):
                        for h in T.unroll(2):
                            # Slot (u, h) is its block's first in the thread (uniform test).
                            if (u == 0 or out_shift_m < 4 or (u == 2 and out_shift_m == 4)) and (
                                h == 0 or out_shift_k < 5
                            ):
                                ex[u, h] = vmax2(ex[u, h], T.shfl_xor(ex[u, h], 1 << s))
            if out_shift_m >= 6:  # bm 64, 128: row 0 of each warp holds the warp's rows
                if lane < LANES:
                    for h in T.unroll(2):
                        red[warp, lane, h] = ex[0, h]
                T.sync_threads()
                for w in T.unroll(4):
                    if (w >> (out_shift_m - 5)) == (warp >> (out_shift_m - 5)):
                        for h in T.unroll(2):
                            ex[0, h] = vmax2(ex[0, h], red[w, tx % LANES, h])
            merge_in_thread(ex, out_shift_m, out_shift_k)

            # 4. The output scales (the thread holding a block's first element writes it), then
            # each slot's inv = 2^(133 - M) (clamped to a finite power of two for a failed block).
            for u in T.unroll(ROWS_PER_THREAD):
                for h in T.unroll(2):
                    e_max = T.cast(T.shift_right(ex[u, h], T.uint32(16)), "int32")
                    e_min = 255 - T.cast(ex[u, h] & T.uint32(0xFFFF), "int32")
                    ok = e_min >= 1 and e_max <= e_min + MAX_EXPONENT_SPREAD and e_max >= MIN_MAX_EXPONENT
                    row = row0 + 8 * u
                    c = col + 16 * h
                    if (
                        row < num_tokens
                        and col_ok
                        and (row & ((1 << out_shift_m) - 1)) == 0
                        and (c & ((1 << out_shift_k) - 1)) == 0
                    ):
                        group = c >> out_shift_k
                        if packed_sf != 0:
                            off = (row >> out_shift_m) * sf_stride_m + (group >> 2) * sf_stride_k + (group & 3)
                            S[off] = T.cast(T.if_then_else(ok, e_max - 6, 255), "uint8")
                            if group == ((hidden - 1) >> out_shift_k):  # zero-fill the rest of the last word
                                for k in T.serial(3 - (group & 3)):
                                    S[off + 1 + k] = T.uint8(0)
                        else:
                            off = (row >> out_shift_m) * sf_stride_m + group * sf_stride_k
                            sf_bits = T.if_then_else(ok, T.shift_left(e_max - 6, 23), T.int32(0x7FC00000))
                            for k in T.unroll(4):
                                S[off + k] = T.cast(T.shift_right(sf_bits, 8 * k) & 255, "uint8")
                    ex[u, h] = T.cast(T.shift_left(T.clamp(260 - e_max, 1, 254), 23), "uint32")

            # 5. Convert and store, a row at a time.
            for u in T.unroll(ROWS_PER_THREAD):
                for h in T.unroll(2):  # columns 16h..16h+15: words 2h, 2h+1
                    scale = T.reinterpret(sfb[u, h], "float32") * T.reinterpret(ex[u, h], "float32")
                    if T.abs(scale) < T.float32(T.infinity("float32")):
                        # The table of the 8 magnitudes; the second half reuses the first's
                        # unless the input scales are 16 columns wide (then so are the output's
                        # or both halves are one output block: the factor is the same).
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
                        # inf or NaN factor (an input scale that is inf or NaN): the element-wise conversion.
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
