"""Per-token (1 x num_per_channels) FP8 e4m3 cast, as a TileLang factory.

Build time only: `build(variant)` returns the PrimFunc that build_tools/aot.py lowers.

Arithmetic (../shared/spec/numerics.md): amax over the group's valid elements,
c = max(amax, clamp); plain SF: sf = c / 448, inv = 448 / c (two true divisions);
round_sf: s = c * (1/448), sf = 2^e with e = ((bits(s) - 1) >> 23) + 1 - 127, inv = 2^-e;
q = e4m3_rne(clamp(x * inv, -448, 448)).

Thread mapping: each thread owns 16 consecutive elements of a row (DEFAULT_CONFIG);
`lanes` consecutive lanes own one SF group and reduce its amax with warp shuffles.
A CTA covers `rows_per_cta` rows x `cols_per_cta` columns; every row and column
tail is masked per vector, so one binary serves every (num_tokens, hidden) with
hidden % vec == 0. All sizes and strides are runtime arguments.

This module: the e4m3 hot kernel, its launch configs and `build`, which dispatches the
runtime-SF and e2m1 variants to per_token_cast_runtime_sf.py.
"""

import tilelang.language as T

from kernels_tl.quant.common import (
    TL_DTYPES,
    per_token_sf_buffer,
    pow2_inverse,
    pow2_scale_exponent,
    pow2_sf,
    store_ue8m0_sf,
    store_ue8m0_word,
)
from kernels_tl.quant.per_token_cast_parts import LaunchConfig, load_row_tiles
from kernels_tl.quant.per_token_cast_runtime_sf import (
    E2M1_CONFIG,
    RUNTIME_CONFIG,
    build_e2m1_rne,
    build_runtime_sf,
    runtime_group_scale_into,
)
from tilebake.quant.per_token_cast import PerTokenCastVariant

# Everything this module defined before the split stays importable from here (bench/, tune.py).
__all__ = [
    "DEFAULT_CONFIG",
    "E2M1_CONFIG",
    "FP32_IN_CONFIG",
    "PASS_CONFIGS",
    "RUNTIME_CONFIG",
    "UE8M0_CONFIG",
    "LaunchConfig",
    "build",
    "build_e2m1_rne",
    "build_runtime_sf",
    "candidate_configs",
    "load_row_tiles",
    "runtime_group_scale_into",
]


# Chosen by bench/tune.py (then tune_per_token_cast.py) on the H200 (bench/results/2026-11-30-NVIDIA-H200/tune.log):
# bf16 -> e4m3 at 16384 x 7168 reached 95.9% of copy bandwidth, against 86-87% for the best
# configs with one 16-byte vector per thread: 16 elements per thread halve the store count.
DEFAULT_CONFIG = LaunchConfig(threads=128, threads_per_row=64, rows_per_thread=2, elems_per_thread=16)
# The packed UE8M0 hot kernels (word stores): 2 warps a CTA, 2 rows a thread. In the H200 sweep of
# bench/ptc_diag.py (bench/results/2026-12-01-NVIDIA-H200/ptc/call2-sweep.log, bf16 16384 x 7168, UE8M0
# column-major) 86.0 / 85.9 us against 86.8 / 86.7 for the byte-store kernel at DEFAULT_CONFIG
# and 87.1 / 87.0 for word stores at DEFAULT_CONFIG.
UE8M0_CONFIG = LaunchConfig(threads=64, threads_per_row=64, rows_per_thread=2, elems_per_thread=16)
# fp32 input, plain SF: 8 warps, 128 threads a row, one row a thread. In the H200 sweep of
# bench/tune.py (bench/results/2026-12-01-NVIDIA-H200/session3/call1/tune_ptc.log) 137.5 / 37.6 / 37.2 us at
# 16384 x 7168 / 4096 x 7168 / 4096 x 4096 against DEFAULT_CONFIG's 138.0 / 39.2 / 37.4; every
# config of 8 or 16 elements a thread lies within 137.3-139.2 us at 16384 x 7168 (the copy roofline).
FP32_IN_CONFIG = LaunchConfig(threads=256, threads_per_row=128, rows_per_thread=1, elems_per_thread=16)


def candidate_configs():
    """The search space `python bench/tune.py build|run DIR per_token_cast` times on a GPU."""
    sixteen = [
        LaunchConfig(t, tpr, r, 16)  # 16 elements a thread (the runtime and e2m1 kernels' only width)
        for t in (64, 128, 256)
        for tpr in (32, 64, 128)
        for r in (1, 2, 4)
        if tpr <= t
    ]
    # Other widths, for the plain kernels (fp32 input: 8 elements = two 16-byte loads a row, 32 = eight).
    others = [LaunchConfig(t, tpr, r, e) for e in (8, 32) for t in (64, 128, 256) for tpr in (32, 64) for r in (2, 4)]
    return sixteen + others


# For every kernel of the op (aot reads it here): every access is guarded per 16-byte vector;
# TileLang's per-element guards would split each vector load into eight scalar ones.
PASS_CONFIGS = {"tl.disable_safe_memory_legalize": True}


def build(v: PerTokenCastVariant, cfg: LaunchConfig = DEFAULT_CONFIG):
    if v.sf_mode == "runtime":
        return build_runtime_sf(v, RUNTIME_CONFIG if cfg is DEFAULT_CONFIG else cfg)
    if v.sf_mode == "rne":
        return build_e2m1_rne(v, E2M1_CONFIG if cfg is DEFAULT_CONFIG else cfg)
    if v.sf_mode == "ue8m0" and cfg is DEFAULT_CONFIG:
        cfg = UE8M0_CONFIG
    if v.sf_mode == "fp32" and v.in_dtype == "fp32" and cfg is DEFAULT_CONFIG:
        cfg = FP32_IN_CONFIG
    assert v.fmt == "e4m3" and v.in_dtype in ("bf16", "fp32"), v
    round_sf, packed_ue8m0 = v.sf_mode in ("round", "ue8m0"), v.sf_mode == "ue8m0"
    in_dtype = TL_DTYPES[v.in_dtype]
    vec = cfg.elems_per_thread or 16 // (2 if v.in_dtype == "bf16" else 4)
    align = 16 // (2 if v.in_dtype == "bf16" else 4)  # elements in 16 bytes: what the host guarantees
    npc = v.num_per_channels
    lanes = npc // vec  # lanes sharing one SF group (a power of two <= 32)
    assert 1 <= lanes <= 32 and 32 % lanes == 0, v
    THREADS, THREADS_PER_ROW, ROWS_PER_THREAD = cfg.threads, cfg.threads_per_row, cfg.rows_per_thread
    rows_per_pass = THREADS // THREADS_PER_ROW
    rows_per_cta = rows_per_pass * ROWS_PER_THREAD
    cols_per_cta = THREADS_PER_ROW * vec
    fmt_max = 448.0

    num_tokens = T.dynamic("num_tokens")
    hidden = T.dynamic("hidden")
    x_stride = T.dynamic("x_stride")
    y_stride = T.dynamic("y_stride")
    sf_shape, sf_strides, sf_dtype = per_token_sf_buffer(num_tokens, hidden, npc, packed_ue8m0)
    num_groups = T.ceildiv(hidden, npc)
    # Packed SF: each word (4 groups, 4 * lanes lanes of one warp and one row) as one 4-byte store,
    # through a uint32 view of S (the host's byte strides are those of an int32 tensor: multiples of 4).
    word_stores = 32 % (4 * lanes) == 0 and THREADS_PER_ROW % (4 * lanes) == 0
    sf_words = (num_tokens, T.ceildiv(num_groups, 4))

    @T.prim_func
    def per_token_cast_kernel(
        X: T.StridedTensor((num_tokens, hidden), (x_stride, 1), in_dtype),
        Y: T.StridedTensor((num_tokens, hidden), (y_stride, 1), "float8_e4m3fn"),
        S: T.StridedTensor(sf_shape, sf_strides, sf_dtype),
        amax_clamp: T.float32,
    ):
        # A 1-D grid whose column tile varies fastest: CTAs resident together read whole
        # consecutive rows (DRAM locality), and the token count has no 65535-block limit.
        with T.Kernel(T.ceildiv(num_tokens, rows_per_cta) * T.ceildiv(hidden, cols_per_cta), threads=THREADS) as b:
            # Registers, so the divisions run once per CTA rather than inlined into every
            # index (where they became 64-bit divisions and halved the bandwidth).
            bx = T.alloc_var("int32")
            by = T.alloc_var("int32")
            bx = b // T.ceildiv(hidden, cols_per_cta)
            by = b % T.ceildiv(hidden, cols_per_cta)
            # The host checks these; they let every row access be one 16-byte vector.
            T.assume(x_stride % align == 0)
            T.assume(y_stride % 16 == 0)
            T.assume(hidden % 16 == 0)
            tx = T.get_thread_binding(0)
            col = by * cols_per_cta + (tx % THREADS_PER_ROW) * vec
            group = col // npc
            xs = T.alloc_local((ROWS_PER_THREAD, vec), in_dtype)
            ys = T.alloc_local((vec,), "float8_e4m3fn")
            if packed_ue8m0 and word_stores:
                S = T.view(S, sf_words, "uint32", (sf_strides[0] // 4, sf_strides[1] // 4))
            load_row_tiles(xs, X, bx, by, tx, col, num_tokens, hidden, cfg, vec, cols_per_cta)
            for u in T.unroll(ROWS_PER_THREAD):
                row = bx * rows_per_cta + u * rows_per_pass + tx // THREADS_PER_ROW
                amax = T.alloc_var("float32")
                amax = T.float32(0)
                for j in T.unroll(vec):
                    amax = T.max(amax, T.abs(T.cast(xs[u, j], "float32")))
                for s in T.unroll(lanes.bit_length() - 1):
                    amax = T.max(amax, T.shfl_xor(amax, lanes >> (s + 1)))
                c = T.max(amax, amax_clamp)
                e = pow2_scale_exponent(c, fmt_max)
                inv = pow2_inverse(e) if round_sf else T.float32(fmt_max) / c
                owner = row < num_tokens and col < hidden and (tx % lanes) == 0
                if packed_ue8m0 and word_stores:
                    store_ue8m0_word(S, row, group, num_groups, e, lanes, owner and tx % (4 * lanes) == 0)
                elif packed_ue8m0:
                    if owner:
                        store_ue8m0_sf(S, row, group, num_groups, e)
                elif owner:
                    S[row, group] = pow2_sf(e) if round_sf else c / T.float32(fmt_max)
                for j in T.vectorized(vec):
                    ys[j] = T.cast(T.clamp(T.cast(xs[u, j], "float32") * inv, -fmt_max, fmt_max), "float8_e4m3fn")
                if row < num_tokens and col < hidden:
                    for j in T.vectorized(vec):
                        Y[row, by * cols_per_cta + (tx % THREADS_PER_ROW) * vec + j] = ys[j]

    return per_token_cast_kernel
