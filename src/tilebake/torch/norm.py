"""Plain-PyTorch reference of RMSNorm forward (+ residual add) and backward.

The oracles for the norm kernels and the slow path on CPU tensors. All arithmetic in fp32
on the input's device; divisions are tensor-by-tensor (a division by a Python scalar may
become a reciprocal multiply on CUDA). Only torch is imported.

Forward, per row of norm_input v (x, or x + residual rounded to x.dtype):
    rstd = rsqrt(sum(v * v) / H + eps)
    out  = round_to_x_dtype((v * rstd) * (w * out_scale))
Backward, with xhat = x * rstd, g' = g * (w * out_scale):
    x_grad = rstd * (g' - xhat * (sum(g' * xhat) / H)) (+ residual_out_grad), in x.dtype
    weight_grad = sum over rows of (g * xhat) * out_scale, fp32
"""

from __future__ import annotations

from typing import Optional

import torch

__all__ = ["norm_backward_ref", "norm_forward_ref"]


def _scaled_weight(weight: Optional[torch.Tensor], out_scale: float, like: torch.Tensor) -> torch.Tensor:
    scale = torch.tensor(out_scale, dtype=torch.float32, device=like.device)
    return scale if weight is None else weight.float() * scale


def norm_forward_ref(
    x: torch.Tensor,
    weight: Optional[torch.Tensor],
    eps: float,
    residual: Optional[torch.Tensor] = None,
    out_scale: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """RMSNorm over the last dim. Returns (out in x.dtype, rstd fp32 x.shape[:-1], norm_input).

    norm_input is x + residual rounded to x.dtype (x itself without residual)."""
    norm_input = x if residual is None else (x.float() + residual.float()).to(x.dtype)
    v = norm_input.float()
    hidden = torch.tensor(v.shape[-1], dtype=torch.float32, device=v.device)
    rstd = torch.rsqrt((v * v).sum(-1) / hidden + torch.tensor(eps, dtype=torch.float32, device=v.device))
    out = ((v * rstd.unsqueeze(-1)) * _scaled_weight(weight, out_scale, v)).to(x.dtype)
    return out, rstd, norm_input


def norm_backward_ref(
    out_grad: torch.Tensor,
    x: torch.Tensor,
    weight: Optional[torch.Tensor],
    rstd: torch.Tensor,
    residual_out_grad: Optional[torch.Tensor] = None,
    out_scale: float = 1.0,
) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """Gradients of norm_forward_ref's out w.r.t. its norm_input and weight, given out_grad.

    x is norm_input and rstd the forward's rstd. residual_out_grad (the gradient reaching
    norm_input from its other uses, e.g. the residual stream) is added to x_grad.
    Returns (x_grad in x.dtype, weight_grad fp32 (H,) or None without weight)."""
    g = out_grad.float()
    xhat = x.float() * rstd.float().unsqueeze(-1)
    g_scaled = g * _scaled_weight(weight, out_scale, g)
    hidden = torch.tensor(x.shape[-1], dtype=torch.float32, device=x.device)
    mean = (g_scaled * xhat).sum(-1, keepdim=True) / hidden
    x_grad = rstd.float().unsqueeze(-1) * (g_scaled - xhat * mean)
    if residual_out_grad is not None:
        x_grad = x_grad + residual_out_grad.float()
    weight_grad = None
    if weight is not None:
        weight_grad = (g * xhat).reshape(-1, x.shape[-1]).sum(0) * torch.tensor(
            out_scale, dtype=torch.float32, device=x.device
        )
    return x_grad.to(x.dtype), weight_grad
