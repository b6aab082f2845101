"""TileLang pieces shared by the quant kernels (build time only)."""

import tilelang.language as T


def per_token_sf_buffer(num_tokens, hidden, num_per_channels: int, packed_ue8m0: bool):
    """The scale-factor tensor of a per-token (1 x num_per_channels) quantisation, as
    (shape, strides, dtype) for T.StridedTensor.

    Its strides are runtime (the `sf_stride_t`, `sf_stride_g` kernel arguments), so row-major
    and TMA-aligned column-major SF share one binary. fp32 SF are indexed [token, group];
    packed UE8M0 SF as bytes [token, word, byte-in-word], strides in bytes.
    """
    sf_stride_t = T.dynamic("sf_stride_t")
    sf_stride_g = T.dynamic("sf_stride_g")
    num_groups = T.ceildiv(hidden, num_per_channels)
    if packed_ue8m0:
        return (num_tokens, T.ceildiv(num_groups, 4), 4), (sf_stride_t, sf_stride_g, 1), "uint8"
    return (num_tokens, num_groups), (sf_stride_t, sf_stride_g), "float32"


def e2m1_code(q):
    """fp32 q -> its e2m1 code (int32 0..15) per numerics.md step 4, branch-free.

    m = |q| with NaN and +inf mapped to 6 (the comparison is false for NaN), then the 3-bit
    magnitude code counts the round-half-even thresholds it reaches: rne(2m) for m < 2,
    rne(m) + 2 for 2 <= m < 4, rne(m / 2) + 4 otherwise, i.e. thresholds
    0.25 < m, 0.75 <= m, 1.25 < m, 1.75 <= m, 2.5 < m, 3.5 <= m, 5 < m. Bit 3 is q's sign bit.
    """
    a = T.abs(q)
    m = T.if_then_else(a < T.float32(6), a, T.float32(6))
    mag = (
        T.cast(m > T.float32(0.25), "int32")
        + T.cast(m >= T.float32(0.75), "int32")
        + T.cast(m > T.float32(1.25), "int32")
        + T.cast(m >= T.float32(1.75), "int32")
        + T.cast(m > T.float32(2.5), "int32")
        + T.cast(m >= T.float32(3.5), "int32")
        + T.cast(m > T.float32(5), "int32")
    )
    sign = T.shift_right(T.reinterpret(q, "uint32"), T.uint32(28)) & T.uint32(8)
    return mag | T.cast(sign, "int32")


def e2m1_value(code):
    """e2m1 code (int32, low 4 bits used) -> fp32 value: magnitudes 0, .5, 1, 1.5, 2, 3, 4, 6
    for k = 0..7 (k / 2 below 4, else (2 + (k & 1)) * ((k >> 1) - 1)); bit 3 negates (-0.0 for 8)."""
    k = code & 7
    twice = T.if_then_else(k < 4, k, 2 * (2 + (k & 1)) * ((k >> 1) - 1))
    v = T.cast(twice, "float32") * T.float32(0.5)
    return T.if_then_else((code & 8) != 0, -v, v)
