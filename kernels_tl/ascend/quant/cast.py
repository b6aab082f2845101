"""cast with stochastic rounding, fp32 -> bf16, for Ascend 950 (build time only), read from
tilebake.quant.cast.CastAscendVariant. The random bits and the rounding are the CUDA kernel's
(kernels_tl/quant/cast.py): one hash a pair of elements (sr_random_pair_into over the pair's fp32
bits and its flat index / 2), 16 bits each; sr_float32_to_bfloat16_bits, integer only.

A block per vector core, each taking chunks core, core + num_vec_cores, ... of CHUNK elements:
the chunk DMA'd to the unified buffer, a SIMT thread per PAIRS_A_THREAD pairs, the bf16 bit
patterns DMA'd out (the copies bound the tail: numel % 4 == 0 from the host).
Built and lowered here, never run here: no NPU and no CANN toolkit on our machines.
"""

import tilelang.ascend.language as T

from kernels_tl.quant.common import sr_float32_to_bfloat16_bits, sr_pair_word, sr_random_pair_into
from tilebake.quant.cast import CastAscendVariant

CHUNK = 4096  # elements a step: 16 KiB of fp32 in, 8 KiB of bf16 out
THREADS = 512
PAIRS_A_THREAD = CHUNK // 2 // THREADS


def build(v: CastAscendVariant):
    num_groups = T.dynamic("num_groups")  # numel / 4
    CORES = v.num_vec_cores

    @T.prim_func
    def cast_kernel(
        X: T.Tensor((num_groups * 4,), "float32"),
        Y: T.Tensor((num_groups * 4,), "uint16"),  # bf16 as its bit patterns
    ):
        with T.Kernel(CORES) as core:
            xs = T.alloc_shared((CHUNK,), "float32")
            ys = T.alloc_shared((CHUNK,), "uint16")
            for r in T.serial(T.ceildiv(T.ceildiv(num_groups * 4, CHUNK) - core, CORES)):
                chunk = core + r * CORES
                T.copy(X[chunk * CHUNK : chunk * CHUNK + CHUNK], xs)
                with T.SimtVF(threads=THREADS):
                    t = T.get_thread_binding()
                    h = T.alloc_local((1,), "uint32")
                    for k in T.serial(PAIRS_A_THREAD):
                        p = k * THREADS + t  # the pair in the chunk: elements 2p, 2p + 1
                        x0 = xs[2 * p]
                        x1 = xs[2 * p + 1]
                        word = sr_pair_word(T.reinterpret(x0, "uint32"), T.reinterpret(x1, "uint32"))
                        sr_random_pair_into(h, word, chunk * (CHUNK // 2) + p)
                        ys[2 * p] = T.cast(sr_float32_to_bfloat16_bits(x0, h[0]), "uint16")
                        ys[2 * p + 1] = T.cast(
                            sr_float32_to_bfloat16_bits(x1, T.shift_right(h[0], T.uint32(16))), "uint16"
                        )
                T.copy(ys, Y[chunk * CHUNK : chunk * CHUNK + CHUNK])

    return cast_kernel
