"""Router inputs whose top-k choice is not decided by rounding."""

from __future__ import annotations

import torch

from tilebake.rand import randn
from tilebake.testing.generator import _device

__all__ = ["construct_logits"]

_MIN_GAP = 1e-6  # between the k-th and (k+1)-th selection score of every row
_MAX_ROUNDS = 100


def construct_logits(params: dict, kwargs: dict) -> torch.Tensor:
    """Random fp32 router logits (num_seqs * (num_tokens + num_padded_tokens), num_routed_experts)
    for moe_topk_gate_forward tests with the sqrtsoftplus scoring function.

    A kernel and a reference may round the selection scores (score + bias) differently; where the
    k-th and (k+1)-th largest are within 1e-6 of each other, they could then pick different
    experts. Such rows are redrawn until every row has a wider gap (RuntimeError after 100 rounds).

    params: num_tokens, num_padded_tokens, num_routed_experts, num_topk, optional num_seqs (1).
    kwargs: the gate's keyword arguments; bias, image_bias and image_token_mask are read (the
    image bias replaces the bias on rows the mask marks)."""
    # The reference scoring function; tilebake.torch loads on first use (see tilebake/__init__).
    from tilebake.torch.topk import score

    num_rows = params.get("num_seqs", 1) * (params["num_tokens"] + params["num_padded_tokens"])
    num_experts, num_topk = params["num_routed_experts"], params["num_topk"]
    device = _device()
    logits = randn((num_rows, num_experts), dtype=torch.float32, device=device)
    if num_topk >= num_experts:
        return logits  # every expert is chosen: no boundary to protect

    bias = kwargs.get("bias")
    if bias is None:
        bias = torch.zeros(num_experts, dtype=torch.float32, device=device)
    image_token_mask = kwargs.get("image_token_mask")
    if image_token_mask is not None:
        bias = torch.where(image_token_mask.unsqueeze(-1), kwargs["image_bias"].unsqueeze(0), bias.unsqueeze(0))
    else:
        bias = bias.unsqueeze(0).expand(num_rows, num_experts)

    selection = score(logits, "sqrtsoftplus") + bias
    for _ in range(_MAX_ROUNDS):
        top = torch.topk(selection, num_topk + 1, dim=-1).values
        close = top[:, num_topk - 1] - top[:, num_topk] <= _MIN_GAP
        if not bool(close.any()):
            return logits
        logits[close] = randn((int(close.sum()), num_experts), dtype=torch.float32, device=device)
        selection[close] = score(logits[close], "sqrtsoftplus") + bias[close]
    raise RuntimeError(f"no logits with a top-{num_topk} gap above {_MIN_GAP} after {_MAX_ROUNDS} draws")
