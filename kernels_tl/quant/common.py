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
