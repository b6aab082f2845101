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
"""

import dataclasses

import tilelang.language as T

from kernels_tl.quant.common import per_token_sf_buffer
from tilebake.quant.per_token_cast import PerTokenCastVariant


@dataclasses.dataclass(frozen=True)
class LaunchConfig:
    threads: int = 256
    threads_per_row: int = 64  # x 16 B = input bytes per row per pass
    rows_per_thread: int = 4  # independent 16-byte loads in flight per thread
    elems_per_thread: int = 0  # contiguous elements a thread owns per row; 0: one 16-byte vector


# Chosen by bench/tune_per_token_cast.py on the H200 (bench/results/2026-11-30-NVIDIA-H200/tune.log):
# bf16 -> e4m3 at 16384 x 7168 reached 95.9% of copy bandwidth, against 86-87% for the best
# configs with one 16-byte vector per thread: 16 elements per thread halve the store count.
DEFAULT_CONFIG = LaunchConfig(threads=128, threads_per_row=64, rows_per_thread=2, elems_per_thread=16)


def candidate_configs():
    """The search space bench/tune_per_token_cast.py times on a GPU."""
    return [
        LaunchConfig(t, tpr, r, ept)
        for t in (128, 256)
        for tpr in (32, 64, 128)
        for r in (2, 4)
        for ept in (0, 16)
        if tpr <= t
    ]


# Every access is guarded per 16-byte vector below; TileLang's per-element guards
# would split each vector load into eight scalar ones.
PASS_CONFIGS = {"tl.disable_safe_memory_legalize": True}


def build(v: PerTokenCastVariant, cfg: LaunchConfig = DEFAULT_CONFIG):
    in_dtype = {"bf16": "bfloat16", "fp32": "float32"}[v.in_dtype]
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
    sf_shape, sf_strides, sf_dtype = per_token_sf_buffer(num_tokens, hidden, npc, v.packed_ue8m0)
    num_groups = T.ceildiv(hidden, npc)

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
            for u in T.unroll(ROWS_PER_THREAD):
                row = bx * rows_per_cta + u * rows_per_pass + tx // THREADS_PER_ROW
                if row < num_tokens and col < hidden:
                    for j in T.vectorized(vec):
                        xs[u, j] = X[
                            row, by * cols_per_cta + (tx % THREADS_PER_ROW) * vec + j
                        ]  # col, spelled out: the vectorizer must see it is a multiple of vec
                else:
                    for j in T.vectorized(vec):
                        xs[u, j] = T.cast(0, in_dtype)
            for u in T.unroll(ROWS_PER_THREAD):
                row = bx * rows_per_cta + u * rows_per_pass + tx // THREADS_PER_ROW
                amax = T.alloc_var("float32")
                amax = T.float32(0)
                for j in T.unroll(vec):
                    amax = T.max(amax, T.abs(T.cast(xs[u, j], "float32")))
                for s in T.unroll(lanes.bit_length() - 1):
                    amax = T.max(amax, T.shfl_xor(amax, lanes >> (s + 1)))
                c = T.max(amax, amax_clamp)
                # round_sf: the power-of-two exponent of the scale, rounded up.
                e = ((T.reinterpret(c * T.float32(1.0 / fmt_max), "int32") - 1) >> 23) + 1 - 127
                inv = T.reinterpret((127 - e) << 23, "float32") if v.round_sf else T.float32(fmt_max) / c
                owner = row < num_tokens and col < hidden and (tx % lanes) == 0
                if v.packed_ue8m0:
                    if owner:
                        S[row, group // 4, group % 4] = T.cast(e + 127, "uint8")
                        # The last group zero-fills the rest of its 4-byte word.
                        if group == num_groups - 1:
                            for k in T.serial(3 - group % 4):
                                S[row, group // 4, group % 4 + 1 + k] = T.uint8(0)
                elif owner:
                    S[row, group] = T.reinterpret((e + 127) << 23, "float32") if v.round_sf else c / T.float32(fmt_max)
                for j in T.vectorized(vec):
                    ys[j] = T.cast(T.clamp(T.cast(xs[u, j], "float32") * inv, -fmt_max, fmt_max), "float8_e4m3fn")
                if row < num_tokens and col < hidden:
                    for j in T.vectorized(vec):
                        Y[row, by * cols_per_cta + (tx % THREADS_PER_ROW) * vec + j] = ys[j]

    return per_token_cast_kernel
