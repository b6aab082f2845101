"""mhc_reduce_partials_and_rmsnorm_fwd / _bwd for Ascend 950 (build time only), read from
tilebake.mhc.mhc_reduce_partials_and_rmsnorm.MhcReducePartialsAndRmsnormAscendVariant (every
size at run time). One RMS group a token; K = rms_group_size, r = 1 / sqrt(sqrsum / K + eps).

fwd: a SIMT thread a (token, mix) element, on GM: out_mul = the split partials added in split
order from split 0, sqrsum likewise (the token's threads each add the same values in the same
order; the mix-0 thread stores it), out = out_mul * r. A block per vector core, each taking the
steps core, core + num_vec_cores, ... of THREADS elements.
bwd: a SIMT thread a token, on GM: out_mul_grad[n] = out_grad[n] * r and sqrsum_grad =
-(dot * (r r r / (2 K))), dot the sum over n in order, from 0, of out_grad[n] * out_mul[n]. A
block per vector core, each taking the steps core, core + num_vec_cores, ... of THREADS tokens.
Each product, sum, quotient and square root is a rounded fp32 operation of its own: the CPU
path's order and bits. Built and lowered here, never run on an NPU: checked on the CPU by
tests/ascend/test_emulated_mhc.py.
"""

import tilelang.ascend.language as T

from kernels_tl.ascend.mhc.common import THREADS
from tilebake.mhc.mhc_reduce_partials_and_rmsnorm import MhcReducePartialsAndRmsnormAscendVariant


def build(v: MhcReducePartialsAndRmsnormAscendVariant):
    return _forward(v.num_vec_cores) if v.direction == "fwd" else _backward(v.num_vec_cores)


def _rstd(sq, group_size, eps):
    return T.float32(1) / T.sqrt(sq / T.cast(group_size, "float32") + eps)


def _forward(CORES):
    n = T.dynamic("num_tokens")
    mixes = T.dynamic("num_mixes")
    splits = T.dynamic("n_splits")

    @T.prim_func
    def mhc_reduce_partials_and_rmsnorm_fwd_kernel(
        PM: T.Tensor((splits, n, mixes), "float32"),
        PS: T.Tensor((splits, n), "float32"),
        OM: T.Tensor((n, mixes), "float32"),
        OS: T.Tensor((n,), "float32"),
        OUT: T.Tensor((n, mixes), "float32"),
        rms_group_size: T.int32,
        rms_eps: T.float32,
    ):
        with T.Kernel(CORES) as core:
            for r in T.serial(T.ceildiv(T.ceildiv(n * mixes, THREADS) - core, CORES)):
                with T.SimtVF(threads=THREADS):
                    i = (core + r * CORES) * THREADS + T.get_thread_binding()
                    acc = T.alloc_var("float32")
                    sq = T.alloc_var("float32")
                    if i < n * mixes:
                        t = i // mixes
                        c = i % mixes
                        acc = PM[0, t, c]
                        sq = PS[0, t]
                        for s in T.serial(splits - 1):
                            acc = acc + PM[s + 1, t, c]
                            sq = sq + PS[s + 1, t]
                        OM[t, c] = acc
                        if c == 0:
                            OS[t] = sq
                        OUT[t, c] = acc * _rstd(sq, rms_group_size, rms_eps)

    return mhc_reduce_partials_and_rmsnorm_fwd_kernel


def _backward(CORES):
    n = T.dynamic("num_tokens")
    mixes = T.dynamic("num_mixes")

    @T.prim_func
    def mhc_reduce_partials_and_rmsnorm_bwd_kernel(
        OG: T.Tensor((n, mixes), "float32"),
        OM: T.Tensor((n, mixes), "float32"),
        OS: T.Tensor((n,), "float32"),
        OMG: T.Tensor((n, mixes), "float32"),
        OSG: T.Tensor((n,), "float32"),
        rms_group_size: T.int32,
        rms_eps: T.float32,
    ):
        with T.Kernel(CORES) as core:
            for r in T.serial(T.ceildiv(T.ceildiv(n, THREADS) - core, CORES)):
                with T.SimtVF(threads=THREADS):
                    t = (core + r * CORES) * THREADS + T.get_thread_binding()
                    rs = T.alloc_var("float32")
                    dot = T.alloc_var("float32")
                    prod = T.alloc_var("float32")
                    coef = T.alloc_var("float32")
                    if t < n:
                        rs = _rstd(OS[t], rms_group_size, rms_eps)
                        dot = T.float32(0)
                        for c in T.serial(mixes):
                            OMG[t, c] = OG[t, c] * rs
                            prod = OG[t, c] * OM[t, c]
                            dot = dot + prod
                        coef = rs * rs
                        coef = coef * rs
                        coef = coef / (T.cast(rms_group_size, "float32") * T.float32(2))  # 2 K, exact
                        OSG[t] = -(dot * coef)

    return mhc_reduce_partials_and_rmsnorm_bwd_kernel
