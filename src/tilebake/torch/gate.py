"""Plain-PyTorch reference of the MoE router forward, moe_topk_gate_forward (the oracle for
tilebake.moe.moe_topk_gate_forward, and its CPU path). Its argument checks and limits are the
op's own (tilebake.moe._router, which imports only torch).

Per token t (T tokens, Er routed experts, k = num_topk, S shared slots):
  1. scores = score(logits) (sqrtsoftplus / softmax / sigmoid, tilebake.torch.topk.score).
  2. The routed experts, by priority:
     mask[t] False      -> nothing: every slot -1, weight 0, unmapped_topk_idx[t] = -1;
     force_random[t]    -> k distinct pseudo-random experts (random_experts), unmapped = -1;
     fix_routing_mask[t]-> the k ids read from unmapped_topk_idx[t] (kept as they are);
     otherwise          -> the top-k of scores + bias (image_bias for image tokens), stable
                           (ties to the smaller index); with num_groups > 1 the DeepSeek-V3
                           grouped selection (tilebake.torch.grouped_topk); written to
                           unmapped_topk_idx[t].
  3. weights = unbiased scores of the chosen experts / (1e-20 + their sum, added left to right
     in slot order), times routed_scaling_factor (fp32).
  4. S shared slots follow (logical ids Er + s, weight 1.0).
  5. With to_physical_map, every slot's logical id e becomes
     to_physical_map[e, (ep_rank + t * 23333) % logical_count[e]] (int64 arithmetic); a count
     outside [1, dup] gives -1 for that slot.
  6. scores (if given) receives step 1's values for the rows routed by score or by
     fix_routing_mask, and 0 for the rows masked out or taken by force_random (as the original,
     whose kernel writes the row only on its scoring path; fixed rows keep their scores, which
     their weights come from).
A token with a non-finite logit (or a fixed routing id outside [0, Er)) is not routed: every
slot -1, weight 0, unmapped_topk_idx[t] = -1 (left as it is for a fixed-routing token), and its
scores row is NaN (0 if it is masked out or random).
"""

from __future__ import annotations

from typing import Optional

import torch

from tilebake._hash import GOLDEN
from tilebake.moe._router import DRAWS_PER_SLOT, PHYSICAL_STRIDE, check_gate_args

from .stochastic import fmix32
from .topk import grouped_topk, score, stable_topk

__all__ = ["moe_topk_gate_forward_ref", "random_experts"]


def random_experts(tokens: torch.Tensor, ep_rank: int, num_experts: int, num_topk: int) -> torch.Tensor:
    """The force_random routing of the tokens with indices `tokens` (int64 (N,)): int64 (N, k),
    k distinct experts in [0, num_experts). With fmix32 = MurmurHash3's 32-bit finaliser and all
    arithmetic mod 2^32:
        seed = fmix32(fmix32(ep_rank) ^ t)
        draw(d) = fmix32(seed + (d + 1) * 0x9E3779B9) % num_experts
    slot s takes the first of draw(64 s), ..., draw(64 s + 63) not already taken by slots
    0..s-1, or, if all 64 collide, the smallest expert not yet taken."""
    n = tokens.numel()
    chosen = torch.full((n, num_topk), -1, dtype=torch.int64, device=tokens.device)
    seed = fmix32(fmix32(torch.full_like(tokens, ep_rank)) ^ (tokens & 0xFFFFFFFF))
    arange = torch.arange(num_experts, device=tokens.device)
    for s in range(num_topk):
        taken = (chosen[:, :s, None] == arange).any(dim=1)  # (N, E)
        slot = torch.full_like(tokens, -1)
        for a in range(DRAWS_PER_SLOT):
            d = s * DRAWS_PER_SLOT + a
            cand = fmix32(seed + (d + 1) * GOLDEN) % num_experts
            free = ~taken.gather(1, cand[:, None])[:, 0]
            slot = torch.where((slot < 0) & free, cand, slot)
        first_free = torch.argmax((~taken).to(torch.int8), dim=1)
        chosen[:, s] = torch.where(slot < 0, first_free, slot)
    return chosen


def moe_topk_gate_forward_ref(
    logits: torch.Tensor,
    num_topk: int,
    use_shared_as_routed: bool,
    num_shared_experts: int,
    routed_scaling_factor: float,
    ep_rank: int,
    scoring_func: str = "sqrtsoftplus",
    mask: Optional[torch.Tensor] = None,
    bias: Optional[torch.Tensor] = None,
    image_bias: Optional[torch.Tensor] = None,
    image_token_mask: Optional[torch.Tensor] = None,
    fix_routing_mask: Optional[torch.Tensor] = None,
    to_physical_map: Optional[torch.Tensor] = None,
    logical_count: Optional[torch.Tensor] = None,
    unmapped_topk_idx: Optional[torch.Tensor] = None,
    force_random: Optional[torch.Tensor] = None,
    out: Optional[tuple[torch.Tensor, torch.Tensor]] = None,
    scores: Optional[torch.Tensor] = None,
    *,
    num_groups: int = 1,
    num_topk_groups: int = 1,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The router forward in plain torch (see the module docstring for the semantics); returns
    (topk_idx int64 (T, k + S), topk_weights fp32 (T, k + S)), written into `out` if given.
    Writes unmapped_topk_idx (except fixed-routing tokens) and scores if given. bias and
    image_bias must be finite (ValueError)."""
    num_tokens, num_experts, k, shared = check_gate_args(
        logits, num_topk, use_shared_as_routed, num_shared_experts, routed_scaling_factor, ep_rank, scoring_func,
        mask, bias, image_bias, image_token_mask, fix_routing_mask, to_physical_map, logical_count,
        unmapped_topk_idx, force_random, out, scores, num_groups, num_topk_groups,
    )  # fmt: skip
    for name, t in (("bias", bias), ("image_bias", image_bias)):
        if t is not None and not bool(torch.isfinite(t).all()):
            raise ValueError(f"{name} must be finite")
    device = logits.device
    width = k + shared
    idx_out, w_out = out if out is not None else (None, None)
    if num_tokens == 0:
        if out is None:
            return torch.empty((0, width), dtype=torch.int64, device=device), torch.empty(
                (0, width), dtype=torch.float32, device=device
            )
        return idx_out, w_out

    bad = ~torch.isfinite(logits).all(dim=1)
    sc = score(torch.where(bad[:, None], 0.0, logits), scoring_func)
    sc = torch.where(bad[:, None], torch.nan, sc)
    false = torch.zeros(num_tokens, dtype=torch.bool, device=device)
    routed = mask if mask is not None else ~false
    rand = (force_random if force_random is not None else false) & routed
    fixed = (fix_routing_mask if fix_routing_mask is not None else false) & routed & ~rand
    if scores is not None:  # rows not routed by score (masked out or random) get 0, as the original
        scores.copy_(torch.where((~routed | rand)[:, None], 0.0, sc))
    zero = torch.zeros(num_experts, dtype=torch.float32, device=device)
    token_bias = (bias if bias is not None else zero).expand(num_tokens, num_experts)
    if image_token_mask is not None:
        token_bias = torch.where(image_token_mask[:, None], image_bias, token_bias)
    sel = torch.where(bad[:, None], 0.0, sc + token_bias)
    if num_groups > 1:
        chosen = grouped_topk(sel, k, num_groups, num_topk_groups)
    else:
        chosen = stable_topk(sel, k)

    if bool(fixed.any()):
        given = unmapped_topk_idx.to(device)
        bad = bad | (fixed & ((given < 0) | (given >= num_experts)).any(dim=1))
        chosen = torch.where(fixed[:, None], given.clamp(0, num_experts - 1), chosen)
    if bool(rand.any()):
        rows = rand.nonzero()[:, 0]
        chosen[rows] = random_experts(rows, ep_rank, num_experts, k)
    routed = routed & ~bad

    picked = sc.gather(1, chosen)
    denominator = torch.full((num_tokens,), 1e-20, dtype=torch.float32, device=device)
    for j in range(k):
        denominator = denominator + picked[:, j]
    weights = picked / denominator[:, None] * routed_scaling_factor
    logical = chosen
    if shared:
        shared_ids = torch.arange(num_experts, num_experts + shared, device=device).expand(num_tokens, shared)
        logical = torch.cat([chosen, shared_ids], dim=1)
        weights = torch.cat([weights, torch.ones(num_tokens, shared, dtype=torch.float32, device=device)], dim=1)
    physical = logical
    if to_physical_map is not None:
        count = logical_count.to(torch.int64)[logical]
        tokens = torch.arange(num_tokens, device=device, dtype=torch.int64)[:, None]
        dup = to_physical_map.shape[1]
        ok = (count >= 1) & (count <= dup)
        col = (ep_rank + tokens * PHYSICAL_STRIDE) % count.clamp(min=1)
        physical = torch.where(ok, to_physical_map[logical, col.clamp(max=dup - 1)].to(torch.int64), -1)

    physical = torch.where(routed[:, None], physical, -1)
    weights = torch.where(routed[:, None], weights, 0.0)
    if unmapped_topk_idx is not None:
        new = torch.where((routed & ~rand)[:, None], chosen, -1)
        unmapped_topk_idx.copy_(torch.where(fixed[:, None], unmapped_topk_idx, new))
    if out is None:
        return physical, weights.contiguous()
    idx_out.copy_(physical)
    w_out.copy_(weights)
    return idx_out, w_out
