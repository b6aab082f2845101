"""fp32 power-of-two weight block scales -> one packed UE8M0 DeepGEMM layout, as a TileLang factory.

Build time only: `build(variant)` returns the PrimFunc that build_tools/aot.py lowers.

One thread per output int32 word: row `row` (a row of the weight, or of its transpose), word
`w` (four bs-wide K blocks). Its four bytes are the fp32 exponent fields of the input scales
[row >> log2(bs), 4w .. 4w+3] (zero past the last block). Reading the input through runtime
strides makes the transposed layout (sf1) the same kernel with the strides swapped; rows vary
fastest across threads, so the MN-major output is written coalesced. A scale that is not a
positive normal power of two (sign, mantissa bits, exponent 0 or 255) becomes the UE8M0 NaN byte
0xFF and sets BAD[0] = 1 (BAD: an int32 the host zeroes before the launches and reads after
them: one device-to-host copy, which raises ValueError; not while a CUDA graph is captured).
"""

import tilelang.language as T

from tilebake.quant.batched_transpose_weight_sf import BatchedTransposeWeightSfVariant

THREADS = 256
# No per-element bounds guards: the buffer extents are nominal, every access is in range by construction.
PASS_CONFIGS = {"tl.disable_safe_memory_legalize": True}


def build(v: BatchedTransposeWeightSfVariant):
    sf_len = T.dynamic("sf_len")
    out_len = T.dynamic("out_len")

    @T.prim_func
    def batched_transpose_weight_sf_kernel(
        SF: T.Tensor((sf_len,), "float32"),  # extents nominal: addressed through the strides below
        OUT: T.Tensor((out_len,), "int32"),
        BAD: T.Tensor((1,), "int32"),
        num_words_total: T.int32,  # groups x words x rows: the threads with work
        rows: T.int32,  # output rows (input row blocks x bs)
        words: T.int32,
        cols: T.int32,  # input column blocks
        shift: T.int32,  # log2(bs)
        in_stride_g: T.int32,
        in_stride_r: T.int32,
        in_stride_c: T.int32,
        out_stride_g: T.int32,
        out_stride_r: T.int32,
        out_stride_w: T.int32,
    ):
        with T.Kernel(T.ceildiv(num_words_total, THREADS), threads=THREADS) as b:
            tx = T.get_thread_binding(0)
            t = T.alloc_var("int32")
            t = b * THREADS + tx
            if t < num_words_total:
                # Registers: each division once, not inlined into every index.
                row = T.alloc_var("int32")
                w = T.alloc_var("int32")
                g = T.alloc_var("int32")
                row = t % rows
                w = (t // rows) % words
                g = t // rows // words
                word = T.alloc_var("int32")
                word = 0
                any_bad = T.alloc_var("int32")
                any_bad = 0
                for j in T.unroll(4):
                    c = w * 4 + j
                    if c < cols:
                        bits = T.reinterpret(
                            SF[g * in_stride_g + (row >> shift) * in_stride_r + c * in_stride_c], "int32"
                        )
                        # Not a positive normal power of two: 0xFF, UE8M0's NaN, never a silently
                        # wrong scale; and the host is told (BAD).
                        exponent = T.shift_right(bits, 23) & 255
                        bad = (bits & T.int32(-2139095041)) != 0 or exponent == 0 or exponent == 255  # 0x807FFFFF
                        word = word | T.shift_left(T.if_then_else(bad, 255, exponent), 8 * j)
                        any_bad = any_bad | T.if_then_else(bad, 1, 0)
                OUT[g * out_stride_g + row * out_stride_r + w * out_stride_w] = word
                if any_bad != 0:
                    BAD[0] = 1  # every writer stores the same value

    return batched_transpose_weight_sf_kernel
