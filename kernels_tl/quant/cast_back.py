"""cast_back: dequantise FP8 e4m3 / packed FP4 e2m1 blocks, y = data * sf, to bf16 or fp32.

Build time only: `build(variant, cfg)` returns the PrimFunc that build_tools/aot.py lowers.

Thread mapping (LaunchConfig): each thread owns `elems_per_thread` consecutive logical elements
of `rows_per_thread` rows; `threads_per_row` threads cover a row tile. The SF block (bm, bk) is
a runtime argument: the host guarantees bk % 16 == 0 (all of a thread's elements share one
scale; row block = row // bm, column block = col // bk, int32 divisions once per row) or, for
per-channel variants, bk == 1 (one scale per element, column block = col). SF kinds: fp32,
float8_e4m3fn (widened), packed UE8M0 (bytes 2^(b - 127), packed along K, or along M when
per-channel). SF strides are runtime, so row- and column-major SF share one binary.
e2m1 data are int8 (T, H/2), the even element in the low nibble.
"""

import dataclasses

import tilelang.language as T

from kernels_tl.quant.common import TL_DTYPES, e2m1x8_bf16x2, e2m1x8_word, ue8m0_to_float32
from tilebake.quant.cast_back import CastBackVariant


@dataclasses.dataclass(frozen=True)
class LaunchConfig:
    threads: int = 256
    threads_per_row: int = 64
    rows_per_thread: int = 4  # independent loads in flight per thread
    elems_per_thread: int = 8  # consecutive logical elements a thread owns per row (8 or 16)


# Chosen by `python bench/tune.py run .carry/tune cast_back` on the H200 (bench/results/
# 2026-11-30-NVIDIA-H200/issue4/tune_cast_back.log), at 16384 x 7168 -> bf16: e4m3 (1, 128) fp32 SF
# 91.0% of copy bandwidth (the previous 256 x 4 rows x 8 elements: 88.4%). e2m1 (1, 32) UE8M0 with
# the PRMT decoder (bench/results/2026-11-30-NVIDIA-H200/perf/e2m1-tune.log): 88.2% with this
# config, 59.3% with the former 128 x 4 rows (more rows a thread is slower here).
DEFAULT_CONFIG = LaunchConfig(threads=512, threads_per_row=64, rows_per_thread=1, elems_per_thread=16)
DEFAULT_CONFIG_E2M1 = DEFAULT_CONFIG


def candidate_configs():
    """The search space bench/tune.py times on a GPU."""
    return [
        LaunchConfig(t, tpr, r, ept)
        for t in (128, 256, 512)
        for tpr in (32, 64, 128)
        for r in (1, 2, 4)
        for ept in (8, 16)
        if tpr <= t
    ]


PASS_CONFIGS = {"tl.disable_safe_memory_legalize": True}  # accesses are guarded per vector


def build(v: CastBackVariant, cfg: LaunchConfig = None):
    out_dtype = TL_DTYPES[v.out_dtype]
    e2m1 = v.in_fmt == "e2m1"
    cfg = cfg or (DEFAULT_CONFIG_E2M1 if e2m1 else DEFAULT_CONFIG)
    ept = cfg.elems_per_thread
    assert ept in (8, 16), cfg
    xvec = ept // 2 if e2m1 else ept  # data bytes a thread loads per row
    THREADS, TPR, RPT = cfg.threads, cfg.threads_per_row, cfg.rows_per_thread
    rows_per_pass = THREADS // TPR
    rows_per_cta = rows_per_pass * RPT
    cols_per_cta = TPR * ept  # logical columns

    num_tokens = T.dynamic("num_tokens")
    x_cols = T.dynamic("x_cols")  # physical columns of the data: H, or H / 2 for e2m1
    x_stride = T.dynamic("x_stride")
    sf_d0 = T.dynamic("sf_d0")
    sf_d1 = T.dynamic("sf_d1")
    sf_stride_0 = T.dynamic("sf_stride_0")
    sf_stride_1 = T.dynamic("sf_stride_1")
    hidden = x_cols * 2 if e2m1 else x_cols
    if v.sf_kind == "ue8m0":  # bytes [word-or-row, col-or-word, byte-in-word], strides in bytes
        sf_shape, sf_strides, sf_dtype = (sf_d0, sf_d1, 4), (sf_stride_0, sf_stride_1, 1), "uint8"
    else:
        sf_shape, sf_strides = (sf_d0, sf_d1), (sf_stride_0, sf_stride_1)
        sf_dtype = TL_DTYPES[v.sf_kind]

    def load_sf(S, rb, cb):
        """The fp32 scale of SF block (rb, cb)."""
        if v.sf_kind == "ue8m0":
            if v.per_channel:  # packed along M
                return ue8m0_to_float32(S[rb // 4, cb, rb % 4])
            return ue8m0_to_float32(S[rb, cb // 4, cb % 4])
        return T.cast(S[rb, cb], "float32")

    @T.prim_func
    def cast_back_kernel(
        X: T.StridedTensor((num_tokens, x_cols), (x_stride, 1), "int8" if e2m1 else "float8_e4m3fn"),
        S: T.StridedTensor(sf_shape, sf_strides, sf_dtype),
        Y: T.Tensor((num_tokens, hidden), out_dtype),
        block_m: T.int32,
        block_k: T.int32,
    ):
        # 1-D grid, column tile fastest (see per_token_cast.py).
        with T.Kernel(T.ceildiv(num_tokens, rows_per_cta) * T.ceildiv(hidden, cols_per_cta), threads=THREADS) as b:
            # Registers, so the divisions run once per CTA rather than inlined into every index.
            bx = T.alloc_var("int32")
            by = T.alloc_var("int32")
            bx = b // T.ceildiv(hidden, cols_per_cta)
            by = b % T.ceildiv(hidden, cols_per_cta)
            T.assume(x_stride % (8 if e2m1 else 16) == 0)  # what the host checks: whole data vectors
            T.assume(x_cols % 8 == 0)
            tx = T.get_thread_binding(0)
            col = by * cols_per_cta + (tx % TPR) * ept  # logical
            # SF block indices: a shift for the usual power-of-two blocks (a uniform branch), an
            # int32 division (some 25 instructions) only otherwise. row, col >= 0.
            cb = T.alloc_var("int32")
            if (block_k & (block_k - 1)) == 0:
                cb = T.shift_right(col, 31 - T.call_extern("int32", "__clz", block_k))
            else:
                cb = col // block_k
            pow2_m = (block_m & (block_m - 1)) == 0
            shift_m = 31 - T.call_extern("int32", "__clz", block_m)
            xs = T.alloc_local((RPT, xvec), "int8" if e2m1 else "float8_e4m3fn")
            sfs = T.alloc_local((RPT, ept), "float32")
            ys = T.alloc_local((ept,), out_dtype)
            for u in T.unroll(RPT):
                row = bx * rows_per_cta + u * rows_per_pass + tx // TPR
                if row < num_tokens and col < hidden:
                    for j in T.vectorized(xvec):
                        xs[u, j] = X[
                            row, by * (cols_per_cta // (2 if e2m1 else 1)) + (tx % TPR) * xvec + j
                        ]  # the physical column, spelled out so the vectorizer sees a multiple of xvec
                    rb = T.alloc_var("int32")
                    if pow2_m:
                        rb = T.shift_right(row, shift_m)
                    else:
                        rb = row // block_m
                    if v.per_channel:
                        for j in T.unroll(ept):
                            sfs[u, j] = load_sf(S, rb, col + j)
                    else:
                        sfs[u, 0] = load_sf(S, rb, cb)
            for u in T.unroll(RPT):
                row = bx * rows_per_cta + u * rows_per_pass + tx // TPR
                if row < num_tokens and col < hidden:
                    if e2m1:
                        # 8 codes a word; each pair's bf16 bits are the top halves of their fp32 values.
                        for i in T.unroll(ept // 8):
                            w = e2m1x8_word(xs, u, 4 * i)
                            for k in T.unroll(4):
                                pair = e2m1x8_bf16x2(w, k)
                                j = 8 * i + 2 * k
                                lo = T.reinterpret(T.shift_left(pair, T.uint32(16)), "float32")
                                hi = T.reinterpret(pair & T.uint32(0xFFFF0000), "float32")
                                ys[j] = T.cast(lo * sfs[u, j if v.per_channel else 0], out_dtype)
                                ys[j + 1] = T.cast(hi * sfs[u, j + 1 if v.per_channel else 0], out_dtype)
                    else:
                        for j in T.unroll(ept):
                            value = T.cast(xs[u, j], "float32")
                            ys[j] = T.cast(value * sfs[u, j if v.per_channel else 0], out_dtype)
                    for j in T.vectorized(ept):
                        Y[row, by * cols_per_cta + (tx % TPR) * ept + j] = ys[j]

    return cast_back_kernel
