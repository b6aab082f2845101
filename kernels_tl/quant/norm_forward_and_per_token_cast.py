"""RMSNorm forward + per-token FP8 e4m3 cast: the factory in kernels_tl/quant/norm_forward.py
with the quantising epilogue (build time only)."""

from kernels_tl.quant.norm_forward import (
    PASS_CONFIGS,
    LaunchConfig,
    build_norm_forward,
    candidate_configs,
    default_config,
)

__all__ = ["PASS_CONFIGS", "build", "candidate_configs"]


def build(v, cfg: LaunchConfig | None = None):
    cfg = cfg or default_config(v.in_dtype, v.has_residual, True)
    return build_norm_forward(v.in_dtype, v.has_weight, v.has_residual, v.num_per_channels, cfg)
