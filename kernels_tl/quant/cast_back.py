"""cast_back: dequantise per-token FP8 e4m3 blocks, y = data * sf, to bf16 or fp32.

Build time only: `build(variant)` returns the PrimFunc that build_tools/aot.py lowers.
Each thread owns 8 consecutive elements (one SF group, since num_per_channels >= 16);
UE8M0 bytes b decode to 2^(b - 127) through the fp32 exponent bits. Sizes and strides
are runtime arguments; SF strides cover row-major and TMA-aligned column-major alike.
"""

import tilelang.language as T

from kernels_tl.quant.common import per_token_sf_buffer
from tilebake.quant.cast_back import CastBackVariant

# Measured on the H200 (bench/results/2026-11-30-NVIDIA-H200): this config reached 89% of
# copy bandwidth at 16384 x 7168; per_token_cast's tuned one (128 threads, 2 rows, 16
# elements a thread) fell to 76% here.
THREADS = 256
THREADS_PER_ROW = 64
ROWS_PER_THREAD = 4
VEC = 8
PASS_CONFIGS = {"tl.disable_safe_memory_legalize": True}  # accesses are guarded per vector


def build(v: CastBackVariant):
    out_dtype = {"bf16": "bfloat16", "fp32": "float32"}[v.out_dtype]
    npc = v.num_per_channels
    rows_per_pass = THREADS // THREADS_PER_ROW
    rows_per_cta = rows_per_pass * ROWS_PER_THREAD
    cols_per_cta = THREADS_PER_ROW * VEC

    num_tokens = T.dynamic("num_tokens")
    hidden = T.dynamic("hidden")
    x_stride = T.dynamic("x_stride")
    sf_shape, sf_strides, sf_dtype = per_token_sf_buffer(num_tokens, hidden, npc, v.packed_ue8m0)

    @T.prim_func
    def cast_back_kernel(
        X: T.StridedTensor((num_tokens, hidden), (x_stride, 1), "float8_e4m3fn"),
        S: T.StridedTensor(sf_shape, sf_strides, sf_dtype),
        Y: T.Tensor((num_tokens, hidden), out_dtype),
    ):
        # 1-D grid, column tile fastest (see per_token_cast.py).
        with T.Kernel(T.ceildiv(num_tokens, rows_per_cta) * T.ceildiv(hidden, cols_per_cta), threads=THREADS) as b:
            # Registers, so the divisions run once per CTA rather than inlined into every
            # index (where they became 64-bit divisions and halved the bandwidth).
            bx = T.alloc_var("int32")
            by = T.alloc_var("int32")
            bx = b // T.ceildiv(hidden, cols_per_cta)
            by = b % T.ceildiv(hidden, cols_per_cta)
            T.assume(x_stride % 16 == 0)
            T.assume(hidden % VEC == 0)
            tx = T.get_thread_binding(0)
            col = by * cols_per_cta + (tx % THREADS_PER_ROW) * VEC
            group = col // npc
            xs = T.alloc_local((ROWS_PER_THREAD, VEC), "float8_e4m3fn")
            sfs = T.alloc_local((ROWS_PER_THREAD,), "float32")
            ys = T.alloc_local((VEC,), out_dtype)
            for u in T.unroll(ROWS_PER_THREAD):
                row = bx * rows_per_cta + u * rows_per_pass + tx // THREADS_PER_ROW
                if row < num_tokens and col < hidden:
                    for j in T.vectorized(VEC):
                        xs[u, j] = X[
                            row, by * cols_per_cta + (tx % THREADS_PER_ROW) * VEC + j
                        ]  # col, spelled out: the vectorizer must see it is a multiple of VEC
                    if v.packed_ue8m0:
                        sfs[u] = T.reinterpret(
                            T.shift_left(T.cast(S[row, group // 4, group % 4], "int32"), 23), "float32"
                        )
                    else:
                        sfs[u] = S[row, group]
            for u in T.unroll(ROWS_PER_THREAD):
                row = bx * rows_per_cta + u * rows_per_pass + tx // THREADS_PER_ROW
                if row < num_tokens and col < hidden:
                    for j in T.vectorized(VEC):
                        ys[j] = T.cast(T.cast(xs[u, j], "float32") * sfs[u], out_dtype)
                    for j in T.vectorized(VEC):
                        Y[row, by * cols_per_cta + (tx % THREADS_PER_ROW) * VEC + j] = ys[j]

    return cast_back_kernel
