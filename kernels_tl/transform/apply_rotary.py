"""apply_rotary: in-place rotary position embedding of query (and key), as a TileLang factory.

Build time only: `build(variant)` returns the PrimFunc that build_tools/aot.py lowers.

Layout: query Q and key K are (batch, seqlen, heads, rot) with runtime strides (the last dim
contiguous); a [T, H, rot] input is batch 1. The cache C is fp32 (rows, rot) = [cos | sin].
Positions come as int32 P32 or int64 P64 (batch, seqlen), or not at all (the sequence index):
`pos_kind` (0 none, 1 int32, 2 int64) picks, the other buffer is a dummy pointer.

Arithmetic per pair (x1, x2), in fp32, cos/sin from cache row r (sin negated when conjugate,
which is exact):
    out1 = fma(x1, cos, -(x2 * sin))    out2 = fma(x2, cos, x1 * sin)
the products rounded to fp32 (__fmul_rn, which nvcc never contracts), each fma rounded once
(__fmaf_rn), then cast to the input dtype (round to nearest even). tilebake.torch.rope computes
exactly this. A token whose row r = position + seqlen_offset (64-bit) is outside
[0, cache rows) is skipped: its query and key are left as they were.

Thread mapping (LaunchConfig): one warp per token, 4 tokens per 128-thread CTA by default. A pair's two elements are
in the same thread: NeoX pairs i and half + i, so lane l loads the 16-byte vectors at l * vec
and half + l * vec; interleaved pairs 2i and 2i + 1, so lane l loads the two vectors at
2 * l * vec (and + vec). Either way lane l needs cos/sin [l * vec, l * vec + vec), loaded once
per token. The L = half / vec lanes of a head times HG = 32 / L head groups fill the warp;
head group g rotates heads g, g + HG, ..., `unroll` heads' loads in flight at once; query heads
first, then key heads (k_heads = 0 without a key).
"""

import dataclasses

import tilelang.language as T

from kernels_tl.quant.common import TL_DTYPES
from tilebake.transform.apply_rotary import ApplyRotaryVariant

PASS_CONFIGS = {"tl.disable_safe_memory_legalize": True}  # every access is guarded per vector


@dataclasses.dataclass(frozen=True)
class LaunchConfig:
    tokens_per_cta: int = 4  # a warp per token: 32 * tokens_per_cta threads
    unroll: int = 4  # heads a thread loads before it computes and stores


# Untuned (no GPU here): 80 registers (bf16) / 62 (fp32), no spills on sm_90a.
DEFAULT_CONFIG = LaunchConfig()


def candidate_configs():
    """A search space for a launch-config sweep on a GPU."""
    return [LaunchConfig(t, u) for t in (2, 4, 8) for u in (2, 4, 8)]


def rotate_pair(x1, x2, c, s):
    """(x1 cos - x2 sin, x2 cos + x1 sin), each an fma of one rounded product."""
    return T.ieee_fmaf(x1, c, -T.ieee_mul(x2, s)), T.ieee_fmaf(x2, c, T.ieee_mul(x1, s))


def build(v: ApplyRotaryVariant, cfg: LaunchConfig = DEFAULT_CONFIG):
    TOKENS_PER_CTA, UNROLL = cfg.tokens_per_cta, cfg.unroll
    THREADS = 32 * TOKENS_PER_CTA
    dtype = TL_DTYPES[v.dtype]
    rot = v.rot_dim
    half = rot // 2
    vec = 16 // (2 if v.dtype == "bf16" else 4)  # elements in a 16-byte vector
    lanes = half // vec  # threads per head
    groups = 32 // lanes  # head groups per token (per warp)
    assert lanes * groups == 32, v

    batch = T.dynamic("batch")
    seqlen = T.dynamic("seqlen")
    q_heads = T.dynamic("q_heads")
    k_heads = T.dynamic("k_heads")
    cache_rows = T.dynamic("cache_rows")
    q_bs, q_ss, q_hs = T.dynamic("q_batch_stride"), T.dynamic("q_token_stride"), T.dynamic("q_head_stride")
    k_bs, k_ss, k_hs = T.dynamic("k_batch_stride"), T.dynamic("k_token_stride"), T.dynamic("k_head_stride")
    c_rs = T.dynamic("cache_stride")
    p_bs, p_ss = T.dynamic("pos_batch_stride"), T.dynamic("pos_token_stride")

    def heads_of(key: bool):
        # A call, not a name bound in the macro (or a macro argument): either renames the dim.
        return k_heads if key else q_heads

    @T.macro
    def rotate_heads(X, bi, si, lane, group, cs, sn, xa, xb, key: bool, interleaved: bool):
        """Rotate heads group, group + HG, ... of token (bi, si) of X (Q, or K when key), lane's pairs."""
        for k in T.serial(T.ceildiv(heads_of(key), groups * UNROLL)):
            for u in T.unroll(UNROLL):
                if (k * UNROLL + u) * groups + group < heads_of(key):
                    if interleaved:
                        for j in T.vectorized(vec):
                            xa[u, j] = X[bi, si, (k * UNROLL + u) * groups + group, lane * (2 * vec) + j]
                        for j in T.vectorized(vec):
                            xb[u, j] = X[bi, si, (k * UNROLL + u) * groups + group, lane * (2 * vec) + vec + j]
                    else:
                        for j in T.vectorized(vec):
                            xa[u, j] = X[bi, si, (k * UNROLL + u) * groups + group, lane * vec + j]
                        for j in T.vectorized(vec):
                            xb[u, j] = X[bi, si, (k * UNROLL + u) * groups + group, half + lane * vec + j]
            for u in T.unroll(UNROLL):
                if (k * UNROLL + u) * groups + group < heads_of(key):
                    if interleaved:
                        # xa holds pairs l*vec + m, xb pairs l*vec + vec/2 + m (m < vec/2).
                        for m in T.unroll(vec // 2):
                            o1, o2 = rotate_pair(
                                T.cast(xa[u, 2 * m], "float32"), T.cast(xa[u, 2 * m + 1], "float32"), cs[m], sn[m]
                            )
                            xa[u, 2 * m] = T.cast(o1, dtype)
                            xa[u, 2 * m + 1] = T.cast(o2, dtype)
                        for m in T.unroll(vec // 2):
                            o1, o2 = rotate_pair(
                                T.cast(xb[u, 2 * m], "float32"),
                                T.cast(xb[u, 2 * m + 1], "float32"),
                                cs[vec // 2 + m],
                                sn[vec // 2 + m],
                            )
                            xb[u, 2 * m] = T.cast(o1, dtype)
                            xb[u, 2 * m + 1] = T.cast(o2, dtype)
                        for j in T.vectorized(vec):
                            X[bi, si, (k * UNROLL + u) * groups + group, lane * (2 * vec) + j] = xa[u, j]
                        for j in T.vectorized(vec):
                            X[bi, si, (k * UNROLL + u) * groups + group, lane * (2 * vec) + vec + j] = xb[u, j]
                    else:
                        for j in T.unroll(vec):
                            o1, o2 = rotate_pair(T.cast(xa[u, j], "float32"), T.cast(xb[u, j], "float32"), cs[j], sn[j])
                            xa[u, j] = T.cast(o1, dtype)
                            xb[u, j] = T.cast(o2, dtype)
                        for j in T.vectorized(vec):
                            X[bi, si, (k * UNROLL + u) * groups + group, lane * vec + j] = xa[u, j]
                        for j in T.vectorized(vec):
                            X[bi, si, (k * UNROLL + u) * groups + group, half + lane * vec + j] = xb[u, j]

    @T.prim_func
    def apply_rotary_kernel(
        Q: T.StridedTensor((batch, seqlen, q_heads, rot), (q_bs, q_ss, q_hs, 1), dtype),
        K: T.StridedTensor((batch, seqlen, k_heads, rot), (k_bs, k_ss, k_hs, 1), dtype),
        C: T.StridedTensor((cache_rows, rot), (c_rs, 1), "float32"),
        P32: T.StridedTensor((batch, seqlen), (p_bs, p_ss), "int32"),
        P64: T.StridedTensor((batch, seqlen), (p_bs, p_ss), "int64"),
        pos_kind: T.int32,
        seqlen_offset: T.int64,
        interleaved: T.int32,
        conjugate: T.int32,
    ):
        with T.Kernel(T.ceildiv(batch * seqlen, TOKENS_PER_CTA), threads=THREADS) as b:
            # The host checks these (16-byte aligned rows of Q, K and C): whole-vector accesses.
            T.assume(q_bs % vec == 0)
            T.assume(q_ss % vec == 0)
            T.assume(q_hs % vec == 0)
            T.assume(k_bs % vec == 0)
            T.assume(k_ss % vec == 0)
            T.assume(k_hs % vec == 0)
            T.assume(c_rs % 4 == 0)
            tx = T.get_thread_binding(0)
            # Registers, so the divisions run once per thread (not in every index).
            token = T.alloc_var("int32")
            bi = T.alloc_var("int32")
            si = T.alloc_var("int32")
            lane = T.alloc_var("int32")
            group = T.alloc_var("int32")
            row = T.alloc_var("int64")
            token = b * TOKENS_PER_CTA + tx // 32
            bi = token // seqlen
            si = token % seqlen
            lane = tx % lanes
            group = (tx % 32) // lanes
            cs = T.alloc_local((vec,), "float32")
            sn = T.alloc_local((vec,), "float32")
            xa = T.alloc_local((UNROLL, vec), dtype)
            xb = T.alloc_local((UNROLL, vec), dtype)
            if token < batch * seqlen:
                if pos_kind == 1:
                    row = T.cast(P32[bi, si], "int64") + seqlen_offset
                elif pos_kind == 2:
                    row = P64[bi, si] + seqlen_offset
                else:
                    row = T.cast(si, "int64") + seqlen_offset
                # Out of the cache: the token is skipped (left as it was), never read out of bounds.
                if row >= 0 and row < T.cast(cache_rows, "int64"):
                    for j in T.vectorized(vec):
                        cs[j] = C[row, lane * vec + j]
                    for j in T.vectorized(vec):
                        sn[j] = C[row, half + lane * vec + j]
                    if conjugate != 0:
                        for j in T.unroll(vec):
                            sn[j] = -sn[j]
                    if interleaved != 0:
                        rotate_heads(Q, bi, si, lane, group, cs, sn, xa, xb, False, True)
                        rotate_heads(K, bi, si, lane, group, cs, sn, xa, xb, True, True)
                    else:
                        rotate_heads(Q, bi, si, lane, group, cs, sn, xa, xb, False, False)
                        rotate_heads(K, bi, si, lane, group, cs, sn, xa, xb, True, False)

    return apply_rotary_kernel
