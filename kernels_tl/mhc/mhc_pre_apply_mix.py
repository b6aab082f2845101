"""mhc_pre_apply_mix, as TileLang factories (build time only); m (<= MAX_M) and every size at run
time.

Forward: a thread VPT 8-column vectors of the flattened (tokens x hidden / 8) vectors, every
stream's loaded before any use; o = mix[0] x[0],
then + mix[i] x[i] for i in order (fp32, each product and sum rounded on its own), rounded to
bf16 once: tilebake.torch.mhc.mhc_pre_apply_mix_ref's arithmetic.
Backward: a warp a token (WARPS tokens a CTA), its lanes over the columns, each step's loads
issued before any use: x_grad[i] = bf16(x_grad[i] + mix[i] o_grad) (has_x_grad), and each lane
sums o_grad . x[i] over its columns; a butterfly in the warp gives mix_grad[i] (a fixed order:
two runs give the same bits; no barrier).
"""

import tilelang.language as T

from tilebake.mhc._common import MAX_MHC_MULT as MAX_M
from tilebake.mhc._common import VEC
from tilebake.mhc.mhc_pre_apply_mix import MhcPreApplyMixVariant

THREADS = 128
WARPS = THREADS // 32
VPT = 2  # the forward's vectors a thread: a token's vectors flattened, so no thread idles on short rows
PASS_CONFIGS = {"tl.disable_safe_memory_legalize": True}  # whole vectors: the host checks hidden % VEC


def build(v: MhcPreApplyMixVariant):
    return _forward() if v.direction == "fwd" else _backward()


def _forward():
    n = T.dynamic("num_tokens")
    m = T.dynamic("mhc_mult")
    h = T.dynamic("hidden")

    @T.prim_func
    def mhc_pre_apply_mix_fwd_kernel(
        X: T.Tensor((n, m, h), "bfloat16"),
        MIX: T.Tensor((n, m), "float32"),
        O: T.Tensor((n, h), "bfloat16"),
    ):
        hv = h // VEC
        with T.Kernel(T.ceildiv(n * hv, THREADS * VPT), threads=THREADS) as b:
            tx = T.get_thread_binding(0)
            T.assume(h % VEC == 0)
            xs = T.alloc_local((VPT, MAX_M, VEC), "bfloat16")
            acc = T.alloc_local((VEC,), "float32")
            ys = T.alloc_local((VEC,), "bfloat16")
            for u in T.unroll(VPT):  # every stream's vectors in flight at once: one DRAM latency
                e = (b * VPT + u) * THREADS + tx
                t, c = e // hv, e % hv * VEC
                if e < n * hv:
                    for i in T.unroll(MAX_M):
                        if i < m:
                            for j in T.vectorized(VEC):
                                xs[u, i, j] = X[t, i, c + j]
            for u in T.unroll(VPT):
                e = (b * VPT + u) * THREADS + tx
                t, c = e // hv, e % hv * VEC
                if e < n * hv:
                    w0 = MIX[t, 0]
                    for j in T.unroll(VEC):
                        acc[j] = T.ieee_mul(w0, T.cast(xs[u, 0, j], "float32"))
                    for i in T.unroll(MAX_M - 1):
                        if i + 1 < m:
                            w = MIX[t, i + 1]
                            for j in T.unroll(VEC):
                                acc[j] = T.ieee_add(acc[j], T.ieee_mul(w, T.cast(xs[u, i + 1, j], "float32")))
                    for j in T.unroll(VEC):
                        ys[j] = T.cast(acc[j], "bfloat16")
                    for j in T.vectorized(VEC):
                        O[t, c + j] = ys[j]

    return mhc_pre_apply_mix_fwd_kernel


def _backward():
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
        with T.Kernel(T.ceildiv(n, WARPS), threads=THREADS) as b:
            tx = T.get_thread_binding(0)
            T.assume(h % VEC == 0)
            lane = tx % 32
            t = b * WARPS + tx // 32  # a warp a token: its sums need no barrier
            gs = T.alloc_local((VEC,), "bfloat16")
            xs = T.alloc_local((MAX_M, VEC), "bfloat16")
            xg = T.alloc_local((MAX_M, VEC), "bfloat16")
            ys = T.alloc_local((VEC,), "bfloat16")
            part = T.alloc_local((MAX_M,), "float32")
            for i in T.unroll(MAX_M):
                part[i] = T.float32(0)
            for p in T.serial(T.ceildiv(h, 32 * VEC)):
                c = (p * 32 + lane) * VEC
                if t < n and c < h:
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
            # the token's sums: a butterfly in its warp (a fixed order: two runs give the same bits)
            for i in T.unroll(MAX_M):
                if i < m:
                    for s in T.unroll(5):
                        part[i] = part[i] + T.shfl_xor(part[i], 16 >> s)
                    if lane == 0 and t < n:
                        MG[t, i] = part[i]

    return mhc_pre_apply_mix_bwd_kernel
