"""Plain-PyTorch references of MoE routing: top-k selection, scoring functions and the
DeepSeek-V3 grouped top-k (the oracles for the tilebake.moe kernels; issue 5).

Selection is a stable descending sort: among equal values the smaller expert index wins, which
is what the kernels promise ("always return the smaller index when there are ties"). Scores
must be finite: a NaN has no place in a descending order, so every function here raises
ValueError naming the argument instead of returning an arbitrary order. Only torch (and the
router's scoring functions, tilebake.moe._router) is imported.
"""

from __future__ import annotations

import torch

from tilebake.moe._router import SCORING_FUNCS

__all__ = ["SCORING_FUNCS", "grouped_topk", "score", "stable_topk"]


def _check_scores(scores: torch.Tensor, name: str) -> None:
    if not isinstance(scores, torch.Tensor) or scores.dim() != 2 or not scores.is_floating_point():
        got = tuple(scores.shape) if isinstance(scores, torch.Tensor) else type(scores).__name__
        raise ValueError(f"{name} must be a 2-D floating tensor (num_tokens, num_experts), got {got}")
    if not bool(torch.isfinite(scores).all()):
        row = int((~torch.isfinite(scores)).any(dim=1).nonzero()[0])
        raise ValueError(f"{name} must be finite; row {row} holds {scores[row][~torch.isfinite(scores[row])][0]}")


def _check_k(num_topk: int, limit: int, name: str = "num_topk") -> None:
    if isinstance(num_topk, bool) or not isinstance(num_topk, int) or not 1 <= num_topk <= limit:
        raise ValueError(f"{name} must be an int in [1, {limit}], got {num_topk!r}")


def stable_topk(scores: torch.Tensor, num_topk: int) -> torch.Tensor:
    """Indices (int64, (T, num_topk)) of each row's num_topk largest scores, in descending order
    of score; equal scores keep ascending index order (a stable sort)."""
    _check_scores(scores, "scores")
    _check_k(num_topk, scores.shape[1])
    order = torch.sort(scores, dim=1, descending=True, stable=True).indices
    return order[:, :num_topk].contiguous()


def score(logits: torch.Tensor, scoring_func: str = "sqrtsoftplus") -> torch.Tensor:
    """Router scores from logits, in fp32:
    sqrtsoftplus: sqrt(x if x > 20 else log1p(exp(x))) (the original's formula; softplus(x) is
    within an fp32 ulp of x beyond 20); softmax over the experts; sigmoid."""
    if scoring_func not in SCORING_FUNCS:
        raise ValueError(f"scoring_func must be one of {SCORING_FUNCS}, got {scoring_func!r}")
    _check_scores(logits, "logits")
    x = logits.float()
    if scoring_func == "sqrtsoftplus":
        return torch.sqrt(torch.where(x > 20, x, torch.log1p(torch.exp(torch.clamp(x, max=20)))))
    if scoring_func == "softmax":
        return torch.softmax(x, dim=1)
    return torch.sigmoid(x)


def grouped_topk(scores: torch.Tensor, num_topk: int, num_groups: int, num_topk_groups: int) -> torch.Tensor:
    """DeepSeek-V3's grouped selection: the experts are split into num_groups equal consecutive
    groups; a group's score is the sum of its two largest scores; the num_topk_groups best groups
    (stable: ties to the smaller group) stay, every other expert is excluded; then the num_topk
    best remaining experts (stable_topk). `scores` are the selection scores (with any
    score-correction bias already added). Returns int64 (T, num_topk)."""
    _check_scores(scores, "scores")
    num_experts = scores.shape[1]
    _check_k(num_groups, num_experts, "num_groups")
    if num_experts % num_groups:
        raise ValueError(f"num_groups={num_groups} must divide the number of experts {num_experts}")
    group_size = num_experts // num_groups
    if group_size < 2:
        raise ValueError(f"each group needs at least 2 experts (its score is a top-2 sum), got {group_size}")
    _check_k(num_topk_groups, num_groups, "num_topk_groups")
    _check_k(num_topk, num_topk_groups * group_size)
    grouped = scores.view(scores.shape[0], num_groups, group_size)
    top2 = torch.sort(grouped, dim=2, descending=True).values[:, :, :2]
    group_scores = top2[:, :, 0] + top2[:, :, 1]
    kept_groups = stable_topk(group_scores, num_topk_groups)
    keep = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(1, kept_groups, True)
    keep = keep.repeat_interleave(group_size, dim=1)
    masked = torch.where(keep, scores, torch.full_like(scores, -torch.inf))
    # -inf marks excluded experts; stable_topk's finiteness check is for the caller's scores.
    order = torch.sort(masked, dim=1, descending=True, stable=True).indices
    return order[:, :num_topk].contiguous()
