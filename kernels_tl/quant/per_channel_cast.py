"""Per-channel (num_per_tokens x 1) FP8 e4m3 cast, as a TileLang factory.

Build time only: `build(variant)` returns the PrimFunc that build_tools/aot.py lowers.

Arithmetic (../shared/spec/numerics.md): per column of a row block, amax over the valid
rows, c = max(amax, clamp); plain SF: sf = c / 448, inv = 448 / c; round_sf:
s = c * (1/448), sf = 2^e with e = ((bits(s) - 1) >> 23) + 1 - 127, inv = 2^-e;
q = e4m3_rne(clamp(x * inv, -448, 448)). Biased exponents are clamped to 0..255 before they
become fp32 bits, as in the reference (an inf gives sf = inf, inv = 0). A quantized input (e4m3 data with (1, npc)
SF) is first widened to x = data * sf_in (one fp32 multiply), then treated like x.

Thread mapping: a CTA (128 threads, 4 warps) owns num_per_tokens rows x 64 columns (npt 128:
8 threads a row, 16 rows a pass) or x 128 columns (npt 32: 16 threads a row, 8 rows a pass);
each thread 8 consecutive columns in num_per_tokens / rows-a-pass rows, all loaded before any
is used and kept in registers (a quantized input as its e4m3 bytes and row scales: the fp32
value is recomputed, the same multiply, when it is quantized). Column maxima: the thread's
rows, the warp's rows (shuffles), the 4 warps (shared memory, one barrier). Each of the first
64 / 128 threads then writes the scale of one column, so no warp carries a serial tail.

Runtime: round_sf, packed_sf (UE8M0 bytes packed 4 to an int32 along tokens), the input
SF's layout (fp32 or packed UE8M0, any byte strides) and num_per_channels.
"""

import tilelang.language as T

from kernels_tl.quant.common import TL_DTYPES, pow2_inverse, pow2_scale_exponent
from tilebake.quant.per_channel_cast import PerChannelCastVariant

THREADS = 128
VEC = 8  # columns a thread owns
WARPS = THREADS // 32
FMT_MAX = 448.0

# Accesses are guarded per vector; TileLang's per-element guards would split them.
PASS_CONFIGS = {"tl.disable_safe_memory_legalize": True}


def build(v: PerChannelCastVariant):
    quantized = v.in_dtype == "e4m3"
    in_dtype = TL_DTYPES[v.in_dtype]
    align = 16 // {"bf16": 2, "fp32": 4, "e4m3": 1}[v.in_dtype]
    npt = v.num_per_tokens
    threads_per_row = 8 if npt == 128 else 16
    rows_per_pass = THREADS // threads_per_row
    rows_per_thread = npt // rows_per_pass
    cols_per_cta = threads_per_row * VEC
    assert rows_per_thread * rows_per_pass == npt and rows_per_thread >= 2, v
    shuffles = (32 // threads_per_row).bit_length() - 1  # the row groups of a warp: xor tpr .. 16
    # The data a thread holds in registers (a quantized input: its bytes and a scale a row):
    # up to 128 bytes, six CTAs an SM (80 registers); more (fp32 npt 128: 256 bytes), four (128).
    held_bytes = rows_per_thread * (VEC + 4 if quantized else VEC * (2 if in_dtype == "bfloat16" else 4))
    ctas_per_sm = 6 if held_bytes <= 128 else 4

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
        with T.Kernel(num_row_blocks * T.ceildiv(hidden, cols_per_cta), threads=THREADS) as b:
            T.annotate_min_blocks_per_sm(ctas_per_sm)  # caps registers: 80 (6 CTAs) or 128 (4)
            # Registers, so the divisions run once per CTA (not as 64-bit divisions per index).
            bx = T.alloc_var("int32")
            by = T.alloc_var("int32")
            bx = b // T.ceildiv(hidden, cols_per_cta)
            by = b % T.ceildiv(hidden, cols_per_cta)
            T.assume(x_stride % align == 0)
            T.assume(hidden % 16 == 0)
            tx = T.get_thread_binding(0)
            warp = tx // 32
            row0 = T.alloc_var("int32")
            row0 = bx * npt + tx // threads_per_row  # + rows_per_pass * u
            col = T.alloc_var("int32")
            col = by * cols_per_cta + (tx % threads_per_row) * VEC
            red = T.alloc_shared((WARPS, cols_per_cta), "float32")  # the warps' column maxima
            xs = T.alloc_local((rows_per_thread, VEC), in_dtype)
            sfs = T.alloc_local((rows_per_thread,), "float32")  # a quantized input's row scales
            amax = T.alloc_local((VEC,), "float32")
            inv = T.alloc_local((VEC,), "float32")
            ys = T.alloc_local((VEC,), "float8_e4m3fn")

            # 1. Every load, before any use.
            for u in T.unroll(rows_per_thread):
                if row0 + rows_per_pass * u < num_tokens and col < hidden:
                    for j in T.vectorized(VEC):
                        xs[u, j] = X[
                            row0 + rows_per_pass * u, by * cols_per_cta + (tx % threads_per_row) * VEC + j
                        ]  # col, spelled out: the vectorizer must see it is a multiple of VEC
                else:
                    for j in T.vectorized(VEC):
                        xs[u, j] = T.cast(0, in_dtype)
            if quantized:
                group = T.alloc_var("int32")
                group = col // num_per_channels
                for u in T.unroll(rows_per_thread):
                    row = row0 + rows_per_pass * u
                    sfs[u] = T.float32(0)
                    if row < num_tokens and col < hidden:
                        if in_sf_packed != 0:
                            byte = T.cast(
                                SIN[row * in_sf_stride_t + (group // 4) * in_sf_stride_g + group % 4], "int32"
                            )
                            # UE8M0 byte b -> 2^(b - 127); byte 0 is the subnormal 2^-127.
                            sfs[u] = T.reinterpret(
                                T.if_then_else(byte == 0, T.int32(1 << 22), T.shift_left(byte, 23)), "float32"
                            )
                        else:
                            off = row * in_sf_stride_t + group * in_sf_stride_g
                            sfs[u] = T.reinterpret(
                                T.cast(SIN[off], "int32")
                                | T.shift_left(T.cast(SIN[off + 1], "int32"), 8)
                                | T.shift_left(T.cast(SIN[off + 2], "int32"), 16)
                                | T.shift_left(T.cast(SIN[off + 3], "int32"), 24),
                                "float32",
                            )

            # 2. Column maxima: the thread's rows, the warp's row groups, the warps.
            for j in T.unroll(VEC):
                amax[j] = T.float32(0)
            for u in T.unroll(rows_per_thread):
                for j in T.unroll(VEC):
                    if quantized:
                        amax[j] = T.max(amax[j], T.abs(T.cast(xs[u, j], "float32") * sfs[u]))
                    else:
                        amax[j] = T.max(amax[j], T.abs(T.cast(xs[u, j], "float32")))
            for s in T.unroll(shuffles):
                for j in T.unroll(VEC):
                    amax[j] = T.max(amax[j], T.shfl_xor(amax[j], threads_per_row << s))
            if tx % 32 < threads_per_row:
                for j in T.vectorized(VEC):
                    red[warp, (tx % threads_per_row) * VEC + j] = amax[j]
            T.sync_threads()
            for w in T.unroll(WARPS):
                for j in T.unroll(VEC):
                    amax[j] = T.max(amax[j], red[w, (tx % threads_per_row) * VEC + j])

            # 3. The scales: thread t < cols_per_cta writes column t's.
            if tx < cols_per_cta and by * cols_per_cta + tx < hidden:
                m = T.alloc_var("float32")
                m = red[0, tx]
                for w in T.unroll(1, WARPS):
                    m = T.max(m, red[w, tx])
                c = T.max(m, amax_clamp)
                e = pow2_scale_exponent(c, FMT_MAX)
                if packed_sf != 0:
                    S8[bx // 4, by * cols_per_cta + tx, bx % 4] = T.cast(e + 127, "uint8")
                    # The last row block zero-fills the rest of its 4-byte word.
                    if bx == num_row_blocks - 1:
                        for k in T.serial(3 - bx % 4):
                            S8[bx // 4, by * cols_per_cta + tx, bx % 4 + 1 + k] = T.uint8(0)
                elif round_sf != 0:
                    S32[bx, by * cols_per_cta + tx] = T.reinterpret(
                        T.shift_left(T.clamp(e + 127, 0, 255), 23), "float32"
                    )
                else:
                    S32[bx, by * cols_per_cta + tx] = c / T.float32(FMT_MAX)

            # 4. Quantise and store.
            for j in T.unroll(VEC):
                c = T.max(amax[j], amax_clamp)
                if round_sf != 0:
                    e = pow2_scale_exponent(c, FMT_MAX)
                    inv[j] = pow2_inverse(e)
                else:
                    inv[j] = T.float32(FMT_MAX) / c
            # e4m3_rne(clamp(q, -448, 448)) is the saturating (satfinite) cast of q itself: the same
            # byte for every q, NaN included (tl::clamp returns a NaN unchanged), 3 instructions fewer.
            for u in T.unroll(rows_per_thread):
                for j in T.vectorized(VEC):
                    if quantized:
                        ys[j] = T.cast(T.cast(xs[u, j], "float32") * sfs[u] * inv[j], "float8_e4m3fn")
                    else:
                        ys[j] = T.cast(T.cast(xs[u, j], "float32") * inv[j], "float8_e4m3fn")
                if row0 + rows_per_pass * u < num_tokens and col < hidden:
                    for j in T.vectorized(VEC):
                        Y[row0 + rows_per_pass * u, by * cols_per_cta + (tx % threads_per_row) * VEC + j] = ys[j]

    return per_channel_cast_kernel
