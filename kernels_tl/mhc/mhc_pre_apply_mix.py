"""mhc_pre_apply_mix, as TileLang factories (build time only); m (<= MAX_M) and every size at run
time.

Forward: a thread an 8-column vector of FWD_TOKENS tokens (grid: token groups x column blocks), all
their loads issued first; o = mix[0] x[0],
then + mix[i] x[i] for i in order (fp32, each product and sum rounded on its own), rounded to
bf16 once: tilebake.torch.mhc.mhc_pre_apply_mix_ref's arithmetic.
Backward: a CTA a token, its threads (the variant's) over the columns: x_grad[i] = bf16(x_grad[i] + mix[i] o_grad)
(has_x_grad), and each thread sums o_grad . x[i] over its columns; a butterfly in each warp and
the warps' sums in warp order give mix_grad[i] (a fixed order: two runs give the same bits).
"""

import dataclasses

import tilelang.language as T

from tilebake.mhc._common import MAX_MHC_MULT, VEC
from tilebake.mhc.mhc_pre_apply_mix import MhcPreApplyMixVariant

PASS_CONFIGS = {"tl.disable_safe_memory_legalize": True}  # whole vectors: the host checks hidden % VEC


@dataclasses.dataclass(frozen=True)
class LaunchConfig:
    threads: int = 128  # a CTA's (forward: over a column block; backward: over a token's columns)
    # The forward's tokens a thread, all their loads in flight at once (H200 session 12, 8192 x 4 x
    # 7168: 2 tokens 141.5 us against 149.4-150.5 for one, a CTA's work too small for the block
    # scheduler to keep DRAM busy)
    # (session 18: threads 64 to 896 with 1, 2 or 4 tokens all took 140.9-146.6 us)
    tokens: int = 2
    max_m: int = MAX_MHC_MULT  # the streams the register arrays hold
    # the forward's grid: token groups x column blocks (False), or token groups only, a CTA
    # stepping over the columns (True; kernels_tl/mhc/mhc_pre_big_fuse.py's streaming)
    column_loop: bool = False


DEFAULT_CONFIG = LaunchConfig()


def candidate_configs():
    """The search space bench/tune.py times on a GPU (the backward: those of one token a thread)."""
    return ([LaunchConfig(128, 2, 8), LaunchConfig(128, 1, 8), LaunchConfig(448, 1, 4), LaunchConfig(896, 1, 4),
             LaunchConfig(1024, 1, 4)]
            + [LaunchConfig(t, k, 4) for t in (64, 128, 224, 256) for k in (1, 2, 4)]
            + [LaunchConfig(t, k, mm, True) for t in (128, 256) for k, mm in ((2, 8), (2, 4), (4, 4))])  # fmt: skip


def build(v: MhcPreApplyMixVariant, cfg: LaunchConfig = None):
    """The variant's kernel (its threads and register streams), or bench/tune.py's candidate cfg."""
    cfg = cfg or dataclasses.replace(DEFAULT_CONFIG, threads=v.threads, max_m=v.max_mult, column_loop=v.column_loop)
    if v.direction == "fwd":
        return _forward(cfg.threads, cfg.tokens, cfg.max_m, cfg.column_loop)
    return _backward(cfg.threads, cfg.max_m)


def vector_mixer(n, m, h, TOKENS, MAX_M, W_BY_TOKEN: bool):
    """A macro: o[t0 + u, vec's 8 columns] = w[0] x[0] + w[1] x[1] + ... (fp32, each product and sum
    rounded on its own, streams in order, one bf16 rounding) for the TOKENS tokens from t0 (those
    below n), every vector's load issued first (one DRAM latency); w = W[t, i] (W_BY_TOKEN: the
    tokens' mixes, (n, m)) or W[u, i] (a CTA's (TOKENS, m) copy). Also mhc_pre_big_fuse's."""

    @T.macro
    def mix(X, O, t0, vec, xs, acc, ys, W):
        if vec * VEC < h:
            for u in T.unroll(TOKENS):  # every vector in flight at once: one DRAM latency
                if t0 + u < n:
                    for i in T.unroll(MAX_M):
                        if i < m:
                            for j in T.vectorized(VEC):
                                xs[u, i, j] = X[t0 + u, i, vec * VEC + j]
            for u in T.unroll(TOKENS):
                t = t0 + u
                if t < n:
                    for j in T.unroll(VEC):
                        acc[j] = T.ieee_mul(W[t if W_BY_TOKEN else u, 0], T.cast(xs[u, 0, j], "float32"))
                    for i in T.unroll(MAX_M - 1):
                        if i + 1 < m:
                            w = W[t if W_BY_TOKEN else u, i + 1]
                            for j in T.unroll(VEC):
                                acc[j] = T.ieee_add(acc[j], T.ieee_mul(w, T.cast(xs[u, i + 1, j], "float32")))
                    for j in T.unroll(VEC):
                        ys[j] = T.cast(acc[j], "bfloat16")
                    for j in T.vectorized(VEC):
                        O[t, vec * VEC + j] = ys[j]

    return mix


def _forward(THREADS, FWD_TOKENS, MAX_M, COLUMN_LOOP=False):
    n = T.dynamic("num_tokens")
    m = T.dynamic("mhc_mult")
    h = T.dynamic("hidden")
    COLUMN_BLOCKS = 1 if COLUMN_LOOP else T.ceildiv(h, THREADS * VEC)  # the grid's
    STEPS = T.ceildiv(h, THREADS * VEC) if COLUMN_LOOP else 1  # a CTA's
    mix = vector_mixer(n, m, h, FWD_TOKENS, MAX_M, True)

    @T.prim_func
    def mhc_pre_apply_mix_fwd_kernel(
        X: T.Tensor((n, m, h), "bfloat16"),
        MIX: T.Tensor((n, m), "float32"),
        O: T.Tensor((n, h), "bfloat16"),
    ):
        # token groups x column blocks, token-major (a one-dimensional grid with a group's column
        # blocks adjacent was slower: 152.8-153.9 us against 140.9, session 12 call 3)
        with T.Kernel(T.ceildiv(n, FWD_TOKENS), COLUMN_BLOCKS, threads=THREADS) as (tb, b):
            tx = T.get_thread_binding(0)
            T.assume(h % VEC == 0)
            xs = T.alloc_local((FWD_TOKENS, MAX_M, VEC), "bfloat16")
            acc = T.alloc_local((VEC,), "float32")
            ys = T.alloc_local((VEC,), "bfloat16")
            # the thread's vector, a variable: vec * VEC + j then stays one 32-bit term of the
            # addresses (from (b * THREADS + tx) * VEC, TileLang widens each term to 64 bits and nvcc
            # splits the 16-byte store into four 4-byte ones)
            vec = T.alloc_var("int32")
            for k in T.serial(STEPS):
                vec = (b + k) * THREADS + tx
                mix(X, O, tb * FWD_TOKENS, vec, xs, acc, ys, MIX)

    return mhc_pre_apply_mix_fwd_kernel


def _backward(THREADS, MAX_M):
    WARPS = THREADS // 32
    n = T.dynamic("num_tokens")
    m = T.dynamic("mhc_mult")
    h = T.dynamic("hidden")

    @T.prim_func
    def mhc_pre_apply_mix_bwd_kernel(
        OG: T.Tensor((n, h), "bfloat16"),
        X: T.Tensor((n, m, h), "bfloat16"),
        MIX: T.Tensor((n, m), "float32"),
        XG: T.Tensor((n, m, h), "bfloat16"),
        MG: T.Tensor((n, m), "float32"),
        has_x_grad: T.int32,
    ):
        with T.Kernel(n, threads=THREADS) as t:
            tx = T.get_thread_binding(0)
            T.assume(h % VEC == 0)
            gs = T.alloc_local((VEC,), "bfloat16")
            xs = T.alloc_local((MAX_M, VEC), "bfloat16")
            xg = T.alloc_local((MAX_M, VEC), "bfloat16")
            ys = T.alloc_local((VEC,), "bfloat16")
            part = T.alloc_local((MAX_M,), "float32")
            red = T.alloc_shared((WARPS, MAX_M), "float32")
            for i in T.unroll(MAX_M):
                part[i] = T.float32(0)
            for p in T.serial(T.ceildiv(h, THREADS * VEC)):
                c = (p * THREADS + tx) * VEC
                if c < h:
                    for j in T.vectorized(VEC):
                        gs[j] = OG[t, c + j]
                    for i in T.unroll(MAX_M):  # every load of the step before any use: one DRAM latency a step
                        if i < m:
                            for j in T.vectorized(VEC):
                                xs[i, j] = X[t, i, c + j]
                            if has_x_grad != 0:
                                for j in T.vectorized(VEC):
                                    xg[i, j] = XG[t, i, c + j]
                    for i in T.unroll(MAX_M):
                        if i < m:
                            for j in T.unroll(VEC):
                                part[i] = part[i] + T.cast(gs[j], "float32") * T.cast(xs[i, j], "float32")
                            if has_x_grad != 0:
                                w = MIX[t, i]
                                for j in T.unroll(VEC):
                                    ys[j] = T.cast(
                                        T.ieee_add(T.cast(xg[i, j], "float32"), T.ieee_mul(w, T.cast(gs[j], "float32"))),
                                        "bfloat16",
                                    )  # fmt: skip
                                for j in T.vectorized(VEC):
                                    XG[t, i, c + j] = ys[j]
            # The token's sums: a butterfly in each warp, then the warps' sums in warp order.
            for i in T.unroll(MAX_M):
                if i < m:
                    for s in T.unroll(5):
                        part[i] = part[i] + T.shfl_xor(part[i], 16 >> s)
                    if tx % 32 == 0:
                        red[tx // 32, i] = part[i]
            T.sync_threads()
            if tx < m:
                total = T.alloc_var("float32")
                total = red[0, tx]
                for w in T.unroll(WARPS - 1):
                    total = total + red[w + 1, tx]
                MG[t, tx] = total

    return mhc_pre_apply_mix_bwd_kernel
