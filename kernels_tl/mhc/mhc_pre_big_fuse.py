"""mhc_pre_big_fuse's mix kernel, as a TileLang factory (build time only): m <= MM (4), n_splits,
sizes and scalars at run time. A warp a token (WARPS tokens a CTA):
- lane c < m (m + 2) sums mix column c's split partials and the square-sum partials in split
  order and scales by the RMSNorm factor (kernels_tl/mhc/mhc_reduce_partials_and_rmsnorm.py's
  arithmetic), then splits it (kernels_tl/mhc/mhc_pre_split_mixes.py's) into pre, post or a raw
  comb entry;
- lanes 0..MM^2 - 1 take comb element (i, j) (lane i * MM + j, a shuffle from lane 2m + i m + j)
  and run mhc_sinkhorn's forward on it (kernels_tl/mhc/mhc_sinkhorn.py's macros; lanes from MM^2
  a slot of zeros).
It writes pre, post_mix and comb_mix; mhc_pre_apply_mix's forward kernel then mixes the streams
with pre. Each step is the single-op kernel's arithmetic, so the bytes are the chain's (reduce,
split, Sinkhorn, pre_apply_mix). The mixes computed in the mixing kernel's CTAs instead (every
column block's, before its stores) made it 182 us against 156 for the chain at 8192 x 4 x 7168
(H200 session 13): the mixes' serial latency held up the streaming.
"""

import tilelang.language as T

from kernels_tl.mhc.mhc_pre_split_mixes import scaled, sigmoid
from kernels_tl.mhc.mhc_reduce_partials_and_rmsnorm import rms_rstd
from kernels_tl.mhc.mhc_sinkhorn import sinkhorn_ops
from tilebake.mhc.mhc_pre_big_fuse import MhcPreBigFuseVariant

WARPS = 4  # tokens a CTA, a warp each


def build(v: MhcPreBigFuseVariant):
    MM = v.max_mult
    assert MM * MM <= 16  # a token's comb in the first half of its warp
    n = T.dynamic("num_tokens")
    m = T.dynamic("mhc_mult")
    m3 = T.dynamic("mix_cols")  # m (m + 2), passed: TileLang cannot bind m from it
    splits = T.dynamic("n_splits")
    sk = sinkhorn_ops(MM, m)

    @T.prim_func
    def mhc_pre_big_fuse_mix_kernel(
        PM: T.Tensor((splits, n, m3), "float32"),
        PS: T.Tensor((splits, n), "float32"),
        SCALE: T.Tensor((3,), "float32"),
        BASE: T.Tensor((m3,), "float32"),
        PRE: T.Tensor((n, m), "float32"),
        POST: T.Tensor((n, m), "float32"),
        COMB: T.Tensor((n, m * m), "float32"),
        rms_group_size: T.int32,
        rms_eps: T.float32,
        pre_eps: T.float32,
        eps: T.float32,  # the Sinkhorn's (the name its macros give it)
        post_mult: T.float32,
        repeat: T.int32,
    ):
        with T.Kernel(T.ceildiv(n, WARPS), threads=WARPS * 32) as tb:
            tx = T.get_thread_binding(0)
            xbuf = T.alloc_shared((2, 1), "float32")  # (the Sinkhorn exchanges by shuffles at MM <= 4)
            t = T.alloc_var("int32")
            c = T.alloc_var("int32")
            mix = T.alloc_var("float32")
            sq = T.alloc_var("float32")
            y = T.alloc_var("float32")
            x = T.alloc_var("float32")
            a = T.alloc_var("float32")
            p = T.alloc_var("float32")
            par = T.alloc_var("int32")
            t = tb * WARPS + tx // 32
            c = tx % 32
            y = T.float32(0)
            if t < n and c < m3:
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
                        PRE[t, c] = T.ieee_add(sg, pre_eps)
                    else:
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
            if t < n and inside:
                COMB[t, i * m + j] = a

    return mhc_pre_big_fuse_mix_kernel
