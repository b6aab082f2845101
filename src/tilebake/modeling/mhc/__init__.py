"""Manifold hyper-connections as autograd layers (the original's tile_kernels.modeling.mhc, a
1.0 module that 2.x dropped and downstream code still imports).

    streams = expand_from_embedding(embedding, mhc_mult=4)             # (..., H) -> (..., m, H)
    layer_input, (post, comb) = mhc_pre(streams, fn, scale, base)      # fn (m3, m H), m3 = m (m + 2)
    streams = mhc_post(layer(layer_input), streams, post, comb)
    hidden = mhc_head(streams, head_fn, head_scale, head_base)         # head_fn (m, m H) -> (..., H)

Streams are bf16, fn / scale / base / norm weights and mixes fp32; m (mhc_mult) is 1 to 8 (the
original: 4). bf16 streams run tilebake.mhc's kernels (their references on CPU tensors); fp32 and
fp64 streams run the reference math (what gradcheck runs). Parameters with a `main_grad`
attribute (Megatron) get their gradient added into it and None returned. The autograd ops
themselves, each with its own signature, are in tilebake.modeling.mhc.ops.
"""

from tilebake.modeling.mhc import ops
from tilebake.modeling.mhc.functional import expand_from_embedding, mhc_head, mhc_post, mhc_pre

__all__ = ["expand_from_embedding", "mhc_pre", "mhc_head", "mhc_post", "ops"]
