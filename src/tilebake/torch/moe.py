"""Plain-PyTorch reference of the MoE routing-weight normalisation (an oracle for tilebake.moe)."""

from __future__ import annotations

import torch

__all__ = ["normalize_weight"]

# The denominator starts here, so a row of zero weights divides by 1e-20, not by 0 (as the
# original, whose comment reads "Align with moe_topk_gate_forward").
DENOMINATOR_START = 1e-20


def normalize_weight(topk_weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(denominator (T,), normalized (T, k)) of fp32 topk_weights (T, k): denominator =
    1e-20 + w[0] + ... + w[k-1], added left to right in fp32; normalized = w / denominator."""
    if not isinstance(topk_weights, torch.Tensor) or topk_weights.dim() != 2:
        got = tuple(topk_weights.shape) if isinstance(topk_weights, torch.Tensor) else type(topk_weights).__name__
        raise ValueError(f"topk_weights must be a 2-D (num_tokens, num_topk) tensor, got {got}")
    if topk_weights.dtype != torch.float32:
        raise TypeError(f"topk_weights must be torch.float32, got {topk_weights.dtype}")
    denominator = torch.full(topk_weights.shape[:1], DENOMINATOR_START, dtype=torch.float32, device=topk_weights.device)
    for j in range(topk_weights.shape[1]):
        denominator = denominator + topk_weights[:, j]
    return denominator, topk_weights / denominator[:, None]
