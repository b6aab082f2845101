"""batched_transpose_weight_sf for Ascend 950 (build time only): fp32 power-of-two weight scales
(G, nb, kb), contiguous, -> UE8M0 bytes packed two to an int16 at (1, 32) granularity, read from
tilebake.quant.batched_transpose_weight_sf.BatchedTransposeWeightSfAscendVariant:

* along 'k' (sf0's buffer, (G, ceil(kb / 2), n)): word w of row r holds the bytes of
  sf[g, r // 32, 2w] (low) and sf[g, r // 32, 2w + 1] (high, 0 past kb);
* along 'n' (sf1's buffer, (G, ceil(nb / 2), k)): word w at column c holds the bytes of
  sf[g, 2w, c // 32] and sf[g, 2w + 1, c // 32] (0 past nb).

The byte of 2^e is e + 127; a scale that is not a positive normal power of two gives 0xFF and
sets the vector core's flag (BAD[core], written once at the end). A block per vector core, each
taking output rows (g, w) core, core + num_vec_cores, ...; a row in chunks of R scale pairs: the
pairs DMA'd to the unified buffer, a SIMT thread a pair (its two bytes, 32 times), the bytes DMA'd
out (the copies bound the tails).

Built and lowered here, never run here: no NPU and no CANN toolkit on our machines.
"""

import tilelang.ascend.language as T

from tilebake.quant.batched_transpose_weight_sf import BatchedTransposeWeightSfAscendVariant

BS = 32  # the block size: each scale covers 32 rows (along 'k') or columns (along 'n')
R = 64  # scale pairs a chunk: 64 x 32 words = 4 KiB out


def build(v: BatchedTransposeWeightSfAscendVariant):
    g_ = T.dynamic("groups")
    nb = T.dynamic("nb")
    kb = T.dynamic("kb")
    along_k = v.along == "k"
    pairs, length = (kb, nb) if along_k else (nb, kb)  # words a row's pair index runs over; scales a row
    CORES = v.num_vec_cores

    @T.macro
    def byte_into(ob, flag, s, present, j, b):
        """Byte b of pair j's 32 words: the UE8M0 byte of s (0 if absent, 0xFF and the flag if bad)."""
        bits = T.reinterpret(s, "int32")
        e = T.shift_right(bits, 23) & 255
        bad = ((bits & T.int32(-2139095041)) != 0) | (e == 0) | (e == 255)  # 0x807FFFFF: sign, mantissa
        if present and bad:
            flag[0] = 1
        byte = T.if_then_else(present, T.if_then_else(bad, 255, e), 0)
        for i in T.serial(BS):
            ob[(j * BS + i) * 2 + b] = T.cast(byte, "uint8")

    @T.prim_func
    def batched_transpose_weight_sf_kernel(
        SF: T.Tensor((g_, nb, kb), "float32"),
        OUT: T.Tensor((g_ * T.ceildiv(pairs, 2), length * BS * 2), "uint8"),  # the int16 buffer's bytes
        BAD: T.Tensor((CORES,), "int32"),
    ):
        with T.Kernel(CORES) as core:
            # along k: R rows of 2 scales, each row 32 bytes apart in the unified buffer (a multi-row
            # DMA's UB row pitch must be a multiple of 32 bytes)
            tile = T.alloc_shared((R, 8) if along_k else (2, R), "float32")
            ob = T.alloc_shared((R * BS * 2,), "uint8")
            flag = T.alloc_shared((8,), "int32")
            with T.SimtVF(threads=8):
                flag[T.get_thread_binding()] = 0
            words = T.ceildiv(pairs, 2)
            for r in T.serial(T.ceildiv(g_ * words - core, CORES)):
                row = core + r * CORES
                g = row // words
                w = row % words
                for c in T.serial(T.ceildiv(length, R)):
                    if along_k:
                        T.copy(SF[g, c * R : c * R + R, 2 * w : 2 * w + 2], tile[0:R, 0:2])
                    else:
                        T.copy(SF[g, 2 * w : 2 * w + 2, c * R : c * R + R], tile)
                    with T.SimtVF(threads=R):
                        j = T.get_thread_binding()
                        for b in T.unroll(2):
                            s = tile[j, b] if along_k else tile[b, j]
                            byte_into(ob, flag, s, 2 * w + b < pairs, j, b)
                    T.copy(ob, OUT[row, c * R * BS * 2])
            T.copy(flag[0:1], BAD[core : core + 1])

    return batched_transpose_weight_sf_kernel
