"""mhc_pre_big_fuse, as a TileLang factory (build time only): m <= MM (4), n_splits, sizes and
scalars at run time.

mhc_pre_apply_mix's forward (kernels_tl/mhc/mhc_pre_apply_mix.py: TOKENS tokens a CTA, a thread
an 8-column vector of each, grid token groups x column blocks) whose CTA first computes its
tokens' mixes, a warp a token, while its residual loads are in flight:
- lane c < m (m + 2) sums mix column c's split partials and the square-sum partials in split
  order and scales by the RMSNorm factor (kernels_tl/mhc/mhc_reduce_partials_and_rmsnorm.py's
  arithmetic), then splits it (kernels_tl/mhc/mhc_pre_split_mixes.py's): pre (to shared memory),
  post, or a raw comb entry;
- lanes 0..MM^2 - 1 take comb element (i, j) (lane i * MM + j, a shuffle from lane 2m + i m + j)
  and run mhc_sinkhorn's forward on it (kernels_tl/mhc/mhc_sinkhorn.py's macros; lanes from MM^2
  a slot of zeros);
- the CTA of column block 0 writes post_mix and comb_mix.
Then a barrier, and the streams mixed with pre. Every step is the single-op kernel's arithmetic,
so the bytes are the chain's (reduce, split, Sinkhorn, pre_apply_mix).
"""

import tilelang.language as T

from kernels_tl.mhc.mhc_pre_apply_mix import mix_store
from kernels_tl.mhc.mhc_pre_split_mixes import sigmoid
from kernels_tl.mhc.mhc_reduce_partials_and_rmsnorm import rms_rstd
from kernels_tl.mhc.mhc_sinkhorn import sinkhorn_ops
from tilebake.mhc._common import VEC
from tilebake.mhc.mhc_pre_big_fuse import MhcPreBigFuseVariant

THREADS = 128
TOKENS = 2  # a CTA's, a warp's mixes each (as mhc_pre_apply_mix's forward: FWD_TOKENS)
PASS_CONFIGS = {"tl.disable_safe_memory_legalize": True}  # whole vectors: the host checks hidden % VEC


def build(v: MhcPreBigFuseVariant):
    MM = v.max_mult
    assert TOKENS <= THREADS // 32 and MM * MM <= 16  # a token's comb in the first half of its warp
    n = T.dynamic("num_tokens")
    m = T.dynamic("mhc_mult")
    m3 = T.dynamic("mix_cols")  # m (m + 2), passed: TileLang cannot bind m from it
    h = T.dynamic("hidden")
    splits = T.dynamic("n_splits")
    sk = sinkhorn_ops(MM, m)

    @T.prim_func
    def mhc_pre_big_fuse_fwd_kernel(
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
        with T.Kernel(T.ceildiv(n, TOKENS), T.ceildiv(h, THREADS * VEC), threads=THREADS) as (tb, b):
            tx = T.get_thread_binding(0)
            T.assume(h % VEC == 0)
            xs = T.alloc_local((TOKENS, MM, VEC), "bfloat16")
            acc = T.alloc_local((VEC,), "float32")
            ys = T.alloc_local((VEC,), "bfloat16")
            pre = T.alloc_shared((TOKENS, MM), "float32")
            xbuf = T.alloc_shared((2, 1), "float32")  # (the Sinkhorn exchanges by shuffles at MM <= 4)
            vec = T.alloc_var("int32")  # as mhc_pre_apply_mix's forward: one 32-bit address term
            vec = b * THREADS + tx
            if vec * VEC < h:  # the residual in flight while the mixes are computed
                for u in T.unroll(TOKENS):
                    if tb * TOKENS + u < n:
                        for i in T.unroll(MM):
                            if i < m:
                                for j in T.vectorized(VEC):
                                    xs[u, i, j] = X[tb * TOKENS + u, i, vec * VEC + j]
            if tx < TOKENS * 32:
                t = T.alloc_var("int32")
                c = T.alloc_var("int32")
                mix = T.alloc_var("float32")
                sq = T.alloc_var("float32")
                y = T.alloc_var("float32")
                x = T.alloc_var("float32")
                a = T.alloc_var("float32")
                p = T.alloc_var("float32")
                par = T.alloc_var("int32")
                t = tb * TOKENS + tx // 32
                c = tx % 32
                y = T.float32(0)
                if t < n and c < m3:
                    mix = PM[0, t, c]
                    sq = PS[0, t]
                    for s in T.serial(splits - 1):
                        mix = T.ieee_add(mix, PM[s + 1, t, c])
                        sq = T.ieee_add(sq, PS[s + 1, t])
                    mix = T.ieee_mul(mix, rms_rstd(sq, rms_group_size, rms_eps))
                    sc = T.if_then_else(c < m, SCALE[0], T.if_then_else(c < 2 * m, SCALE[1], SCALE[2]))
                    y = T.ieee_add(T.ieee_mul(mix, sc), BASE[c])
                    if c < 2 * m:
                        sg = sigmoid(y)
                        if c < m:
                            pre[tx // 32, c] = T.ieee_add(sg, pre_eps)
                        elif b == 0:
                            POST[t, c - m] = T.ieee_mul(sg, post_mult)
                # comb element (i, j) of lane i * MM + j: the raw entry from lane 2m + i m + j
                i = c // MM
                j = c % MM
                inside = c < MM * MM and i < m and j < m
                x = T.shfl_sync(y, T.if_then_else(inside, 2 * m + i * m + j, 0))  # every lane: converged
                x = T.if_then_else(inside, x, T.float32(0))
                par = 0
                sk.softmax(x, eps, a, p, tx, xbuf, par)
                sk.normalize(a, repeat, eps, tx, xbuf, par)
                if b == 0 and t < n and inside:
                    COMB[t, i * m + j] = a
            T.sync_threads()
            if vec * VEC < h:
                for u in T.unroll(TOKENS):
                    if tb * TOKENS + u < n:
                        mix_store(O, tb * TOKENS + u, vec, pre, u, xs, u, m, MM, acc, ys)

    return mhc_pre_big_fuse_fwd_kernel
