"""RMSNorm forward + per-token FP8 e4m3 cast: the factory in kernels_tl/quant/norm_forward.py
with the quantising epilogue (build time only)."""

from kernels_tl.quant.norm_forward import PASS_CONFIGS, build_norm_forward

__all__ = ["PASS_CONFIGS", "build"]


def build(v):
    return build_norm_forward(v.in_dtype, v.has_weight, v.has_residual, v.num_per_channels)
