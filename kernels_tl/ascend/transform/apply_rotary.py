"""apply_rotary for Ascend 950 (build time only), read from
tilebake.transform.apply_rotary.ApplyRotaryAscendVariant: query (and key) rotated in place,
per pair (x1, x2) (NeoX halves i, rot/2 + i, or GPT-J pairs 2i, 2i + 1 with interleaved) in fp32:
out1 = fma(x1, cos, -(x2 sin)), out2 = fma(x2, cos, x1 sin), sin negated with conjugate, rounded
to the tensors' dtype (tilebake.torch.rotary_embedding_ref's arithmetic). G holds each token's
cache row [cos | sin] (gathered by the host), F whether that row was inside the cache (a token
outside stays as it was).

A block per vector core, each taking tokens core, core + num_vec_cores, ...: the token's heads
of query and key, its cache row and flag DMA'd to the unified buffer, a SIMT thread a pair index
(over the heads), the heads DMA'd back. Built and lowered here, never run here: no NPU and no
CANN toolkit on our machines; the vector cores' fmaf (called by name) is unverified.
"""

import tilelang.ascend.language as T

from kernels_tl.quant.common import TL_DTYPES
from tilebake.transform.apply_rotary import MAX_ASCEND_ROW, ApplyRotaryAscendVariant


def build(v: ApplyRotaryAscendVariant):
    n = T.dynamic("num_tokens")
    qh = T.dynamic("q_heads")
    kh = T.dynamic("k_heads")
    dtype = TL_DTYPES[v.dtype]
    ROT = v.rot_dim
    HALF = ROT // 2
    CORES = v.num_vec_cores

    @T.macro
    def rotate(xs, of_key: bool, cs, interleaved, conjugate, i):
        """Pair i of every head of the token's row xs (query's, or key's), in place (the head
        count is read from the kernel's own q_heads / k_heads: a macro argument would rename it)."""
        cos = cs[i]
        sin = T.if_then_else(conjugate != 0, -cs[HALF + i], cs[HALF + i])
        for h in T.serial(kh if of_key else qh):
            a = h * ROT + T.if_then_else(interleaved != 0, 2 * i, i)
            b = h * ROT + T.if_then_else(interleaved != 0, 2 * i + 1, HALF + i)
            x1 = T.cast(xs[a], "float32")
            x2 = T.cast(xs[b], "float32")
            xs[a] = T.cast(T.call_extern("float32", "fmaf", x1, cos, -(x2 * sin)), dtype)
            xs[b] = T.cast(T.call_extern("float32", "fmaf", x2, cos, x1 * sin), dtype)

    @T.prim_func
    def apply_rotary_kernel(
        Q: T.Tensor((n, qh * ROT), dtype),
        K: T.Tensor((n, kh * ROT), dtype),  # (Q's address without key: k_heads 0, never touched)
        G: T.Tensor((n, ROT), "float32"),
        F: T.Tensor((n,), "int32"),
        interleaved: T.int32,
        conjugate: T.int32,
    ):
        with T.Kernel(CORES) as core:
            qs = T.alloc_shared((MAX_ASCEND_ROW,), dtype)
            ks = T.alloc_shared((MAX_ASCEND_ROW,), dtype)
            cs = T.alloc_shared((ROT,), "float32")
            fs = T.alloc_shared((8,), "int32")
            for r in T.serial(T.ceildiv(n - core, CORES)):
                t = core + r * CORES
                T.copy(Q[t, 0:MAX_ASCEND_ROW], qs)
                T.copy(K[t, 0:MAX_ASCEND_ROW], ks)
                T.copy(G[t, 0:ROT], cs)
                T.copy(F[t : t + 1], fs[0:1])
                with T.SimtVF(threads=HALF):
                    i = T.get_thread_binding()
                    if fs[0] != 0:
                        rotate(qs, False, cs, interleaved, conjugate, i)
                        rotate(ks, True, cs, interleaved, conjugate, i)
                T.copy(qs, Q[t, 0:MAX_ASCEND_ROW])
                T.copy(ks, K[t, 0:MAX_ASCEND_ROW])

    return apply_rotary_kernel
