"""mhc_pre_big_fuse_fwd: the whole of an inference mhc_pre after the projection GEMM, from its
split-K partials to the layer's input: reduce the partials and scale by the RMSNorm factor,
split the mixes, Sinkhorn-normalise the residual mix, and mix the streams.

The original runs this as one kernel for m = 4, n_splits == 1 and a token count that is a
multiple of 16. Here it is the training path's four kernels (mhc_reduce_partials_and_rmsnorm_fwd,
mhc_pre_split_mixes_fwd, mhc_sinkhorn_fwd, mhc_pre_apply_mix_fwd) in one call: any m from 1 to 8,
any token count, any n_splits, and the same bytes as the training path by construction. The
mixes are T x m (m + 2) floats, so the unfused steps move little beyond pre_apply_mix's own
read of the residual; what fusing would save is three launches.
"""

from __future__ import annotations

from typing import Optional

import torch

from tilebake.mhc._common import check_streams


def mhc_pre_big_fuse_fwd(gemm_out_mul: torch.Tensor, gemm_out_sqrsum: torch.Tensor, mhc_scale: torch.Tensor,
                         mhc_base: torch.Tensor, residual: torch.Tensor, post_mix: Optional[torch.Tensor] = None,
                         comb_mix: Optional[torch.Tensor] = None, layer_input: Optional[torch.Tensor] = None,
                         rms_eps: float = 1e-6, mhc_pre_eps: float = 1e-6, mhc_sinkhorn_eps: float = 1e-6,
                         mhc_post_mult_value: float = 1.0, sinkhorn_repeat: int = 10, n_splits: int = 16):  # fmt: skip
    """(post_mix, comb_mix, layer_input) of one mhc_pre from the projection's partials.

    gemm_out_mul (n_splits, T, 1, m3) and gemm_out_sqrsum (n_splits, T, 1) fp32: split-K partials
    of residual @ fn^T and of the residual's square sums (mhc_pre_norm_gemm_fwd's outputs);
    mhc_scale (3,), mhc_base (m3,) fp32; residual (..., m, H) bf16 with T tokens in its leading
    dims. Outputs, written where given, else allocated: post_mix (..., m, 1) fp32 (also accepted:
    (..., m)), comb_mix (..., m, m) fp32 (also (..., m * m)), layer_input (..., H) bf16.
    n_splits must equal gemm_out_mul's dim 0.
    """
    import tilebake.mhc as mhc

    check_streams(residual, "residual", torch.bfloat16, 2)
    check_streams(gemm_out_mul, "gemm_out_mul", torch.float32, 4)
    m, hidden = residual.shape[-2:]
    lead = tuple(residual.shape[:-2])
    num_tokens = residual.numel() // max(m * hidden, 1)
    if gemm_out_mul.dim() != 4 or tuple(gemm_out_mul.shape[1:3]) != (num_tokens, 1):
        raise ValueError(f"gemm_out_mul must have shape (n_splits, {num_tokens}, 1, m3) for the residual's "
                         f"{num_tokens} tokens, got {tuple(gemm_out_mul.shape)}")  # fmt: skip
    if gemm_out_mul.shape[-1] != m * (m + 2):
        raise ValueError(f"gemm_out_mul's last dim must be m (m + 2) = {m * (m + 2)} for the residual's {m} streams, "
                         f"got {gemm_out_mul.shape[-1]}")  # fmt: skip
    _, _, mixes = mhc.mhc_reduce_partials_and_rmsnorm_fwd(gemm_out_mul, gemm_out_sqrsum, rms_group_size=m * hidden,
                                                          rms_eps=rms_eps, n_splits=n_splits)  # fmt: skip
    pre = torch.empty((*lead, m, 1), dtype=torch.float32, device=residual.device)
    comb_raw = torch.empty((*lead, m, m), dtype=torch.float32, device=residual.device)
    if post_mix is None:
        post_mix = torch.empty((*lead, m, 1), dtype=torch.float32, device=residual.device)
    mhc.mhc_pre_split_mixes_fwd(mixes.view(*lead, m * (m + 2)), mhc_scale, mhc_base, pre, post_mix, comb_raw,
                                mhc_post_mult_value, mhc_pre_eps)  # fmt: skip
    if comb_mix is not None and tuple(comb_mix.shape) == (*lead, m * m):
        mhc.mhc_sinkhorn_fwd(comb_raw, comb_mix.view(*lead, m, m), sinkhorn_repeat, mhc_sinkhorn_eps)
    else:
        comb_mix = mhc.mhc_sinkhorn_fwd(comb_raw, comb_mix, sinkhorn_repeat, mhc_sinkhorn_eps)
    layer_input = mhc.mhc_pre_apply_mix_fwd(residual, pre, layer_input)
    return post_mix, comb_mix, layer_input
