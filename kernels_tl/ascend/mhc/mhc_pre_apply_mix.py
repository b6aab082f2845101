"""mhc_pre_apply_mix_fwd / _bwd for Ascend 950 (build time only), read from
tilebake.mhc.mhc_pre_apply_mix.MhcPreApplyMixAscendVariant (m and every size at run time).

fwd: o = sum over i in order of mix[t, i] * x[t, i, :] in fp32 (each product and sum rounded on
its own: separate statements), rounded to bf16 once (tilebake.torch.mhc.mhc_pre_apply_mix_ref).
A block per vector core, each taking the (token, CHUNK-column chunk) items core, core +
num_vec_cores, ...: the m x chunks DMA'd in, THREADS SIMT threads a column each in turn, o's
chunk DMA'd out.

bwd: x_grad[i] = bf16(x_grad[i] + mix[i] * o_grad) in place (has_x_grad; else x_grad is not
touched) and mix_grad[i] = the sum over the columns of o_grad * x[i]: a token a step of a vector core, its
chunks in turn, each thread's column sums kept in the unified buffer and added in thread order at
the token's end (written to GM by the SIMT threads). Built and lowered here, never run on an NPU:
checked on the CPU by tests/ascend/test_emulated_mhc.py.
"""

import tilelang.ascend.language as T

from kernels_tl.ascend.mhc.common import CHUNK, STEPS, THREADS
from tilebake.mhc._common import MAX_MHC_MULT
from tilebake.mhc.mhc_pre_apply_mix import MhcPreApplyMixAscendVariant

M = MAX_MHC_MULT


def build(v: MhcPreApplyMixAscendVariant):
    n = T.dynamic("num_tokens")
    m = T.dynamic("mhc_mult")
    hidden = T.dynamic("hidden")
    CORES = v.num_vec_cores
    return _forward(n, m, hidden, CORES) if v.direction == "fwd" else _backward(n, m, hidden, CORES)


def _forward(n, m, hidden, CORES):
    @T.prim_func
    def mhc_pre_apply_mix_fwd_kernel(
        X: T.Tensor((n, m, hidden), "bfloat16"),
        MIX: T.Tensor((n, m), "float32"),
        O: T.Tensor((n, hidden), "bfloat16"),
    ):
        with T.Kernel(CORES) as core:
            xs = T.alloc_shared((M, CHUNK), "bfloat16")
            os = T.alloc_shared((CHUNK,), "bfloat16")
            chunks = T.ceildiv(hidden, CHUNK)
            for r in T.serial(T.ceildiv(n * chunks - core, CORES)):
                item = core + r * CORES
                t = item // chunks
                c0 = item % chunks * CHUNK
                for i in T.serial(m):
                    T.copy(X[t, i, c0 : c0 + CHUNK], xs[i, 0:CHUNK])
                with T.SimtVF(threads=THREADS):
                    k = T.get_thread_binding()
                    mix = T.alloc_local((M,), "float32")
                    acc = T.alloc_var("float32")
                    prod = T.alloc_var("float32")
                    for i in T.serial(m):
                        mix[i] = MIX[t, i]
                    for q in T.serial(STEPS):
                        j = q * THREADS + k
                        acc = mix[0] * T.cast(xs[0, j], "float32")
                        for i in T.serial(m - 1):
                            prod = mix[i + 1] * T.cast(xs[i + 1, j], "float32")
                            acc = acc + prod
                        os[j] = T.cast(acc, "bfloat16")
                T.copy(os, O[t, c0 : c0 + CHUNK])

    return mhc_pre_apply_mix_fwd_kernel


def _backward(n, m, hidden, CORES):
    @T.prim_func
    def mhc_pre_apply_mix_bwd_kernel(
        OG: T.Tensor((n, hidden), "bfloat16"),
        X: T.Tensor((n, m, hidden), "bfloat16"),
        MIX: T.Tensor((n, m), "float32"),
        XG: T.Tensor((n, m, hidden), "bfloat16"),
        MG: T.Tensor((n, m), "float32"),
        has_x_grad: T.int32,
    ):
        with T.Kernel(CORES) as core:
            gs = T.alloc_shared((CHUNK,), "bfloat16")
            xs = T.alloc_shared((M, CHUNK), "bfloat16")
            xgs = T.alloc_shared((M, CHUNK), "bfloat16")
            part = T.alloc_shared((THREADS, M), "float32")
            for r in T.serial(T.ceildiv(n - core, CORES)):
                t = core + r * CORES
                with T.SimtVF(threads=THREADS):
                    k = T.get_thread_binding()
                    for i in T.serial(M):
                        part[k, i] = T.float32(0)
                for c in T.serial(T.ceildiv(hidden, CHUNK)):
                    c0 = c * CHUNK
                    T.copy(OG[t, c0 : c0 + CHUNK], gs)
                    for i in T.serial(m):
                        T.copy(X[t, i, c0 : c0 + CHUNK], xs[i, 0:CHUNK])
                        if has_x_grad != 0:
                            T.copy(XG[t, i, c0 : c0 + CHUNK], xgs[i, 0:CHUNK])
                    with T.SimtVF(threads=THREADS):
                        k = T.get_thread_binding()
                        mix = T.alloc_local((M,), "float32")
                        prod = T.alloc_var("float32")
                        for i in T.serial(m):
                            mix[i] = MIX[t, i]
                        for q in T.serial(STEPS):
                            j = q * THREADS + k
                            if c0 + j < hidden:  # the column sums skip the chunk's stale tail
                                g = T.cast(gs[j], "float32")
                                for i in T.serial(m):
                                    part[k, i] = part[k, i] + g * T.cast(xs[i, j], "float32")
                                    if has_x_grad != 0:
                                        prod = mix[i] * g
                                        prod = T.cast(xgs[i, j], "float32") + prod
                                        xgs[i, j] = T.cast(prod, "bfloat16")
                    if has_x_grad != 0:
                        for i in T.serial(m):
                            T.copy(xgs[i, 0:CHUNK], XG[t, i, c0 : c0 + CHUNK])
                with T.SimtVF(threads=M):  # mix_grad: the threads' partials in order
                    i = T.get_thread_binding()
                    acc = T.alloc_var("float32")
                    acc = T.float32(0)
                    for p in T.serial(THREADS):
                        acc = acc + part[p, i]
                    if i < m:
                        MG[t, i] = acc

    return mhc_pre_apply_mix_bwd_kernel
