"""mhc_pre_big_fuse's kernel, as a TileLang factory (build time only): m <= MM (4), n_splits,
sizes and scalars at run time. One launch; a CTA takes TOKENS tokens whole (all their columns):
1. warp w < TOKENS, token w of the CTA's: lane c < m (m + 2) sums mix column c's split partials
   and the square-sum partials in split order and scales by the RMSNorm factor
   (kernels_tl/mhc/mhc_reduce_partials_and_rmsnorm.py's arithmetic), then splits it
   (kernels_tl/mhc/mhc_pre_split_mixes.py's): pre into shared memory, post_mix out, a raw comb
   entry kept in the lane's register;
2. the CTA mixes its tokens' streams with pre (mhc_pre_apply_mix's forward arithmetic), a thread an
   8-column vector of every token, the CTA stepping over the columns;
3. each warp's lanes 0..MM^2 - 1 take comb element (i, j) (lane i * MM + j, a shuffle from lane
   2m + i m + j) and run mhc_sinkhorn's forward on it (kernels_tl/mhc/mhc_sinkhorn.py's macros).
Each step is the single-op kernel's arithmetic, so the bytes are the chain's (reduce, split,
Sinkhorn, pre_apply_mix). The Sinkhorn comes last: no one waits for it, other CTAs' streams hide
it. (The mixes recomputed by every column block's CTA of the apply kernel took 182 us against 156
for the chain at 8192 x 4 x 7168, H200 session 13: each CTA's work was too small to hide them.)
"""

import dataclasses

import tilelang.language as T

from kernels_tl.mhc.mhc_pre_apply_mix import vector_mixer
from kernels_tl.mhc.mhc_pre_split_mixes import scaled, sigmoid
from kernels_tl.mhc.mhc_reduce_partials_and_rmsnorm import rms_rstd
from kernels_tl.mhc.mhc_sinkhorn import sinkhorn_ops
from tilebake.mhc._common import VEC
from tilebake.mhc.mhc_pre_big_fuse import MhcPreBigFuseVariant

PASS_CONFIGS = {"tl.disable_safe_memory_legalize": True}  # whole vectors: the host checks hidden % VEC


@dataclasses.dataclass(frozen=True)
class LaunchConfig:
    threads: int = 128  # a CTA's; its warps compute the mixes, a token each
    tokens: int = 4  # a CTA's (<= its warps), all their vectors' loads in flight at once


DEFAULT_CONFIG = LaunchConfig()


def candidate_configs():
    """The search space bench/tune.py times on a GPU."""
    return [LaunchConfig(t, k) for t in (64, 128, 256) for k in (1, 2, 4) if k <= t // 32]


def build(v: MhcPreBigFuseVariant, cfg: LaunchConfig = None):
    cfg = cfg or DEFAULT_CONFIG
    MM, THREADS, TOKENS = v.max_mult, cfg.threads, cfg.tokens
    assert MM * MM <= 16 and TOKENS <= THREADS // 32  # a token's comb in the first half of its warp
    n = T.dynamic("num_tokens")
    m = T.dynamic("mhc_mult")
    h = T.dynamic("hidden")
    m3 = T.dynamic("mix_cols")  # m (m + 2), passed: TileLang cannot bind m from it
    splits = T.dynamic("n_splits")
    sk = sinkhorn_ops(MM, m)
    mix_streams = vector_mixer(n, m, h, TOKENS, MM, False)

    @T.prim_func
    def mhc_pre_big_fuse_kernel(
        PM: T.Tensor((splits, n, m3), "float32"),
        PS: T.Tensor((splits, n), "float32"),
        SCALE: T.Tensor((3,), "float32"),
        BASE: T.Tensor((m3,), "float32"),
        X: T.Tensor((n, m, h), "bfloat16"),
        POST: T.Tensor((n, m), "float32"),
        COMB: T.Tensor((n, m * m), "float32"),
        O: T.Tensor((n, h), "bfloat16"),
        rms_group_size: T.int32,
        rms_eps: T.float32,
        pre_eps: T.float32,
        eps: T.float32,  # the Sinkhorn's (the name its macros give it)
        post_mult: T.float32,
        repeat: T.int32,
    ):
        with T.Kernel(T.ceildiv(n, TOKENS), threads=THREADS) as tb:
            tx = T.get_thread_binding(0)
            T.assume(h % VEC == 0)
            pre = T.alloc_shared((TOKENS, MM), "float32")
            xbuf = T.alloc_shared((2, 1), "float32")  # (the Sinkhorn exchanges by shuffles at MM <= 4)
            xs = T.alloc_local((TOKENS, MM, VEC), "bfloat16")
            acc = T.alloc_local((VEC,), "float32")
            ys = T.alloc_local((VEC,), "bfloat16")
            t = T.alloc_var("int32")
            c = T.alloc_var("int32")
            vec = T.alloc_var("int32")  # a variable: 32-bit address terms (kernels_tl/mhc/mhc_pre_apply_mix.py)
            mix = T.alloc_var("float32")
            sq = T.alloc_var("float32")
            y = T.alloc_var("float32")
            x = T.alloc_var("float32")
            a = T.alloc_var("float32")
            p = T.alloc_var("float32")
            par = T.alloc_var("int32")
            # 1. the mixes of token tx // 32 (warps past TOKENS idle)
            t = tb * TOKENS + tx // 32
            c = tx % 32
            y = T.float32(0)
            if tx // 32 < TOKENS and t < n and c < m3:
                mix = PM[0, t, c]
                sq = PS[0, t]
                for s in T.serial(splits - 1):
                    mix = T.ieee_add(mix, PM[s + 1, t, c])
                    sq = T.ieee_add(sq, PS[s + 1, t])
                mix = T.ieee_mul(mix, rms_rstd(sq, rms_group_size, rms_eps))
                y = scaled(mix, c, m, SCALE, BASE)
                if c < 2 * m:
                    sg = sigmoid(y)
                    if c < m:
                        pre[tx // 32, c] = T.ieee_add(sg, pre_eps)
                    else:
                        POST[t, c - m] = T.ieee_mul(sg, post_mult)
            T.sync_threads()
            # 2. the streams mixed, o = pre[0] x[0] + pre[1] x[1] + ... in order, one bf16 rounding
            for k in T.serial(T.ceildiv(h, THREADS * VEC)):
                vec = k * THREADS + tx
                mix_streams(X, O, tb * TOKENS, vec, xs, acc, ys, pre)
            # 3. comb element (i, j) of lane i * MM + j: the raw entry from lane 2m + i m + j
            i = c // MM
            j = c % MM
            inside = c < MM * MM and i < m and j < m
            x = T.shfl_sync(y, T.if_then_else(inside, 2 * m + i * m + j, 0))  # every lane: converged
            x = T.if_then_else(inside, x, T.float32(0))
            par = 0
            sk.softmax(x, eps, a, p, tx, xbuf, par)
            sk.normalize(a, repeat, eps, tx, xbuf, par)
            if tx // 32 < TOKENS and t < n and inside:
                COMB[t, i * m + j] = a

    return mhc_pre_big_fuse_kernel
