"""fused_weight for Ascend 950 (build time only), read from
tilebake.engram.fused_weight.FusedWeightAscendVariant: weight_hidden * weight_embed, two bf16
tensors, as fp32 (exact: a product of two bf16 values).

A block per vector core, each taking chunks core, core + num_vec_cores, ... of CHUNK elements of
the flattened tensors: both DMA'd to the unified buffer (the copy bounds the last chunk), a SIMT
thread per LANES elements, the products DMA'd out. Built and lowered here, never run on an NPU:
checked on the CPU by tests/ascend/test_emulated_engram.py.
"""

import tilelang.ascend.language as T

from tilebake.engram.fused_weight import FusedWeightAscendVariant

CHUNK = 4096
THREADS = 256


def build(v: FusedWeightAscendVariant):
    numel = T.dynamic("numel")
    CORES = v.num_vec_cores

    @T.prim_func
    def fused_weight_kernel(
        WH: T.Tensor((numel,), "bfloat16"),
        WE: T.Tensor((numel,), "bfloat16"),
        W: T.Tensor((numel,), "float32"),
    ):
        with T.Kernel(CORES) as core:
            hs = T.alloc_shared((CHUNK,), "bfloat16")
            es = T.alloc_shared((CHUNK,), "bfloat16")
            ws = T.alloc_shared((CHUNK,), "float32")
            for s in T.serial(T.ceildiv(T.ceildiv(numel, CHUNK) - core, CORES)):
                c0 = (core + s * CORES) * CHUNK
                T.copy(WH[c0 : c0 + CHUNK], hs)
                T.copy(WE[c0 : c0 + CHUNK], es)
                with T.SimtVF(threads=THREADS):
                    t = T.get_thread_binding()
                    for j in T.serial(CHUNK // THREADS):
                        i = j * THREADS + t
                        ws[i] = T.cast(hs[i], "float32") * T.cast(es[i], "float32")
                T.copy(ws, W[c0 : c0 + CHUNK])

    return fused_weight_kernel
