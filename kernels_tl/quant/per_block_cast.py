"""Per-block (bm x bk) FP8 e4m3 / FP4 e2m1 cast, as a TileLang factory.

Build time only: `build(variant)` returns the PrimFunc that build_tools/aot.py lowers.

Arithmetic (../shared/spec/numerics.md): amax over the block's valid elements,
c = max(amax, clamp); plain SF: sf = c / fmt_max, inv = fmt_max / c; round_sf:
s = c * (1/fmt_max), sf = 2^e with e = ((bits(s) - 1) >> 23) + 1 - 127, inv = 2^-e;
precomputed SF: inv = 1 / sf. The biased exponents of sf and inv are clamped to 0..255 before
they become fp32 bits, as the reference does (an inf in a block gives e = 128: sf = inf, inv = 0).
e4m3: q = e4m3_rne(clamp(x * inv, -448, 448)); e2m1: the code of numerics.md step 4, two codes
a byte (even element in the low nibble).

Thread mapping: a CTA owns bm rows x 128 columns (whole blocks: 128 / bk of them per
row block). Each thread owns 16 consecutive elements in bm / 32 rows. A block's amax is
reduced over its lanes with warp shuffles, then over the 32 rows of a pass through
shared memory. One CTA writes each SF, so no atomics.

Runtime flags (uniform branches, no extra binaries): mode (0 cast, 1 SF only, 2 cast
with a given fp32 SF), round_sf, packed_sf (UE8M0 bytes packed 4 to an int32 along K).
The SF is addressed as bytes with runtime byte strides, so fp32 / packed UE8M0 and
row-major / TMA-aligned column-major SF share one binary.
"""

import tilelang.language as T

from kernels_tl.quant.common import TL_DTYPES, e2m1_code, pow2_inverse, pow2_scale_exponent
from tilebake.quant.per_block_cast import PerBlockCastVariant

THREADS = 256
VEC = 16  # elements a thread owns per row
THREADS_PER_ROW = 8  # x VEC = 128 columns per CTA
ROWS_PER_PASS = THREADS // THREADS_PER_ROW  # 32
COLS_PER_CTA = THREADS_PER_ROW * VEC

# Every access is guarded per vector below; TileLang's per-element guards would split
# each vector access into scalar ones.
PASS_CONFIGS = {"tl.disable_safe_memory_legalize": True}


def build(v: PerBlockCastVariant):
    in_dtype = TL_DTYPES[v.in_dtype]
    align = 16 // (2 if v.in_dtype == "bf16" else 4)  # elements in 16 bytes: what the host guarantees
    bm, bk = v.block_m, v.block_k
    e2m1 = v.fmt == "e2m1"
    fmt_max = 6.0 if e2m1 else 448.0
    rows_per_thread = bm // ROWS_PER_PASS
    lanes = bk // VEC  # consecutive threads sharing one block's columns
    groups_per_cta = COLS_PER_CTA // bk
    assert rows_per_thread * ROWS_PER_PASS == bm and lanes * VEC == bk and THREADS_PER_ROW % lanes == 0, v
    out_vec = VEC // 2 if e2m1 else VEC  # output bytes per thread per row
    y_dtype = "uint8" if e2m1 else "float8_e4m3fn"
    # The data a thread holds in registers: at up to 128 bytes (32 registers) four CTAs fit an
    # SM under 64 registers a thread (three for e2m1 over 4 rows: its encode spilled at 64), so
    # some CTAs' loads overlap the others' barrier and math. Otherwise two (128 registers).
    held_bytes = rows_per_thread * VEC * (2 if v.in_dtype == "bf16" else 4)
    ctas_per_sm = 2 if held_bytes > 128 else (3 if e2m1 and rows_per_thread > 1 else 4)

    num_tokens = T.dynamic("num_tokens")
    hidden = T.dynamic("hidden")
    x_stride = T.dynamic("x_stride")
    y_stride = T.dynamic("y_stride")
    num_row_blocks = T.ceildiv(num_tokens, bm)
    num_groups = T.ceildiv(hidden, bk)

    @T.prim_func
    def per_block_cast_kernel(
        X: T.StridedTensor((num_tokens, hidden), (x_stride, 1), in_dtype),
        Y: T.StridedTensor((num_tokens, hidden // 2 if e2m1 else hidden), (y_stride, 1), y_dtype),
        # The SF as bytes at runtime byte strides; the extent is nominal (nothing checks it).
        S: T.Tensor((num_tokens * hidden,), "uint8"),
        amax_clamp: T.float32,
        mode: T.int32,
        round_sf: T.int32,
        packed_sf: T.int32,
        sf_stride_m: T.int32,  # bytes between row blocks
        sf_stride_k: T.int32,  # bytes between K blocks (fp32) or packed words
    ):
        with T.Kernel(num_row_blocks * T.ceildiv(hidden, COLS_PER_CTA), threads=THREADS) as b:
            T.annotate_min_blocks_per_sm(ctas_per_sm)  # caps registers: 64 (4 CTAs), 80 (3) or 128 (2)
            # Registers, so the divisions run once per CTA (not as 64-bit divisions per index).
            bx = T.alloc_var("int32")
            by = T.alloc_var("int32")
            bx = b // T.ceildiv(hidden, COLS_PER_CTA)
            by = b % T.ceildiv(hidden, COLS_PER_CTA)
            # The host checks these; they let every row access be whole vectors.
            T.assume(x_stride % align == 0)
            T.assume(y_stride % 16 == 0)
            T.assume(hidden % (32 if e2m1 else 16) == 0)
            tx = T.get_thread_binding(0)
            col = by * COLS_PER_CTA + (tx % THREADS_PER_ROW) * VEC
            g_local = (tx % THREADS_PER_ROW) // lanes
            group = by * groups_per_cta + g_local
            red = T.alloc_shared((ROWS_PER_PASS, groups_per_cta), "float32")
            xs = T.alloc_local((rows_per_thread, VEC), in_dtype)
            ys = T.alloc_local((out_vec,), y_dtype)
            for u in T.unroll(rows_per_thread):
                row = bx * bm + u * ROWS_PER_PASS + tx // THREADS_PER_ROW
                if row < num_tokens and col < hidden:
                    for j in T.vectorized(VEC):
                        xs[u, j] = X[
                            row, by * COLS_PER_CTA + (tx % THREADS_PER_ROW) * VEC + j
                        ]  # col, spelled out: the vectorizer must see it is a multiple of VEC
                else:
                    for j in T.vectorized(VEC):
                        xs[u, j] = T.cast(0, in_dtype)
            # Block amax: this thread's elements, its lanes (shuffles), the pass's rows (smem).
            amax = T.alloc_var("float32")
            amax = T.float32(0)
            for u in T.unroll(rows_per_thread):
                for j in T.unroll(VEC):
                    amax = T.max(amax, T.abs(T.cast(xs[u, j], "float32")))
            for s in T.unroll(lanes.bit_length() - 1):
                amax = T.max(amax, T.shfl_xor(amax, lanes >> (s + 1)))
            if tx % lanes == 0:
                red[tx // THREADS_PER_ROW, g_local] = amax
            T.sync_threads()
            for r in T.unroll(ROWS_PER_PASS):
                amax = T.max(amax, red[r, g_local])
            c = T.max(amax, amax_clamp)
            e = pow2_scale_exponent(c, fmt_max)
            inv = T.alloc_var("float32")
            sf_off = T.alloc_var("int32")
            if packed_sf != 0:
                sf_off = bx * sf_stride_m + (group // 4) * sf_stride_k + group % 4
            else:
                sf_off = bx * sf_stride_m + group * sf_stride_k
            if mode == 2:
                # The given fp32 SF, read as its 4 little-endian bytes.
                if col < hidden:
                    sf_bits = (
                        T.cast(S[sf_off], "int32")
                        | T.shift_left(T.cast(S[sf_off + 1], "int32"), 8)
                        | T.shift_left(T.cast(S[sf_off + 2], "int32"), 16)
                        | T.shift_left(T.cast(S[sf_off + 3], "int32"), 24)
                    )
                    inv = T.float32(1.0) / T.reinterpret(sf_bits, "float32")
                else:
                    inv = T.float32(0)
            elif round_sf != 0:
                inv = pow2_inverse(e)
            else:
                inv = T.float32(fmt_max) / c
            # One thread per block writes its SF: lane 0 of the pass's first row.
            if mode != 2 and tx < THREADS_PER_ROW and tx % lanes == 0 and col < hidden:
                if packed_sf != 0:
                    S[sf_off] = T.cast(e + 127, "uint8")
                    # The last K block zero-fills the rest of its 4-byte word.
                    if group == num_groups - 1:
                        for k in T.serial(3 - group % 4):
                            S[sf_off + 1 + k] = T.uint8(0)
                else:
                    sf_bits = T.if_then_else(
                        round_sf != 0,
                        T.shift_left(T.clamp(e + 127, 0, 255), 23),
                        T.reinterpret(c / T.float32(fmt_max), "int32"),
                    )
                    for k in T.unroll(4):
                        S[sf_off + k] = T.cast(T.shift_right(sf_bits, 8 * k) & 255, "uint8")
            if mode != 1:
                for u in T.unroll(rows_per_thread):
                    row = bx * bm + u * ROWS_PER_PASS + tx // THREADS_PER_ROW
                    if e2m1:
                        for j in T.unroll(out_vec):
                            lo = e2m1_code(T.cast(xs[u, 2 * j], "float32") * inv)
                            hi = e2m1_code(T.cast(xs[u, 2 * j + 1], "float32") * inv)
                            ys[j] = T.cast(lo | T.shift_left(hi, 4), "uint8")
                    else:
                        for j in T.vectorized(VEC):
                            ys[j] = T.cast(
                                T.clamp(T.cast(xs[u, j], "float32") * inv, -fmt_max, fmt_max), "float8_e4m3fn"
                            )
                    if row < num_tokens and col < hidden:
                        for j in T.vectorized(out_vec):
                            Y[row, by * (COLS_PER_CTA * out_vec // VEC) + (tx % THREADS_PER_ROW) * out_vec + j] = ys[j]

    return per_block_cast_kernel
