"""In-place per-token fake quantisation (quantise to e4m3/e2m1, dequantise), as a TileLang factory.

Build time only. Arithmetic: numerics.md steps 1-4 (as per_token_cast.py), then
y = decode(q) * sf in fp32 with sf the stored scale widened to fp32 (plain c / fmt_max;
round_sf 2^e; use_e4m3_sf e4m3_rne(min(c / fmt_max, 448))), rounded to x's dtype. round_sf and
use_e4m3_sf are runtime flags (uniform branches), so only (dtype, fmt, npc) are compiled in.

Thread mapping as per_token_cast: each thread owns `elems_per_thread` consecutive elements of
`rows_per_thread` rows; npc / elems_per_thread lanes reduce a group's amax with warp shuffles.
Every access is guarded per vector, so one binary serves every (num_tokens, hidden % 16 == 0).
"""

import dataclasses

import tilelang.language as T

from kernels_tl.quant.common import (
    TL_DTYPES,
    e2m1_code,
    e2m1_decode_float32,
    pow2_inverse,
    pow2_scale_exponent,
    pow2_sf,
)
from tilebake.quant.per_token_cast_and_cast_back import PerTokenCastAndCastBackVariant


@dataclasses.dataclass(frozen=True)
class LaunchConfig:
    threads: int = 128
    threads_per_row: int = 64
    rows_per_thread: int = 2
    elems_per_thread: int = 16  # 8 or 16; npc must be a multiple


# per_token_cast's measured best on the H200 (the same access pattern, read then write).
DEFAULT_CONFIG = LaunchConfig()


def candidate_configs():
    """The search space bench/tune.py times on a GPU."""
    return [
        LaunchConfig(t, tpr, r, ept)
        for t in (128, 256)
        for tpr in (32, 64, 128)
        for r in (1, 2, 4)
        for ept in (8, 16)
        if tpr <= t
    ]


PASS_CONFIGS = {"tl.disable_safe_memory_legalize": True}


def build(v: PerTokenCastAndCastBackVariant, cfg: LaunchConfig = DEFAULT_CONFIG):
    in_dtype = TL_DTYPES[v.in_dtype]
    align = 16 // (2 if v.in_dtype == "bf16" else 4)
    vec = cfg.elems_per_thread
    npc = v.num_per_channels
    lanes = npc // vec
    assert 1 <= lanes <= 32 and npc % vec == 0, (v, cfg)
    e2m1 = v.fmt == "e2m1"
    fmt_max = 6.0 if e2m1 else 448.0
    THREADS, TPR, RPT = cfg.threads, cfg.threads_per_row, cfg.rows_per_thread
    rows_per_pass = THREADS // TPR
    rows_per_cta = rows_per_pass * RPT
    cols_per_cta = TPR * vec

    num_tokens = T.dynamic("num_tokens")
    hidden = T.dynamic("hidden")
    x_stride = T.dynamic("x_stride")

    @T.prim_func
    def per_token_cast_and_cast_back_kernel(
        X: T.StridedTensor((num_tokens, hidden), (x_stride, 1), in_dtype),
        amax_clamp: T.float32,
        round_sf: T.int32,
        use_e4m3_sf: T.int32,
    ):
        with T.Kernel(T.ceildiv(num_tokens, rows_per_cta) * T.ceildiv(hidden, cols_per_cta), threads=THREADS) as b:
            bx = T.alloc_var("int32")
            by = T.alloc_var("int32")
            bx = b // T.ceildiv(hidden, cols_per_cta)
            by = b % T.ceildiv(hidden, cols_per_cta)
            T.assume(x_stride % align == 0)
            T.assume(hidden % 16 == 0)
            tx = T.get_thread_binding(0)
            col = by * cols_per_cta + (tx % TPR) * vec
            xs = T.alloc_local((RPT, vec), in_dtype)
            ys = T.alloc_local((vec,), in_dtype)
            for u in T.unroll(RPT):
                row = bx * rows_per_cta + u * rows_per_pass + tx // TPR
                if row < num_tokens and col < hidden:
                    for j in T.vectorized(vec):
                        xs[u, j] = X[row, by * cols_per_cta + (tx % TPR) * vec + j]
                else:
                    for j in T.vectorized(vec):
                        xs[u, j] = T.cast(0, in_dtype)
            for u in T.unroll(RPT):
                row = bx * rows_per_cta + u * rows_per_pass + tx // TPR
                amax = T.alloc_var("float32")
                amax = T.float32(0)
                for j in T.unroll(vec):
                    amax = T.max(amax, T.abs(T.cast(xs[u, j], "float32")))
                for s in T.unroll(lanes.bit_length() - 1):
                    amax = T.max(amax, T.shfl_xor(amax, lanes >> (s + 1)))
                c = T.max(amax, amax_clamp)
                sf = T.alloc_var("float32")
                inv = T.alloc_var("float32")
                if round_sf != 0:
                    # e = the exponent of c * (1/fmt_max), rounded up (e + 127 lies in [0, 255]).
                    e = pow2_scale_exponent(c, fmt_max)
                    sf = pow2_sf(e)
                    inv = pow2_inverse(e)
                elif use_e4m3_sf != 0:
                    sf = T.cast(T.cast(T.min(c / T.float32(fmt_max), T.float32(448)), "float8_e4m3fn"), "float32")
                    inv = T.float32(1) / sf
                else:
                    sf = c / T.float32(fmt_max)
                    inv = T.float32(fmt_max) / c
                for j in T.unroll(vec):
                    q = T.cast(xs[u, j], "float32") * inv
                    if e2m1:
                        d = e2m1_decode_float32(e2m1_code(q))
                    else:
                        # fminf/fmaxf would turn a NaN into +-448; the reference keeps it NaN.
                        d = T.if_then_else(
                            T.isnan(q), q, T.cast(T.cast(T.clamp(q, -fmt_max, fmt_max), "float8_e4m3fn"), "float32")
                        )
                    ys[j] = T.cast(d * sf, in_dtype)
                if row < num_tokens and col < hidden:
                    for j in T.vectorized(vec):
                        X[row, by * cols_per_cta + (tx % TPR) * vec + j] = ys[j]

    return per_token_cast_and_cast_back_kernel
