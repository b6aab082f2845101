"""mhc_reduce_partials_and_rmsnorm, as TileLang factories (build time only); every size at run time.

Forward: a thread a (token, mix) element: out_mul = the split partials added in split order,
sqrsum likewise (the token's threads each add the same values in the same order), and
out = out_mul * rsqrt(sqrsum / K + eps), rsqrt as 1 / sqrt (fp32, IEEE).
Backward: a thread a token: out_mul_grad[n] = out_grad[n] r, and
sqrsum_grad = (sum over n in order of out_grad[n] out_mul[n]) * (-r^3 / (2 K)).
"""

import tilelang.language as T

from tilebake.mhc.mhc_reduce_partials_and_rmsnorm import MhcReducePartialsAndRmsnormVariant

THREADS = 256
PASS_CONFIGS = {"tl.disable_safe_memory_legalize": True}  # guarded below


def build(v: MhcReducePartialsAndRmsnormVariant):
    return _forward() if v.direction == "fwd" else _backward()


def rms_rstd(sq, group_size, eps):
    return T.ieee_fdiv(T.float32(1), T.ieee_fsqrt(T.ieee_add(T.ieee_fdiv(sq, T.cast(group_size, "float32")), eps)))


def _forward():
    num_tokens = T.dynamic("num_tokens")
    num_mixes = T.dynamic("num_mixes")
    n_splits = T.dynamic("n_splits")

    @T.prim_func
    def mhc_reduce_partials_and_rmsnorm_fwd_kernel(
        PM: T.Tensor((n_splits, num_tokens, num_mixes), "float32"),
        PS: T.Tensor((n_splits, num_tokens), "float32"),
        OM: T.Tensor((num_tokens, num_mixes), "float32"),
        OS: T.Tensor((num_tokens,), "float32"),
        OUT: T.Tensor((num_tokens, num_mixes), "float32"),
        rms_group_size: T.int32,
        rms_eps: T.float32,
    ):
        with T.Kernel(T.ceildiv(num_tokens * num_mixes, THREADS), threads=THREADS) as b:
            tx = T.get_thread_binding(0)
            e = b * THREADS + tx
            t = e // num_mixes
            n = e % num_mixes
            acc = T.alloc_var("float32")
            sq = T.alloc_var("float32")
            if e < num_tokens * num_mixes:
                acc = PM[0, t, n]
                sq = PS[0, t]
                for s in T.serial(n_splits - 1):
                    acc = T.ieee_add(acc, PM[s + 1, t, n])
                    sq = T.ieee_add(sq, PS[s + 1, t])
                OM[t, n] = acc
                if n == 0:
                    OS[t] = sq
                OUT[t, n] = T.ieee_mul(acc, rms_rstd(sq, rms_group_size, rms_eps))

    return mhc_reduce_partials_and_rmsnorm_fwd_kernel


def _backward():
    num_tokens = T.dynamic("num_tokens")
    num_mixes = T.dynamic("num_mixes")

    @T.prim_func
    def mhc_reduce_partials_and_rmsnorm_bwd_kernel(
        OG: T.Tensor((num_tokens, num_mixes), "float32"),
        OM: T.Tensor((num_tokens, num_mixes), "float32"),
        OS: T.Tensor((num_tokens,), "float32"),
        OMG: T.Tensor((num_tokens, num_mixes), "float32"),
        OSG: T.Tensor((num_tokens,), "float32"),
        rms_group_size: T.int32,
        rms_eps: T.float32,
    ):
        with T.Kernel(T.ceildiv(num_tokens, THREADS), threads=THREADS) as b:
            t = b * THREADS + T.get_thread_binding(0)
            r = T.alloc_var("float32")
            dot = T.alloc_var("float32")
            if t < num_tokens:
                r = rms_rstd(OS[t], rms_group_size, rms_eps)
                dot = T.float32(0)
                for n in T.serial(num_mixes):
                    g = OG[t, n]
                    OMG[t, n] = T.ieee_mul(g, r)
                    dot = T.ieee_add(dot, T.ieee_mul(g, OM[t, n]))
                coef = T.ieee_fdiv(T.ieee_mul(T.ieee_mul(r, r), r), T.cast(2 * rms_group_size, "float32"))
                OSG[t] = -T.ieee_mul(dot, coef)

    return mhc_reduce_partials_and_rmsnorm_bwd_kernel
