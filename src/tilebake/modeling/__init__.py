"""Autograd layers built on tilebake's kernels (the original's tile_kernels.modeling):
tilebake.modeling.engram (the Engram gate)."""
