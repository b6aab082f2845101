"""Packed FP4 e2m1 bytes -> fp32 or bf16 values, as a TileLang factory (build time only).

Byte i of the flat input holds element 2i in its low nibble and 2i + 1 in its high nibble
(tilebake.torch.unpack_from_e2m1fn_x2, the reference). A nibble c decodes to sign (c >> 3) and
magnitude index m = c & 7 -> (0, 0.5, 1, 1.5, 2, 3, 4, 6): written as fp32 bits, exponent
field (m >> 1) + 126 and mantissa bit 22 = m & 1 for m >= 2, 0.5 = 0x3F000000 for m = 1, +-0
for m = 0 (code 8 is -0.0, as the reference's table). Every value is exact in bf16, whose bits
are the fp32 bits' top half. The kernel writes those bit patterns (uint32 / uint16); the host
views them as float32 / bfloat16.

Mapping: each thread owns VEC consecutive bytes (one 16-byte load, 2 x VEC outputs); a CTA
THREADS x VEC bytes; the last thread's partial vector is decoded byte by byte.
"""

import tilelang.language as T

from tilebake.quant.unpack_from_e2m1fn_x2 import UnpackE2m1Variant

THREADS = 256
VEC = 16  # input bytes a thread: one 16-byte load; 64 (bf16) or 128 (fp32) bytes stored
PASS_CONFIGS = {"tl.disable_safe_memory_legalize": True}  # guarded per vector below


def _fp32_bits(c):
    """The fp32 bit pattern (uint32) of e2m1 code c (a uint32 in [0, 16))."""
    m = c & T.uint32(7)
    magnitude = T.if_then_else(
        m >= T.uint32(2),
        T.shift_left(T.shift_right(m, T.uint32(1)) + T.uint32(126), T.uint32(23))
        | T.shift_left(m & T.uint32(1), T.uint32(22)),
        T.if_then_else(m == T.uint32(1), T.uint32(0x3F000000), T.uint32(0)),
    )
    return magnitude | T.shift_left(T.shift_right(c, T.uint32(3)), T.uint32(31))


def build(v: UnpackE2m1Variant):
    bits = "uint32" if v.out_dtype == "fp32" else "uint16"
    num_bytes = T.dynamic("num_bytes")
    chunk = 4 if bits == "uint32" else 8  # output elements in 16 bytes

    def decoded(c):
        word = _fp32_bits(c)
        return word if bits == "uint32" else T.cast(T.shift_right(word, T.uint32(16)), "uint16")

    @T.prim_func
    def unpack_from_e2m1fn_x2_kernel(
        X: T.Tensor((num_bytes,), "uint8"),
        Y: T.Tensor((num_bytes * 2,), bits),
    ):
        with T.Kernel(T.ceildiv(num_bytes, THREADS * VEC), threads=THREADS) as b:
            tx = T.get_thread_binding(0)
            xs = T.alloc_local((VEC,), "uint8")
            ys = T.alloc_local((2 * VEC,), bits)
            base = (b * THREADS + tx) * VEC  # an expression, so the vectorizer sees its alignment
            if base + VEC <= num_bytes:
                for j in T.vectorized(VEC):
                    xs[j] = X[base + j]
                for j in T.unroll(VEC):
                    ys[2 * j] = decoded(T.cast(xs[j], "uint32") & T.uint32(15))
                    ys[2 * j + 1] = decoded(T.shift_right(T.cast(xs[j], "uint32"), T.uint32(4)))
                for h in T.unroll(2 * VEC // chunk):  # 16-byte stores (a wider vector has no CUDA type on sm_100a)
                    for j in T.vectorized(chunk):
                        Y[2 * base + h * chunk + j] = ys[h * chunk + j]
            else:
                for j in T.serial(VEC):
                    if base + j < num_bytes:
                        Y[2 * (base + j)] = decoded(T.cast(X[base + j], "uint32") & T.uint32(15))
                        Y[2 * (base + j) + 1] = decoded(T.shift_right(T.cast(X[base + j], "uint32"), T.uint32(4)))

    return unpack_from_e2m1fn_x2_kernel
