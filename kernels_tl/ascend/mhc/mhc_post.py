"""mhc_post_fwd / _bwd for Ascend 950 (build time only), read from
tilebake.mhc.mhc_post.MhcPostAscendVariant (m and every size at run time).

fwd: out[t, o, :] = post[t, o] * x + sum over i in order of comb[t, i, o] * residual[t, i, :],
each term added by a fused multiply-add (fmaf, as tilebake.torch.mhc.mhc_post_ref's fma32),
rounded to bf16 once. A block per vector core, each taking the (token, CHUNK-column chunk) items
core, core + num_vec_cores, ...: the x and m residual chunks DMA'd in, THREADS SIMT threads (the
token's post and comb read from GM into registers) a column each in turn, the m output chunks
DMA'd out.

bwd: d_x = sum_o post[o] d_o[o], d_residual[i] = sum_o comb[i, o] d_o[o] (fp32, o in order,
rounded to bf16), d_post[o] = sum over the columns of x d_o[o], d_comb[i, o] of residual[i]
d_o[o]: a token a step of a vector core, its chunks in turn; each thread keeps its columns' sums
in the unified buffer, added in thread order at the token's end (a fixed order) and written to
GM by the SIMT threads. Built and lowered here, never run on an NPU: checked on the CPU by
tests/ascend/test_emulated_mhc.py; the vector cores' fmaf (called by name) is unverified.
"""

import tilelang.ascend.language as T

from kernels_tl.ascend.mhc.common import CHUNK, STEPS, THREADS
from tilebake.mhc._common import MAX_MHC_MULT
from tilebake.mhc.mhc_post import MhcPostAscendVariant

M = MAX_MHC_MULT
SUMS = M + M * M  # a thread's d_post and d_comb partials


def build(v: MhcPostAscendVariant):
    n = T.dynamic("num_tokens")
    m = T.dynamic("mhc_mult")
    hidden = T.dynamic("hidden")
    CORES = v.num_vec_cores
    return _forward(n, m, hidden, CORES) if v.direction == "fwd" else _backward(n, m, hidden, CORES)


def _forward(n, m, hidden, CORES):
    @T.prim_func
    def mhc_post_fwd_kernel(
        X: T.Tensor((n, hidden), "bfloat16"),
        R: T.Tensor((n, m, hidden), "bfloat16"),
        POST: T.Tensor((n, m), "float32"),
        COMB: T.Tensor((n, m, m), "float32"),
        OUT: T.Tensor((n, m, hidden), "bfloat16"),
    ):
        with T.Kernel(CORES) as core:
            xs = T.alloc_shared((CHUNK,), "bfloat16")
            rs = T.alloc_shared((M, CHUNK), "bfloat16")
            os = T.alloc_shared((M, CHUNK), "bfloat16")
            chunks = T.ceildiv(hidden, CHUNK)
            for r in T.serial(T.ceildiv(n * chunks - core, CORES)):
                item = core + r * CORES
                t = item // chunks
                c0 = item % chunks * CHUNK
                T.copy(X[t, c0 : c0 + CHUNK], xs)
                for i in T.serial(m):
                    T.copy(R[t, i, c0 : c0 + CHUNK], rs[i, 0:CHUNK])
                with T.SimtVF(threads=THREADS):
                    k = T.get_thread_binding()
                    post = T.alloc_local((M,), "float32")
                    comb = T.alloc_local((M * M,), "float32")
                    acc = T.alloc_var("float32")
                    for o in T.serial(m):
                        post[o] = POST[t, o]
                        for i in T.serial(m):
                            comb[i * M + o] = COMB[t, i, o]
                    for q in T.serial(STEPS):
                        j = q * THREADS + k
                        for o in T.serial(m):
                            acc = post[o] * T.cast(xs[j], "float32")
                            for i in T.serial(m):
                                acc = T.call_extern("float32", "fmaf", comb[i * M + o], T.cast(rs[i, j], "float32"), acc)
                            os[o, j] = T.cast(acc, "bfloat16")
                for o in T.serial(m):
                    T.copy(os[o, 0:CHUNK], OUT[t, o, c0 : c0 + CHUNK])

    return mhc_post_fwd_kernel


def _backward(n, m, hidden, CORES):
    @T.prim_func
    def mhc_post_bwd_kernel(
        X: T.Tensor((n, hidden), "bfloat16"),
        R: T.Tensor((n, m, hidden), "bfloat16"),
        POST: T.Tensor((n, m), "float32"),
        COMB: T.Tensor((n, m, m), "float32"),
        DO: T.Tensor((n, m, hidden), "bfloat16"),
        DX: T.Tensor((n, hidden), "bfloat16"),
        DR: T.Tensor((n, m, hidden), "bfloat16"),
        DPOST: T.Tensor((n, m), "float32"),
        DCOMB: T.Tensor((n, m, m), "float32"),
    ):
        with T.Kernel(CORES) as core:
            xs = T.alloc_shared((CHUNK,), "bfloat16")  # x, then d_x
            rs = T.alloc_shared((M, CHUNK), "bfloat16")
            gs = T.alloc_shared((M, CHUNK), "bfloat16")
            drs = T.alloc_shared((M, CHUNK), "bfloat16")
            part = T.alloc_shared((THREADS, SUMS), "float32")
            for r in T.serial(T.ceildiv(n - core, CORES)):
                t = core + r * CORES
                with T.SimtVF(threads=THREADS):
                    k = T.get_thread_binding()
                    for s in T.serial(SUMS):
                        part[k, s] = T.float32(0)
                for c in T.serial(T.ceildiv(hidden, CHUNK)):
                    c0 = c * CHUNK
                    T.copy(X[t, c0 : c0 + CHUNK], xs)
                    for i in T.serial(m):
                        T.copy(R[t, i, c0 : c0 + CHUNK], rs[i, 0:CHUNK])
                        T.copy(DO[t, i, c0 : c0 + CHUNK], gs[i, 0:CHUNK])
                    with T.SimtVF(threads=THREADS):
                        k = T.get_thread_binding()
                        post = T.alloc_local((M,), "float32")
                        comb = T.alloc_local((M * M,), "float32")
                        acc = T.alloc_var("float32")
                        for o in T.serial(m):
                            post[o] = POST[t, o]
                            for i in T.serial(m):
                                comb[i * M + o] = COMB[t, i, o]
                        for q in T.serial(STEPS):
                            j = q * THREADS + k
                            if c0 + j < hidden:  # the sums over columns skip the chunk's stale tail
                                x = T.cast(xs[j], "float32")
                                for o in T.serial(m):
                                    g = T.cast(gs[o, j], "float32")
                                    part[k, o] = part[k, o] + x * g
                                    for i in T.serial(m):
                                        part[k, M + i * M + o] = part[k, M + i * M + o] + T.cast(rs[i, j], "float32") * g
                                acc = T.float32(0)
                                for o in T.serial(m):
                                    acc = acc + post[o] * T.cast(gs[o, j], "float32")
                                xs[j] = T.cast(acc, "bfloat16")
                                for i in T.serial(m):
                                    acc = T.float32(0)
                                    for o in T.serial(m):
                                        acc = acc + comb[i * M + o] * T.cast(gs[o, j], "float32")
                                    drs[i, j] = T.cast(acc, "bfloat16")
                    T.copy(xs, DX[t, c0 : c0 + CHUNK])
                    for i in T.serial(m):
                        T.copy(drs[i, 0:CHUNK], DR[t, i, c0 : c0 + CHUNK])
                with T.SimtVF(threads=SUMS):  # the token's column sums, threads' partials in order
                    s = T.get_thread_binding()
                    acc = T.alloc_var("float32")
                    acc = T.float32(0)
                    for p in T.serial(THREADS):
                        acc = acc + part[p, s]
                    if s < m:
                        DPOST[t, s] = acc
                    elif s >= M and (s - M) // M < m and (s - M) % M < m:
                        DCOMB[t, (s - M) // M, (s - M) % M] = acc

    return mhc_post_bwd_kernel
