"""Lossless FP4 (e2m1) -> FP8 (e4m3) block re-quantisation, as a TileLang factory.

Build time only: `build(variant)` returns the PrimFunc that build_tools/aot.py lowers.

Arithmetic (src/tilebake/torch/cast_lossless.py): per output block, max and min of the input
scales over its valid elements; sf_out = max * 2^-6, inv = 64 / max, q = value * (sf_in * inv),
e4m3 (exact). A block whose input scales are not normal powers of two within a ratio of 2^11
(or whose max is below 2^-120) gets a NaN scale (UE8M0 byte 0xFF): a kernel cannot raise, and
a NaN scale poisons every dequantised value of exactly the blocks that are wrong.

Thread mapping: a CTA (128 threads) owns 128 rows x 128 columns; warp w rows 32w..32w+31; a
thread 16 columns (one 8-byte load of codes, one 16-byte store, so a warp's store instruction
writes 4 whole 128-byte row segments) in 8 rows, 4 apart. All loads (8 x 8 bytes of codes and
the input scales) are issued before any is used. The block max/min only needs the scales:
shuffles over the lanes of a column block and the warp's 32 rows, then (bm 128) the 4 warps
through shared memory. The input SF block (bm_in, bk_in) is runtime (log2 shifts; bk_in >= 16,
so a thread's 16 columns share one scale), and so are the SF layouts.

Conversion: per row a thread has one factor s = sf_in * inv; +-v give e4m3 bytes that differ
only in the sign bit, so an 8-byte table of the magnitudes' bytes serves all 16 codes: 2 byte
permutes for the magnitudes of 8 codes, 2 for their sign bits. In a block the cast can do
exactly (ok) s is a power of two 2^k, -5 <= k <= 6, and the bytes of (0, .5, 1, 1.5, 2, 3, 4,
6) * s are 0 and E + (0, 8, 12, 16, 20, 24, 28) with E = (k + 6) << 3 (exact products, normal
e4m3): the table costs 4 integer instructions. Other blocks build it with the fp32 multiplies
and casts an element would take (the clamp to +-448 is what the saturating cast does for a
finite product); an inf/NaN factor takes the element-wise path. Same bytes as the reference.
"""

import dataclasses

import tilelang.language as T

from tilebake.quant.per_block_cast_lossless import PerBlockCastLosslessVariant


@dataclasses.dataclass(frozen=True)
class LaunchConfig:
    lanes: int = 8  # threads of a row: 8 -> 16 columns (an 8-byte load) a thread, 4 -> 32 (16 bytes)
    rows_per_thread: int = 8  # independent loads in flight a thread
    sm_threads: int = 1024  # threads an SM the register cap allows (1024: 64 registers, 2048: 32)


# 16-byte loads, 4 rows a thread (64.1% of copy in a first H200 run, against 56.3% for 8-byte
# loads in 8 rows): bench/results/2026-11-30-NVIDIA-H200/perf/.
DEFAULT_CONFIG = LaunchConfig(lanes=4, rows_per_thread=4, sm_threads=1024)


def candidate_configs():
    """The search space `python bench/tune.py build|run DIR per_block_cast_lossless` times (bm 128)."""
    return [
        LaunchConfig(lanes, rpt, t)
        for lanes, rpt, t in (
            (4, 4, 1024),
            (8, 8, 1024),
            (4, 4, 768),
            (8, 8, 768),
            (4, 2, 1024),
            (4, 2, 1536),
            (4, 2, 2048),
            (8, 4, 1024),
            (8, 4, 1536),
            (8, 2, 2048),
            (4, 8, 768),
            (4, 8, 1024),
        )
    ]


ROWS_PER_CTA = 128
WORDS_PER_CTA = 16  # words of codes = 128 columns
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


# A 16-byte global store as one instruction: nvcc splits TileLang's `*(uint4*)Y = *(uint4*)ys`
# (a struct copy out of a local array) into four 4-byte stores whenever it cannot prove the
# address 16-byte aligned, which is most of the time here (the host checks it is).
STORE16_SOURCE = """
__device__ __forceinline__ void tilebake_store16(void* ptr, unsigned a, unsigned b, unsigned c, unsigned d) {
  asm volatile("st.global.v4.u32 [%0], {%1, %2, %3, %4};" :: "l"(ptr), "r"(a), "r"(b), "r"(c), "r"(d) : "memory");
}
"""


def byte_perm(x, y, selector):
    return T.call_extern("uint32", "__byte_perm", x, y, selector)


def build(v: PerBlockCastLosslessVariant, cfg: LaunchConfig = DEFAULT_CONFIG):
    bm, bk = v.block_m, v.block_k
    assert bm in (32, 128) and bk in (32, 128), v
    LANES = cfg.lanes
    ROWS_PER_THREAD = cfg.rows_per_thread
    COLS = 128 // LANES  # columns a thread (16 or 32)
    WORDS = COLS // 8  # words of codes a thread loads a row
    HALVES = COLS // 16  # 16-column pieces: one input scale and one 16-byte store each
    ROWS_PER_PASS = 32 // LANES  # rows a warp instruction
    ROWS_PER_WARP = ROWS_PER_PASS * ROWS_PER_THREAD
    WARPS = ROWS_PER_CTA // ROWS_PER_WARP
    THREADS = 32 * WARPS
    assert WARPS * ROWS_PER_WARP == ROWS_PER_CTA and (bm == 128 or ROWS_PER_WARP == 32), (v, cfg)

    num_tokens = T.dynamic("num_tokens")
    x_words = T.dynamic("x_words")  # hidden / 8: words of codes a row
    x_stride = T.dynamic("x_stride")  # words
    y_stride = T.dynamic("y_stride")  # words
    hidden = x_words * 8
    num_groups = T.ceildiv(hidden, bk)
    lanes_a_group = bk // COLS  # the lanes of a row whose columns are one output column block
    warp_blocks = 1 if bm == 32 else 0  # a warp's 32 rows are one row block (bm 32)
    writer_warps = WARPS if bm == 32 else 1  # the warps that write scales

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
            T.annotate_min_blocks_per_sm(cfg.sm_threads // THREADS)  # caps the registers
            T.import_source(STORE16_SOURCE)
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
            row0 = bx * ROWS_PER_CTA + warp * ROWS_PER_WARP + lane // LANES  # + ROWS_PER_PASS * u
            col = T.alloc_var("int32")
            col = (by * WORDS_PER_CTA + (tx % LANES) * WORDS) * 8  # the thread's first column
            col_ok = col < hidden
            g_in = T.alloc_local((HALVES,), "int32")
            for h in T.unroll(HALVES):
                g_in[h] = (col + 16 * h) >> in_shift_k  # all equal unless bk_in == 16
            xs = T.alloc_local((ROWS_PER_THREAD, WORDS), "uint32")
            sfb = T.alloc_local((ROWS_PER_THREAD, HALVES), "int32")  # fp32 bits of the row scales
            red_max = T.alloc_shared((WARPS, LANES), "float32")
            red_min = T.alloc_shared((WARPS, LANES), "float32")
            ys = T.alloc_local((4,), "uint32")
            tab_lo = T.alloc_var("uint32")
            tab_hi = T.alloc_var("uint32")
            smax = T.alloc_var("float32")
            smin = T.alloc_var("float32")

            # 1. Every load, before any use.
            for u in T.unroll(ROWS_PER_THREAD):
                if row0 + ROWS_PER_PASS * u < num_tokens and col_ok:
                    for j in T.vectorized(WORDS):
                        xs[u, j] = X[row0 + ROWS_PER_PASS * u, by * WORDS_PER_CTA + (tx % LANES) * WORDS + j]
                else:
                    for j in T.vectorized(WORDS):
                        xs[u, j] = T.uint32(0)
            if in_sf_packed != 0:
                for u in T.unroll(ROWS_PER_THREAD):
                    for h in T.unroll(HALVES):
                        if row0 + ROWS_PER_PASS * u < num_tokens and col_ok:
                            sfb[u, h] = T.cast(
                                SIN[
                                    ((row0 + ROWS_PER_PASS * u) >> in_shift_m) * in_sf_stride_m
                                    + (g_in[h] >> 2) * in_sf_stride_k
                                    + (g_in[h] & 3)
                                ],
                                "int32",
                            )
                        else:
                            sfb[u, h] = 0
                # UE8M0 byte b -> 2^(b - 127); byte 0 is the subnormal 2^-127 (not valid here).
                for u in T.unroll(ROWS_PER_THREAD):
                    for h in T.unroll(HALVES):
                        sfb[u, h] = T.if_then_else(sfb[u, h] == 0, T.int32(1 << 22), T.shift_left(sfb[u, h], 23))
            else:
                for u in T.unroll(ROWS_PER_THREAD):
                    for h in T.unroll(HALVES):
                        if row0 + ROWS_PER_PASS * u < num_tokens and col_ok:
                            sfb[u, h] = SIN32[
                                (((row0 + ROWS_PER_PASS * u) >> in_shift_m) * in_sf_stride_m + g_in[h] * in_sf_stride_k)
                                >> 2
                            ]
                        else:
                            sfb[u, h] = 0

            # 2. Block max and min of the scales: the thread's, the lanes of its column block, the
            # warp's rows, the warps (bm 128). Rows and columns outside the tensor count as max 0
            # / min +inf.
            smax = T.float32(0)
            smin = T.float32(T.infinity("float32"))
            for u in T.unroll(ROWS_PER_THREAD):
                for h in T.unroll(HALVES):
                    f = T.reinterpret(sfb[u, h], "float32")
                    exponent = T.shift_right(sfb[u, h], 23) & 255
                    normal_pow2 = (sfb[u, h] & T.int32(-2139095041)) == 0 and exponent >= 1 and exponent <= 254
                    valid = row0 + ROWS_PER_PASS * u < num_tokens and col_ok
                    smax = T.max(smax, T.if_then_else(valid, f, T.float32(0)))
                    smin = T.min(
                        smin,
                        T.if_then_else(
                            valid, T.if_then_else(normal_pow2, f, T.float32(0)), T.float32(T.infinity("float32"))
                        ),
                    )
            for s in T.unroll(lanes_a_group.bit_length() - 1):
                smax = T.max(smax, T.shfl_xor(smax, 1 << s))
                smin = T.min(smin, T.shfl_xor(smin, 1 << s))
            for s in T.unroll(ROWS_PER_PASS.bit_length() - 1):  # the row lanes of the warp
                smax = T.max(smax, T.shfl_xor(smax, LANES << s))
                smin = T.min(smin, T.shfl_xor(smin, LANES << s))
            if bm == 128 and WARPS > 1:
                if lane < LANES:
                    red_max[warp, lane] = smax
                    red_min[warp, lane] = smin
                T.sync_threads()
                for w in T.unroll(WARPS):
                    smax = T.max(smax, red_max[w, tx % LANES])
                    smin = T.min(smin, red_min[w, tx % LANES])
            ok = T.alloc_var("bool")
            ok = smin > T.float32(0) and smax <= smin * T.float32(MAX_SCALE_RATIO) and smax >= T.float32(MIN_BLOCK_MAX)
            sf_out = smax * T.float32(2.0**-6)
            inv = T.alloc_var("float32")
            inv = T.float32(64.0) / smax

            # 3. The output scale: one thread a block.
            block_row = bx * (ROWS_PER_CTA // bm) + warp * warp_blocks
            group = by * (128 // bk) + (tx % LANES) // lanes_a_group
            if (
                lane < LANES
                and lane % lanes_a_group == 0
                and warp < writer_warps
                and col_ok
                and block_row * bm < num_tokens
            ):
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

            # 4. Convert and store, 16 columns (2 words of codes, 4 words of bytes) at a time.
            for u in T.unroll(ROWS_PER_THREAD):
                for h in T.unroll(HALVES):
                    scale = T.reinterpret(sfb[u, h], "float32") * inv
                    if ok:
                        # s = 2^k exactly: E = (k + 6) << 3 from the exponent bits, bytes added per
                        # lane (no carries: E + 28 < 128). Rows outside the tensor get a table
                        # never stored.
                        e4 = T.cast(
                            T.shift_left(T.shift_right(T.reinterpret(scale, "int32"), 23) - 121, 3) & 255, "uint32"
                        )
                        tab_lo = e4 * T.uint32(0x01010100) + T.uint32(0x0C080000)
                        tab_hi = e4 * T.uint32(0x01010101) + T.uint32(0x1C181410)
                    else:
                        tab_lo = magnitude_table(scale, 0)
                        tab_hi = magnitude_table(scale, 4)
                    if ok or T.abs(scale) < T.float32(T.infinity("float32")):
                        for k in T.unroll(2):
                            w = xs[u, 2 * h + k]
                            # Magnitudes: byte permutes select table bytes by the 3 low bits of 4
                            # nibbles each (bit 3 of a selector nibble must be clear).
                            mag = w & T.uint32(0x77777777)
                            # Sign bits: code i's sign (bit 4i+3) is bit 7 of byte i/2 of w << 4
                            # (even i) or of w (odd i); pick those bytes in order, keep bit 7.
                            w4 = T.shift_left(w, T.uint32(4))
                            ys[2 * k] = byte_perm(tab_lo, tab_hi, mag) ^ (
                                byte_perm(w4, w, T.uint32(0x5140)) & T.uint32(0x80808080)
                            )
                            ys[2 * k + 1] = byte_perm(tab_lo, tab_hi, T.shift_right(mag, T.uint32(16))) ^ (
                                byte_perm(w4, w, T.uint32(0x7362)) & T.uint32(0x80808080)
                            )
                    else:
                        # inf or NaN factor (a block the SF marks NaN): the element-wise conversion.
                        for k in T.unroll(2):
                            w = xs[u, 2 * h + k]
                            for o in T.unroll(2):
                                ys[2 * k + o] = T.uint32(0)
                                for i in T.unroll(4):
                                    code = T.cast(T.shift_right(w, T.uint32(16 * o + 4 * i)) & T.uint32(15), "int32")
                                    ys[2 * k + o] = ys[2 * k + o] | T.shift_left(
                                        e4m3_byte(e2m1_value(code) * scale), T.uint32(8 * i)
                                    )
                    if row0 + ROWS_PER_PASS * u < num_tokens and col_ok:
                        T.call_extern(
                            "handle",
                            "tilebake_store16",
                            T.address_of(
                                Y[row0 + ROWS_PER_PASS * u, 2 * (by * WORDS_PER_CTA + (tx % LANES) * WORDS) + 4 * h]
                            ),
                            ys[0],
                            ys[1],
                            ys[2],
                            ys[3],
                        )

    return per_block_cast_lossless_kernel
