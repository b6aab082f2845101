"""Autograd layers built on tilebake's kernels (the original's tile_kernels.modeling):
tilebake.modeling.engram (the Engram gate) and tilebake.modeling.mhc (manifold
hyper-connections: expand_from_embedding, mhc_pre, mhc_post, mhc_head, and their autograd ops in
tilebake.modeling.mhc.ops)."""
