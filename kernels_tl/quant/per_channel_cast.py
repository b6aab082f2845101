"""Per-channel (num_per_tokens x 1) FP8 e4m3 cast, as a TileLang factory.

Build time only: `build(variant)` returns the PrimFunc that build_tools/aot.py lowers.

Arithmetic (../shared/spec/numerics.md): per column of a row block, amax over the valid
rows, c = max(amax, clamp); plain SF: sf = c / 448, inv = 448 / c; round_sf:
s = c * (1/448), sf = 2^e with e = ((bits(s) - 1) >> 23) + 1 - 127, inv = 2^-e;
q = e4m3_rne(clamp(x * inv, -448, 448)). Biased exponents are clamped to 0..255 before they
become fp32 bits, as in the reference (an inf gives sf = inf, inv = 0). A quantized input (e4m3 data with (1, npc)
SF) is first widened to x = data * sf_in (one fp32 multiply), then treated like x.

Thread mapping: a CTA owns num_per_tokens rows x 128 columns. Each thread owns 8
consecutive columns in num_per_tokens / 16 rows, keeps them in registers, and reduces
its column maxima; the 16 rows of a pass are reduced through shared memory.

Runtime: round_sf, packed_sf (UE8M0 bytes packed 4 to an int32 along tokens), the input
SF's layout (fp32 or packed UE8M0, any byte strides) and num_per_channels.
"""

import tilelang.language as T

from tilebake.quant.per_channel_cast import PerChannelCastVariant

THREADS = 256
VEC = 8  # columns a thread owns
THREADS_PER_ROW = 16
ROWS_PER_PASS = THREADS // THREADS_PER_ROW  # 16
COLS_PER_CTA = THREADS_PER_ROW * VEC  # 128
FMT_MAX = 448.0

# Accesses are guarded per vector; TileLang's per-element guards would split them.
PASS_CONFIGS = {"tl.disable_safe_memory_legalize": True}


def build(v: PerChannelCastVariant):
    quantized = v.in_dtype == "e4m3"
    in_dtype = {"bf16": "bfloat16", "fp32": "float32", "e4m3": "float8_e4m3fn"}[v.in_dtype]
    reg_dtype = "float32" if quantized else in_dtype  # e4m3 inputs are kept widened and scaled
    align = 16 // {"bf16": 2, "fp32": 4, "e4m3": 1}[v.in_dtype]
    npt = v.num_per_tokens
    rows_per_thread = npt // ROWS_PER_PASS
    assert rows_per_thread * ROWS_PER_PASS == npt, v
    # The data a thread holds in registers: up to 64 bytes, four CTAs an SM fit under 64
    # registers a thread; up to 128 bytes three (80: at 64 sm_100a spilled 200 bytes), so some
    # CTAs' loads overlap the others' barriers and math. Otherwise two (128 registers).
    held_bytes = rows_per_thread * VEC * (2 if reg_dtype == "bfloat16" else 4)
    ctas_per_sm = 4 if held_bytes <= 64 else (3 if held_bytes <= 128 else 2)

    num_tokens = T.dynamic("num_tokens")
    hidden = T.dynamic("hidden")
    x_stride = T.dynamic("x_stride")
    num_row_blocks = T.ceildiv(num_tokens, npt)

    @T.prim_func
    def per_channel_cast_kernel(
        X: T.StridedTensor((num_tokens, hidden), (x_stride, 1), in_dtype),
        Y: T.Tensor((num_tokens, hidden), "float8_e4m3fn"),
        # The output SF, by its layout (the host passes one pointer as both; one is used).
        S32: T.Tensor((num_row_blocks, hidden), "float32"),
        S8: T.Tensor((T.ceildiv(num_row_blocks, 4), hidden, 4), "uint8"),
        # The input SF of a quantized x, as bytes at runtime byte strides (extent nominal).
        SIN: T.Tensor((num_tokens * hidden,), "uint8"),
        amax_clamp: T.float32,
        round_sf: T.int32,
        packed_sf: T.int32,
        in_sf_packed: T.int32,
        in_sf_stride_t: T.int32,  # bytes between rows of the input SF
        in_sf_stride_g: T.int32,  # bytes between its groups (fp32) or packed words
        num_per_channels: T.int32,
    ):
        with T.Kernel(num_row_blocks * T.ceildiv(hidden, COLS_PER_CTA), threads=THREADS) as b:
            T.annotate_min_blocks_per_sm(ctas_per_sm)  # caps registers: 64 (4 CTAs), 80 (3) or 128 (2)
            # Registers, so the divisions run once per CTA (not as 64-bit divisions per index).
            bx = T.alloc_var("int32")
            by = T.alloc_var("int32")
            bx = b // T.ceildiv(hidden, COLS_PER_CTA)
            by = b % T.ceildiv(hidden, COLS_PER_CTA)
            T.assume(x_stride % align == 0)
            T.assume(hidden % 16 == 0)
            tx = T.get_thread_binding(0)
            col = by * COLS_PER_CTA + (tx % THREADS_PER_ROW) * VEC
            # Rows 0..15: per-thread column maxima; row 16: the block's column maxima (one
            # buffer, so the compiler cannot overlay the two while both are live).
            red = T.alloc_shared((ROWS_PER_PASS + 1, COLS_PER_CTA), "float32")
            group = T.alloc_var("int32")
            group = col // num_per_channels if quantized else 0
            xs = T.alloc_local((rows_per_thread, VEC), reg_dtype)
            raw = T.alloc_local((VEC,), in_dtype)
            amax = T.alloc_local((VEC,), "float32")
            inv = T.alloc_local((VEC,), "float32")
            ys = T.alloc_local((VEC,), "float8_e4m3fn")
            for u in T.unroll(rows_per_thread):
                row = bx * npt + u * ROWS_PER_PASS + tx // THREADS_PER_ROW
                if row < num_tokens and col < hidden:
                    if quantized:
                        for j in T.vectorized(VEC):
                            raw[j] = X[row, by * COLS_PER_CTA + (tx % THREADS_PER_ROW) * VEC + j]
                        sf_in = T.alloc_var("float32")
                        if in_sf_packed != 0:
                            byte = T.cast(
                                SIN[row * in_sf_stride_t + (group // 4) * in_sf_stride_g + group % 4], "int32"
                            )
                            # UE8M0 byte b -> 2^(b - 127); byte 0 is the subnormal 2^-127.
                            sf_in = T.reinterpret(
                                T.if_then_else(byte == 0, T.int32(1 << 22), T.shift_left(byte, 23)), "float32"
                            )
                        else:
                            off = row * in_sf_stride_t + group * in_sf_stride_g
                            sf_in = T.reinterpret(
                                T.cast(SIN[off], "int32")
                                | T.shift_left(T.cast(SIN[off + 1], "int32"), 8)
                                | T.shift_left(T.cast(SIN[off + 2], "int32"), 16)
                                | T.shift_left(T.cast(SIN[off + 3], "int32"), 24),
                                "float32",
                            )
                        for j in T.unroll(VEC):
                            xs[u, j] = T.cast(raw[j], "float32") * sf_in
                    else:
                        for j in T.vectorized(VEC):
                            xs[u, j] = X[
                                row, by * COLS_PER_CTA + (tx % THREADS_PER_ROW) * VEC + j
                            ]  # col, spelled out: the vectorizer must see it is a multiple of VEC
                else:
                    for j in T.vectorized(VEC):
                        xs[u, j] = T.cast(0, reg_dtype)
            # Column maxima: this thread's rows, then the pass's 16 rows through shared memory.
            for j in T.unroll(VEC):
                amax[j] = T.float32(0)
            for u in T.unroll(rows_per_thread):
                for j in T.unroll(VEC):
                    amax[j] = T.max(amax[j], T.abs(T.cast(xs[u, j], "float32")))
            for j in T.vectorized(VEC):
                red[tx // THREADS_PER_ROW, (tx % THREADS_PER_ROW) * VEC + j] = amax[j]
            T.sync_threads()
            if tx < COLS_PER_CTA:
                m = T.alloc_var("float32")
                m = T.float32(0)
                for r in T.unroll(ROWS_PER_PASS):
                    m = T.max(m, red[r, tx])
                red[ROWS_PER_PASS, tx] = m
            T.sync_threads()
            for j in T.unroll(VEC):
                c = T.max(red[ROWS_PER_PASS, (tx % THREADS_PER_ROW) * VEC + j], amax_clamp)
                e = ((T.reinterpret(c * T.float32(1.0 / FMT_MAX), "int32") - 1) >> 23) + 1 - 127
                if round_sf != 0:
                    inv[j] = T.reinterpret(T.shift_left(T.clamp(127 - e, 0, 255), 23), "float32")
                else:
                    inv[j] = T.float32(FMT_MAX) / c
                # The first row of the pass writes the SF of its columns.
                if tx < THREADS_PER_ROW and col < hidden:
                    if packed_sf != 0:
                        S8[bx // 4, col + j, bx % 4] = T.cast(e + 127, "uint8")
                        # The last row block zero-fills the rest of its 4-byte word.
                        if bx == num_row_blocks - 1:
                            for k in T.serial(3 - bx % 4):
                                S8[bx // 4, col + j, bx % 4 + 1 + k] = T.uint8(0)
                    elif round_sf != 0:
                        S32[bx, col + j] = T.reinterpret(T.shift_left(T.clamp(e + 127, 0, 255), 23), "float32")
                    else:
                        S32[bx, col + j] = c / T.float32(FMT_MAX)
            for u in T.unroll(rows_per_thread):
                row = bx * npt + u * ROWS_PER_PASS + tx // THREADS_PER_ROW
                for j in T.vectorized(VEC):
                    ys[j] = T.cast(T.clamp(T.cast(xs[u, j], "float32") * inv[j], -FMT_MAX, FMT_MAX), "float8_e4m3fn")
                if row < num_tokens and col < hidden:
                    for j in T.vectorized(VEC):
                        Y[row, by * COLS_PER_CTA + (tx % THREADS_PER_ROW) * VEC + j] = ys[j]

    return per_channel_cast_kernel
