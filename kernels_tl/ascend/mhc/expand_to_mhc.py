"""expand_to_mhc_fwd / _bwd for Ascend 950 (build time only), read from
tilebake.mhc.expand_to_mhc.ExpandToMhcAscendVariant: fwd, o[t, i, :] = x[t, :] for each of the
m streams; bwd, x_grad = the m streams' gradients summed in fp32 in stream order, rounded to
bf16 once (tilebake.torch.mhc's references, the same bits).

A block per vector core, each taking the (token, CHUNK-column chunk) items core, core +
num_vec_cores, ...: fwd DMAs the x chunk in and out m times (no arithmetic); bwd DMAs the m
gradient chunks in, THREADS SIMT threads add them column by column, the sum DMA'd out. Built and
lowered here, never run on an NPU: checked on the CPU by tests/ascend/test_emulated_mhc.py.
"""

import tilelang.ascend.language as T

from kernels_tl.ascend.mhc.common import CHUNK, STEPS, THREADS
from tilebake.mhc._common import MAX_MHC_MULT
from tilebake.mhc.expand_to_mhc import ExpandToMhcAscendVariant


def build(v: ExpandToMhcAscendVariant):
    n = T.dynamic("num_tokens")
    m = T.dynamic("mhc_mult")
    hidden = T.dynamic("hidden")
    CORES = v.num_vec_cores

    if v.direction == "fwd":

        @T.prim_func
        def expand_to_mhc_fwd_kernel(X: T.Tensor((n, hidden), "bfloat16"), O: T.Tensor((n, m, hidden), "bfloat16")):
            with T.Kernel(CORES) as core:
                xs = T.alloc_shared((CHUNK,), "bfloat16")
                chunks = T.ceildiv(hidden, CHUNK)
                for r in T.serial(T.ceildiv(n * chunks - core, CORES)):
                    item = core + r * CORES
                    t = item // chunks
                    c0 = item % chunks * CHUNK
                    T.copy(X[t, c0 : c0 + CHUNK], xs)
                    for i in T.serial(m):
                        T.copy(xs, O[t, i, c0 : c0 + CHUNK])

        return expand_to_mhc_fwd_kernel

    @T.prim_func
    def expand_to_mhc_bwd_kernel(OG: T.Tensor((n, m, hidden), "bfloat16"), XG: T.Tensor((n, hidden), "bfloat16")):
        with T.Kernel(CORES) as core:
            gs = T.alloc_shared((MAX_MHC_MULT, CHUNK), "bfloat16")
            xs = T.alloc_shared((CHUNK,), "bfloat16")
            chunks = T.ceildiv(hidden, CHUNK)
            for r in T.serial(T.ceildiv(n * chunks - core, CORES)):
                item = core + r * CORES
                t = item // chunks
                c0 = item % chunks * CHUNK
                for i in T.serial(m):
                    T.copy(OG[t, i, c0 : c0 + CHUNK], gs[i, 0:CHUNK])
                with T.SimtVF(threads=THREADS):
                    k = T.get_thread_binding()
                    acc = T.alloc_var("float32")
                    for q in T.serial(STEPS):
                        j = q * THREADS + k
                        acc = T.cast(gs[0, j], "float32")
                        for i in T.serial(m - 1):
                            acc = acc + T.cast(gs[i + 1, j], "float32")
                        xs[j] = T.cast(acc, "bfloat16")
                T.copy(xs, XG[t, c0 : c0 + CHUNK])

    return expand_to_mhc_bwd_kernel
