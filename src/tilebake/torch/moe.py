"""Plain-PyTorch references of the MoE routing-weight normalisation and of the router backward
(oracles for tilebake.moe)."""

from __future__ import annotations

from typing import Optional

import torch

__all__ = ["mask_indices_by_tp", "moe_topk_gate_backward_ref", "normalize_weight"]

# The denominator starts here, so a row of zero weights divides by 1e-20, not by 0 (as the
# original, whose comment reads "Align with moe_topk_gate_forward").
DENOMINATOR_START = 1e-20


def mask_indices_by_tp(
    indices: torch.Tensor, n: int, num_ep_ranks: int, tp_rank: int, num_tp_ranks: int
) -> torch.Tensor:
    """Expert indices as tensor-parallel rank tp_rank numbers its own experts, -1 for the others.

    The n experts are spread over num_ep_ranks GPUs, n // num_ep_ranks each, and GPU g belongs to
    tensor-parallel rank g % num_tp_ranks of data-parallel group g // num_tp_ranks. An index on a
    GPU of tp_rank becomes (its group) * per_gpu + (its place on the GPU): tp_rank's experts
    numbered group after group; an index of another rank and a negative one become -1. Same shape
    and dtype as indices (any integer dtype, any shape)."""
    for value, name in ((n, "n"), (num_ep_ranks, "num_ep_ranks"), (num_tp_ranks, "num_tp_ranks")):
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    if n % num_ep_ranks:
        raise ValueError(f"n ({n}) must be a multiple of num_ep_ranks ({num_ep_ranks})")
    if isinstance(tp_rank, bool) or not isinstance(tp_rank, int) or not 0 <= tp_rank < num_tp_ranks:
        raise ValueError(f"tp_rank must be an int in [0, {num_tp_ranks}), got {tp_rank!r}")
    if not isinstance(indices, torch.Tensor) or indices.is_floating_point() or indices.is_complex():
        raise TypeError(f"indices must be an integer tensor, got {getattr(indices, 'dtype', type(indices).__name__)}")
    per_gpu = n // num_ep_ranks
    gpu = torch.div(indices, per_gpu, rounding_mode="floor")
    local = gpu // num_tp_ranks * per_gpu + indices % per_gpu
    return torch.where((indices >= 0) & (gpu % num_tp_ranks == tp_rank), local, -1).to(indices.dtype)


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


def moe_topk_gate_backward_ref(
    scores: torch.Tensor,
    topk_idx: torch.Tensor,
    topk_weights: torch.Tensor,
    grad_topk_weights: torch.Tensor,
    routed_scaling_factor: float,
    scoring_func: str = "sqrtsoftplus",
    mask: Optional[torch.Tensor] = None,
    grad_scores_sum: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """grad_logits of the MoE router, computed in float64 and returned in scores' dtype.

    Per token, u = scores (score(logits) of the forward), slots j with idx_j >= 0 (-1: masked),
    g = grad_topk_weights, w = topk_weights, s = routed_scaling_factor:
      the routing weights w_j = s * u[idx_j] / D, D = 1e-20 + sum_j u[idx_j], give
      dL/du[e] = sum_{j: idx_j = e} (s * g_j - <g, w>) / D;
      with grad_scores_sum (num_seqs, E): h = its row of the token's sequence (num_tokens /
      num_seqs contiguous tokens each), S = sum_e u[e], and for mask True tokens
      dL/du += (h - <h, u> / S) / S (the gradient of u / S);
    then dL/dlogits by the scoring function's derivative written with u:
      sqrtsoftplus: (1 - exp(-u^2)) / (2u) (= sigmoid(x) / (2 sqrt(softplus(x))); 0 at u = 0),
      sigmoid: u (1 - u), softmax: u * (dL/du - <u, dL/du>).
    A token with mask False gets a zero row. Raises ValueError for an index outside
    [-1, num_experts) and for a bad scoring_func or shape.
    """
    if scoring_func not in ("sqrtsoftplus", "sigmoid", "softmax"):
        raise ValueError(f"scoring_func must be one of ('sqrtsoftplus', 'sigmoid', 'softmax'), got {scoring_func!r}")
    if scores.dim() != 2 or topk_idx.dim() != 2 or topk_idx.shape[0] != scores.shape[0]:
        raise ValueError(
            f"scores must be (num_tokens, num_experts) and topk_idx (num_tokens, num_topk), got "
            f"{tuple(scores.shape)} and {tuple(topk_idx.shape)}"
        )
    num_tokens, num_experts = scores.shape
    if topk_idx.numel() and not bool(((topk_idx >= -1) & (topk_idx < num_experts)).all()):
        bad = topk_idx[(topk_idx < -1) | (topk_idx >= num_experts)][0]
        raise ValueError(f"topk_idx must hold expert indices in [0, {num_experts}) or -1 (masked), got {int(bad)}")
    u = scores.double()
    valid = topk_idx >= 0
    idx = topk_idx.clamp(min=0)
    g = torch.where(valid, grad_topk_weights.double(), 0.0)
    w = topk_weights.double()
    den = DENOMINATOR_START + torch.where(valid, u.gather(1, idx), 0.0).sum(dim=1, keepdim=True)
    route = torch.where(valid, (routed_scaling_factor * g - (g * w).sum(dim=1, keepdim=True)) / den, 0.0)
    grad_u = torch.zeros_like(u).scatter_add_(1, idx, route)
    if grad_scores_sum is not None:
        num_seqs = grad_scores_sum.shape[0]
        if num_seqs < 1 or num_tokens % num_seqs or grad_scores_sum.shape[1] != num_experts:
            raise ValueError(
                f"grad_scores_sum must be (num_seqs, {num_experts}) with num_seqs dividing {num_tokens}, "
                f"got {tuple(grad_scores_sum.shape)}"
            )
        h = grad_scores_sum.double().repeat_interleave(num_tokens // num_seqs, dim=0)
        counted = torch.ones(num_tokens, 1, dtype=torch.bool, device=u.device) if mask is None else mask[:, None]
        total = u.sum(dim=1, keepdim=True)
        inv = torch.where(counted, 1 / torch.where(counted, total, 1.0), 0.0)
        grad_u = grad_u + (h - (h * u).sum(dim=1, keepdim=True) * inv) * inv
    if scoring_func == "sqrtsoftplus":
        grad = grad_u * torch.where(u > 0, -torch.expm1(-u * u) / (2 * torch.where(u > 0, u, 1.0)), 0.0)
    elif scoring_func == "sigmoid":
        grad = grad_u * u * (1 - u)
    else:
        grad = u * (grad_u - (u * grad_u).sum(dim=1, keepdim=True))
    if mask is not None:
        grad = torch.where(mask[:, None], grad, 0.0)
    return grad.to(scores.dtype)
